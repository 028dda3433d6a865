"""Traced ops whose function or rules close over values of an enclosing
``jit``, ``vmap``, ``scan`` or ``cond`` (closure conversion, ``_closures.py``):
they work as if the values were operands, derivatives through a closed-over
value are right or a clear error, and host code closing over a tracer is an
error at the call.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import anybind as ab
from helpers import assert_close, check_first_order, jvp_and_vjp, randn

TOL = dict(rtol=1e-10, atol=1e-10)


def _op(kind, a):
    """An op made inside an enclosing transformation, closing over its value ``a``."""
    fn = lambda y: a * jnp.sin(y)
    if kind == "jvp":
        return ab.bind(fn, traced=True, name="c_jvp",
                       jvp=lambda p, t: a * jnp.cos(p[0]) * t[0])
    if kind == "vjp":
        return ab.bind(fn, traced=True, name="c_vjp",
                       vjp=lambda p, g: (a * jnp.cos(p[0]) * g,))
    return ab.bind(fn, traced=True, name="c_plain")


CONTEXTS = {  # (a, y) -> out, the op made inside the transformation
    "jit": lambda make: jax.jit(lambda a, y: make(a)(y)),
    "vmap": lambda make: jax.vmap(lambda a, y: make(a)(y)),
    "vmap_unbatched_arg": lambda make: (lambda a, y: jax.vmap(lambda a: make(a)(y))(a)),
    "scan": lambda make: (lambda a, y: lax.scan(lambda c, yi: (c, make(c)(yi)), a,
                                                jnp.stack([y, 2 * y]))[1]),
    "cond": lambda make: (lambda a, y: lax.cond(a[0] > 0, lambda a, y: make(a)(y),
                                                lambda a, y: -y, a, y)),
}


def _ref(a):
    return lambda y: a * jnp.sin(y)


@pytest.mark.parametrize("kind", ["jvp", "vjp", "plain"])
@pytest.mark.parametrize("context", list(CONTEXTS))
def test_closure_works_as_operand(context, kind):
    a, y = 1.5 + randn(3) ** 2, randn(3, seed=1)
    f = CONTEXTS[context](lambda a: _op(kind, a))
    ref = CONTEXTS[context](_ref)
    out = f(a, y)
    assert_close(out, ref(a, y), **TOL)
    dy, ybar = randn(3, seed=2), randn(np.shape(out), seed=3)
    got, want = jvp_and_vjp([lambda y: f(a, y), lambda y: ref(a, y)], (y,), (dy,), ybar)
    assert_close(got, want, **TOL)


@pytest.mark.parametrize("context", ["jit", "vmap"])
def test_derivative_through_closed_over_value(context):
    """JAX's own derivative where the op has no rules; an error naming the op otherwise."""
    a, y = 1.5 + randn(3) ** 2, randn(3, seed=1)
    loss = lambda make: (lambda a, y: CONTEXTS[context](make)(a, y).sum())
    assert_close(jax.grad(loss(lambda a: _op("plain", a)), (0, 1))(a, y),
                 jax.grad(loss(_ref), (0, 1))(a, y), **TOL)
    check_first_order(lambda a: CONTEXTS[context](lambda a: _op("plain", a))(a, y), (a,))
    for kind in ("jvp", "vjp"):
        with pytest.raises(TypeError, match=rf"'c_{kind}'.*closes over.*closed-over value 0"
                                            r".*positional argument"):
            jax.grad(loss(lambda a: _op(kind, a)))(a, y)


def test_rules_closing_over_what_the_function_does_not_use():
    """A tangent of a value only the vjp rule uses is the derivative of that rule."""
    def f(w, x):
        op = ab.bind(lambda x: jnp.sin(x), traced=True, name="scaled_grad",
                     vjp=lambda p, g: (w * jnp.cos(p[0]) * g,))
        return jax.grad(lambda x: op(x).sum())(x)
    w, x = 0.7, randn(3)
    assert_close(jax.jit(f)(w, x), w * jnp.cos(x), **TOL)
    assert_close(jax.jacfwd(f)(w, x), jnp.cos(x), **TOL)  # d/dw through the rule
    assert_close(jax.grad(lambda w: f(w, x).sum())(w), jnp.cos(x).sum(), **TOL)
    # f itself does not use w, so its own tangent in w is zero
    g = lambda w, x: ab.bind(lambda x: jnp.sin(x), traced=True, name="scaled_grad",
                             vjp=lambda p, ct: (w * jnp.cos(p[0]) * ct,))(x)
    assert_close(jax.jvp(lambda w: g(w, x), (w,), (1.,))[1], jnp.zeros(3), **TOL)


