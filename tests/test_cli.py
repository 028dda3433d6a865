"""The command line: ``python -m anybind check|demo|--help``, run as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from anybind.cli import _demo, _main as _cli

GOOD = '''
import numpy as np
import anybind as ab

X = np.linspace(0.5, 1.5, 4)
mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="vectorized", name="mul",
              jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
              vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct),
              examples=lambda: ((X, X + 1), {}))
double = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, name="double",
                 transpose=lambda ct: (2 * ct,), examples=lambda: ((X,), {}))
no_examples = ab.bind(np.sin, shape=ab.like(0), name="no_examples")
'''

BAD = '''
import numpy as np
import anybind as ab

sin = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="sin",
              jvp=lambda p, t: 2 * np.cos(p[0]) * t[0],
              examples=lambda: ((np.linspace(0.1, 1.0, 5),), {}))
'''


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anybind", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


@pytest.fixture
def modules(tmp_path):
    (tmp_path / "good_ops.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad_ops.py").write_text(textwrap.dedent(BAD))
    (tmp_path / "empty.py").write_text("x = 1\n")
    return tmp_path


def test_help_documents_every_command():
    r = run("--help")
    assert r.returncode == 0
    for word in ("check", "demo", "MODULE[:NAME]", "examples="):
        assert word in r.stdout
    check_help, demo_help = run("check", "--help"), run("demo", "--help")
    assert check_help.returncode == demo_help.returncode == 0
    assert "--rtol" in check_help.stdout and "--x64" in check_help.stdout
    assert "--json" in demo_help.stdout and "gammaln" in demo_help.stdout


def test_no_command_prints_help_and_fails():
    r = run()
    assert r.returncode == 2 and "check" in r.stdout


def test_check_every_op_of_a_module_file(modules):
    r = run("check", str(modules / "good_ops.py"), "--x64")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "op 'mul'" in r.stdout and "op 'double'" in r.stdout
    assert "transpose" in r.stdout and "status" in r.stdout  # the tables
    summary = r.stdout.split("\n\n")[-1]
    assert "mul" in summary and "ok" in summary
    assert "no_examples" in summary and "skipped" in summary


def test_check_one_op_by_module_name(modules):
    r = run("check", "good_ops:mul", cwd=modules)  # float32 without --x64
    assert r.returncode == 0, r.stdout + r.stderr
    assert "op 'mul'" in r.stdout and "op 'double'" not in r.stdout


def test_check_fails_on_a_wrong_rule(modules):
    r = run("check", str(modules / "bad_ops.py"), "--x64")
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "fails check 'jvp'" in r.stdout


def test_check_json(modules):
    r = run("check", str(modules / "bad_ops.py"), "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["ok"] is False
    assert out["summary"][0]["status"] == "FAIL"
    assert out["reports"][0]["rows"][-1]["check"] == "jvp"


@pytest.mark.parametrize("target", ["no_such_module_xyz", "empty.py", "good_ops:X",
                                    "good_ops:missing"])
def test_check_usage_errors(modules, target):
    path = str(modules / target) if target.endswith(".py") else target
    r = run("check", path, cwd=modules)
    assert r.returncode == 2 and "anybind check:" in r.stderr


def test_demo():
    """The one full demo run: exit 0, every op and transformation, all ✓."""
    r = run("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    for op in ("scipy.special.gammaln", "numpy.fft.fft", "numpy.sort", "scipy.linalg.lu_solve",
               "JAXbind 01: scipy.fft.fftn", "JAXbind 02: multilinear", "JAXbind 03: nonlinear",
               "numba N-body (compiled)"):
        assert op in r.stdout
    for t in _demo.TRANSFORMS:
        assert t in r.stdout
    assert "✗" not in r.stdout and r.stdout.count("✓") >= 30  # 42 with ducc0
    assert "results agree with their pure-JAX references" in r.stdout


def test_demo_json(monkeypatch, capsys):
    monkeypatch.setattr(_demo, "cases", lambda: ([_demo.numpy_fft_case()], []))
    assert _cli.main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    assert {r["transformation"] for r in out["results"]} == set(_demo.TRANSFORMS)
    assert all(r["status"] == "ok" for r in out["results"])


def test_demo_exits_nonzero_when_a_result_is_wrong(monkeypatch, capsys):
    def broken():
        c = _demo.numpy_fft_case()
        c.op.def_transpose(lambda ct: (1.5 * ct,))  # not the DFT's transpose
        return [c], []
    monkeypatch.setattr(_demo, "cases", broken)
    assert _cli.main(["demo"]) == 1
    out = capsys.readouterr().out
    assert "✗" in out and "FAILED" in out
