"""The package's shape (issue 44): no module in ``dgl_exact/`` over :data:`MAX_MODULE_LINES` lines, no function
over :data:`MAX_FUNCTION_LINES` lines (``def`` line to last line, docstring included), and no file using another
module's underscore names (``from .x import _name``, or ``x._name`` on a module ``x`` it imported; dunders such as
``__version__`` aside). Another module's private name is its implementation: whoever needs it needs a public name.

Today's offenders are listed below, each with its current size; the lists may only shrink. A listed item that
grew fails, and so does one that is fixed (at or under the limit, or gone) but still listed: remove it. A new
offender is not added here: split the module or function, or make the name public. ``python
tests/integration/test_code_shape.py`` prints what the lists would be now.
"""
from __future__ import annotations

import ast
import functools
import pathlib
from typing import Dict, Iterator, Optional, Set, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOT = REPO / "dgl_exact"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# --- allowlists (issue 44): entries may only be removed or lowered ------------------------------------------
#: module -> its line count
LONG_MODULES: Dict[str, int] = {
    "dgl_exact/ops/structure.py": 641,
}
#: ``module:qualified.function`` -> its line count
LONG_FUNCTIONS: Dict[str, int] = {
    "dgl_exact/cli/train.py:train": 157,
    "dgl_exact/data/registry.py:load_dataset": 84,
    "dgl_exact/nn/conv/gatconv.py:GATConv.forward": 82,
    "dgl_exact/nn/conv/graphconv.py:GraphConv.forward": 88,
    "dgl_exact/nn/conv/sageconv.py:SAGEConv.forward": 103,
}
#: ``module -> other.module._name``: a module that uses another module's underscore name
PRIVATE_IMPORTS: Set[str] = {
    "dgl_exact/cli/bench.py -> dgl_exact.cli._common._check_dataset",
    "dgl_exact/cli/bench.py -> dgl_exact.cli._common._check_outputs",
    "dgl_exact/cli/plan.py -> dgl_exact.cli._common._check_outputs",
    "dgl_exact/cli/train.py -> dgl_exact.cli._common._check_dataset",
    "dgl_exact/cli/train.py -> dgl_exact.cli._common._check_outputs",
    "dgl_exact/cli/train.py -> dgl_exact.cli._common._int_choice",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._HALF",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._ONE",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._ZERO",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._code_levels",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._code_uniform",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._group_meta1",
    "dgl_exact/kernels/_numba_gpu.py -> dgl_exact.kernels._numba_cpu._hash_u",
    "dgl_exact/kernels/numba_kernels.py -> dgl_exact.kernels.reference._finite_max",
    "dgl_exact/nn/_base.py -> dgl_exact.ops.graph._check_nodes",
    "dgl_exact/ops/blocks.py -> dgl_exact.ops.elementwise._kernel_for",
    "dgl_exact/ops/blocks.py -> dgl_exact.ops.elementwise._mask_like",
    "dgl_exact/ops/gat.py -> dgl_exact.ops.graph._check_nodes",
    "dgl_exact/ops/gat.py -> dgl_exact.ops.graph._edge_softmax_ref",
    "dgl_exact/ops/gat.py -> dgl_exact.ops.graph._softmax_backward",
    "dgl_exact/ops/gat.py -> dgl_exact.ops.graph._spmm_ref",
    "dgl_exact/ops/gcn2_recompute.py -> dgl_exact.ops.gcn2._layer_forward",
    "dgl_exact/ops/gcn2_recompute.py -> dgl_exact.ops.gcn2._row_ranges",
    "dgl_exact/ops/norm_act.py -> dgl_exact.ops.dense._BatchNorm",
    "dgl_exact/ops/sage.py -> dgl_exact.ops.graph._check_nodes",
    "dgl_exact/ops/sage_norm.py -> dgl_exact.ops.graph._check_nodes",
    "dgl_exact/pyg/_base.py -> dgl_exact.ops.graph._CopyUMinMax",
    "dgl_exact/pyg/_base.py -> dgl_exact.ops.graph._CopyUReduce",
    "dgl_exact/pyg/_base.py -> dgl_exact.ops.graph._UMulESum",
    "dgl_exact/pyg/conversions.py -> dgl_exact.pyg.sage_conv._AGGREGATIONS",
    "dgl_exact/pyg/gat_conv.py -> dgl_exact.ops.gat._GATAttention",
    "dgl_exact/pyg/gat_conv.py -> dgl_exact.ops.gat._GATAttentionChunked",
    "dgl_exact/pyg/gat_conv.py -> dgl_exact.ops.gat._attention",
    "dgl_exact/pyg/gat_conv.py -> dgl_exact.ops.gat._chunk_budget",
    "dgl_exact/pyg/sage_conv.py -> dgl_exact.ops.sage._SAGEMean",
}


