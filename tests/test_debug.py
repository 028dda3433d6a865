"""Debug mode (``ab.debug()``, ``ANYBIND_DEBUG=1``): unwritten outputs named, inputs copied."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, randn

DTYPES = [np.float32, np.float64, np.complex64, np.complex128, np.int32, np.bool_]


def _half(x, *, out):
    """Writes the even elements of out[0] and all of out[1]; forgets the odd ones."""
    out[0][..., ::2] = x[..., ::2]
    out[1][...] = x


def _half_op(name):
    return ab.bind(_half, shape=lambda x: (x, x), out=True, vmap="vectorized", name=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("wrap", ["eager", "jit", "vmap"])
def test_unwritten_outputs_are_named(dtype, wrap):
    op = _half_op(f"half_{wrap}")
    x = np.ones((2, 5) if wrap == "vmap" else 5, dtype)
    f = {"eager": op, "jit": jax.jit(op), "vmap": jax.vmap(op)}[wrap]
    where = r"\[0, 1\], \[0, 3\], \[1, 1\], \[1, 3\]" if wrap == "vmap" else r"\[1\], \[3\]"
    # (leaving the block, a failing program's JaxRuntimeError becomes its HostError)
    with pytest.raises(ab.HostError, match=rf"'half_{wrap}'.*function left "
                                           rf"{4 if wrap == 'vmap' else 2} of "
                                           rf"{10 if wrap == 'vmap' else 5} elements of "
                                           rf"output 0 \(\[0\]\) unwritten: {where}"):
        with ab.debug():
            jax.block_until_ready(f(x))
    f(x)  # outside debug mode nothing is checked (and the odd elements are garbage)


def test_fully_written_outputs_pass_and_values_are_kept():
    def full(x, *, out):
        out[...] = 2 * x
    op = ab.bind(full, shape=ab.like(0), out=True, name="full_write")
    x = randn(6)
    with ab.debug():
        assert_close(op(x), 2 * x)
        assert_close(jax.jit(jax.vmap(op))(np.stack([x, x])), 2 * np.stack([x, x]))


def test_long_lists_of_unwritten_elements_are_cut():
    op = ab.bind(lambda x, *, out: None, shape=ab.like(0), out=True, name="writes_nothing")
    with ab.debug(), pytest.raises(ab.HostError, match=r"left 100 of 100 elements.*and 90 more"):
        op(np.ones(100))


def test_host_code_keeping_its_inputs_gets_copies():
    kept = []
    op = ab.bind(lambda x: (kept.append(x), x + 1)[1], shape=ab.like(0), name="keeps_inputs")
    f = jax.jit(lambda v: op(v * 1))
    with ab.debug():
        for i in range(20):
            f(jnp.full(3, float(i))).block_until_ready()
        assert [float(k[0]) for k in kept] == [float(i) for i in range(20)]
        assert not kept[0].flags.writeable


def test_debug_reraises_host_errors_from_compiled_programs():
    def bad(x):
        raise ValueError("no such value")
    op = ab.bind(bad, shape=ab.like(0), name="raises_inside_jit")
    f = jax.jit(lambda v: op(v) + 1)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"(?s)HostError: anybind op "
                                                         r"'raises_inside_jit'.*no such value"):
        f(X := randn(3)).block_until_ready()
    with pytest.raises(ab.HostError, match="'raises_inside_jit'") as info, ab.debug():
        f(X).block_until_ready()
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.slow  # starts a process
def test_environment_variable_turns_it_on():
    code = ("import numpy as np, anybind as ab\n"
            "op = ab.bind(lambda x, *, out: None, shape=ab.like(0), out=True, name='env')\n"
            "try:\n    op(np.ones(2))\nexcept ab.HostError as e:\n    print('named:', e)\n")
    env = {**os.environ, "ANYBIND_DEBUG": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "named: anybind op 'env': the function left 2 of 2 elements" in out
