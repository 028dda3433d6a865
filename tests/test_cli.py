"""The command line: ``python -m anybind check|demo|info|--help``, run as a user runs it.

The commands run in a fresh process (slow: ``-m "not slow"`` leaves them out) and in
this one, through the parser's entry point.
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import anybind
from anybind.cli import _demo, _info, _main as _cli

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


@pytest.mark.slow
def test_help_documents_every_command():
    r = run("--help")
    assert r.returncode == 0
    for word in ("check", "demo", "info", "MODULE[:NAME]", "examples="):
        assert word in r.stdout
    check_help, demo_help = run("check", "--help"), run("demo", "--help")
    assert check_help.returncode == demo_help.returncode == 0
    assert "--rtol" in check_help.stdout and "--x64" in check_help.stdout
    assert "--json" in demo_help.stdout and "gammaln" in demo_help.stdout


@pytest.mark.slow
def test_no_command_prints_help_and_fails():
    r = run()
    assert r.returncode == 2 and "check" in r.stdout


@pytest.mark.slow
def test_check_every_op_of_a_module_file(modules):
    r = run("check", str(modules / "good_ops.py"), "--x64")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "op 'mul'" in r.stdout and "op 'double'" in r.stdout
    assert "transpose" in r.stdout and "status" in r.stdout  # the tables
    summary = r.stdout.split("\n\n")[-1]
    assert "mul" in summary and "ok" in summary
    assert "no_examples" in summary and "skipped" in summary


@pytest.mark.slow
def test_check_one_op_by_module_name(modules):
    r = run("check", "good_ops:mul", cwd=modules)  # float32 without --x64
    assert r.returncode == 0, r.stdout + r.stderr
    assert "op 'mul'" in r.stdout and "op 'double'" not in r.stdout


@pytest.mark.slow
def test_check_fails_on_a_wrong_rule(modules):
    r = run("check", str(modules / "bad_ops.py"), "--x64")
    assert r.returncode == 1
    assert "FAIL" in r.stdout and "fails check 'jvp'" in r.stdout


@pytest.mark.slow
def test_check_json(modules):
    r = run("check", str(modules / "bad_ops.py"), "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["ok"] is False
    assert out["summary"][0]["status"] == "FAIL"
    assert out["reports"][0]["rows"][-1]["check"] == "jvp"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["no_such_module_xyz", "empty.py", "good_ops:X",
                                    "good_ops:missing"])
def test_check_usage_errors(modules, target):
    path = str(modules / target) if target.endswith(".py") else target
    r = run("check", path, cwd=modules)
    assert r.returncode == 2 and "anybind check:" in r.stderr


@pytest.mark.slow
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


@pytest.mark.slow  # tens of seconds: the demo's transformation matrix, in this process
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


def test_check_in_process(modules, capsys):
    """``check`` through the entry point: a right op passes, a wrong jvp fails, naming it."""
    assert _cli.main(["check", str(modules / "good_ops.py")]) == 0
    assert "op 'mul'" in capsys.readouterr().out
    assert _cli.main(["check", str(modules / "bad_ops.py")]) == 1
    assert "fails check 'jvp'" in capsys.readouterr().out


# ------------------------------------------------------------------------------ info

def _info_json(capsys, *args: str) -> tuple[int, dict]:
    code = _cli.main(["info", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _built(stem: str) -> bool:
    """Whether the C extension ``stem`` sits in the installed package, by its file."""
    routes = Path(anybind.__file__).parent / "routes"
    return any((routes / f"{stem}{suffix}").exists()
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def test_info_reports_this_install(capsys):
    code, out = _info_json(capsys)
    assert code == 0
    v = out["versions"]
    assert (v["anybind"], v["jax"], v["numpy"]) == (anybind.__version__, jax.__version__,
                                                    np.__version__)
    assert v["python"].endswith(".".join(map(str, sys.version_info[:3])))
    handler, shim = out["routes"]["python_handler"], out["routes"]["compiled_shim"]
    assert handler["built"] == _built("_pycall") and shim["built"] == _built("_shim")
    assert handler["loaded"] == handler["built"]  # built for this Python, it loads
    requires = importlib.metadata.requires("anybind")
    window = [r for r in requires if "extra ==" not in r]
    assert [w["requirement"] for w in out["jax_window"]] == window
    assert all(w["ok"] for w in out["jax_window"])
    assert set(out["extras"]) == set(importlib.metadata.metadata("anybind")
                                     .get_all("Provides-Extra"))
    assert out["versions"]["optional"]["scipy"] == importlib.metadata.version("scipy")


def test_info_text_names_every_section(capsys):
    from anybind.__main__ import main  # the script's entry point
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    for section in ("versions", "extras", "routes", "Python FFI handler", "compiled shim",
                    "GPU", "shim cache", "jax window"):
        assert section in text
    assert f"jaxlib{' ' * 16}{importlib.metadata.version('jaxlib')}" in text


def test_info_says_when_the_handlers_were_not_built(monkeypatch, capsys, tmp_path):
    """An install made without a C compiler, on a machine that still has none."""
    monkeypatch.setattr(_info, "_extension", lambda name: None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    code, out = _info_json(capsys)
    handler, shim = out["routes"]["python_handler"], out["routes"]["compiled_shim"]
    assert code == 0 and not handler["built"] and not shim["built"]
    assert shim["compiler"] is None and "buffer callback" in handler["note"]
    assert _cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "Python FFI handler    NOT built" in text
    assert "compiled shim         NOT built at install; no C compiler" in text


def test_info_shim_cache_states(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = _info_json(capsys)[1]["shim_cache"]
    assert cache["path"] == str(tmp_path / "anybind") and not cache["exists"]
    (tmp_path / "anybind").mkdir(mode=0o700)
    (tmp_path / "anybind" / "shim-0123.json").write_text("{}")
    (tmp_path / "anybind" / "shim-0123-4567.so").write_bytes(b"x" * 3000)
    cache = _info_json(capsys)[1]["shim_cache"]
    assert cache["exists"] and cache["private"]
    assert (cache["builds"], cache["bytes"]) == (1, 3000)
    os.chmod(tmp_path / "anybind", 0o777)
    cache = _info_json(capsys)[1]["shim_cache"]
    assert cache["private"] is False and "NOT private" in cache["state"]


def test_info_fails_outside_the_jax_window(monkeypatch, capsys):
    real = _info._version
    monkeypatch.setattr(_info, "_version", lambda d: "0.4.30" if d == "jax" else real(d))
    code, out = _info_json(capsys)
    assert code == 1
    assert [w["ok"] for w in out["jax_window"] if w["requirement"].startswith("jax>")] == [False]
    assert _cli.main(["info"]) == 1 and "OUTSIDE THE WINDOW" in capsys.readouterr().out


@pytest.mark.parametrize("version, spec, ok", [
    ("0.10.2", "jax>=0.8.0", True), ("0.7.2", "jax>=0.8.0", False),
    ("0.10.2.dev20260101", "jax>=0.10.2", True), ("0.10.1rc1", "jax>=0.10.2", False),
    ("0.10.2", "jax==0.10.*", True), ("0.11.0", "jax==0.10.*", False),
    ("2.13.0", "torch>=2.4,<=2.13.0", True), ("2.13.1", "torch>=2.4,<=2.13.0", False),
    ("0.11", "jax>=0.8,<0.11", False), ("1.4", "x~=1.2", True), ("2.0", "x~=1.2", False),
    ("3.1", "x!=3.1", False), ("3.1.1", "x!=3.1", True)])
def test_window_comparison(version, spec, ok):
    assert _info.satisfies(version, spec) is ok


@pytest.mark.slow
def test_info_runs_as_a_user_runs_it():
    r = run("info")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Python FFI handler" in r.stdout and "jax window" in r.stdout
    assert r.stdout.startswith(f"anybind {anybind.__version__}")


def test_info_says_when_the_shim_cache_cannot_be_created(monkeypatch, capsys, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    cases = {str(tmp_path / "a-file"): "is not a folder",
             str(tmp_path / "a-file" / "below"): "is not a folder",
             "/proc/anybind-probe": "cannot be made in /proc"}
    for home, why in cases.items():
        monkeypatch.setenv("XDG_CACHE_HOME", home)
        cache = _info_json(capsys)[1]["shim_cache"]
        assert not cache["exists"] and cache["creatable"] is False, cache
        assert "cannot be created" in cache["state"] and why in cache["state"], cache
        assert "the first build creates it" not in cache["state"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "new" / "deeper"))
    cache = _info_json(capsys)[1]["shim_cache"]
    assert cache["creatable"] and "the first build creates it" in cache["state"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing was made
    # a folder that is not writable (as another user would find it; root writes anyway)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("XDG_CACHE_HOME", str(locked))
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) != str(locked))
    cache = _info_json(capsys)[1]["shim_cache"]
    assert "cannot be created" in cache["state"] and "is not writable" in cache["state"]