def _modules() -> Iterator[Tuple[str, pathlib.Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        yield path.relative_to(REPO).as_posix(), path


def _dotted(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(dotted: str) -> Optional[pathlib.Path]:
    """The file of a ``dgl_exact`` module or package, None for anything else (a name inside a module)."""
    if dotted != "dgl_exact" and not dotted.startswith("dgl_exact."):
        return None
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def _private_uses(path: pathlib.Path, tree: ast.AST) -> Set[str]:
    """``other.module._name`` for each underscore name of another ``dgl_exact`` module that ``path`` imports
    by name or reads as an attribute of a module it imported."""
    me = _dotted(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    modules: Dict[str, str] = {}  # local name -> dotted module it is bound to
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # ``import a.b.c`` binds ``a``; ``import a.b.c as x`` binds ``x`` to a.b.c
                bound = alias.name if alias.asname else alias.name.split(".")[0]
                if _module_file(bound) is not None:
                    modules[alias.asname or bound] = bound
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if _module_file(source) is None:
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if _module_file(target) is not None:  # a submodule: a module, not a name inside one
                    modules[alias.asname or alias.name] = target
                elif _private(alias.name) and source != me:
                    found.add(target)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                # ``dgl_exact.ops.keep._x`` through ``import dgl_exact``: the longest prefix that is a module
                dotted = [modules[value.id]] + chain[::-1]
                for cut in range(len(dotted) - 1, 0, -1):
                    owner = ".".join(dotted[:cut])
                    if _module_file(owner) is not None:
                        if _private(dotted[cut]) and owner != me:
                            found.add(f"{owner}.{dotted[cut]}")
                        break
    return found


def current_offenders() -> Tuple[Dict[str, int], Dict[str, int], Set[str]]:
    """(long modules, long functions, private uses) of the package as it is now (scanned once per root)."""
    return _scan(REPO)


@functools.lru_cache(maxsize=None)
def _scan(repo: pathlib.Path) -> Tuple[Dict[str, int], Dict[str, int], Set[str]]:
    modules, functions, private = {}, {}, set()
    for name, path in _modules():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            modules[name] = lines
        tree = ast.parse(text)
        for qualname, size in _functions(tree):
            if size > MAX_FUNCTION_LINES:
                functions[f"{name}:{qualname}"] = max(size, functions.get(f"{name}:{qualname}", 0))
        private |= {f"{name} -> {use}" for use in _private_uses(path, tree)}
    return modules, functions, private


def _compare(kind: str, limit: int, now: Dict[str, int], allowed: Dict[str, int]) -> list:
    problems = []
    for item, size in sorted(now.items()):
        if item not in allowed:
            problems.append(f"{item}: {size} lines, over the {limit}-line limit for a {kind} (split it)")
        elif size > allowed[item]:
            problems.append(f"{item}: {size} lines, grew from {allowed[item]} (the allowlist only shrinks)")
    for item in sorted(set(allowed) - set(now)):
        problems.append(f"{item}: now at most {limit} lines or gone; remove it from the {kind} allowlist")
    return problems


def test_no_module_over_the_limit():
    problems = _compare("module", MAX_MODULE_LINES, current_offenders()[0], LONG_MODULES)
    assert not problems, "\n".join(problems)


def test_no_function_over_the_limit():
    problems = _compare("function", MAX_FUNCTION_LINES, current_offenders()[1], LONG_FUNCTIONS)
    assert not problems, "\n".join(problems)


def test_no_module_uses_another_modules_private_names():
    now = current_offenders()[2]
    problems = [f"{use}: another module's underscore name (make it public, or keep the use inside its module)"
                for use in sorted(now - PRIVATE_IMPORTS)]
    problems += [f"{use}: no longer used; remove it from PRIVATE_IMPORTS" for use in sorted(PRIVATE_IMPORTS - now)]
    assert not problems, "\n".join(problems)


def test_an_allowlist_only_shrinks():
    allowed = {"a.py:f": 90, "b.py:g": 85, "c.py:h": 100}
    now = {"a.py:f": 91, "b.py:g": 82, "d.py:k": 81}  # f grew, g shrank, h was fixed, k is new
    problems = _compare("function", 80, now, allowed)
    assert len(problems) == 3
    assert "a.py:f: 91 lines, grew from 90" in problems[0]
    assert problems[1].startswith("d.py:k: 81 lines, over the 80-line limit")
    assert problems[2].startswith("c.py:h: now at most 80 lines or gone; remove it")


def test_the_checks_see_what_they_forbid(tmp_path, monkeypatch):
    """The walkers on a small package: a long function and module, a private name imported, and one read
    through an imported module, against public names, dunders and a module's own private names."""
    pkg = tmp_path / "dgl_exact"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '1'\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("_hidden = 1\nshown = 2\n")
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (pkg / "sub" / "b.py").write_text(
        "from . import a\nfrom .a import _hidden, shown\nfrom .. import __version__\nfrom ..sub import a as alias\n"
        "import dgl_exact.sub.a\n_mine = 0\n\n"
        f"class C:\n    def long(self):\n{body}\n\n"
        "def short():\n    return a._hidden, a.shown, alias._hidden, dgl_exact.sub.a._other, _mine, a.__name__\n"
        + "\n" * MAX_MODULE_LINES)
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    monkeypatch.setitem(globals(), "ROOT", pkg)
    modules, functions, private = current_offenders()
    assert set(modules) == {"dgl_exact/sub/b.py"}
    assert functions == {"dgl_exact/sub/b.py:C.long": MAX_FUNCTION_LINES + 1}
    assert private == {"dgl_exact/sub/b.py -> dgl_exact.sub.a._hidden", "dgl_exact/sub/b.py -> dgl_exact.sub.a._other"}


if __name__ == "__main__":
    long_modules, long_functions, private_uses = current_offenders()
    print("LONG_MODULES = {")
    print("".join(f'    "{k}": {v},\n' for k, v in sorted(long_modules.items())) + "}")
    print("LONG_FUNCTIONS = {")
    print("".join(f'    "{k}": {v},\n' for k, v in sorted(long_functions.items())) + "}")
    print("PRIVATE_IMPORTS = {")
    print("".join(f'    "{k}",\n' for k in sorted(private_uses)) + "}")
