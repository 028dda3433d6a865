"""jax.export of programs that call compiled ops: they serialise with no
``disabled_checks``, and run in a fresh process that imports the module that
binds the ops (``compiled_ops.py``), with the same results as here."""
import gc
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
import compiled_ops as co
from anybind.routes import _compiled
from helpers import assert_close, randn, run_fresh_python


def _program(x1, x2, xs):
    """Every route of the export: function, jvp, vjp, transpose, bwd, vmap, scan."""
    mul, cumsum, exp = co.mul("numba"), co.cumsum(), co.exp()
    y = co.mul("ctypes")(x1, x2) + co.mul("cffi", "vectorized")(x1, x2)
    g = jax.grad(lambda a, b: (mul(a, b) * cumsum(b)).sum(), argnums=(0, 1))(x1, x2)
    t = jax.jvp(mul, (x1, x2), (x2, x1))[1]
    v = jax.vmap(jax.grad(lambda x: exp(x).sum()))(xs)
    s = jax.lax.scan(lambda c, _: (mul(c, x2) * 0.5, None), x1, None, length=3)[0]
    return y, g, t, v, s


def _run_fresh(script: str, tmp_path: Path):
    return run_fresh_python(script, cwd=tmp_path)


@pytest.mark.slow  # starts a process
def test_exported_program_runs_in_a_fresh_process(tmp_path):
    x1, x2, xs = randn((2, 3)), randn((2, 3), seed=1), 0.5 * randn((4, 3), seed=2)
    exported = jax.export.export(jax.jit(_program))(x1, x2, xs)
    assert "anybind_compiled" in exported.mlir_module()
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "inputs.npz", x1=x1, x2=x2, xs=xs)
    want = _program(x1, x2, xs)
    assert_close(exported.call(x1, x2, xs), want)

    res = _run_fresh("""
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        import compiled_ops  # binds the ops: their compiled functions register by name
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        inputs = np.load("inputs.npz")
        out = exported.call(inputs["x1"], inputs["x2"], inputs["xs"])
        np.savez("outputs.npz", *jax.tree.leaves(out))
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "outputs.npz")
    leaves = jax.tree.leaves(want)
    assert_close([got[f"arr_{i}"] for i in range(len(leaves))], leaves)


@pytest.mark.slow  # starts a process
def test_a_fresh_process_without_the_binding_names_the_missing_function(tmp_path):
    only_here = ab.bind(co.clib("ctypes")["mul"], shape=ab.like(0), name="bound_only_here")
    x = randn(3)
    exported = jax.export.export(jax.jit(only_here))(x, x)
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    res = _run_fresh("""
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        import compiled_ops
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        try:
            exported.call(np.ones(3), np.ones(3))
        except Exception as e:
            print(e)
    """, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "no compiled function is registered under the name 'bound_only_here'" in res.stdout
    assert "import the module that binds it" in res.stdout


def test_a_name_means_one_function_while_an_op_holds_it():
    k = co.clib("ctypes")
    first = ab.bind(k["mul"], shape=ab.like(0), name="rebound")
    with pytest.raises(ValueError, match=r"anybind op 'rebound': its compiled function would "
                       r"link as 'rebound', which another live op .* binds to a different "
                       r"function"):
        ab.bind(k["mul_jvp"], shape=ab.like(0), name="rebound")  # another function
    again = ab.bind(k["mul"], shape=ab.like(0), name="rebound")  # the same function: fine
    x = jnp.ones(3)
    for op in (first, again):
        assert 'anybind_name = "rebound"' in jax.jit(op).lower(x, x).as_text()
        assert_close(op(x, 2 * x), 4 * np.ones(3))
    exported = jax.export.export(jax.jit(first))(x, x)  # linked by the op's own name
    assert f"anybind_key = {_compiled.key_of('rebound')}" in exported.mlir_module()
    blob = exported.serialize()
    compiled = jax.jit(first).lower(x, x).compile()  # linked by a key of this process
    del first, again, op, exported  # (an Exported holds its ops)
    gc.collect()
    second = ab.bind(k["mul_jvp"], shape=lambda a, b, c, d: a, name="rebound")  # free now
    assert_close(second(x, x, x, x), 3 * np.ones(3))
    assert_close(compiled(x, 2 * x), 4 * np.ones(3))  # still the function it was built for
    with pytest.raises(Exception, match=r"anybind op 'rebound': the compiled function: a "
                       r"program exported with another function or export_version under "
                       r"the name 'rebound' runs here"):
        # the name now means another function (its fingerprint differs)
        jax.block_until_ready(jax.export.deserialize(blob).call(x, x))
