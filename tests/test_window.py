"""The supported window is stated once (``anybind._window``) and everywhere else agrees:
pyproject's ``requires-python``, classifiers, dependencies, ``torch`` extra and
``[tool.cibuildwheel]``, the requirements on Getting started, ``.ci/run``'s two stacks and
``python -m anybind info``."""
import pathlib
import re
import tomllib

from anybind._window import TESTED, WHEELS
from anybind.cli import _info

ROOT = pathlib.Path(__file__).parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_python_window_in_pyproject():
    meta = PROJECT["project"]
    assert meta["requires-python"] == f">={TESTED['python'][0]}"
    listed = [c.rsplit(":: ", 1)[1] for c in meta["classifiers"]
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert listed == list(WHEELS)
    assert WHEELS[0] == TESTED["python"][0] and TESTED["python"][1] in WHEELS
    build = PROJECT["tool"]["cibuildwheel"]["build"]
    assert build == [f"cp{v.replace('.', '')}-*" for v in WHEELS]


def test_dependencies_start_at_the_oldest_tested():
    deps = PROJECT["project"]["dependencies"]
    assert f"jax>={TESTED['jax'][0]}" in deps and f"jaxlib>={TESTED['jax'][0]}" in deps
    assert f"numpy>={_minor(TESTED['numpy'][0])}" in deps
    assert f"jax>={TESTED['jax'][0]}" in PROJECT["build-system"]["requires"]


def test_torch_extra_admits_exactly_the_tested_range():
    lo, hi = TESTED["torch"]
    major, minor = map(int, _minor(hi).split("."))
    assert PROJECT["project"]["optional-dependencies"]["torch"] == [
        f"torch>={_minor(lo)},<{major}.{minor + 1}"]
    assert _info.satisfies(lo, PROJECT["project"]["optional-dependencies"]["torch"][0])
    assert _info.satisfies(hi, PROJECT["project"]["optional-dependencies"]["torch"][0])


def test_ci_runs_both_ends():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"find_python {re.escape(TESTED['python'][1])}\b", ci)
    assert re.search(rf"find_python {re.escape(TESTED['python'][0])}\b", ci)
    assert f'"jax=={TESTED["jax"][0]}"' in ci and f'"jaxlib=={TESTED["jax"][0]}"' in ci
    assert f'"numpy=={TESTED["numpy"][0]}"' in ci
    assert f'"torch=={TESTED["torch"][0]}"' in ci


def test_getting_started_states_the_window():
    text = (ROOT / "docs" / "getting-started.md").read_text()
    for name, label in (("python", "Python"), ("jax", "JAX"), ("numpy", "NumPy"),
                        ("torch", "PyTorch")):
        lo, hi = TESTED[name]
        row = re.search(rf"^\| {label} \| (.*?) \| (.*?) \|", text, re.M)
        assert row, f"getting-started.md has no requirements row for {label}"
        assert row.groups() == (lo, hi), (label, row.groups(), (lo, hi))


def test_info_reports_the_window():
    report = _info.render(_info.gather())
    for name, (lo, hi) in TESTED.items():
        assert re.search(rf"^  {name}\s+{re.escape(lo)} – {re.escape(hi)}; installed ", report,
                         re.M), name
