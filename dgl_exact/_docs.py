"""Docstring text written once and shared: a line of a docstring that is only ``%(name)s`` becomes the fragment
``name`` (at that line's indentation; ``{name}`` in a fragment becomes the decorated object's name). The
modules of each package keep their own fragments (:data:`dgl_exact.nn._base.DOC_FRAGMENTS`,
:data:`dgl_exact.pyg._base.DOC_FRAGMENTS`) and fill their docstrings with :func:`doc_filler`."""
from __future__ import annotations

from typing import Callable, Dict

__all__ = ["doc_filler"]


def doc_filler(fragments: Dict[str, str]) -> Callable:
    """A decorator that fills the docstring of the class or function it decorates from ``fragments`` (see
    above; an unknown name raises KeyError at import) and returns it unchanged otherwise."""

    def fill(obj):
        lines = []
        for line in obj.__doc__.splitlines():
            key = line.strip()
            if key.startswith("%(") and key.endswith(")s"):
                indent = line[: len(line) - len(line.lstrip())]
                text = fragments[key[2:-2]].replace("{name}", obj.__name__)
                lines += [indent + part if part else "" for part in text.splitlines()]
            else:
                lines.append(line)
        obj.__doc__ = "\n".join(lines)
        return obj

    return fill
