"""Compositions of transformations, and which rule runs under each.

``vmap`` never removes a custom rule: an op whose rules deliberately disagree
with its function (f = sin, but f' = 3) shows which derivative ran. Every
composition below must give 3, whether the rules are host or traced, given
as jvp, vjp or both, for a host or a traced function, in every vmap mode.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, randn
from ops import CASES, VMAP_MODES

TOL = dict(rtol=1e-10, atol=1e-10)


# ------------------------------------------------- the rule that ran, not JAX's

RULE_KINDS = ["host_both", "traced_jvp", "traced_vjp", "traced_both"]


def _fake(kind: str, fn_traced: bool, mode: str):
    """f = sin with derivative rules that say f' = 3."""
    fn = jnp.sin if fn_traced else np.sin
    op = ab.bind(fn, shape=ab.like(0), traced=fn_traced, name=f"fake_{kind}_{fn_traced}",
                 vmap=mode if mode != "rule" else "sequential")
    if mode == "rule":
        xp = jnp if fn_traced else np
        op.def_vmap(lambda n, b, x: (xp.sin(x), True), traced=fn_traced)
    traced = kind != "host_both"
    if kind in ("host_both", "traced_jvp", "traced_both"):
        op.def_jvp(lambda p, t: 3 * t[0], traced=traced)
    if kind in ("host_both", "traced_vjp", "traced_both"):
        op.def_vjp(lambda p, ct: (3 * ct,), traced=traced)
    return op


COMPOSITIONS = {
    "jvp": lambda f, X: jax.vmap(lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1])(X),
    "grad": lambda f, X: jax.vmap(jax.grad(lambda x: f(x).sum()))(X),
    "grad_of_vmap": lambda f, X: jax.grad(lambda X: jax.vmap(f)(X).sum())(X),
    "jit_vmap_grad": lambda f, X: jax.jit(jax.vmap(jax.grad(lambda x: f(x).sum())))(X),
    "jvp_of_vmap": lambda f, X: jax.jvp(jax.vmap(f), (X,), (jnp.ones_like(X),))[1],
    "linearize_of_vmap": lambda f, X: jax.linearize(jax.vmap(f), X)[1](jnp.ones_like(X)),
    "vmap_jacfwd": lambda f, X: jax.vmap(lambda x: jnp.diag(jax.jacfwd(f)(x)))(X),
    "vmap_jacrev": lambda f, X: jax.vmap(lambda x: jnp.diag(jax.jacrev(f)(x)))(X),
    "jacrev_of_vmap": lambda f, X: jnp.einsum("ijij->ij", jax.jacrev(jax.vmap(f))(X)),
    "jacfwd_of_vmap": lambda f, X: jnp.einsum("ijij->ij", jax.jacfwd(jax.vmap(f))(X)),
    "grad_of_vmap_of_vmap": lambda f, X: jax.grad(
        lambda X: jax.vmap(jax.vmap(f))(X[:, :, None]).sum())(X),
    "vmap_of_vmap_of_grad": lambda f, X: jax.vmap(jax.vmap(jax.grad(f)))(X),
    "transpose_of_linearized_vmap": lambda f, X: jax.linear_transpose(
        jax.linearize(jax.vmap(f), X)[1], X)(jnp.ones_like(X))[0],
    "checkpoint_grad_of_vmap": lambda f, X: jax.grad(
        jax.checkpoint(lambda X: jax.vmap(f)(X).sum()))(X),
}


# (a user vmap rule batches the function only; its rules batch as in sequential mode)
@pytest.mark.parametrize("composition", list(COMPOSITIONS))
@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
@pytest.mark.parametrize("kind", RULE_KINDS)
def test_custom_rule_survives_every_composition(kind, mode, composition):
    op = _fake(kind, False, mode)
    f = jax.jit(lambda X: COMPOSITIONS[composition](op, X))
    np.testing.assert_allclose(f(randn((2, 3))), np.full((2, 3), 3.0), **TOL)


@pytest.mark.parametrize("composition", ["jvp", "grad", "grad_of_vmap", "jvp_of_vmap",
                                         "vmap_jacrev", "transpose_of_linearized_vmap"])
@pytest.mark.parametrize("kind", RULE_KINDS)
def test_custom_rule_wins_over_jax_derivative_of_traced_function(kind, composition):
    op = _fake(kind, True, "vectorized")
    f = jax.jit(lambda X: COMPOSITIONS[composition](op, X))
    np.testing.assert_allclose(f(randn((2, 3))), np.full((2, 3), 3.0), **TOL)


