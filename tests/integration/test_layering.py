"""The compression layer sits below the ops: what ``dgl_exact.compression`` and ``dgl_exact.compression_config`` import
(module level or inside functions, transitively within the package) never reaches the ops layer, the
modules or training, and they import DGL nowhere themselves (only the kernels' DGL backend does, for graph
aggregation)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dgl_exact"


def _module_file(name: str):
    parts = name.split(".")[1:]
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(name: str, path: pathlib.Path):
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            yield mod
            for alias in node.names:  # ``from . import x`` may name a submodule
                yield f"{mod}.{alias.name}"


def _closure(start: str):
    seen, todo, external = set(), [start], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name)
        if path is None:
            continue
        for mod in _imports(name, path):
            if mod.startswith("dgl_exact"):
                parts = mod.split(".")
                # a package's __init__ runs before any of its submodules
                todo.extend(".".join(parts[:i]) for i in range(2, len(parts) + 1) if _module_file(".".join(parts[:i])))
            else:
                external.add(mod.split(".")[0])
    return seen, external


def test_compression_and_config_do_not_reach_ops_nn_or_dgl():
    for start in ("dgl_exact.compression", "dgl_exact.compression_config", "dgl_exact.tracing"):
        inside, external = _closure(start)
        assert not any(m.startswith(("dgl_exact.ops", "dgl_exact.nn", "dgl_exact.training")) for m in inside), \
            (start, sorted(inside))
        own = [m for m in inside
               if m.startswith(("dgl_exact.compression", "dgl_exact.compression_config", "dgl_exact.tracing"))]
        for name in own:
            assert not any(m == "dgl" or m.startswith("dgl.") for m in _imports(name, _module_file(name))), name
