"""JAX's tests of ``jax.custom_transpose`` and ``linear_call``
(``tests/custom_api_test.py`` in jax-ml/jax, class CustomTransposeTest, as it
stood before JAX deleted ``custom_transpose`` in commit 4c7d2d0c13), rewritten
for anybind's linear ops, keeping their assertions.

How a case translates: ``custom_transpose`` of ``fn(r, x)`` (and
``linear_call(fn, tp, r, x)``) is ``ab.bind(lambda x, *, r: fn(r, x),
traced=True, linear=True)`` with ``def_transpose(lambda ct, *, r: (tp(r, ct),),
traced=True)``: the residual ``r`` is a keyword operand (omitted where it is
``()`` or ``None``), the linear argument positional. ``linear_call`` still
exists in JAX, so those cases run it side by side as the reference.

One deliberate difference: anybind's transpose of an op's transpose is the op
itself (``f`` and ``f_transpose`` are each other's transpose), as it is for
``linear_call``; ``custom_transpose`` instead differentiated the transpose rule
as JAX code. With an untrue transpose rule the higher transposes therefore
differ (test_one_degree, test_two_degrees, test_recursive): the tests assert
anybind's numbers, checked against ``linear_call`` where it can express the case.

Left out: none; test_jvp_res and test_jvp_both, unimplemented in JAX, are
ported with an op declared ``linear=(1,)`` (linear in x given r).
"""
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.custom_derivatives import linear_call

import anybind as ab
from helpers import assert_close, transpose_unary

pytestmark = pytest.mark.slow  # a ported suite: JAX's own custom_jvp/custom_vjp tests


def linear(fn, tp=None, name="fn"):
    """A traced linear op of ``fn(x, **kw)`` with the traced transpose ``tp(ct, **kw)``
    (``kw``: the op's keywords, such as the residual ``r``)."""
    op = ab.bind(fn, traced=True, linear=True, name=name)
    if tp is not None:
        op.def_transpose(lambda ct, **k: (tp(ct, **k),), traced=True)
    return op


def _div(tp_scale=1.):
    """fn(r, x) = x / r, with the transpose t / (tp_scale·r) (untrue unless 1)."""
    return linear(lambda x, *, r: x / r, lambda t, *, r: t / (tp_scale * r))


X, Y = jnp.ones(2) * 6., jnp.ones(2) * 3.


# ports CustomTransposeTest.test_linear_call
def test_linear_call():
    fn = _div()
    f = lambda x, y: x + fn(x, r=y)
    ref = lambda x, y: x + linear_call(lambda r, x: x / r, lambda r, t: t / r, y, x)
    f_ref = lambda x, y: x + x / y
    assert_close(f(X, Y), f_ref(X, Y))
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: f_ref(x, Y), X)(X))
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: ref(x, Y), X)(X))


# ports CustomTransposeTest.test_linear_call_incorrect_transpose
def test_linear_call_incorrect_transpose():
    fn = _div(2.)  # not the true transpose
    f = lambda x, y: x + fn(x, r=y)
    ref = lambda x, y: x + linear_call(lambda r, x: x / r, lambda r, t: t / (2. * r), y, x)
    f_ref = lambda x, y: x + x / y
    assert_close(f(X, Y), f_ref(X, Y))
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: f_ref(x, 2. * Y), X)(X))  # double the divisor
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: ref(x, Y), X)(X))


# ports CustomTransposeTest.test_linear_call_transpose_transpose_transpose
def test_linear_call_transpose_transpose_transpose():
    tp = lambda r, t: t / (2. * r)  # untrue transpose
    fn = _div(2.)
    f = lambda x: x + fn(x, r=Y)
    ft = transpose_unary(f, X)
    ftt = transpose_unary(ft, X)
    fttt = transpose_unary(ftt, X)
    assert_close(ft(X), X + tp(Y, X))
    assert_close(f(X), ftt(X))
    assert_close(ft(X), fttt(X))


