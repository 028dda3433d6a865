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
LAYERS = [("core", "_window"), ("routes",), ("_api",), ("torch",), ("check", "recipes", "contrib"),
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


# Layers above core that must use an op's interface, never its private state.
ABOVE_CORE = ("routes", "torch", "check", "recipes", "contrib", "cli")


def _private_op_attributes() -> set:
    """Every private name an op has: its instance state and its private methods."""
    from anybind.core._op import CoreOp

    op = anybind.bind(lambda x: x, shape=anybind.like(0), name="probe")
    names = {k for k in vars(op._core) if k.startswith("_")}
    names |= {k for k in vars(CoreOp) if k.startswith("_") and not k.startswith("__")}
    return names | {"_core", "_made"}  # the handle's


def test_no_layer_above_core_reads_an_ops_private_state():
    """Routes, front ends and checks ask core's interface (``call_for``, ``primitive``,
    ``version``, ``state``, …); an import graph cannot see an attribute reach, so it is
    read here from the source: ``x._family`` on anything but ``self``/``cls``."""
    private = _private_op_attributes()
    reaches = []
    for name, path in _modules().items():
        if name.split(".")[0] not in ABOVE_CORE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                reaches.append(f"{name}:{node.lineno}: .{node.attr}")
    assert reaches == []


def _code_names_and_notes(path: Path) -> tuple[set, list]:
    """(identifiers the code uses, [(line, text) of its comments and docstrings])."""
    import io
    import re
    import tokenize

    text = path.read_text()
    if path.suffix in (".c", ".h"):
        notes = [(text.count("\n", 0, m.start()) + 1, m.group())
                 for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S)]
        code = re.sub(r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\])*\"", " ", text, flags=re.S)
        return set(re.findall(r"[A-Za-z_]\w*", code)), notes
    names, notes = set(), []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME:
            names.add(tok.string)
        elif tok.type == tokenize.COMMENT:
            notes.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU").startswith(('"""', "'''")):
            notes.append((tok.start[0], tok.string))
    return names, notes


def test_docstrings_and_comments_name_modules_that_exist():
    """A ``_module``, ``package._module``, ``_module.py`` or ``_module._name`` named in a
    docstring or a comment (Python and C) is a module of the package, and the name
    after it is one its code uses: a module renamed or removed leaves no stale pointer."""
    import re

    files = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".c", ".h")]
    modules = {p.stem for p in files} | {p.name for p in PACKAGE.rglob("*") if p.is_dir()}
    used, notes = set(), []
    per_module: dict = {}
    for p in files:
        names, found = _code_names_and_notes(p)
        used |= names
        per_module.setdefault(p.stem, set()).update(names)
        notes += [(p, line, text) for line, text in found]
    ref = re.compile(r"(?:(?<=[\s`'\"(\[,])|^)((?:[a-z]+[./])*_[a-z][a-z0-9_]*)"
                     r"((?:\.[A-Za-z_]\w*)*)(\.py|\.c|\.h)?\b", re.M)
    outside = ("torch", "jax", "jaxlib", "numpy", "xla", "ducc0", "scipy", "numba", "cupy")
    stale = []
    for p, line, text in notes:
        for m in ref.finditer(text):
            path, attrs, suffix = m.group(1), m.group(2), m.group(3)
            parts = re.split(r"[./]", path)
            head = parts[-1]
            if parts[0] in outside:  # another package's private module
                continue
            where = f"{p.relative_to(PACKAGE)}:{line}: {m.group(0)}"
            if suffix:
                if head not in modules:
                    stale.append(where)
            elif head in modules:
                attr = attrs.lstrip(".").split(".")[0]
                if attr and attr.startswith("_") and attr not in per_module.get(head, set()):
                    stale.append(where)
            elif len(parts) > 1 and parts[-2] in modules and head not in per_module.get(
                    parts[-2], set()):
                stale.append(where)
            elif len(parts) == 1 and head not in used:
                stale.append(where)
    assert stale == []