def test_symbolic_zero_rule_and_higher_order_with_closures():
    def f(a, x, y):
        op = ab.bind(lambda x, y: a * jnp.sin(x) * y, traced=True, name="sym")

        @op.def_jvp(traced=True, symbolic_zeros=True)
        def _(p, t):
            (x, y), (tx, ty) = p, t
            out = 0.
            if tx is not None:
                out = out + a * jnp.cos(x) * y * tx
            if ty is not None:
                out = out + a * jnp.sin(x) * ty
            return out
        return op(x, y)
    ref = lambda a, x, y: a * jnp.sin(x) * y
    a, x, y = 1.3, 0.4, -0.8
    for argnums in (1, 2, (1, 2)):
        assert_close(jax.jit(jax.grad(f, argnums))(a, x, y), jax.grad(ref, argnums)(a, x, y),
                     **TOL)
    assert_close(jax.jit(jax.hessian(f, (1, 2)))(a, x, y), jax.hessian(ref, (1, 2))(a, x, y),
                 **TOL)


def test_linear_op_closing_over_a_value():
    a, y, ct = randn(3), randn(3, seed=1), randn(3, seed=2)
    derived = lambda a: ab.bind(lambda y: a * y, traced=True, linear=True, name="lin")
    given = lambda a: ab.bind(lambda y: a * y, traced=True, linear=True, name="lin_t",
                              transpose=lambda c: (a * c,))
    for make in (derived, given):
        t = jax.jit(lambda a, y, ct: jax.linear_transpose(make(a), y)(ct))(a, y, ct)
        assert_close(t, (a * ct,), **TOL)
        assert_close(jax.vmap(lambda a, y: jax.grad(lambda y: make(a)(y) ** 2)(y))(a, y),
                     2 * a ** 2 * y, **TOL)


def test_traced_vmap_rule_with_closures_is_an_error():
    def f(a, y):
        op = ab.bind(lambda y: a * jnp.sin(y), traced=True, name="vr",
                     vmap=lambda n, b, y: (a * jnp.sin(y), True))
        return jax.vmap(op)(y)
    with pytest.raises(TypeError, match="'vr' closes over.*vmap rule cannot run.*keyword "
                                        "operands"):
        jax.jit(f)(2., jnp.ones(3))


def test_an_op_used_after_its_trace_ended_reports_the_leak():
    kept = {}

    @jax.jit
    def g(a, y):
        kept["op"] = _op("plain", a)
        return kept["op"](y)
    g(2., 1.)
    with pytest.raises(jax.errors.UnexpectedTracerError):
        kept["op"](1.)


# ------------------------------------------------------------------- host code

def _host(a):
    return ab.bind(lambda y: a * np.sin(y), shape=ab.like(0), name="host_closure")


def _host_rule(a):
    return ab.bind(np.sin, shape=ab.like(0), name="host_rule", jvp=lambda p, t: a * t[0])


@pytest.mark.parametrize("make,what", [(_host, "function"), (_host_rule, "jvp rule")])
@pytest.mark.parametrize("transform", ["jit", "vmap"])
def test_host_code_closing_over_a_tracer_is_an_error_at_the_call(make, what, transform):
    f = lambda a, y: make(a)(y)
    t = jax.jit(f) if transform == "jit" else jax.vmap(f)
    with pytest.raises(TypeError, match=rf"'host_\w+': its host {what} closes over 'a', a "
                                        r"traced value.*keyword operand \(op\(\.\.\., a=a\)\)"):
        t(jnp.ones(2), jnp.ones(2))