@pytest.mark.parametrize("kind", RULE_KINDS)
def test_custom_rule_used_eagerly(kind):
    op = _fake(kind, False, "vectorized")
    for c in ("grad", "grad_of_vmap", "jvp_of_vmap"):
        np.testing.assert_allclose(COMPOSITIONS[c](op, randn((2, 3))), np.full((2, 3), 3.0),
                                   **TOL)


# ------------------------------------------------------- values of compositions

def _loss(f):
    return lambda *a: sum(jnp.sum(jnp.abs(o) ** 2) for o in jax.tree.leaves(f(*a))
                          if jnp.issubdtype(o.dtype, jnp.inexact))


def _batched(case, size=2):
    return jax.tree.map(lambda *r: np.stack(r), *[jax.tree.map(
        lambda x: x * (1 + 0.3 * k), case.args()) for k in range(size)])


VALUE_COMPOSITIONS = {
    "jit_vmap_grad": lambda f: jax.jit(jax.vmap(jax.grad(_loss(f)))),
    "grad_vmap": lambda f: jax.grad(lambda *a: jax.vmap(_loss(f))(*a).sum()),
    "vmap_value_and_grad": lambda f: jax.vmap(jax.value_and_grad(_loss(f))),
    "jacrev_vmap": lambda f: (lambda *a: jax.jacrev(lambda *a: jax.vmap(_loss(f))(*a))(*a)),
    "vmap_jvp": lambda f: jax.vmap(lambda *a: jax.jvp(_loss(f), a, a)[1]),
}

CASE_NAMES = [n for n in CASES if n != "fft"] + ["fft"]


VALUE_MATRIX = [(n, m, c) for n in CASE_NAMES for m in VMAP_MODES for c in VALUE_COMPOSITIONS
                if m == "vectorized" or c in ("grad_vmap", "jacrev_vmap")]


@pytest.mark.parametrize("name,mode,composition", VALUE_MATRIX)
def test_compositions_match_reference(name, mode, composition):
    case = CASES[name]
    t = VALUE_COMPOSITIONS[composition]
    args = _batched(case)
    assert_tree_close(jax.jit(t(case.op(mode)))(*args), jax.jit(t(case.reference()))(*args),
                      **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_of_jacfwd_and_jacrev(mode):
    case = CASES["mul"]
    args = _batched(case, 3)
    for jac in (jax.jacfwd, jax.jacrev):
        t = lambda f: jax.jit(jax.vmap(jac(f, argnums=(0, 1))))
        assert_tree_close(t(case.op(mode))(*args), t(case.reference())(*args), **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_hessian_of_linear_op(mode):
    case = CASES["matvec"]
    xs = randn((3, 3))
    f = lambda x: jnp.sum(jnp.sin(case.op(mode)(x)))
    ref = lambda x: jnp.sum(jnp.sin(case.reference()(x)))
    t = lambda g: jax.jit(jax.vmap(jax.hessian(g)))
    assert_tree_close(t(f)(xs), t(ref)(xs), **TOL)


def test_ops_compose_with_each_other():
    """Outputs of one bound op feed another, through grad and vmap."""
    mul, matvec, sort = (CASES[n].make("vectorized") for n in ("mul", "matvec", "sort"))
    a = randn((4, 3), seed=1)

    def f(x):
        y = matvec(mul(x, x), a=a)
        s, _ = sort(y)
        return jnp.sum(s * jnp.arange(4.0))

    def ref(x):
        y = a @ (x * x**2)
        return jnp.sum(jnp.sort(y) * jnp.arange(4.0))

    xs = randn((2, 3))  # in vectorized rules, the sort's cotangent arrives unbatched here
    assert_tree_close(jax.jit(jax.vmap(jax.grad(f)))(xs), jax.vmap(jax.grad(ref))(xs), **TOL)
    gv = lambda g: jax.jit(jax.grad(lambda xs: jax.vmap(g)(xs).sum()))
    assert_tree_close(gv(f)(xs), gv(ref)(xs), **TOL)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_grad_with_respect_to_an_unbatched_argument_of_vmap(mode):
    """x2 is shared by every row: its cotangent sums the rows' (rules see it unbatched)."""
    case = CASES["mul"]
    op = case.make(mode)
    x1s, x2 = randn((4, 3)), randn(3, seed=1)
    t = lambda f: jax.jit(jax.grad(lambda x1s, x2: jnp.sum(
        jnp.sin(jax.vmap(f, in_axes=(0, None))(x1s, x2))), argnums=(0, 1)))
    assert_tree_close(t(op)(x1s, x2), t(case.ref)(x1s, x2), **TOL)
    j = lambda f: jax.jit(jax.jacfwd(lambda x2: jax.vmap(f, in_axes=(0, None))(x1s, x2)))
    assert_tree_close(j(op)(x2), j(case.ref)(x2), **TOL)
