"""Programs exported by one JAX release and loaded by another: the two ends of the window.

CI's oldest-stack step names the newest stack's interpreter in ``ANYBIND_OTHER_PYTHON``;
each stack exports a program that calls compiled ops, and each loads the other's with
``ab.deserialize``. Where JAX reads the program, it gives the writer's numbers; where JAX
refuses, the error names the op, the reading release and the window (measured: jax 0.12
refuses programs of jax 0.8.0, and 0.8.0 cannot read those of 0.12).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _compiled

pytestmark = pytest.mark.slow  # starts processes

HERE = Path(__file__).parent
OTHER = os.environ.get("ANYBIND_OTHER_PYTHON")

_SETUP = """
import json, sys, jax, numpy as np
jax.config.update("jax_enable_x64", True)
import anybind as ab, compiled_ops as co
f = lambda a, b: co.mul("ctypes")(a, b) + co.cumsum()(b)
x = np.linspace(0.1, 1.0, 5)
"""
_EXPORT = _SETUP + """
exported = jax.export.export(jax.jit(f))(x, x)
open(sys.argv[1], "wb").write(exported.serialize())
print(json.dumps({"jax": jax.__version__, "out": np.asarray(f(x, x)).tolist()}))
"""
_LOAD = _SETUP + """
try:
    out = ab.deserialize(open(sys.argv[1], "rb").read()).call(x, x)
    print(json.dumps({"jax": jax.__version__, "out": np.asarray(out).tolist()}))
except ValueError as e:
    print(json.dumps({"jax": jax.__version__, "error": str(e)}))
"""


def _run(python: str, script: str, path: Path) -> dict:
    # the tests' modules only: each interpreter imports its own jax and anybind
    env = dict(os.environ, PYTHONPATH=str(HERE))
    res = subprocess.run([python, "-c", script, str(path)], env=env, capture_output=True,
                         text=True, timeout=300, cwd=path.parent)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _release(version: str) -> tuple:
    return tuple(int(p) for p in version.split(".")[:3])


def _refused(writer: str, reader: str) -> bool | None:
    """Whether JAX refuses, as measured at the ends of the window; None: not measured."""
    w, r = _release(writer), _release(reader)
    if w[:2] == r[:2]:
        return False
    if w <= (0, 8, 1) and r >= (0, 11, 1):
        return True
    if w >= (0, 12) and r < (0, 9):
        return True
    return None


@pytest.mark.skipif(not OTHER, reason="ANYBIND_OTHER_PYTHON names no second stack (CI's "
                                      "oldest-stack step sets it)")
@pytest.mark.parametrize("direction", ["here_to_other", "other_to_here"])
def test_exports_between_the_two_stacks(tmp_path, direction):
    writer, reader = ((sys.executable, OTHER) if direction == "here_to_other"
                      else (OTHER, sys.executable))
    wrote = _run(writer, _EXPORT, tmp_path / "program.bin")
    read = _run(reader, _LOAD, tmp_path / "program.bin")
    refused = _refused(wrote["jax"], read["jax"])
    if "error" in read:
        assert refused is not False, read["error"]
        for part in ("'cmul_ctypes_sequential'", "'ccumsum_sequential'", f"jax {read['jax']}",
                     "0.11.1", "0.8.0"):
            assert part in read["error"], (part, read["error"])
    else:
        assert refused is not True, f"jax {read['jax']} read a program of jax {wrote['jax']}"
        np.testing.assert_allclose(read["out"], wrote["out"], rtol=1e-12)


def test_deserialize_reads_what_this_jax_wrote(tmp_path):
    wrote = _run(sys.executable, _EXPORT, tmp_path / "program.bin")
    read = _run(sys.executable, _LOAD, tmp_path / "program.bin")
    assert read == wrote


def test_a_refused_program_names_its_ops(monkeypatch):
    """JAX's refusal (here as JAX 0.12 words it, for a program of jax 0.8.0) becomes an
    error naming the compiled ops of this process that the program calls."""
    import compiled_ops as co
    x = np.linspace(0.1, 1.0, 5)
    op = co.mul("ctypes")
    blob = jax.export.export(jax.jit(op))(x, x).serialize()

    def refuse(data):
        raise ValueError("Exported being deserialized seems to be older than the 6-month "
                         "backward-compatibility window")
    monkeypatch.setattr(jax.export, "deserialize", refuse)
    with pytest.raises(ValueError, match=r"(?s)'cmul_ctypes_sequential'.*6-month.*0\.11\.1"):
        ab.deserialize(blob)
    assert "0.8.0" in _compiled.EXPORT_WINDOW
