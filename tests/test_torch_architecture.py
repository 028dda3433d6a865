"""torch's private API has one seam, ``anybind/torch/_torch.py``, as JAX's has ``core/_jax.py``.

Read from the source: an import of a private torch module or name, or an
attribute reach into one (``torch._C.x``, ``forward_ad._current_level``,
``t._version``) anywhere in the package but the seam fails here.
"""
import ast
from pathlib import Path

import anybind

PACKAGE = Path(anybind.__file__).resolve().parent
SEAM = PACKAGE / "torch" / "_torch.py"
# private attributes of tensors that only the seam may read
TENSOR_PRIVATE = {"_version", "_is_zerotensor", "_base", "_cdata"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches(path: Path) -> list[str]:
    """Every reach into torch's private API in one module, as ``line: what``."""
    tree = ast.parse(path.read_text())
    torch_names, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    if any(_private(p) for p in a.name.split(".")):
                        found.append(f"{node.lineno}: import {a.name}")
                    torch_names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            if any(_private(p) for p in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for a in node.names:
                if _private(a.name):
                    found.append(f"{node.lineno}: from {node.module} import {a.name}")
                torch_names.add(a.asname or a.name)
    attrs = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    inner = {id(n.value) for n in attrs}
    for node in attrs:
        if node.attr in TENSOR_PRIVATE:
            found.append(f"{node.lineno}: .{node.attr}")
            continue
        if id(node) in inner:  # a chain is reported once, whole
            continue
        chain, root = [node.attr], node.value
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in torch_names and any(map(_private, chain)):
            found.append(f"{node.lineno}: {root.id}.{'.'.join(reversed(chain))}")
    return found


def test_torch_private_api_is_used_in_the_seam_only():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path == SEAM:
            continue
        got = _reaches(path)
        if got:
            offenders[str(path.relative_to(PACKAGE))] = got
    assert offenders == {}


def test_the_check_sees_each_kind_of_reach(tmp_path):
    """The check itself: each form of reach is reported, public torch is not."""
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\nimport torch.autograd.forward_ad as fw\n"
        "from torch._functorch import pyfunctorch\n"
        "from torch.autograd.forward_ad import _set_fwd_grad_enabled, make_dual\n"
        "a = torch._C._are_functorch_transforms_active()\n"
        "b = fw._current_level\nc = t._version\n"
        "d = torch.func.vjp\ne = torch.__version__\n")
    got = sorted(r.split(": ", 1)[1] for r in _reaches(src))
    assert got == sorted(["from torch._functorch import ...",
                   "from torch.autograd.forward_ad import _set_fwd_grad_enabled",
                   "torch._C._are_functorch_transforms_active", "fw._current_level",
                   "._version"])


def test_the_seam_names_a_release_for_each_symbol():
    """Each module-level name the seam binds to torch says since which release (``(2.x)``)."""
    import re

    missing = []
    lines = SEAM.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([a-zA-Z]\w*) = ", line)
        if m and not re.search(r"\(\d+\.\d+", line):
            missing.append(f"{i + 1}: {m.group(1)}")
    for node in ast.parse(SEAM.read_text()).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node) or ""
            if node.name != "after_import" and not re.search(r"\d+\.\d+\)", doc):
                missing.append(f"{node.lineno}: def {node.name}")
    assert missing == []
