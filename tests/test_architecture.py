"""The package's layout holds: imports run one way, and JAX's private API has one seam.

Read from the source (every ``import`` statement, at module level or inside a
function), so a lazy import that hides a circle or an upward dependency fails
here too.
"""
import ast
from pathlib import Path

import anybind

PACKAGE = Path(anybind.__file__).resolve().parent

# Layers, bottom to top: a module may import its own layer's modules and lower layers'.
LAYERS = [("core",), ("routes",), ("_api",), ("torch",), ("check", "recipes", "contrib"),
          ("cli", "__init__", "__main__")]
SEAM = "core._jax"
PRIVATE = ("jax._src", "jax.interpreters", "jax.core", "jaxlib")


def _modules() -> dict:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path) -> tuple[set, set]:
    """(anybind modules imported, external modules imported) by one module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner, outer = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                (inner if a.name.startswith("anybind.") else outer).add(
                    a.name.removeprefix("anybind."))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                mod = node.module or ""
                if mod == "anybind" or mod.startswith("anybind."):
                    base = mod.removeprefix("anybind").lstrip(".")
                    for a in node.names:
                        inner.add(f"{base}.{a.name}".lstrip(".") if base else a.name)
                else:
                    outer.update(f"{mod}.{a.name}" for a in node.names)
                    outer.add(mod)
                continue
            base = package.split(".") if package else []
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            mod = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                inner.add(f"{mod}.{a.name}" if mod else a.name)
    return inner, outer


def _resolve(target: str, mods: dict) -> str | None:
    """The module that ``target`` (a module, or a name in one) is, or is in; None for
    anybind's C extensions (their source sits beside them as a ``.c`` file)."""
    if (PACKAGE / (target.replace(".", "/") + ".c")).exists():
        return None
    while target:
        if target in mods:
            return target
        target = target.rpartition(".")[0]
    return None


def _graph() -> dict:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        inner, _ = _imports(name, path)
        graph[name] = {m for m in (_resolve(t, mods) for t in inner) if m and m != name}
    return graph


def _layer(name: str) -> int:
    top = name.split(".")[0]
    return next(i for i, tops in enumerate(LAYERS) if top in tops)


def test_every_private_jax_symbol_is_imported_in_the_seam_only():
    mods = _modules()
    offenders = {}
    for name, path in mods.items():
        _, outer = _imports(name, path)
        bad = sorted(m for m in outer if m.startswith(PRIVATE))
        if bad and name != SEAM:
            offenders[name] = bad
    assert offenders == {}


def test_no_import_circles():
    graph = _graph()
    circles = []
    state: dict = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert circles == []


def test_imports_run_down_the_layers():
    upward = sorted((a, b) for a, deps in _graph().items() for b in deps
                    if _layer(b) > _layer(a))
    assert upward == []


def test_core_knows_no_route_and_no_front_end():
    """core reaches routes and front ends only through its registries."""
    for name, deps in _graph().items():
        if name.startswith("core"):
            assert all(d.startswith("core") for d in deps), (name, deps)
