"""Misuse of the API and faults in user code: a clear error naming the op, never a
stale rule, a swallowed interrupt or a program that loses its callbacks."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close


def _sin(name, **kw):
    return ab.bind(np.sin, shape=ab.like(0), name=name,
                   vjp=lambda p, ct: (np.cos(p[0]) * ct,), **kw)


# ------------------------------------------------- a rule given later is used everywhere

@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_a_rule_given_after_use_is_used_by_every_program(kind):
    """Programs traced with the old rule (a jitted function, the op's eager programs) are
    traced again at their next call, as fresh traces are: no program keeps a stale rule."""
    op = _sin(f"redefined_{kind}", jvp=lambda p, t: np.cos(p[0]) * t[0])
    x = jnp.linspace(0.0, 1.0, 3)
    if kind == "vjp":
        run = jax.jit(jax.grad(lambda v: op(v).sum()))
        fresh = lambda v: jax.grad(lambda w: op(w).sum())(v)  # noqa: E731
    else:
        run = jax.jit(lambda v: jax.jvp(op, (v,), (jnp.ones_like(v),))[1])
        fresh = lambda v: jax.jvp(op, (v,), (jnp.ones_like(v),))[1]  # noqa: E731
    assert_close(run(x), jnp.cos(x))
    assert_close(fresh(x), jnp.cos(x))
    if kind == "vjp":
        op.def_vjp(lambda p, ct: (3 * np.cos(p[0]) * ct,))
    else:
        op.def_jvp(lambda p, t: 3 * np.cos(p[0]) * t[0])
    assert_close(run(x), 3 * jnp.cos(x))
    assert_close(fresh(x), 3 * jnp.cos(x))


# --------------------------------------------------------------------- BaseExceptions

@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
@pytest.mark.parametrize("how", ["eager", "grad"])
def test_a_base_exception_in_host_code_is_reraised_itself_by_eager_calls(exc, how):
    def f(x):
        raise exc("boom")
    op = ab.bind(f, shape=ab.like(0), name=f"base_{exc.__name__}")
    call = op if how == "eager" else jax.grad(lambda v: op(v).sum())
    with pytest.raises(exc) as info:
        call(np.ones(3))
    assert any(f"anybind op 'base_{exc.__name__}': the function raised {exc.__name__}: boom"
               in n for n in info.value.__notes__)


def test_a_base_exception_under_jit_names_the_op():
    def f(x):
        raise KeyboardInterrupt("boom")
    op = ab.bind(f, shape=ab.like(0), name="base_jit")
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="anybind op 'base_jit': the function raised KeyboardInterrupt"):
        jax.jit(op)(np.ones(3))


# ------------------------------------------------------------------- bad API input

def test_an_array_as_vmap_mode_is_a_clear_error():
    with pytest.raises(ValueError, match=r"'vm': vmap must be one of \('sequential', "
                                         r"'expand_dims', 'broadcast_all', 'vectorized'\) or a "
                                         r"rule, got array"):
        ab.bind(np.sin, shape=ab.like(0), vmap=np.array([1, 2]), name="vm")
    op = ab.bind(np.sin, shape=ab.like(0), name="vm_rule")
    with pytest.raises(ValueError, match="'vm_rule': def_vjp's vmap must be"):
        op.def_vjp(lambda p, ct: (ct,), vmap=np.array([1, 2]))


@pytest.mark.parametrize("shape", [(-1,), (2.5,), ("3",)])
def test_a_bad_output_shape_is_a_clear_error(shape):
    op = ab.bind(np.sin, shape=jax.ShapeDtypeStruct((3,), np.float32), name="badshape")
    op_bad = ab.bind(np.sin, shape=lambda x: type("S", (), {"shape": shape,
                                                            "dtype": np.float32})(),
                     name="badshape2")
    assert op(np.ones(3, np.float32)).shape == (3,)
    with pytest.raises(TypeError, match=r"'badshape2': the output spec gives the output the "
                                        r"shape .*every dimension must be a non-negative"):
        op_bad(np.ones(3, np.float32))


def test_vmap_past_numpys_rank_limit_is_a_clear_error():
    add = ab.bind(lambda a, b: a + b, shape=ab.like(0), name="rank65", vmap="vectorized")
    x = jnp.zeros((1,) * 64)
    with pytest.raises(TypeError, match="'rank65': under vmap its function gets arrays of "
                                        "rank 65.*NumPy's limit of 64"):
        jax.vmap(add, in_axes=(None, 0))(x, jnp.zeros((2,) + (1,) * 63))


@pytest.mark.slow  # starts a process
def test_the_cli_names_a_bad_target():
    res = subprocess.run([sys.executable, "-m", "anybind", "check", ""],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2
    assert "expected MODULE[:NAME]" in res.stderr and "Traceback" not in res.stderr


# --------------------------------------------------- programs own their callbacks

def test_a_user_function_named_like_an_eager_program_keeps_its_callbacks():
    """Which program holds a host callback does not depend on any name."""
    op = ab.bind(np.sin, shape=ab.like(0), name="owned")

    def anybind_eager_0_owned(x):
        return op(x) * 2

    other = ab.bind(np.cos, shape=ab.like(0), name="other")
    other(np.ones(2))  # an op whose eager cache might be taken for the owner
    f = jax.jit(anybind_eager_0_owned)
    x = jnp.linspace(0.0, 1.0, 3)
    assert_close(f(x), 2 * jnp.sin(x))
    del other
    import gc
    gc.collect()
    assert_close(f(x + 1), 2 * jnp.sin(x + 1))