# ports CustomTransposeTest.test_linear_call_scalar_to_vector
def test_linear_call_scalar_to_vector():
    fn = linear(lambda x: [x, x], lambda t: t[0] + t[1])
    f = lambda c, x: fn(c * x)
    ref = lambda c, x: linear_call(lambda _, x: [x, x], lambda _, t: t[0] + t[1], (), c * x)
    f_ref = lambda c, x: [c * x, c * x]
    c, x, t = 2., 3., [4., 5.]
    assert_close(f(c, x), f_ref(c, x))
    assert_close(transpose_unary(partial(f, c), x)(t), transpose_unary(partial(f_ref, c), x)(t))
    assert_close(transpose_unary(partial(f, c), x)(t), transpose_unary(partial(ref, c), x)(t))


def _nested_id_and_f():
    # the identity with an untrue transpose of 0, and (f) the identity with an
    # untrue transpose of 7, whose function and transpose call id_ (whose own
    # transposes must never run)
    def id_(x):
        return linear(lambda x: x, lambda t: 0., name="id")(x)

    def f(x):
        return linear(lambda x: id_(x), lambda t: id_(7.), name="f")(x)
    return id_, f


def _check_nested(id_, f):
    x = 5.
    id_t = transpose_unary(id_, x)
    id_tt = transpose_unary(id_t, x)
    ft = transpose_unary(f, x)
    ftt = transpose_unary(ft, x)
    fttt = transpose_unary(ftt, x)
    assert_close(id_(x), x)
    assert_close(id_t(x), 0.)
    assert_close(id_tt(x), x)
    assert_close(f(x), x)
    assert_close(ft(x), 7.)
    assert_close(ftt(x), x)
    assert_close(fttt(x), 7.)


# ports CustomTransposeTest.test_linear_call_nested
def test_linear_call_nested():
    _check_nested(*_nested_id_and_f())

    def id_ref(x):  # the same with linear_call, as the reference
        return linear_call(lambda _, x: x, lambda _, t: 0., (), x)

    def f_ref(x):
        return linear_call(lambda _, x: id_ref(x), lambda _, t: id_ref(7.), (), x)
    _check_nested(id_ref, f_ref)


# ports CustomTransposeTest.test_linear_call_jit
def test_linear_call_jit():
    fn = _div()
    f = lambda x, y: x + fn(x, r=y)
    assert_close(f(X, Y), jax.jit(f)(X, Y))
    f1 = lambda x: f(x, Y)
    assert_close(transpose_unary(f1, X)(X), jax.jit(transpose_unary(f1, X))(X))
    assert_close(transpose_unary(f1, X)(X), X + X / Y)


# ports CustomTransposeTest.test_linear_call_type_mismatch
def test_linear_call_type_mismatch():
    fn = ab.bind(lambda x, *, r: x / r, traced=True, linear=True, name="fn")
    fn.def_transpose(lambda ct, *, r: None, traced=True)  # not a tuple
    f1 = lambda x: x + fn(x, r=Y)
    with pytest.raises(TypeError, match="'fn'.*transpose.*tuple"):
        transpose_unary(f1, X)(X)


# ports CustomTransposeTest.test_linear_call_recursion
def test_linear_call_recursion():
    # the transpose makes a new op of the same kind, recursively
    def f(x):
        return linear(lambda x: x, lambda t: f(t), name="f")(x)
    assert_close(jax.jit(f)(0.1), 0.1)
    assert_close(transpose_unary(f, 0.1)(0.3), 0.3)


# ports CustomTransposeTest.test_linear_call_grad
def test_linear_call_grad():
    fn = _div()
    f = lambda x, y: x + fn(x, r=y)
    f_ref = lambda x, y: x + x / y
    x, y = jnp.array(6.), jnp.array(3.)
    assert_close(jax.grad(f)(x, y), jax.grad(f_ref)(x, y))


