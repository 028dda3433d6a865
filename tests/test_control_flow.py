"""Bound ops inside checkpoint, lax.scan / cond / while_loop / fori_loop bodies,
and ahead-of-time compiled programs, with derivatives and vmap through them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_tree_close, host_call_count, randn
from ops import CASES, VMAP_MODES, mul, mul_ref, sincos

TOL = dict(rtol=1e-10, atol=1e-10)


def _step_ops(mode):
    """(name, step(c, y), reference step) built from ops of each kind."""
    m = mul(mode)
    sin, _ = sincos(mode, "jvp")
    mv = CASES["matvec"].make(mode)
    a = randn((3, 3), seed=9) / 2
    return {
        "mul": (lambda c, y: m(c, y) * 0.5 + y, lambda c, y: mul_ref(c, y) * 0.5 + y),
        "sin": (lambda c, y: sin(c) * y, lambda c, y: jnp.sin(c) * y),
        "matvec": (lambda c, y: mv(c, a=a) + y, lambda c, y: a @ c + y),
    }


STEPS = ["mul", "sin", "matvec"]


def _programs(step):
    """Functions of (x, y) that run ``step`` inside each control-flow construct."""
    return {
        "checkpoint": lambda x, y: jnp.sum(jax.checkpoint(lambda x: step(step(x, y), y))(x) ** 2),
        "checkpoint_nothing_saveable": lambda x, y: jnp.sum(jax.checkpoint(
            lambda x: step(step(x, y), y), policy=jax.checkpoint_policies.nothing_saveable)(x)),
        "scan_carry": lambda x, y: jnp.sum(lax.scan(
            lambda c, _: (step(c, y), None), x, length=3)[0]),
        "scan_xs": lambda x, y: jnp.sum(lax.scan(
            lambda c, yi: (c + step(x, yi), step(yi, c)), x, jnp.stack([y, 2 * y]))[1]),
        "cond": lambda x, y: jnp.sum(lax.cond(
            jnp.sum(y) > 0, lambda x: step(x, y), lambda x: step(y, x), x)),
        "cond_false": lambda x, y: jnp.sum(lax.cond(
            jnp.sum(y) < 0, lambda x: step(x, y), lambda x: step(y, x), x)),
        "fori_loop": lambda x, y: jnp.sum(lax.fori_loop(0, 3, lambda i, c: step(c, y), x)),
        "while_loop": lambda x, y: jnp.sum(lax.while_loop(
            lambda s: s[0] < 3, lambda s: (s[0] + 1, step(s[1], y)), (0, x))[1]),
    }


PROGRAMS = list(_programs(None))
REVERSE_OK = [p for p in PROGRAMS if p != "while_loop"]  # JAX cannot reverse a while_loop


def _xy():
    return randn(3) / 2, randn(3, seed=1) / 2


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("step", STEPS)
def test_value_and_forward_derivative(step, program):
    f, ref = (_programs(s)[program] for s in _step_ops("vectorized")[step])
    x, y = _xy()
    assert_tree_close(jax.jit(f)(x, y), ref(x, y), **TOL)
    jvp = lambda g: (lambda x, y: jax.jvp(g, (x, y), (y, x)))
    assert_tree_close(jvp(f)(x, y), jax.jit(jvp(ref))(x, y), **TOL)


@pytest.mark.parametrize("program", REVERSE_OK)
@pytest.mark.parametrize("step", STEPS)
def test_grad(step, program):
    f, ref = (_programs(s)[program] for s in _step_ops("vectorized")[step])
    x, y = _xy()
    assert_tree_close(jax.jit(jax.grad(f, argnums=(0, 1)))(x, y),
                      jax.jit(jax.grad(ref, argnums=(0, 1)))(x, y), **TOL)


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap(mode, program):
    """Batched x and y: cond predicates and while conditions become batched too."""
    f, ref = (_programs(s)[program] for s in _step_ops(mode)["mul"])
    xs, ys = randn((3, 3)) / 2, randn((3, 3), seed=1) / 2 * np.array([[1], [-1], [1]])
    assert_tree_close(jax.jit(jax.vmap(f))(xs, ys), jax.jit(jax.vmap(ref))(xs, ys), **TOL)


@pytest.mark.parametrize("program", REVERSE_OK)
@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_grad(mode, program):
    f, ref = (_programs(s)[program] for s in _step_ops(mode)["mul"])
    xs, ys = randn((3, 3)) / 2, randn((3, 3), seed=1) / 2 * np.array([[1], [-1], [1]])
    t = lambda g: jax.jit(jax.vmap(jax.grad(g)))
    assert_tree_close(t(f)(xs, ys), t(ref)(xs, ys), **TOL)


@pytest.mark.parametrize("program", REVERSE_OK)
def test_hessian_through_control_flow(program):
    """Traced rules calling bound ops: second order through every construct."""
    f, ref = (_programs(s)[program] for s in _step_ops("vectorized")["sin"])
    x, y = _xy()
    assert_tree_close(jax.jit(jax.hessian(f))(x, y), jax.jit(jax.hessian(ref))(x, y), **TOL)


def test_scan_of_linear_op_transpose():
    mv = CASES["matvec"].make("vectorized")
    a = randn((3, 3), seed=9) / 2
    f = lambda x: lax.scan(lambda c, _: (mv(c, a=a), c), x, length=3)[1]
    ref = lambda x: lax.scan(lambda c, _: (a @ c, c), x, length=3)[1]
    x, ybar = randn(3), randn((3, 3), seed=1)
    assert_tree_close(jax.linear_transpose(f, x)(ybar), jax.linear_transpose(ref, x)(ybar), **TOL)


# ------------------------------------------------------------- ahead of time

@pytest.mark.parametrize("mode", VMAP_MODES)
def test_aot_compiled_primal_grad_and_vmap(mode):
    m = mul(mode)
    x1, x2 = randn(3), randn(3, seed=1)
    X1, X2 = randn((2, 3), seed=2), randn((2, 3), seed=3)
    prim = jax.jit(m).lower(x1, x2).compile()
    grad = jax.jit(jax.grad(lambda a, b: m(a, b).sum(), argnums=(0, 1))).lower(x1, x2).compile()
    vmapped = jax.jit(jax.vmap(m)).lower(X1, X2).compile()
    for seed in (0, 5):  # a compiled program runs again on new data
        a, b = randn(3, seed=seed), randn(3, seed=seed + 1)
        np.testing.assert_allclose(prim(a, b), mul_ref(a, b), **TOL)
        assert_tree_close(grad(a, b), jax.grad(lambda a, b: mul_ref(a, b).sum(),
                                               argnums=(0, 1))(a, b), **TOL)
    np.testing.assert_allclose(vmapped(X1, X2), mul_ref(X1, X2), **TOL)


def test_aot_compiled_hessian_of_traced_rules():
    sin, cos = sincos("vectorized", "both")
    f = lambda x: jnp.sum(sin(x) * cos(x))
    x = randn(3)
    compiled = jax.jit(jax.hessian(f)).lower(x).compile()
    ref = jax.hessian(lambda x: jnp.sum(jnp.sin(x) * jnp.cos(x)))
    np.testing.assert_allclose(compiled(x), ref(x), **TOL)


def test_aot_text_contains_the_host_call():
    m = mul("vectorized")
    text = jax.jit(m).lower(randn(3), randn(3)).as_text()
    assert host_call_count(text) >= 1
