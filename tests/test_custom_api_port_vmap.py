"""JAX's tests of ``jax.custom_batching`` (``tests/custom_api_test.py`` in
jax-ml/jax, class CustomVmapTest), rewritten for anybind's vmap rules, keeping
their assertions.

How a case translates: ``custom_vmap(fn)`` with ``def_vmap(rule)`` is
``ab.bind(fn, traced=True)`` with ``def_vmap(rule, traced=True)``, the rule
``(axis_size, in_batched, *args) -> (out, out_batched)`` with the batch axis at
0; ``in_batched`` is a tuple (JAX: a list) with ``.kwargs`` for keyword
operands. ``sequential_vmap`` is a host op with ``vmap="sequential"``.

Deliberate differences, asserted with anybind's numbers:

- The derivatives of a batched op come from its unbatched rules (here JAX's own
  derivative of the traced function), not from differentiating the vmap rule:
  the jvp of ``vmap(f)`` with f = sin and the rule cos is cos·ẋ, where JAX gives
  −sin·ẋ; and ``grad`` works where JAX's ``custom_vmap`` raises.
- A vmap rule's outputs are checked against the batched output types, so a rule
  returning an output shaped like the unbatched one is an error.
- A missing vmap rule is not an error: a traced function is batched by JAX.

Left out: none.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import anybind as ab
from helpers import assert_close

pytestmark = pytest.mark.slow  # a ported suite: JAX's own custom_jvp/custom_vjp tests


def traced(fn, rule=None, name="f"):
    """A traced op of ``fn`` with the traced vmap rule ``rule``."""
    op = ab.bind(fn, traced=True, name=name)
    if rule is not None:
        op.def_vmap(rule, traced=True)
    return op


def _sin_cos(check=None):
    """f = sin, batched as cos; ``check(axis_size, in_batched, xs)`` runs in the rule."""
    def rule(axis_size, in_batched, xs):
        if check is not None:
            check(axis_size, in_batched, xs)
        return jnp.cos(xs), in_batched[0]
    return traced(jnp.sin, rule)


# ports CustomVmapTest.test_basic
def test_basic():
    def check(axis_size, in_batched, xs):
        (xs_batched,) = in_batched
        assert xs_batched is True
        assert axis_size == xs.shape[0]
    f = _sin_cos(check)
    x, xs = jnp.array(1.), jnp.arange(3)
    assert_close(f(x), jnp.sin(x))
    assert_close(jax.vmap(f)(xs), jnp.cos(xs))


# ports CustomVmapTest.test_closure
def test_closure():
    z = jnp.array([2., 1., 3.])

    def rule(axis_size, in_batched, *args):
        assert len(in_batched) == 1 and len(args) == 1
        (xs,), (xs_batched,) = args, in_batched
        assert xs_batched is True and axis_size == xs.shape[0]
        return z[None, :] + jnp.cos(xs)[:, None], xs_batched
    f = traced(lambda x: z + jnp.sin(x), rule)
    x, xs = jnp.array(1.), jnp.arange(3)
    assert_close(f(x), z + jnp.sin(x))
    # JAX's rule returns z + cos(xs), shaped like one example's output: anybind
    # checks the batched output type, so that rule is an error; the batched one
    # above gives one row z + cos(x) per example
    assert_close(jax.vmap(f)(xs), z[None, :] + jnp.cos(xs)[:, None])
    g = traced(lambda x: z + jnp.sin(x), lambda n, b, xs: (z + jnp.cos(xs), b[0]), name="g")
    with pytest.raises(TypeError, match=r"'g': the vmap rule returned float64\[3\] for output "
                                        r"0; expected float64\[3,3\]"):
        jax.vmap(g)(xs)


# ports CustomVmapTest.test_rule_multi_output
def test_rule_multi_output():
    f = traced(lambda x: (jnp.sin(x), jnp.cos(x)),
               lambda axis_size, in_batched, xs: ((jnp.cos(xs), jnp.sin(xs)),
                                                  tuple(in_batched * 2)))
    x, xs = jnp.array(1.), jnp.arange(3)
    assert_close(f(x), (jnp.sin(x), jnp.cos(x)))
    assert_close(jax.vmap(f)(xs), (jnp.cos(xs), jnp.sin(xs)))


# ports CustomVmapTest.test_nary
def test_nary():
    def rule(axis_size, in_batched, xs, ys):
        assert tuple(in_batched) == (True, True)
        assert axis_size == 3 == xs.shape[0] == ys.shape[0]
        return jnp.cos(xs) + ys ** 2., True
    f = traced(lambda x, y: jnp.sin(x) + y ** 2., rule)
    xs, ys = jnp.arange(3.0), jnp.arange(3.0)
    assert_close(jax.vmap(f)(xs, ys), jnp.cos(xs) + ys ** 2.)


# ports CustomVmapTest.test_nary_mixed_batching
def test_nary_mixed_batching():
    size, vlen = 4, 3
    in_batched_log = []

    def vector_dot(u, v):
        assert u.ndim == 1 and v.ndim == 1
        return u @ v

    def rule(axis_size, in_batched, u, v):
        in_batched_log.append(tuple(in_batched))
        assert axis_size == size
        u_batched, v_batched = in_batched
        assert u.shape == ((size, vlen) if u_batched else (vlen,))
        assert v.shape == ((size, vlen) if v_batched else (vlen,))
        if u_batched and v_batched:
            return jnp.sum(u * v, axis=1), True
        return (u @ v if u_batched else v @ u), u_batched or v_batched
    f = traced(vector_dot, rule)
    v = lambda *shape: jnp.ones(shape)
    seen = []
    for in_axes, args, expected, batched in [
            ((0, None), (v(4, 3), v(3)), v(4, 3) @ v(3), (True, False)),
            ((1, None), (v(3, 4), v(3)), v(3, 4).T @ v(3), (True, False)),
            ((None, 0), (v(3), v(4, 3)), v(3) @ v(4, 3).T, (False, True)),
            ((0, 0), (v(4, 3), v(4, 3)), jnp.sum(v(4, 3) * v(4, 3), axis=1), (True, True))]:
        in_batched_log.clear()
        assert_close(jax.vmap(f, in_axes=in_axes)(*args), expected)
        # the rule may be traced more than once per vmap, and not again for a
        # signature already traced (the second case); every call saw the same
        assert set(in_batched_log) <= {batched}
        seen += in_batched_log
    assert set(seen) == {(True, False), (False, True), (True, True)}


# ports CustomVmapTest.test_rule_input_signature
def test_rule_input_signature():
    rule_args = []

    def check(axis_size, in_batched, xs):
        rule_args.append((axis_size, in_batched))
    f = _sin_cos(check)
    jax.vmap(f)(jnp.arange(3))
    assert rule_args
    for axis_size, in_batched in rule_args:
        assert type(axis_size) is int
        # JAX: a list; here a tuple, with the keyword operands' flags in .kwargs
        assert isinstance(in_batched, tuple) and len(in_batched) == 1
        assert in_batched.kwargs == {}


# ports CustomVmapTest.test_rule_output_vs_batching_output_mismatch
def test_rule_output_vs_batching_output_mismatch():
    f = traced(jnp.sin, lambda axis_size, in_batched, xs: ([jnp.sin(xs), jnp.cos(xs)],
                                                           in_batched))
    with pytest.raises(TypeError, match=r"'f': the vmap rule returned list for output 0; "
                                        r"expected float64\[3\]"):
        jax.vmap(f)(jnp.arange(3.))
    # the output right, the batching flags of another structure
    g = traced(jnp.sin, lambda axis_size, in_batched, xs: (jnp.cos(xs), [True, True]),
               name="g")
    with pytest.raises(TypeError, match="'g': the vmap rule returned out_batched of structure"):
        jax.vmap(g)(jnp.arange(3.))


# ports CustomVmapTest.test_rule_vs_call_output_mismatch
def test_rule_vs_call_output_mismatch():
    f = traced(jnp.sin, lambda axis_size, in_batched, xs: ([jnp.sin(xs)], in_batched))
    with pytest.raises(TypeError, match=r"'f': the vmap rule returned list for output 0; "
                                        r"expected float64\[3\]"):
        jax.vmap(f)(jnp.arange(3.))


def _check_3_batched(axis_size, in_batched, xs):
    assert axis_size == 3
    assert tuple(in_batched) == (True,)


# ports CustomVmapTest.test_jvp_basic
def test_jvp_basic():
    # JAX differentiates the vmap rule (tangent −sin·ẋ); here the batched op's
    # tangent comes from f's own derivative: cos·ẋ
    f = _sin_cos(_check_3_batched)
    f_jvp = lambda x, tx: jax.jvp(f, [x], [tx])
    x, tx = jnp.array(1.), jnp.array(2.)
    xs, txs = jnp.arange(3.), jnp.arange(3.) * 2.
    y, ty = f_jvp(x, tx)
    assert_close(y, jnp.sin(x))
    assert_close(ty, jnp.cos(x) * tx)
    ys, tys = jax.vmap(f_jvp)(xs, txs)
    assert_close(ys, jnp.cos(xs))
    assert_close(tys, jnp.cos(xs) * txs)
    ys, tys = jax.jvp(jax.vmap(f), [xs], [txs])
    assert_close(ys, jnp.cos(xs))
    assert_close(tys, jnp.cos(xs) * txs)


# ports CustomVmapTest.test_jvp_closure
def test_jvp_closure():
    # the batched output type as in test_closure; tangents from f's own derivative
    z = jnp.array([2., 1., 3.])
    bcast = lambda x: z + x - z

    def rule(axis_size, in_batched, xs):
        _check_3_batched(axis_size, in_batched, xs)
        return z[None, :] + jnp.cos(xs)[:, None], in_batched[0]
    f = traced(lambda x: z + jnp.sin(x), rule)
    f_jvp = lambda x, tx: jax.jvp(f, [x], [tx])
    x, tx = jnp.array(1.), jnp.array(2.)
    xs, txs = jnp.arange(3.), jnp.arange(3.) * 2.
    y, ty = f_jvp(x, tx)
    assert_close(y, z + jnp.sin(x))
    assert_close(ty, bcast(jnp.cos(x)) * tx)
    for ys, tys in [jax.vmap(f_jvp)(xs, txs), jax.jvp(jax.vmap(f), [xs], [txs])]:
        assert_close(ys, z[None, :] + jnp.cos(xs)[:, None])
        assert_close(tys, jnp.broadcast_to((jnp.cos(xs) * txs)[:, None], (3, 3)))


# ports CustomVmapTest.test_jvp_nary
def test_jvp_nary():
    def rule(axis_size, in_batched, xs, ys):
        assert axis_size == 3 and tuple(in_batched) == (True, True)
        return jnp.cos(xs) + ys, True
    f = traced(lambda x, y: jnp.sin(x) + y, rule)
    f_jvp = lambda x, y, tx, ty: jax.jvp(f, [x, y], [tx, ty])
    xs, ys, txs, tys = 4. + jnp.arange(3. * 4).reshape((4, 3))
    for zs, tzs in [jax.vmap(f_jvp)(xs, ys, txs, tys), jax.jvp(jax.vmap(f), [xs, ys], [txs, tys])]:
        assert_close(zs, jnp.cos(xs) + ys)
        assert_close(tzs, jnp.cos(xs) * txs + tys)  # JAX: −sin(xs)·ẋ + ẏ


# ports CustomVmapTest.test_jvp_extra_batched_tangents
def test_jvp_extra_batched_tangents():
    # the primal is not batched, so neither is the op: the rule never runs (JAX runs
    # it with in_batched [False]), y is sin(x) and the tangents cos(x)·ẋ
    calls = []
    f = _sin_cos(lambda *args: calls.append(args))
    f_jvp = lambda x, tx: jax.jvp(f, [x], [tx])
    txs = 2. + jnp.arange(3.)
    x = jnp.array(1, dtype=txs.dtype)
    y, tys = jax.vmap(f_jvp, in_axes=(None, 0), out_axes=(None, 0))(x, txs)
    assert_close(y, jnp.sin(x))
    assert_close(tys, jnp.cos(x) * txs)
    assert not calls


# ports CustomVmapTest.test_jacfwd
def test_jacfwd():
    # as above: the rule never runs; the Jacobian is f's, diag(cos x)
    calls = []
    f = _sin_cos(lambda *args: calls.append(args))
    x = jnp.arange(3.) + .72
    assert_close(jax.jacfwd(f)(x), jnp.diag(jnp.cos(x)))
    assert not calls


# ports CustomVmapTest.test_jvp_extra_batched_primals
def test_jvp_extra_batched_primals():
    # batched primals: the rule runs (in_batched (True,); JAX: [False]) for the
    # primal; the tangent is f's derivative, cos(xs)·ẋ
    f = _sin_cos(_check_3_batched)
    f_jvp = lambda x, tx: jax.jvp(f, [x], [tx])
    xs = jnp.arange(3.)
    tx = jnp.array(4, dtype=xs.dtype)
    ys, tys = jax.vmap(f_jvp, in_axes=(0, None))(xs, tx)
    assert_close(ys, jnp.cos(xs))
    assert_close(tys, jnp.cos(xs) * tx)


# ports CustomVmapTest.test_jvp_extra_batched_primals_with_linear_vmap_rule
def test_jvp_extra_batched_primals_with_linear_vmap_rule():
    f_linear = traced(lambda x: 7. * x,
                      lambda axis_size, in_batched, xs: (11. * xs, in_batched[0]), name="lin")
    f_nonlinear = _sin_cos()
    f_lin_jvp = lambda x, tx: jax.jvp(f_linear, [x], [tx])
    f_non_jvp = lambda x, tx: jax.jvp(f_nonlinear, [x], [tx])
    xs = jnp.arange(3.)
    tx = jnp.array(4., dtype=xs.dtype)
    # the tangent of a linear function stays unbatched; it is f's, 7·ẋ (JAX: no check)
    ys, ty = jax.vmap(f_lin_jvp, in_axes=(0, None), out_axes=(0, None))(xs, tx)
    assert_close((ys, ty), (11. * xs, 7. * tx))
    with pytest.raises(ValueError, match="at vmap out_axes"):
        jax.vmap(f_non_jvp, in_axes=(0, None), out_axes=(0, None))(xs, tx)


# ports CustomVmapTest.test_jvp_dataflow_violation
def test_jvp_dataflow_violation():
    # JAX's rule calls a custom_jvp whose jvp makes the primal depend on the tangent;
    # here the batched op's derivative is f's own, so output primals never depend on
    # tangents: with only tangents batched, y stays unbatched and out_axes=(None, 0)
    # works where JAX raises
    cos_bad = jax.custom_jvp(jnp.cos)
    cos_bad.defjvp(lambda x, tx: (jnp.cos(x[0] * tx[0]), tx[0]))
    f = traced(jnp.sin, lambda axis_size, in_batched, xs: (cos_bad(xs), in_batched[0]))
    f_jvp = lambda x, tx: jax.jvp(f, [x], [tx])
    txs = 2. + jnp.arange(3.)
    x = jnp.array(1, dtype=txs.dtype)
    ys, tys = jax.vmap(f_jvp, in_axes=(None, 0))(x, txs)
    assert_close(ys, jnp.broadcast_to(jnp.sin(x), (3,)))
    assert_close(tys, jnp.cos(x) * txs)
    y, tys = jax.vmap(f_jvp, in_axes=(None, 0), out_axes=(None, 0))(x, txs)
    assert_close((y, tys), (jnp.sin(x), jnp.cos(x) * txs))


def _tree_case(x, xs):
    tree_sin = lambda t: jax.tree.map(jnp.sin, t)
    tree_cos = lambda t: jax.tree.map(jnp.cos, t)
    in_batched_ref = jax.tree.map(lambda _: True, x)

    def rule(axis_size, in_batched, xs):
        assert tuple(in_batched) == (in_batched_ref,)
        (sz,) = {z.shape[0] for z in jax.tree.leaves(xs)}
        assert axis_size == sz
        return tree_cos(xs), in_batched[0]
    f = traced(tree_sin, rule)
    assert_close(f(x), tree_sin(x))
    ys = jax.vmap(f)(xs)
    assert jax.tree.structure(ys) == jax.tree.structure(xs)
    assert_close(ys, tree_cos(xs))


# ports CustomVmapTest.test_tree
def test_tree():
    x, xs = jnp.array(1.), jnp.arange(3)
    _tree_case((x, [x + 1, x + 2], [x + 3], x + 4), (xs, [xs + 1, xs + 2], [xs + 3], xs + 4))


# ports CustomVmapTest.test_tree_with_nones
def test_tree_with_nones():
    x, xs = jnp.array(1.), jnp.arange(3)
    _tree_case((x, [x + 1, None], [x + 3], None), (xs, [xs + 1, None], [xs + 3], None))


# ports CustomVmapTest.test_jit
def test_jit():
    def check(axis_size, in_batched, xs):
        assert tuple(in_batched) == (True,) and axis_size == xs.shape[0]
    f = _sin_cos(check)
    x, xs = jnp.array(1.), jnp.arange(3)
    assert_close(f(x), jax.jit(f)(x))
    assert_close(jax.jit(jax.vmap(f))(xs), jax.vmap(f)(xs))
    assert_close(jax.vmap(jax.jit(f))(xs), jax.vmap(f)(xs))
    assert_close(jax.vmap(f)(xs), jnp.cos(xs))


def _sequential(fn, ndims):
    """A host op of ``fn`` with vmap="sequential" that logs its arguments' ranks."""
    calls = []

    def logged(*args):
        calls.append(tuple(np.ndim(a) for a in args))
        return fn(*args)
    return ab.bind(logged, shape=ab.like(0), vmap="sequential", name="f"), calls


