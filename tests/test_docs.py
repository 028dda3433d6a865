"""Every code block of the docs runs, and a block that raises fails the suite.

Pages are ``docs/**/*.md`` and ``README.md``. Each page runs in a fresh Python
process, as a reader would run it: its ```python blocks in order, sharing one
namespace, in a temporary working directory (with JAX's defaults: no x64,
whatever devices JAX finds). A failing block fails its page's test with the
traceback, whose line numbers are the page's own.

A block is changed by marker comments on the lines just above its fence
(invisible in the rendered page); markers above a page's title apply to every
block of the page. One or more of:

- ``<!-- docs-test: requires MOD ... -->``: skipped unless every Python module
  MOD can be imported;
- ``<!-- docs-test: requires-gpu -->``: skipped unless JAX sees a GPU;
- ``<!-- docs-test: file PATH -->``: the block (any language) is written to PATH
  in the working directory;
- ``<!-- docs-test: shell -->``: the block (bash) is run by bash in the working
  directory;
- ``<!-- docs-test: output -->``: the block (a ```text block, shown as the
  output) is what the runnable block above it printed, compared as doctest
  compares, ``...`` matching anything and runs of whitespace equal (so a long
  line may be shown wrapped); skipped with that block. ``output approx``: the
  numbers in it may differ from those printed by a factor of up to 2 or by up
  to 1e-6 (errors of finite differences, which vary with the CPU), the rest is
  compared as above.

Each marked block also gets a test of its own, skipped with the reason while
its condition is unmet, so that nothing is left out silently. PyTorch's blocks
run where torch is installed (CI: ``pytest tests/test_docs.py -k torch`` in the
step that installs it; page ids name torch).

Run as a script (``python tests/test_docs.py PAGE``), this file runs one page.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([*ROOT.glob("docs/**/*.md"), ROOT / "README.md"])

_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
KNOWN = {"requires", "requires-gpu", "file", "shell", "output"}


@dataclasses.dataclass
class Block:
    page: str          # path relative to the repository
    line: int          # line of the first line of code (1-based)
    lang: str
    code: str
    markers: list[tuple[str, list[str]]]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def marker(self, name: str) -> list[str] | None:
        for key, args in self.markers:
            if key == name:
                return args
        return None


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the markers above each."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    found, markers, page_markers, i = [], [], None, 0
    while i < len(lines):
        m = _MARKER.match(lines[i])
        if m:
            words = m.group(1).split()
            markers.append((words[0], words[1:]) if words else ("", []))
            i += 1
            continue
        if page_markers is None and lines[i].startswith("# "):   # above the title: every block's
            page_markers, markers = markers, []
        f = _FENCE.match(lines[i])
        if f:
            indent, fence, lang = f.group("indent"), f.group("fence"), f.group("info").lower()
            start, body, i = i + 2, [], i + 1
            while i < len(lines) and not (lines[i].strip().startswith(fence)
                                          and lines[i].strip().strip(fence[0]) == ""):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
                i += 1
            found.append(Block(rel, start, lang, "\n".join(body) + "\n",
                               [*(page_markers or []), *markers]))
            markers, i = [], i + 1
            continue
        if lines[i].strip():      # markers belong to the fence right below them
            markers = []
        i += 1
    return found


def runnable(block: Block) -> bool:
    if block.marker("output") is not None:
        return False
    return (block.lang in ("python", "py") or block.marker("file") is not None
            or block.marker("shell") is not None)


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d*(?:e[-+]?\d+)?(?![\w.])")


def _numbers_close(shown: str, printed: str) -> str:
    """``printed`` with each number replaced by the one shown where the two are close."""
    want, got = _NUMBER.findall(shown), _NUMBER.findall(printed)
    if len(want) != len(got):
        return printed
    pieces, last = [], 0
    for w, m in zip(want, _NUMBER.finditer(printed)):
        a, b = float(w), float(m.group())
        close = abs(a - b) <= 1e-6 or (a * b > 0 and max(a / b, b / a) <= 2)
        pieces += [printed[last:m.start()], w if close else m.group()]
        last = m.end()
    return "".join(pieces) + printed[last:]


def check_output(block: Block, printed: str) -> None:
    """Raise unless ``printed`` matches the output block, as doctest matches (``...``)."""
    import doctest
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    if "approx" in (block.marker("output") or []):
        printed = _numbers_close(block.code, printed)
    if not checker.check_output(block.code.strip() + "\n", printed.strip() + "\n", flags):
        raise AssertionError(f"{block.where}: the output shown is not what the block above "
                             f"printed.\nshown:\n{block.code}printed:\n{printed}")


def skip_reason(block: Block) -> str | None:
    """Why the block cannot run here, or None."""
    missing = [m for m in block.marker("requires") or [] if importlib.util.find_spec(m) is None]
    if missing:
        return f"{block.where} needs {', '.join(missing)}, not installed"
    if block.marker("requires-gpu") is not None and not _have_gpu():
        return f"{block.where} needs a GPU seen by JAX"
    return None


def _have_gpu() -> bool:
    import jax
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def run_page(page: Path, workdir: Path) -> None:
    """Run a page's blocks in this process, in order; raise on the first failure."""
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))   # as for `python` started there: its modules import
    # shell blocks' `python` is this interpreter
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    namespace: dict = {"__name__": "__main__"}
    printed = None    # what the last block that ran printed; None after a skipped one
    for block in blocks(page):
        if block.marker("output") is not None:
            if printed is not None and not skip_reason(block):
                check_output(block, printed)
                print(f"ok {block.where} (output)", flush=True)
            continue
        if not runnable(block):
            continue
        if skip_reason(block):
            printed = None
            continue
        start = time.perf_counter()
        target = block.marker("file")
        out = io.StringIO()
        if target:
            Path(target[0]).write_text(block.code)
        elif block.marker("shell") is not None:
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], check=True,
                                  stdout=subprocess.PIPE, text=True)
            out.write(proc.stdout)
        else:   # padded so that tracebacks give the page's own line numbers
            with contextlib.redirect_stdout(out):
                exec(compile("\n" * (block.line - 1) + block.code, block.page, "exec"),
                     namespace)
        printed = out.getvalue()
        sys.stdout.write(printed)
        print(f"ok {block.where} {time.perf_counter() - start:.2f} s", flush=True)


