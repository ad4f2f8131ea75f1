"""Torch calls routed to dgl_exact's ops inside a scope: one torch-function mode, one dispatch table.

Two scopes, entered around every converted model's forward, run some torch calls on dgl_exact's ops:
:func:`~.functional.functional_ops` (``F.relu``, ``F.dropout``, ...) and :func:`~.products.compressed_products`
(``a * b``). Both go through the one :class:`torch.overrides.TorchFunctionMode` here, and every call it takes
is an entry of one table, :data:`ROUTES`: torch callable -> (the switch of the scope that owns it, its route).
Each owner declares its entries once, where it defines its ops (:func:`route`); its scope is a
:func:`scope` over its own switch, so each keeps its own rules (``compressed_products`` is not entered while
dynamo traces; ``functional_ops`` is).

The mode sees every outermost torch call of the forward while it is pushed (a call it routes runs with the
mode off: what dgl_exact's op calls inside is not seen again). A call not in the table, nearly all of them
(views, shapes, matmuls, DGL's and the user's other calls), costs one dictionary lookup before it runs as torch
runs it. A route takes the call's ``(args, kwargs)`` and gives a callable without arguments that runs
dgl_exact's op (its own frame, which :func:`dgl_exact.explain` and the census name), or None: torch runs the
call. The handler's frame keeps the name ``__torch_function__``: ``explain`` and the census skip such frames as
a scope passing calls on.

The mode is pushed by the outermost enabled scope of a thread or asyncio task (either kind) and popped when
that scope is left; a nested scope only sets its switch (``enabled=False``: torch's own inside it).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Dict, Iterator, Mapping, Optional, Tuple

from torch.overrides import TorchFunctionMode

__all__ = ["ROUTES", "route", "scope"]

#: a route: ``(args, kwargs)`` of the torch call -> a callable running dgl_exact's op, or None (torch runs it)
Route = Callable[[tuple, dict], Optional[Callable[[], object]]]
#: torch callable -> (the switch of the scope that owns it, its route); filled by :func:`route`
ROUTES: Dict[Callable, Tuple[contextvars.ContextVar, Route]] = {}
_pushed: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_torch_routes_mode", default=False)


def route(switch: contextvars.ContextVar, routes: Mapping[Callable, Route]) -> None:
    """Route the calls of each torch callable of ``routes`` by its route while ``switch`` is true in a
    :func:`scope` (one owner per callable)."""
    for func in routes:
        owner = ROUTES.get(func)
        if owner is not None and owner[0] is not switch:
            raise ValueError(f"{func!r} is routed by the scope of {owner[0].name} already")
    ROUTES.update((func, (switch, how)) for func, how in routes.items())


class _RoutedCalls(TorchFunctionMode):
    """Runs the calls of :data:`ROUTES` whose scope is on through their route; the rest as torch runs them."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            entry = ROUTES.get(func)
        except TypeError:  # an unhashable callable: not one of them
            entry = None
        if entry is not None and entry[0].get():
            call = entry[1](args, kwargs or {})
            if call is not None:
                return call()
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def scope(switch: contextvars.ContextVar, enabled: bool, push: bool = True) -> Iterator[None]:
    """``switch`` set to ``enabled`` inside the block; the mode pushed there if ``enabled`` and ``push`` and
    no enclosing scope of this thread or task pushed it. Left in another context than entered (a generator
    resumed elsewhere), the switch is set to False."""
    token = switch.set(enabled)
    pushing = enabled and push and not _pushed.get()
    pushed = _pushed.set(True) if pushing else None
    try:
        if pushing:
            with _RoutedCalls():
                yield
        else:
            yield
    finally:
        if pushed is not None:
            _pushed.reset(pushed)
        try:
            switch.reset(token)
        except ValueError:
            switch.set(False)