# ports CustomVmapTest.test_sequential_vmap_basic
def test_sequential_vmap_basic():
    # JAX compares the jaxpr with lax.map's; here: one call of the function per
    # row, each on one example, and lax.map's numbers
    f, calls = _sequential(lambda x: x + 1., 1)
    xs = jnp.arange(3.)
    assert_close(jax.vmap(f)(xs), lax.map(lambda x: x + 1., xs))
    assert calls == [(0,)] * 3


# ports CustomVmapTest.test_sequential_vmap_nary_same_batching
def test_sequential_vmap_nary_same_batching():
    f, calls = _sequential(lambda x, y: x + y, 2)
    xs, ys = jnp.arange(3.), 4. + jnp.arange(3.)
    assert_close(jax.vmap(f)(xs, ys), lax.map(lambda a: a[0] + a[1], (xs, ys)))
    assert calls == [(0, 0)] * 3


# ports CustomVmapTest.test_sequential_vmap_nary_mixed_batching
def test_sequential_vmap_nary_mixed_batching():
    f, calls = _sequential(lambda x, y: x + y, 2)
    xs, y = jnp.arange(3.), 4.
    assert_close(jax.vmap(f, in_axes=(0, None))(xs, y), lax.map(lambda x: x + y, xs))
    assert calls == [(0, 0)] * 3