# ports CustomTransposeTest.test_basic
def test_basic():
    def f(x, y):  # the op made inside the function, as in JAX
        return x + _div()(x, r=y)
    f_ref = lambda x, y: x + x / y
    assert_close(f(X, Y), f_ref(X, Y))
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: f_ref(x, Y), X)(X))


# ports CustomTransposeTest.test_incorrect_transpose
def test_incorrect_transpose():
    def f(x, y):
        return x + _div(2.)(x, r=y)  # not the true transpose
    f_ref = lambda x, y: x + x / y
    assert_close(f(X, Y), f_ref(X, Y))
    assert_close(transpose_unary(lambda x: f(x, Y), X)(X),
                 transpose_unary(lambda x: f_ref(x, 2. * Y), X)(X))  # double the divisor


# ports CustomTransposeTest.test_transpose_transpose_transpose
def test_transpose_transpose_transpose():
    # fn and tp are each other's (declared) transpose
    fn = ab.bind(lambda x, *, r: x / r, traced=True, linear=True, name="fn")
    tp = ab.bind(lambda t, *, r: t / (2. * r), traced=True, linear=True, name="tp")  # untrue
    fn.def_transpose(lambda ct, *, r: (tp(ct, r=r),), traced=True)
    tp.def_transpose(lambda ct, *, r: (fn(ct, r=r),), traced=True)
    f = lambda x: x + fn(x, r=Y)
    ft = transpose_unary(f, X)
    ftt = transpose_unary(ft, X)
    fttt = transpose_unary(ftt, X)
    assert_close(ft(X), X + tp(X, r=Y))
    assert_close(f(X), ftt(X))
    assert_close(ft(X), fttt(X))


# ports CustomTransposeTest.test_scalar_to_vector
def test_scalar_to_vector():
    def f(c, x):
        fn = linear(lambda x: [x, x], lambda t: t[0] + t[1])
        return fn(c * x)
    f_ref = lambda c, x: [c * x, c * x]
    c, x, t = 2., 3., [4., 5.]
    assert_close(f(c, x), f_ref(c, x))
    assert_close(transpose_unary(partial(f, c), x)(t), transpose_unary(partial(f_ref, c), x)(t))


# ports CustomTransposeTest.test_nested
def test_nested():
    # as test_linear_call_nested, with the pairs declared each other's transposes
    def id_(x):
        f = ab.bind(lambda x: x, traced=True, linear=True, name="id_f")
        t = ab.bind(lambda t: 0., traced=True, linear=True, name="id_t")
        f.def_transpose(lambda ct: (t(ct),), traced=True)
        t.def_transpose(lambda ct: (f(ct),), traced=True)
        return f(x)

    def f(x):
        f_ = ab.bind(lambda x: id_(x), traced=True, linear=True, name="f_")
        t_ = ab.bind(lambda t: id_(7.), traced=True, linear=True, name="t_")
        f_.def_transpose(lambda ct: (t_(ct),), traced=True)
        t_.def_transpose(lambda ct: (f_(ct),), traced=True)
        return f_(x)
    _check_nested(id_, f)


T = lambda f: transpose_unary(f, 0.)


# ports CustomTransposeTest.test_one_degree
def test_one_degree():
    # custom_transpose: 2, then 3 at every order (the transpose of ft = 3z is JAX's);
    # anybind, like linear_call, transposes f's transpose back into f
    f = linear(lambda z: 2. * z, lambda z: 3. * z, name="f")
    ref = lambda z: linear_call(lambda _, z: 2. * z, lambda _, z: 3. * z, (), z)
    for g in (f, ref):
        assert_close([g(1.), T(g)(1.), T(T(g))(1.), T(T(T(g)))(1.), T(T(T(T(g))))(1.)],
                     [2., 3., 2., 3., 2.])


