"""traced=True: JAX functions run inline (no host call), with JAX's own
derivatives where no rule is given, and custom rules that forward and reverse
mode both honour (a vjp defines the jvp by transposition and vice versa).

These are also the gaps of ``jax.custom_jvp``/``custom_vjp`` that DESIGN.md
lists: jvp of a vjp-only function, linear_transpose of it, keyword-only
arguments, and a custom batching rule together with grad.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, check_first_order, host_call_count, randn
from ops import sincos

TOL = dict(rtol=1e-10, atol=1e-10)


def _fn(x, y, *, w, p):
    return {"s": jnp.sin(x) * y ** p + w, "n": jnp.sum(x > 0).astype(jnp.int32)}


def _plain():
    return ab.bind(_fn, traced=True, name="traced_plain")


def _inputs():
    return randn(3), randn(3, seed=1), randn(3, seed=2)


TRANSFORMS = {
    "jit": lambda f: jax.jit(f),
    "grad": lambda f: jax.grad(lambda x, y: f(x, y)["s"].sum(), argnums=(0, 1)),
    "jvp": lambda f: (lambda x, y: jax.jvp(f, (x, y), (y, x))[1]["s"]),
    "hessian": lambda f: jax.hessian(lambda x, y: f(x, y)["s"].sum(), argnums=(0, 1)),
    "third": lambda f: jax.jacfwd(jax.hessian(lambda x, y: f(x, y)["s"].sum())),
    "vmap": lambda f: jax.vmap(f, in_axes=(0, None)),
    "vmap_hessian": lambda f: jax.vmap(jax.hessian(lambda x, y: f(x, y)["s"].sum()),
                                       in_axes=(0, None)),
    "linear_transpose": lambda f: (lambda x, y: jax.linear_transpose(
        jax.linearize(lambda x: f(x, y)["s"], x)[1], x)(y)),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_jax_derivatives_without_rules_and_no_host_call(transform):
    op = _plain()
    x, y, w = _inputs()
    f = lambda x, y: op(x, y, w=w, p=2)
    ref = lambda x, y: _fn(x, y, w=w, p=2)
    if transform.startswith("vmap"):
        x = np.stack([x, 2 * x])
    t = TRANSFORMS[transform]
    assert_tree_close(jax.jit(t(f))(x, y), jax.jit(t(ref))(x, y), **TOL)
    assert host_call_count(jax.jit(t(f)).lower(x, y)) == 0


def test_output_spec_inferred_and_checked():
    op = _plain()
    x, y, w = _inputs()
    out = op(x, y, w=w, p=3)
    assert out["s"].shape == (3,) and out["n"].dtype == jnp.int32
    check_first_order(lambda x, y: op(x, y, w=w, p=3)["s"], (x, y))


# ------------------------------------------------- custom rules on JAX functions

def _sin_with(rule: str):
    """jnp.sin with a traced rule stating f' = 3 (deliberately not cos)."""
    op = ab.bind(jnp.sin, traced=True, name=f"sin_custom_{rule}")
    if rule in ("jvp", "both"):
        op.def_jvp(lambda p, t: 3 * t[0], traced=True)
    if rule in ("vjp", "both"):
        op.def_vjp(lambda p, ct: (3 * ct,), traced=True)
    return op


@pytest.mark.parametrize("rule", ["jvp", "vjp", "both"])
def test_forward_and_reverse_agree_with_the_custom_rule(rule):
    op = _sin_with(rule)
    x = randn(3)
    three = 3 * np.eye(3)
    np.testing.assert_allclose(jax.jacfwd(op)(x), three, **TOL)
    np.testing.assert_allclose(jax.jacrev(op)(x), three, **TOL)
    np.testing.assert_allclose(jax.jvp(op, (x,), (x,))[1], 3 * x, **TOL)
    lin = jax.linearize(op, x)[1]
    np.testing.assert_allclose(jax.linear_transpose(lin, x)(x)[0], 3 * x, **TOL)
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: op(x).sum()))(np.stack([x, x])),
                               3 * np.ones((2, 3)), **TOL)
    assert host_call_count(jax.jit(jax.grad(lambda x: op(x).sum())).lower(x)) == 0


def test_second_derivative_differentiates_the_rule():
    """A vjp rule in JAX is differentiated for higher orders: f' = x² ⇒ f'' = 2x."""
    op = ab.bind(jnp.sin, traced=True, name="sin_rule_x2")
    op.def_vjp(lambda p, ct: (p[0] ** 2 * ct,), traced=True)
    x = randn(3)
    np.testing.assert_allclose(jax.hessian(lambda x: op(x).sum())(x), np.diag(2 * x), **TOL)
    np.testing.assert_allclose(jax.jacfwd(jax.jacfwd(op))(x)[np.arange(3), np.arange(3),
                                                             np.arange(3)], 2 * x, **TOL)