def _square_with_rule():
    # lax.map(batch_size=b) runs the op under vmap on chunks of b: the function sees
    # single examples, the vmap rule whole chunks
    def fn(x):
        assert x.shape == ()
        return x ** 2

    def rule(axis_size, in_batched, xs):
        assert in_batched[0] is True and xs.shape[0] == axis_size
        return xs ** 2, True
    return traced(fn, rule, name="square")


# ports CustomVmapTest.test_batch_map_basic
@pytest.mark.parametrize("batch_size", [0, 1, 4, 8, 16])
def test_batch_map_basic(batch_size):
    x = np.arange(16)
    y = lax.map(_square_with_rule(), x, batch_size=batch_size)
    np.testing.assert_array_equal(y, x ** 2)


# ports CustomVmapTest.test_batch_map_pytrees
@pytest.mark.parametrize("batch_size", [0, 1, 4, 8, 16])
def test_batch_map_pytrees(batch_size):
    sq = _square_with_rule()
    f = lambda x: {"b": sq(x["a"])}
    outputs = lax.map(f, {"a": np.arange(16)}, batch_size=batch_size)
    assert_close(outputs["b"], np.arange(16) ** 2)


# ports CustomVmapTest.test_batch_divides_axis
def test_batch_divides_axis():
    def fn(x, a):
        assert x.shape == (4,)
        return (x + a) ** 2

    def rule(axis_size, in_batched, x, a):
        assert x.shape == (axis_size, 4) and a.shape == (axis_size, 4)
        return (x + a) ** 2, True
    f = traced(fn, rule)
    rng = np.random.default_rng(0)
    x, a = rng.integers(-10, 10, (16, 4)), rng.integers(-10, 10, (16, 4))
    y = jax.jit(lambda x, a: lax.map(lambda t: f(*t), (x, a), batch_size=8))(x, a)
    assert_close(y, (x + a) ** 2)


