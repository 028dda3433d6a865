"""Named vmap axes inside traced ops: ``lax.psum`` and ``lax.axis_index`` over the
name of an enclosing ``jax.vmap(..., axis_name=...)``, in the op's function and in
its rules, checked against the same code written with ``jax.custom_jvp``."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import anybind as ab
from helpers import assert_close, randn


def _pair(fn, rule):
    """The same function and jvp rule as an anybind op and as a jax.custom_jvp."""
    op = ab.bind(fn, traced=True, jvp=rule, name="named")
    ref = jax.custom_jvp(fn)
    ref.defjvp(lambda p, t: (fn(*p), rule(p, t)))
    return op, ref


def _centered():
    """x - mean over axis 'i' of x, with its exact (linear) jvp rule: psum in both."""
    def fn(x):
        return x - lax.psum(x, "i") / lax.psum(1., "i")
    return _pair(fn, lambda p, t: fn(t[0]))


def _ramp():
    """x·(1 + i) on axis 'i', with a rule that uses axis_index too."""
    def fn(x):
        return x * (1. + lax.axis_index("i").astype(x.dtype))
    return _pair(fn, lambda p, t: t[0] * (1. + lax.axis_index("i").astype(t[0].dtype)))


X = randn((4, 3))


@pytest.mark.parametrize("make", [_centered, _ramp], ids=["psum", "axis_index"])
@pytest.mark.parametrize("transform", ["vmap", "jit", "grad_of_vmap", "vmap_of_grad",
                                       "jvp", "vmap_in_axes_1"])
def test_one_named_axis(make, transform):
    op, ref = make()

    def run(f):
        v = jax.vmap(f, axis_name="i")
        return {
            "vmap": lambda: v(X),
            "jit": lambda: jax.jit(v)(X),
            "grad_of_vmap": lambda: jax.grad(lambda x: jnp.sum(jnp.sin(v(x))))(X),
            "vmap_of_grad": lambda: jax.vmap(
                jax.grad(lambda x: jnp.sum(jnp.sin(f(x)))), axis_name="i")(X),
            "jvp": lambda: jax.jvp(v, (X,), (jnp.cos(X),)),
            "vmap_in_axes_1": lambda: jax.vmap(f, axis_name="i", in_axes=1, out_axes=1)(X),
        }[transform]()
    assert_close(run(op), run(ref))


def _two_names():
    """psum over the outer name 'o' and the inner name 'i', and axis_index of both."""
    def fn(x):
        o = lax.axis_index("o").astype(x.dtype)
        return lax.psum(x, "o") * (1. + lax.axis_index("i").astype(x.dtype)) + \
            lax.psum(x * o, "i")
    return _pair(fn, lambda p, t: jax.jvp(fn, p, t)[1])


@pytest.mark.parametrize("transform", ["vmap", "jit", "grad", "vmap_of_grad"])
def test_nested_named_axes(transform):
    op, ref = _two_names()

    def run(f):
        v = jax.vmap(jax.vmap(f, axis_name="i"), axis_name="o")
        return {
            "vmap": lambda: v(X),
            "jit": lambda: jax.jit(v)(X),
            "grad": lambda: jax.grad(lambda x: jnp.sum(jnp.sin(v(x))))(X),
            "vmap_of_grad": lambda: jax.vmap(jax.vmap(
                jax.grad(lambda x: jnp.sum(jnp.sin(f(x)))), axis_name="i"), axis_name="o")(X),
        }[transform]()
    assert_close(run(op), run(ref))


def test_named_axis_between_unnamed_ones():
    """An unnamed vmap inside and outside the named one: the merged axis has three factors."""
    op, ref = _centered()
    x = randn((2, 4, 3, 5))
    run = lambda f: jax.vmap(jax.vmap(jax.vmap(f), axis_name="i"))(x)  # noqa: E731
    assert_close(run(op), run(ref))


def test_psum_of_an_unbatched_operand():
    """No operand varies over 'i', the op's output does not either (out_axes=None)."""
    op, ref = _pair(lambda x: lax.psum(x, "i"), lambda p, t: lax.psum(t[0], "i"))
    run = lambda f: jax.vmap(lambda _, x: f(x), axis_name="i", in_axes=(0, None),  # noqa: E731
                             out_axes=None)(jnp.arange(4.), 2.)
    assert_close(run(op), run(ref))
    assert_close(run(op), 8.)


def test_axis_index_of_an_unbatched_operand():
    op, ref = _ramp()
    run = lambda f: jax.vmap(lambda _: f(jnp.asarray(2.)), axis_name="i")(jnp.arange(4.))  # noqa: E731
    assert_close(run(op), run(ref))
    grad = lambda f: jax.grad(lambda c: jnp.sum(  # noqa: E731
        jax.vmap(lambda _: f(c), axis_name="i")(jnp.arange(4.))))(2.)
    assert_close(grad(op), grad(ref))


def test_unnamed_vmap_is_unchanged():
    """Without axis_name the op is batched as before: one batch parameter, no names."""
    op = ab.bind(jnp.sin, traced=True, name="plain_sin")
    jaxpr = jax.make_jaxpr(jax.vmap(jax.vmap(op)))(X)
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "plain_sin"]
    assert eqn.params["batch"].axes == ()
    assert eqn.params["batch"].size == X.size


def test_wrong_arity_names_the_op():
    op = ab.bind(lambda x, y: x * y, traced=True, name="g")
    with pytest.raises(TypeError, match="op 'g'.*does not take.*"
                                        "missing 1 required positional argument: 'y'"):
        op(0.5)
    with pytest.raises(TypeError, match="op 'g'.*does not take.*"
                                        "unexpected keyword argument 'z'"):
        op(0.5, 1., z=2)