# ports CustomTransposeTest.test_two_degrees
def test_two_degrees():
    # custom_transpose: 2, 3, then 7 at every order; here T(T(f)) is f again, so
    # ft's own transpose (7z) never runs
    ft = linear(lambda z: 3. * z, lambda z: 7. * z, name="ft")
    f = linear(lambda z: 2. * z, lambda z: ft(z), name="f")
    assert_close([f(1.), T(f)(1.), T(T(f))(1.), T(T(T(f)))(1.), T(T(T(T(f))))(1.)],
                 [2., 3., 2., 3., 2.])
    assert_close(T(ft)(1.), 7.)


# ports CustomTransposeTest.test_symmetric
def test_symmetric():
    f = ab.bind(lambda z: 2. * z, traced=True, linear=True, name="f")
    g = ab.bind(lambda z: 3. * z, traced=True, linear=True, name="g")
    f.def_transpose(lambda z: (g(z),), traced=True)
    g.def_transpose(lambda z: (f(z),), traced=True)
    assert_close([f(1.), T(f)(1.), T(T(f))(1.), T(T(T(f)))(1.), T(T(T(T(f))))(1.)],
                 [2., 3., 2., 3., 2.])


# ports CustomTransposeTest.test_recursive
def test_recursive():
    # custom_transpose: 1, 2, 3, 4, 5 (each transpose of the rule f(c + 1, ·) makes
    # c + 2, ...); here T(T(g)) is g again
    f = ab.bind(lambda z, *, c: c * z, traced=True, linear=True, name="f")
    f.def_transpose(lambda z, *, c: (f(z, c=c + 1.),), traced=True)
    g = lambda z: f(z, c=1.)
    assert_close([g(1.), T(g)(1.), T(T(g))(1.), T(T(T(g)))(1.), T(T(T(T(g))))(1.)],
                 [1., 2., 1., 2., 1.])


# ports CustomTransposeTest.test_jvp_lin
def test_jvp_lin():
    fn = _div()
    f = lambda x, y: x + fn(x, r=y)
    f_ref = lambda x, y: x + x / y
    x, y, tx = 6., 3., 1.
    assert_close(jax.jvp(lambda x: f(x, y), [x], [tx]), jax.jvp(lambda x: f_ref(x, y), [x], [tx]))


def _div_in_r():
    # unimplemented for custom_transpose (the residual is not differentiable); an op
    # linear in x given r (linear=(1,)) takes tangents in both; its transpose in x is
    # JAX's, t / r, the same as the custom rule's
    return ab.bind(lambda r, x: x / r, traced=True, linear=(1,), name="fn")


# ports CustomTransposeTest.test_jvp_res
def test_jvp_res():
    fn = _div_in_r()
    f = lambda x, y: x + fn(y, x)
    f_ref = lambda x, y: x + x / y
    x, y, ty = 6., 3., 1.
    assert_close(jax.jvp(lambda y: f(x, y), [y], [ty]), jax.jvp(lambda y: f_ref(x, y), [y], [ty]))
    assert_close(transpose_unary(lambda x: f(x, y), x)(1.), 1. + 1. / y)


# ports CustomTransposeTest.test_jvp_both
def test_jvp_both():
    fn = _div_in_r()
    f = lambda x, y: x + fn(y, x)
    f_ref = lambda x, y: x + x / y
    x, y, tx, ty = 6., 3., 1., 1.
    assert_close(jax.jvp(f, [x, y], [tx, ty]), jax.jvp(f_ref, [x, y], [tx, ty]))


# ports CustomTransposeTest.test_make_jaxpr
def test_make_jaxpr():
    # JAX: custom_transpose_call in the jaxpr, not in its transpose's. Here the op is
    # its own primitive, and its transpose the op's transpose primitive
    fn = ab.bind(lambda x, *, r: x / r, traced=True, linear=True, name="fn")
    fn.def_transpose(lambda t, *, r: (2 * t / r,), traced=True)
    f_ = lambda x: x + fn(x, r=Y)
    f_t = transpose_unary(f_, X)
    names = lambda f: {e.primitive.name for e in jax.make_jaxpr(f)(X).eqns}
    assert "fn" in names(f_)
    assert "fn_transpose" in names(f_t) and "fn" not in names(f_t)
    assert_close(f_t(X), X + 2 * X / Y)