# ports CustomVmapTest.test_undefined_rule
def test_undefined_rule():
    # JAX raises "No batching rule defined"; a traced op without a vmap rule is
    # batched by JAX
    f = traced(jnp.sin)
    assert_close(f(0.5), jnp.sin(0.5))
    assert_close(jax.vmap(f)(jnp.arange(3.)), jnp.sin(jnp.arange(3.)))


# ports CustomVmapTest.test_kwargs
def test_kwargs():
    # f(x=x) passes x as a keyword operand: the rule gets it by keyword, and its
    # batching in in_batched.kwargs
    def rule(axis_size, in_batched, *, x):
        assert tuple(in_batched) == () and in_batched.kwargs == {"x": True}
        assert axis_size == x.shape[0]
        return jnp.cos(x), True
    f = traced(lambda *, x: jnp.sin(x), rule)
    x, xs = jnp.array(1.), jnp.arange(3.)
    assert_close(f(x=x), jnp.sin(x))
    assert_close(jax.vmap(lambda x: f(x=x))(xs), jnp.cos(xs))
    assert_close(jax.vmap(f)(x=xs), jnp.cos(xs))


# ports CustomVmapTest.test_partial_eval_raises
def test_partial_eval_raises():
    # JAX cannot linearize a custom_vmap function; here grad uses f's derivative
    f = _sin_cos()
    assert_close(jax.grad(f)(0.5), jnp.cos(0.5))