def test_numerically_stable_gradient():
    """The custom_jvp classic: log(1 + eˣ) at x = 1000 without nan."""
    softplus = ab.bind(lambda x: jnp.log1p(jnp.exp(x)), traced=True, name="softplus")
    softplus.def_jvp(lambda p, t: jax.nn.sigmoid(p[0]) * t[0], traced=True)
    x = jnp.array([-1000.0, 0.0, 1000.0])
    g = jax.vmap(jax.grad(softplus))(x)
    np.testing.assert_allclose(g, [0.0, 0.5, 1.0])
    h = jax.vmap(jax.grad(jax.grad(softplus)))(x)
    np.testing.assert_allclose(h, [0.0, 0.25, 0.0])


def test_keyword_only_arguments():
    op = ab.bind(lambda x, *, scale, shift: x * scale + shift, traced=True, name="kwonly")
    op.def_vjp(lambda p, ct, *, scale, shift: (ct * scale,), traced=True)
    x, shift = randn(3), randn(3, seed=1)
    f = lambda x: op(x, scale=2.0, shift=shift).sum()
    np.testing.assert_allclose(jax.grad(f)(x), 2 * np.ones(3), **TOL)
    np.testing.assert_allclose(jax.jvp(lambda x: op(x, scale=2.0, shift=shift), (x,), (x,))[1],
                               2 * x, **TOL)


def test_custom_vmap_rule_with_grad():
    """A traced batching rule and a custom jvp together: grad(vmap) and vmap(grad) work."""
    calls = []

    def rule(axis_size, in_batched, x):
        calls.append(axis_size)
        return jnp.sin(x), in_batched[0]

    op = ab.bind(jnp.sin, traced=True, vmap=rule, name="sin_vmap_rule")
    op.def_jvp(lambda p, t: jnp.cos(p[0]) * t[0], traced=True)
    X = randn((4, 3))
    np.testing.assert_allclose(jax.vmap(op)(X), np.sin(X), **TOL)
    assert calls and set(calls) == {4}  # the rule batched it (traced again for out_batched)
    g1, g2, h = jax.jit(lambda X: (jax.grad(lambda X: jax.vmap(op)(X).sum())(X),
                                   jax.vmap(jax.grad(lambda x: op(x).sum()))(X),
                                   jax.vmap(jax.hessian(lambda x: op(x).sum()))(X)))(X)
    np.testing.assert_allclose(g1, np.cos(X), **TOL)
    np.testing.assert_allclose(g2, np.cos(X), **TOL)
    np.testing.assert_allclose(h, jax.vmap(jnp.diag)(-np.sin(X)), **TOL)


def test_traced_function_calling_host_ops():
    sin, cos = sincos("vectorized", "jvp")
    op = ab.bind(lambda x: sin(x) * cos(x), traced=True, name="traced_outer")
    ref = lambda x: jnp.sin(x) * jnp.cos(x)
    x = randn(3)
    assert_tree_close(jax.hessian(lambda x: op(x).sum())(x),
                      jax.hessian(lambda x: ref(x).sum())(x), **TOL)
    assert_tree_close(jax.vmap(op)(np.stack([x, -x])), jax.vmap(ref)(np.stack([x, -x])), **TOL)
    assert host_call_count(jax.jit(op).lower(x)) == 2  # the inner host ops only


def test_host_function_with_traced_rules_and_custom_rule_calling_traced_op():
    """A traced op inside a host op's traced rule."""
    dsin = ab.bind(jnp.cos, traced=True, name="dsin")
    sin = ab.bind(np.sin, shape=ab.like(0), name="sin_host_traced_rule")
    sin.def_jvp(lambda p, t: dsin(p[0]) * t[0], traced=True)
    x = randn(3)
    np.testing.assert_allclose(jax.hessian(lambda x: sin(x).sum())(x), np.diag(-np.sin(x)), **TOL)


def test_traced_linear_op_transposed_by_jax():
    op = ab.bind(lambda x, *, a: a @ x, traced=True, linear=True, name="traced_matvec")
    a, x, y = randn((4, 3)), randn(3, seed=1), randn(4, seed=2)
    (t,) = jax.linear_transpose(lambda x: op(x, a=a), x)(y)
    np.testing.assert_allclose(t, a.T @ y, **TOL)
    h = jax.hessian(lambda x: jnp.sum(op(x, a=a) ** 2))(x)
    np.testing.assert_allclose(h, 2 * a.T @ a, **TOL)
    assert host_call_count(jax.jit(jax.hessian(lambda x: jnp.sum(op(x, a=a) ** 2))).lower(x)) == 0


# ------------------------------------------------ vjp rules that are not adjoints

def _clip():
    return ab.bind(lambda lo, hi, x: x, traced=True, name="clip",
                   vjp=lambda p, g: (None, None, jnp.clip(g, p[0], p[1])))