def _check_jit(f):
    f_ = lambda x: f(x, Y)
    f_t = transpose_unary(f_, X)
    g_ = jax.jit(f_)
    g_t = transpose_unary(g_, X)
    assert_close(f(X, Y), jax.jit(f)(X, Y))
    assert_close(f_(X), jax.jit(f_)(X))
    assert_close(f_t(X), jax.jit(f_t)(X))
    assert_close(f_(X), g_(X))
    assert_close(f_t(X), g_t(X))
    assert_close(f_t(X), X + 2 * X / Y)


# ports CustomTransposeTest.test_jit
def test_jit():
    fn = linear(lambda x, *, r: x / r, lambda t, *, r: 2 * t / r)
    _check_jit(lambda x, y: x + fn(x, r=y))


# ports CustomTransposeTest.test_jit_recursive
def test_jit_recursive():
    fn = ab.bind(lambda x, *, r: x / r, traced=True, linear=True, name="fn")
    fn.def_transpose(lambda t, *, r: (2 * fn(t, r=r),), traced=True)  # the op in its rule
    _check_jit(lambda x, y: x + fn(x, r=y))


def _check_cond(fn):
    f_ = lambda x: x + fn(x, r=Y)
    f_t = transpose_unary(f_, X)
    g_ = partial(lambda i, x: lax.cond(i > 0, f_, lambda x: x, x), 7.)
    g_t = transpose_unary(g_, X)
    assert_close(f_(X), g_(X))
    assert_close(f_t(X), g_t(X))
    assert_close(g_t(X), X + 2 * X / Y)


# ports CustomTransposeTest.test_cond
def test_cond():
    _check_cond(linear(lambda x, *, r: x / r, lambda t, *, r: 2 * t / r))


# ports CustomTransposeTest.test_cond_recursive
def test_cond_recursive():
    fn = ab.bind(lambda x, *, r: x / r, traced=True, linear=True, name="fn")
    fn.def_transpose(lambda t, *, r: (2 * fn(t, r=r),), traced=True)
    _check_cond(fn)


# ports CustomTransposeTest.test_compose_custom_jvp
def test_compose_custom_jvp():
    # a jvp rule applying a linear op (with its transpose) to the tangent; JAX's
    # use_direct_linearize flag has no counterpart
    g = linear(lambda dx, *, x: jnp.cos(x) * dx, lambda t, *, x: jnp.cos(x) * t, name="g")
    f = ab.bind(jnp.sin, traced=True, name="f")
    f.def_jvp(lambda p, t: g(t[0], x=p[0]), traced=True)
    assert_close(jax.grad(f)(0.5), jnp.cos(0.5))
    assert_close(jax.jvp(f, (0.5,), (2.,)), (jnp.sin(0.5), 2. * jnp.cos(0.5)))


# ports CustomTransposeTest.test_input_none
def test_input_none():
    # a None argument; the jvp rule hands all tangents to a linear op whose
    # (untrue) transpose gives y a zero cotangent
    g = ab.bind(lambda x, *, r: x[1], traced=True, linear=True, name="g")
    g.def_transpose(lambda t, *, r: ((None, jnp.zeros_like(r[1])),), traced=True)
    f = ab.bind(lambda x, y: y, traced=True, name="f")
    f.def_jvp(lambda p, t: g(t, r=p), traced=True)
    (gy,) = jax.grad(f, argnums=(1,))(None, jnp.float32(2))
    assert gy.dtype == jnp.float32
    assert_close(gy, 0.)