# ports CustomVmapTest.test_compose_custom_vjp
def test_compose_custom_vjp():
    f = ab.bind(lambda x, y: jnp.sin(x) * y, traced=True, name="f",
                vjp=lambda p, g: (jnp.cos(p[0]) * g * p[1], jnp.sin(p[0]) * g))
    f.def_vmap(lambda axis_size, in_batched, xs, ys: (jnp.cos(xs) * ys, True), traced=True)
    xs, ys = jnp.linspace(0, 1, 5), jnp.linspace(-0.1, 0.1, 5)
    assert_close(jax.vmap(f)(xs, ys), jnp.cos(xs) * ys)
    assert_close(jax.grad(f, argnums=(0, 1))(xs[0], ys[0]),
                 (jnp.cos(xs[0]) * ys[0], jnp.sin(xs[0])))


# ports CustomVmapTest.test_compose_custom_vjp_bwd_rule
def test_compose_custom_vjp_bwd_rule():
    # host fwd and bwd rules batched sequentially (JAX: sequential_vmap on both),
    # each call on one example; JAX's bwd (x·ȳ, y·ȳ) is not f's derivative
    ndims = []

    def fwd(x, y):
        ndims.append(np.ndim(x))
        return np.sin(x) * y, (x, y)
    fun = ab.bind(lambda x, y: np.sin(x) * y, shape=ab.like(0), vmap="sequential", name="fun")
    fun.def_fwd(fwd, residuals=lambda x, y: (x, y))
    fun.def_bwd(lambda res, ct: (res[0] * ct, res[1] * ct))
    xs = jnp.linspace(0, 1, 5)
    y = jnp.array(0.5, dtype=xs.dtype)
    f = jax.vmap(jax.jit(fun), in_axes=(0, None))
    out, f_vjp = jax.vjp(f, xs, y)
    assert_close(out, jnp.sin(xs) * y)
    assert_close(f_vjp(out), (xs * out, jnp.sum(y * out)))
    assert ndims and set(ndims) == {0}


# ports CustomVmapTest.test_resolve_kwargs_error_message
def test_resolve_kwargs_error_message():
    def rule(*args, **kw):
        raise AssertionError("should not be executed")
    f = traced(lambda x, y, *, z=None: jnp.sin(x) * y, rule)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'y'"):
        f(0.5)
    # JAX cannot resolve the keyword z to a position; here it is a static keyword
    assert_close(f(0.5, 0.1, z=1.0), jnp.sin(0.5) * 0.1)