def test_vjp_rule_that_is_not_linear_serves_reverse_mode():
    """Gradient clipping: reverse mode runs the rule as given (JAX's answer 0.2)."""
    clip = _clip()
    f = lambda x: clip(-0.1, x + 0.1, x)
    np.testing.assert_allclose(jax.grad(f)(0.1), 0.2, **TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(0.1), 0.2, **TOL)
    x = np.array([0.1, 0.5, -0.05])
    np.testing.assert_allclose(jax.vmap(jax.grad(f))(x), np.minimum(x + 0.1, 1.0), **TOL)
    ybar = np.array([2.0, -3.0, 0.05])
    np.testing.assert_allclose(jax.vjp(lambda x: clip(-0.1, 0.2, x), x)[1](ybar)[0],
                               np.clip(ybar, -0.1, 0.2), **TOL)
    np.testing.assert_allclose(jax.jacrev(lambda x: clip(-0.1, 1.0, x))(x), np.eye(3), **TOL)


@pytest.mark.parametrize("mode", ["jvp", "jacfwd", "linearize"])
def test_forward_mode_of_a_nonlinear_vjp_rule_asks_for_a_jvp_rule(mode):
    clip = _clip()
    f = lambda x: clip(-0.1, 0.2, x)
    run = {"jvp": lambda: jax.jvp(f, (0.1,), (1.0,)), "jacfwd": lambda: jax.jacfwd(f)(0.1),
           "linearize": lambda: jax.linearize(f, 0.1)[1](1.0)}[mode]
    with pytest.raises(ab.MissingRuleError, match="'clip' has no jvp rule.*not linear in the "
                                                  "cotangent.*give a jvp rule"):
        run()


def test_straight_through_and_gradient_reversal():
    """Linear vjp rules that are not f's derivative: forward mode transposes them."""
    ste = ab.bind(jnp.round, traced=True, name="ste", vjp=lambda p, g: (g,))
    rev = ab.bind(lambda x: x, traced=True, name="grad_reversal", vjp=lambda p, g: (-g,))
    x = np.array([0.3, 1.7])
    np.testing.assert_allclose(ste(x), [0.0, 2.0], **TOL)
    np.testing.assert_allclose(jax.grad(lambda x: ste(x).sum())(x), np.ones(2), **TOL)
    np.testing.assert_allclose(jax.jvp(ste, (x,), (x,))[1], x, **TOL)
    np.testing.assert_allclose(jax.grad(lambda x: rev(x).sum())(x), -np.ones(2), **TOL)
    np.testing.assert_allclose(jax.jvp(rev, (x,), (x,))[1], -x, **TOL)


# ------------------------------------------------- Python numbers from traced rules

def test_python_numbers_and_weak_types_from_traced_rules_in_every_role():
    """What a host rule may return, a traced rule may: Python numbers that the dtype
    holds, and weakly typed values whose dtype promotes to the declared one."""
    x32 = np.float32(0.5)
    jvp = ab.bind(lambda x: jnp.cos(2 * x) / 2.0, traced=True, name="py_jvp",
                  jvp=lambda p, t: 3 * t[0])
    for x in (1.0, x32):  # a Python-float tangent makes the rule return a Python float
        assert_tree_close(jax.jvp(jvp, (x,), (x,))[1], jnp.asarray(3 * x))
    vjp = ab.bind(jnp.sin, traced=True, name="py_vjp", vjp=lambda p, ct: (2,))
    assert_tree_close(jax.grad(vjp)(x32), np.float32(2.0))
    lin = ab.bind(lambda x: 2.0 * x, traced=True, name="py_transpose", linear=True,
                  transpose=lambda ct: (2,))
    assert_tree_close(jax.grad(lin)(x32), np.float32(2.0))
    const = ab.bind(lambda x: 1.5, traced=True, name="py_primal")
    assert_tree_close(jax.jit(const)(x32), jnp.asarray(1.5))
    weak = ab.bind(jnp.sin, traced=True, name="weak_jvp",
                   jvp=lambda p, t: jnp.asarray(0.25) * 4)  # weakly typed float64
    assert_tree_close(jax.jvp(weak, (x32,), (x32,))[1], np.float32(1.0))
    vmap = ab.bind(jnp.sin, traced=True, name="py_vmap", vmap=lambda n, b, x: (0.5, False))
    assert_tree_close(jax.vmap(vmap)(np.ones(3, np.float32)), np.full(3, 0.5, np.float32))
    ints = ab.bind(lambda n: 2 * n, traced=True, name="bad_int", vmap=lambda k, b, n: (1.5, False))
    with pytest.raises(TypeError, match=r"the vmap rule returned float.*expected int32\[3\]"):
        jax.vmap(ints)(np.ones(3, np.int32))


@pytest.mark.parametrize("rule,shape,match", [
    (lambda p, t: 1j, (), "the jvp rule returned the Python complex 1j.*not a float64"),
    (lambda p, t: 2.0, (2,), r"the Python float 2.0.*float64\[2\]"),
    (lambda p, t: jnp.asarray(1.5) + jnp.zeros((), jnp.float32), (),
     r"returned float32\[\] .*expected float64"),
])
def test_traced_rule_outputs_that_do_not_convert_are_refused(rule, shape, match):
    op = ab.bind(jnp.sin, traced=True, name="bad_out", jvp=rule)
    x = np.ones(shape)
    with pytest.raises(TypeError, match=match):
        jax.jvp(op, (x,), (x,))