def test_host_function_with_the_value_as_keyword_operand():
    op = ab.bind(lambda y, *, a: a * np.sin(y), shape=ab.like(0), name="host_kw",
                 vmap="vectorized", jvp=lambda p, t, *, a: a * np.cos(p[0]) * t[0])
    a, y = randn(3), randn(3, seed=1)
    g = jax.jit(jax.vmap(lambda a, y: jax.jvp(lambda y: op(y, a=a), (y,), (y,))))
    assert_close(g(a, y), (a * np.sin(y), a * np.cos(y) * y), **TOL)




def _self_calling(fn, **bind):
    """An op whose traced jvp rule calls the op itself on a stack of inputs, as the
    contrib NUFFTs do: d a·sin(x) = a·sin(x + π/2) dx."""
    op = ab.bind(fn, name="s_stack", **bind)

    @op.def_jvp(traced=True)
    def _(primals, tangents, **kw):
        (x,), (t,) = primals, tangents
        return op(jnp.stack([x + np.pi / 2]), **kw)[0] * t
    return op


@pytest.mark.parametrize("traced", [False, True])
def test_rule_calling_its_own_op_on_a_stack(traced):
    """Under a trace such an op is traced once per call, not again for each stack its
    rule makes, and its derivatives of every order are right."""
    op = (_self_calling(lambda x, *, a: a * jnp.sin(x), traced=True) if traced else
          _self_calling(lambda x, *, a: a * np.sin(x), shape=ab.like(0)))
    x = randn((5,))
    g = jax.jit(lambda a, x: jax.grad(lambda x: op(x, a=a).sum())(x))
    assert_close(g(2.0, x), 2.0 * np.cos(x), **TOL)
    h = jax.jit(lambda a, x: jax.hessian(lambda x: op(x, a=a).sum())(x))
    assert_close(h(2.0, x), np.diag(-2.0 * np.sin(x)), **TOL)
    check_first_order(lambda x: op(x, a=2.0), (x,))


def test_rule_calling_its_own_op_on_its_own_shapes_closes_over_tracers():
    """A rule that calls its op on the call's own inputs (d a·sin(x) = a·sin(x + π/2) dx)
    while the op closes over a jit tracer or a vmap tracer (a): the inner calls take
    the closed-over value as an operand; every order in x is right, against a·sin."""
    def op_of(a):
        op = ab.bind(lambda x: a * jnp.sin(x), traced=True, name="s_same")

        @op.def_jvp(traced=True)
        def _(primals, tangents):
            (x,), (t,) = primals, tangents
            return op(x + np.pi / 2) * t
        return op

    def derivative(a, x, order):  # the order-th derivative along ones, by nested jvps
        g = op_of(a)
        for _ in range(order):
            g = (lambda g: lambda x: jax.jvp(g, (x,), (jnp.ones_like(x),))[1])(g)
        return g(x)
    x = randn((5,))
    for order in range(4):
        want = lambda a: a * np.sin(x + order * np.pi / 2)  # noqa: E731
        assert_close(jax.jit(derivative, static_argnums=2)(2.0, x, order), want(2.0))
        assert_close(jax.vmap(derivative, (0, None, None))(jnp.array([2.0, 3.0]), x, order),
                     np.stack([want(2.0), want(3.0)]))
    check_first_order(lambda x: jax.jit(lambda a, x: op_of(a)(x))(2.0, x), (x,))
    hess = jax.jit(lambda a, x: jax.hessian(lambda x: op_of(a)(x).sum())(x))(2.0, x)
    assert_close(hess, np.diag(-2.0 * np.sin(x)))


def test_rule_calling_its_own_op_may_not_close_over_tracers():
    """Its inner calls are on other shapes (a stack), which would each need a conversion
    of their own, so closing over a traced value is a clear error at the call naming
    both shapes (a keyword operand, as above, is the way)."""
    f = jax.jit(lambda a, x: _self_calling(lambda x: a * jnp.sin(x), traced=True)(x))
    with pytest.raises(TypeError, match=r"s_stack' is called by its own rules on inputs "
                                        r"\(float64\[1, 5\]\) other than those of the call "
                                        r"being traced \(float64\[5\]\), and its traced code "
                                        r"closes over 1 traced value"):
        f(2.0, randn((5,)))
