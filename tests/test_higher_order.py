"""Derivatives of every order from traced rules that call bound ops.

Host sin and cos whose traced rules call each other (with a traced jvp only,
a traced vjp only, or both) and the paper's x1·x2² with traced jnp rules: all
orders, in every nesting of forward and reverse mode, batched, against the
pure-JAX reference and against differences of the next-lower order.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_tree_close, check_jvp_fd, randn
from ops import VMAP_MODES, mul, mul_ref, sincos

RULES = ["jvp", "vjp", "both"]
TOL = dict(rtol=1e-10, atol=1e-12)


def _f(sin, cos):
    """A scalar function mixing both ops, so every rule of each is exercised."""
    return lambda x: jnp.sum(sin(x) * cos(2 * x) + sin(x) ** 2)


def _ref(x):
    return jnp.sum(jnp.sin(x) * jnp.cos(2 * x) + jnp.sin(x) ** 2)


TRANSFORMS = {
    "grad_grad": lambda f: jax.grad(lambda x: jax.grad(f)(x)[0]),
    "eager_hessian": jax.hessian,  # the others run under jit
    "jacfwd_jacrev": lambda f: jax.jacfwd(jax.jacrev(f)),
    "jacrev_jacfwd": lambda f: jax.jacrev(jax.jacfwd(f)),
    "jvp_of_grad": lambda f: (lambda x: jax.jvp(jax.grad(f), (x,), (jnp.cos(x),))[1]),
    "grad_of_jvp": lambda f: jax.grad(lambda x: jax.jvp(f, (x,), (jnp.cos(x),))[1]),
    "third_fwd": lambda f: jax.jacfwd(jax.hessian(f)),
    "third_rev": lambda f: jax.jacrev(jax.jacrev(jax.grad(f))),
    "vmap_hessian": lambda f: (lambda x: jax.vmap(jax.hessian(f))(jnp.stack([x, 2 * x]))),
    "hessian_of_vmap": lambda f: jax.hessian(lambda x: jax.vmap(f)(jnp.stack([x, 2 * x])).sum()),
}


# the vmap mode plays no part in these (eager_hessian: slow op-by-op, one mode is enough)
# Every transform in vectorized mode; the batched ones in the other modes.
UNBATCHED = {"grad_grad", "jvp_of_grad", "grad_of_jvp", "eager_hessian"}
OTHER_MODES = {"vmap_hessian", "jacfwd_jacrev", "third_fwd"}
MATRIX = [(r, m, t) for r in RULES for m in VMAP_MODES for t in TRANSFORMS
          if m == "vectorized" or (t in OTHER_MODES and r != "both")]


@pytest.mark.parametrize("rules,mode,transform", MATRIX)
def test_sin_cos_higher_order(rules, mode, transform):
    sin, cos = sincos(mode, rules)
    t = TRANSFORMS[transform]
    x = randn(3)
    f = t(_f(sin, cos))
    got = f(x) if transform == "eager_hessian" else jax.jit(f)(x)
    assert_tree_close(got, jax.jit(t(_ref))(x), **TOL)


@pytest.mark.parametrize("rules", RULES)
def test_fourth_derivative_of_scalar(rules):
    sin, _ = sincos("vectorized", rules)
    d = sin
    for _ in range(4):
        d = jax.grad(d)
    x = 0.7
    np.testing.assert_allclose(d(x), np.sin(x), rtol=1e-12)  # sin'''' = sin


@pytest.mark.parametrize("rules", RULES)
def test_hessian_against_differences_of_gradient(rules):
    sin, cos = sincos("vectorized", rules)
    f = _f(sin, cos)
    check_jvp_fd(jax.jit(jax.grad(f)), randn(3), randn(3, seed=1), rtol=1e-6, atol=1e-7)
    check_jvp_fd(jax.jit(jax.hessian(f)), randn(3), randn(3, seed=2), rtol=1e-6, atol=1e-7)


MUL_TRANSFORMS = {
    "hessian": lambda g: jax.hessian(g, argnums=(0, 1)),
    "third": lambda g: jax.jacfwd(jax.hessian(g, argnums=1), argnums=0),
    "vmap_hessian": lambda g: jax.vmap(jax.hessian(g), in_axes=(0, None)),
}


@pytest.mark.parametrize("transform", list(MUL_TRANSFORMS))
@pytest.mark.parametrize("mode", VMAP_MODES)
def test_traced_rules_give_mul_all_orders(mode, transform):
    op = mul(mode, traced_rules=True)
    x1, x2 = randn(3), randn(3, seed=1)
    f = lambda a, b: jnp.sum(op(a, b) * jnp.sin(a))
    ref = lambda a, b: jnp.sum(mul_ref(a, b) * jnp.sin(a))
    t = MUL_TRANSFORMS[transform]
    args = (jnp.stack([x1, x1 + 1]), x2) if transform == "vmap_hessian" else (x1, x2)
    assert_tree_close(jax.jit(t(f))(*args), jax.jit(t(ref))(*args), **TOL)


def test_vmap_hessian_batched_over_a_second_argument():
    sin, cos = sincos("vectorized", "jvp")
    f = lambda x, y: jnp.sum(sin(x * y) * cos(x))
    ref = lambda x, y: jnp.sum(jnp.sin(x * y) * jnp.cos(x))
    x, ys = randn(3), randn((4, 3), seed=1)
    t = lambda g: jax.jit(jax.vmap(jax.hessian(g), in_axes=(None, 0)))
    assert_tree_close(t(f)(x, ys), t(ref)(x, ys), **TOL)