# ----------------------------------------------------------------------------- tests

if __name__ != "__main__":
    import pytest

    pytestmark = pytest.mark.slow  # runs every docs page, in processes of their own

    def _page_id(page: Path) -> str:
        rel = page.relative_to(ROOT).as_posix()
        torch = any("torch" in (b.marker("requires") or []) for b in blocks(page))
        return rel + ("[torch]" if torch and "torch" not in rel else "")

    _RUNNABLE = [p for p in PAGES if any(runnable(b) for b in blocks(p))]
    _MARKED = [b for p in PAGES for b in blocks(p) if b.markers and runnable(b)]

    @pytest.mark.parametrize("page", _RUNNABLE, ids=_page_id)
    def test_page_runs(page: Path, tmp_path: Path) -> None:
        import anybind  # the pages run against the same anybind as this process
        where = str(Path(anybind.__file__).resolve().parent.parent)
        env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(
            p for p in [where, os.environ.get("PYTHONPATH", "")] if p))
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.fail(f"a code block of {page.relative_to(ROOT)} failed:\n"
                        f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}", pytrace=False)

    @pytest.mark.parametrize("block", _MARKED, ids=lambda b: b.where)
    def test_marked_block(block: Block) -> None:
        """Marked blocks: skipped with the reason where their condition is unmet."""
        for key, args in block.markers:
            assert key in KNOWN, f"{block.where}: unknown docs-test marker {key!r}"
            assert args or key in ("requires-gpu", "shell"), f"{block.where}: {key} needs names"
        reason = skip_reason(block)
        if reason:
            pytest.skip(reason)

    def test_every_page_is_in_the_nav() -> None:
        """mkdocs.yml lists every page under docs/ (a page left out is unreachable)."""
        nav = (ROOT / "mkdocs.yml").read_text()
        for page in ROOT.glob("docs/**/*.md"):
            assert page.relative_to(ROOT / "docs").as_posix() in nav, page

    def test_every_public_name_is_in_the_api_reference() -> None:
        """docs/reference/api.md documents each name of ``anybind.__all__``.

        A name is entered as ``::: anybind.NAME``, or, where that path is a module
        (``anybind.check``, the package, shadowed by the function), as the object's
        own path with the option ``heading: anybind.NAME``.
        """
        import anybind
        api = (ROOT / "docs" / "reference" / "api.md").read_text()
        missing = [n for n in anybind.__all__
                   if f"::: anybind.{n}\n" not in api and f"heading: anybind.{n}\n" not in api]
        assert not missing, f"add '::: anybind.NAME' to docs/reference/api.md for {missing}"

    def _api_objects():
        import anybind
        for name in anybind.__all__:
            try:
                obj = getattr(anybind, name)
            except ImportError:  # the bridges need torch: the PyTorch step runs them (-k torch)
                continue
            if not isinstance(obj, str):  # constants (C_SIGNATURE) are documented by value
                yield name, obj
            if name == "Op":
                for member in ("def_jvp", "def_vjp", "def_transpose", "def_fwd", "def_bwd",
                               "def_vmap", "torch"):
                    yield f"Op.{member}", getattr(obj, member)

    @pytest.mark.parametrize("name", [n for n, _ in _api_objects()])
    def test_api_reference_examples_run(name: str) -> None:
        """The examples in the docstrings, which the API reference shows, run as shown."""
        import doctest

        import jax
        obj = dict(_api_objects())[name]
        doc = obj.__doc__
        assert doc and ">>>" in doc, f"ab.{name}'s docstring shows no example"
        needs_torch = re.search(r">>> (import|from) .*\btorch\b", doc)
        if needs_torch and not importlib.util.find_spec("torch"):
            pytest.skip(f"ab.{name}'s example needs torch, not installed")
        test = doctest.DocTestParser().get_doctest(doc, {}, name, None, 0)
        with jax.enable_x64(False):   # the examples show JAX's default dtypes
            result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
        assert result.failed == 0, f"the docstring example of ab.{name} failed"

    def test_a_failing_block_fails(tmp_path: Path) -> None:
        """The runner stops at a block that raises and names its line."""
        page = tmp_path / "page.md"
        page.write_text("# t\n\n```python\nx = 1\n```\n\n```python\nraise ValueError(x)\n```\n")
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "ValueError: 1" in proc.stderr and "page.md\", line 8" in proc.stderr

    def test_markers_skip_blocks(tmp_path: Path) -> None:
        """A block whose module is missing is skipped, by its own marker or the page's."""
        page = tmp_path / "page.md"
        page.write_text("<!-- docs-test: requires no_such_module_anywhere -->\n# t\n\n"
                        "```python\nraise ValueError\n```\n")
        assert [skip_reason(b) is not None for b in blocks(page)] == [True]
        page.write_text("# t\n\n<!-- docs-test: requires no_such_module_anywhere -->\n"
                        "```python\nraise ValueError\n```\n\n```python\nprint('ran')\n```\n")
        assert [skip_reason(b) is not None for b in blocks(page)] == [True, False]
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr

    def test_requirements_match_pyproject() -> None:
        """Getting started states the Python, JAX and NumPy floors pyproject declares (the
        releases tested at both ends: tests/test_window.py)."""
        import tomllib
        text = (ROOT / "pyproject.toml").read_text()
        project = tomllib.loads(text)["project"]
        floors = {"Python": project["requires-python"].removeprefix(">=")}
        for dep in project["dependencies"]:
            name, _, version = dep.partition(">=")
            if name in ("jax", "numpy"):
                floors[{"jax": "JAX", "numpy": "NumPy"}[name]] = version
        page = (ROOT / "docs" / "getting-started.md").read_text()
        for name, version in floors.items():
            assert f"{name} ≥ {version}" in page, f"getting-started.md: say '{name} ≥ {version}'"

    def test_output_blocks_are_checked(tmp_path: Path) -> None:
        """An output block must match what the block above printed; ``...`` matches anything."""
        page = tmp_path / "page.md"
        body = ("# t\n\n```python\nprint('x =', 1)\nprint('took 3.2 s')\n```\n\n"
                "<!-- docs-test: output -->\n```text\n{}\n```\n")
        page.write_text(body.format("x = 1\ntook ... s"))
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        page.write_text(body.format("x = 2\ntook ... s"))
        proc = subprocess.run([sys.executable, __file__, str(page)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "page.md:10: the output shown" in proc.stderr, proc.stderr


if __name__ == "__main__":
    page = Path(sys.argv[1]).resolve()
    try:
        run_page(page, Path.cwd())
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
