"""In-place derivative rules (``def_jvp/def_vjp/def_transpose/def_bwd(rule, out=True)``):
the rule writes tangents and cotangents into XLA's buffers, under jvp, grad, vmap
(both modes), jit and linear_transpose, with pytree arguments, integer leaves and
arguments that are not differentiated."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, check_first_order, check_transpose_identity, randn

TOL = dict(rtol=1e-10, atol=1e-10)
MODES = ["sequential", "vectorized"]


def _ref(p, y):
    """f({"a": a, "k": k}, y) = (a·y², k·a + y): a pytree argument with an integer leaf."""
    a, k = p["a"], p["k"]
    return a * y**2, k * a + y


def _op(mode, log):
    def fn(p, y):
        return _ref(p, y)

    op = ab.bind(fn, shape=lambda p, y: (y, y), vmap=mode, name=f"inplace_rules_{mode}")

    @op.def_jvp(out=True)
    def _(primals, tangents, *, out):
        (p, y), (dp, dy) = primals, tangents
        t0, t1 = out  # views: write with out= or in-place operators on the names
        assert dp["k"] is None and t0.flags.writeable
        np.multiply(y**2, dp["a"], out=t0)
        t0 += 2 * p["a"] * y * dy
        np.multiply(p["k"], dp["a"], out=t1)
        t1 += dy

    @op.def_vjp(out=True)
    def _(primals, ct, *, out):
        (p, y), (c0, c1) = primals, ct
        log.append((out[0] is not None, out[1] is not None))
        pbar, ybar = out
        if pbar is not None:
            assert pbar["k"] is None  # integer leaf: no cotangent
            np.multiply(y**2, c0, out=pbar["a"])
            pbar["a"] += p["k"] * c1
        if ybar is not None:
            np.multiply(2 * p["a"] * y, c0, out=ybar)
            ybar += c1
    return op


def _inputs(shape=(3,)):
    k = np.arange(1, 1 + int(np.prod(shape)), dtype=np.int32).reshape(shape) % 5
    return {"a": randn(shape), "k": k}, randn(shape, seed=1)


@pytest.mark.parametrize("mode", MODES)
def test_inplace_jvp_and_vjp_against_differences(mode):
    op = _op(mode, [])
    check_first_order(op, _inputs())
    p, y = _inputs()
    t = ({"a": randn(3, seed=2), "k": np.zeros(3, jax.dtypes.float0)}, randn(3, seed=3))
    assert_tree_close(jax.jit(lambda a, b: jax.jvp(op, a, b))((p, y), t),
                      jax.jvp(_ref, (p, y), t), **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_inplace_vjp_gets_none_for_arguments_not_differentiated(mode):
    log = []
    op = _op(mode, log)
    p, y = _inputs()
    loss = lambda f: (lambda y, p: sum(jnp.sum(jnp.sin(o)) for o in f(p, y)))
    assert_tree_close(jax.jit(jax.grad(loss(op)))(y, p), jax.grad(loss(_ref))(y, p), **TOL)
    assert log == [(False, True)]


@pytest.mark.parametrize("mode", MODES)
def test_inplace_rules_under_vmap(mode):
    op = _op(mode, [])
    p, y = _inputs((4, 3))
    loss = lambda f: (lambda a, y, k: sum(jnp.sum(o**2) for o in f({"a": a, "k": k}, y)))
    for in_axes in [(0, 0, 0), (0, None, 0), (None, 0, None)]:
        args = (p["a"] if in_axes[0] == 0 else p["a"][0], y if in_axes[1] == 0 else y[0],
                p["k"] if in_axes[2] == 0 else p["k"][0])
        g = jax.vmap(jax.grad(loss(op), argnums=(0, 1)), in_axes=in_axes)
        want = jax.vmap(jax.grad(loss(_ref), argnums=(0, 1)), in_axes=in_axes)(*args)
        assert_tree_close(jax.jit(g)(*args), want, **TOL)
        t = jax.vmap(lambda a, y, k: jax.jvp(lambda a, y: op({"a": a, "k": k}, y),
                                             (a, y), (a, y))[1], in_axes=in_axes)(*args)
        want = jax.vmap(lambda a, y, k: jax.jvp(lambda a, y: _ref({"a": a, "k": k}, y),
                                                (a, y), (a, y))[1], in_axes=in_axes)(*args)
        assert_tree_close(t, want, **TOL)


def _scale_op(mode):
    """A linear op x ↦ (3x, x[::-1]) with an in-place transpose."""
    op = ab.bind(lambda x: (3 * x, x[..., ::-1]), shape=lambda x: (x, x), linear=True,
                 vmap=mode, name=f"inplace_transpose_{mode}")

    @op.def_transpose(out=True)
    def _(ct, *, out):
        (xbar,) = out
        np.multiply(ct[0], 3, out=xbar)
        xbar += ct[1][..., ::-1]
    return op


@pytest.mark.parametrize("mode", MODES)
def test_inplace_transpose(mode):
    op = _scale_op(mode)
    x, ybar = randn(5), (randn(5, seed=1), randn(5, seed=2))
    check_transpose_identity(op, x, randn(5, seed=3), ybar)
    (xbar,) = jax.jit(jax.linear_transpose(op, x))(ybar)
    np.testing.assert_allclose(xbar, 3 * ybar[0] + ybar[1][::-1], **TOL)
    X = randn((2, 5))
    got = jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(op(x)[0] * op(x)[1]))))(X)
    want = jax.vmap(jax.grad(lambda x: jnp.sum(3 * x * x[::-1])))(X)
    np.testing.assert_allclose(got, want, **TOL)


def test_inplace_bwd_with_residuals():
    """f(x) = sin(x); fwd saves cos(x), the in-place bwd multiplies it by ȳ."""
    calls = []
    op = ab.bind(np.sin, shape=ab.like(0), name="inplace_bwd_sin",
                 jvp=lambda p, t: np.cos(p[0]) * t[0])
    op.def_fwd(lambda x: (np.sin(x), np.cos(x)), residuals=lambda x: x)

    @op.def_bwd(out=True)
    def _(cos_x, ct, *, out):
        calls.append(1)
        np.multiply(cos_x, ct, out=out[0])

    x = randn(4)
    g = jax.jit(jax.grad(lambda x: jnp.sum(op(x) ** 2)))(x)
    np.testing.assert_allclose(g, 2 * np.sin(x) * np.cos(x), **TOL)
    assert calls == [1]
    check_first_order(op, (x,))


def test_inplace_rule_that_returns_a_value_is_an_error():
    op = ab.bind(np.sin, shape=ab.like(0), name="inplace_returns")
    op.def_vjp(lambda p, ct, *, out: (np.cos(p[0]) * ct,), out=True)
    with pytest.raises(Exception, match=r"(?s)'inplace_returns'.*vjp rule.*out=True.*None"):
        jax.grad(lambda x: op(x).sum())(randn(3))


def test_inplace_traced_rule_is_an_error():
    op = ab.bind(np.sin, shape=ab.like(0), name="inplace_traced")
    with pytest.raises(TypeError, match=r"'inplace_traced'.*def_jvp\(out=True\).*host"):
        op.def_jvp(lambda p, t, *, out: None, traced=True, out=True)


def test_inplace_vmap_rule_fills_the_whole_batch_in_one_call():
    """def_vmap(rule, out=True): one host call writes every row of the batched output."""
    calls = []

    def fn(x, y, *, out):
        np.multiply(x, y, out=out)

    op = ab.bind(fn, shape=ab.like(0), out=True, name="inplace_vmap_rule",
                 jvp=lambda p, t: p[1] * t[0] + p[0] * t[1])

    @op.def_vmap(out=True)
    def _(size, in_batched, x, y, *, out):
        calls.append((size, tuple(in_batched)))
        assert out.shape[0] == size
        np.multiply(x, y, out=out)  # an unbatched argument broadcasts against the batch

    X, Y = randn((4, 3)), randn(3, seed=1)
    np.testing.assert_allclose(jax.jit(jax.vmap(op, in_axes=(0, None)))(X, Y), X * Y, **TOL)
    assert calls == [(4, (True, False))]
    t = jax.vmap(lambda x: jax.jvp(lambda x: op(x, Y), (x,), (x,))[1])(X)
    np.testing.assert_allclose(t, X * Y, **TOL)
    op.def_vmap(lambda size, in_batched, x, y, *, out: out, out=True)
    with pytest.raises(Exception, match=r"(?s)'inplace_vmap_rule'.*vmap rule.*out=True.*None"):
        jax.vmap(op)(X, X)


def test_inplace_rule_with_its_own_batching():
    """A rule's vmap= (a mode or a batched variant) keeps the in-place calling convention."""
    rows, batched = [], []

    def vjp(primals, ct, *, out):
        rows.append(ct.shape)
        np.multiply(np.cos(primals[0]), ct, out=out[0])

    def vjp_batched(primals, ct, *, out):
        batched.append(out[0].shape)
        np.multiply(np.cos(primals[0]), ct, out=out[0])

    X = randn((4, 3))
    want = jax.vmap(jax.grad(lambda x: jnp.sum(jnp.sin(x) ** 2)))(X)
    for variant, log, shape in (("sequential", rows, (3,)), (vjp_batched, batched, (4, 3))):
        op = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="inplace_rule_vmap")
        op.def_vjp(vjp, out=True, vmap=variant)
        got = jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(op(x) ** 2))))(X)
        np.testing.assert_allclose(got, want, **TOL)
        assert log and set(log) == {shape}
