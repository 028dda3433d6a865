"""vmap of every op in every mode: sequential, vectorized, a user rule (host and traced).

The reference is always ``jax.vmap`` of the pure-JAX function with the same
``in_axes``/``out_axes``, so the batching layout (axis position, unbatched
arguments, nesting) is checked, not just the values.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_tree_close, host_call_count, randn
from ops import CASES, VMAP_MODES

CASE_NAMES = list(CASES)


def _split(case):
    """(array keywords, static keywords) of a case."""
    kw = case.kwargs()
    arrays = {k: v for k, v in kw.items() if isinstance(v, np.ndarray)}
    static = {k: v for k, v in kw.items() if k not in arrays}
    return arrays, static


def _as_fn(f, static):
    """f(*args, **arrays, **static) as a function of (args, arrays), for vmap in_axes."""
    return lambda args, arrays: f(*args, **arrays, **static)


def _stack(tree, size, offset=0.0):
    return jax.tree.map(
        lambda x: np.stack([x + (offset + 0.5 * k) * np.ones_like(x) for k in range(size)]), tree)


def _inputs(case, size=3):
    arrays, static = _split(case)
    args = case.args()
    return (args, arrays), (_stack(args, size), _stack(arrays, size, 0.1)), static


def _variants(name):
    """in_axes variants that make sense for a case: (id, in_axes builder, moves axis to -1)."""
    case = CASES[name]
    arrays, _ = _split(case)
    n_leaves = len(jax.tree.leaves(case.args()))
    out = ["all", "last_axis"]
    if arrays:
        out += ["args_only", "keywords_only"]
    if n_leaves > 1:
        out += ["first_leaf_only"]
    return out


def _in_axes(variant, inputs):
    args, arrays = inputs
    if variant in ("all", "last_axis"):
        ax = -1 if variant == "last_axis" else 0
        return (jax.tree.map(lambda _: ax, args), jax.tree.map(lambda _: ax, arrays))
    if variant == "args_only":
        return (jax.tree.map(lambda _: 0, args), jax.tree.map(lambda _: None, arrays))
    if variant == "keywords_only":
        return (jax.tree.map(lambda _: None, args), jax.tree.map(lambda _: 0, arrays))
    if variant == "first_leaf_only":
        leaves, tdef = jax.tree.flatten(args)
        return (tdef.unflatten([0] + [None] * (len(leaves) - 1)),
                jax.tree.map(lambda _: None, arrays))
    raise ValueError(variant)


def _select(variant, in_axes, plain, batched):
    """Per leaf: the batched input where its axis is not None, else the plain one."""
    def pick(ax, p, b):
        if ax is None:
            return p
        return np.moveaxis(b, 0, -1) if variant == "last_axis" else b
    return jax.tree.map(pick, in_axes, plain, batched, is_leaf=lambda x: x is None)


MATRIX = [(n, v, m) for n in CASE_NAMES for v in _variants(n) for m in VMAP_MODES]


@pytest.mark.parametrize("name,variant,mode", MATRIX)
def test_vmap_matches_reference(name, variant, mode):
    case = CASES[name]
    plain, batched, static = _inputs(case)
    in_axes = _in_axes(variant, plain)
    inputs = _select(variant, in_axes, plain, batched)
    out_axes = -1 if variant == "last_axis" else 0
    op = case.make(mode)
    got = jax.vmap(_as_fn(op, static), in_axes=in_axes, out_axes=out_axes)(*inputs)
    want = jax.vmap(_as_fn(case.ref, static), in_axes=in_axes, out_axes=out_axes)(*inputs)
    assert_tree_close(got, want)


@pytest.mark.parametrize("mode", VMAP_MODES)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_nested_vmap_matches_reference(name, mode):
    """vmap(vmap(f)) with the outer axis at 1 and the inner at 0, under jit."""
    case = CASES[name]
    plain, _, static = _inputs(case)
    both = _stack(_stack(plain, 3), 2, 0.3)  # leaves (2, 3, ...)
    swapped = jax.tree.map(lambda x: np.swapaxes(x, 0, 1), both)  # leaves (3, 2, ...)
    op = case.make(mode)

    def nest(f):
        return jax.jit(jax.vmap(jax.vmap(_as_fn(f, static), in_axes=0), in_axes=1))
    assert_tree_close(nest(op)(*swapped), nest(case.ref)(*swapped))


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_nested_vmap_outer_product(mode):
    """Inner vmap over x1 only, outer over x2 only: every pair (i, j)."""
    op = CASES["mul"].make(mode)
    a, b = randn((4, 3)), randn((2, 3), seed=1)
    f = jax.vmap(jax.vmap(op, in_axes=(0, None)), in_axes=(None, 0))
    np.testing.assert_allclose(f(a, b), a[None] * b[:, None] ** 2, rtol=1e-12)
    g = jax.vmap(jax.vmap(op, in_axes=(None, 0), out_axes=1), in_axes=(0, None), out_axes=0)
    np.testing.assert_allclose(g(a, b), np.moveaxis(a[:, None] * b[None] ** 2, 1, 2), rtol=1e-12)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_triple_vmap_mixed_axes(mode):
    op = CASES["mul"].make(mode)
    x1, x2 = randn((2, 3, 4)), randn((4, 5), seed=1)
    f = jax.vmap(jax.vmap(jax.vmap(op, in_axes=(0, None)), in_axes=(1, None)),
                 in_axes=(None, 1), out_axes=2)
    ref = jax.vmap(jax.vmap(jax.vmap(CASES["mul"].ref, in_axes=(0, None)), in_axes=(1, None)),
                   in_axes=(None, 1), out_axes=2)
    np.testing.assert_allclose(f(x1, x2), ref(x1, x2), rtol=1e-12)


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_matvec_outer_over_matrix_inner_over_vector(mode):
    op = CASES["matvec"].make(mode)
    xs, a_s = randn((3, 3)), randn((2, 4, 3), seed=1)
    f = jax.vmap(lambda a: jax.vmap(lambda x: op(x, a=a))(xs))
    np.testing.assert_allclose(f(a_s), jnp.einsum("bij,cj->bci", a_s, xs), rtol=1e-12)


@pytest.mark.parametrize("size", [1, 0])
@pytest.mark.parametrize("mode", VMAP_MODES)
def test_vmap_size_one_and_zero(mode, size):
    op = CASES["mul"].make(mode)
    x1, x2 = randn((size, 3)), randn((size, 3), seed=1)
    out = jax.vmap(op)(x1, x2)
    assert out.shape == (size, 3)
    np.testing.assert_allclose(out, x1 * x2**2, rtol=1e-12)


# ---------------------------------------------------------- what each mode does

def _recording(mode, record):
    def fn(x1, x2):
        record.append((x1.shape, x2.shape))
        return x1 * x2**2
    return ab.bind(fn, shape=ab.like(0), vmap=mode, name=f"rec_{mode}")


def test_sequential_is_one_host_call_looping_in_python():
    record = []
    op = _recording("sequential", record)
    x1, x2 = randn((4, 3)), randn(3, seed=1)
    f = jax.jit(jax.vmap(op, in_axes=(0, None)))
    assert host_call_count(f.lower(x1, x2)) == 1
    assert "while" not in f.lower(x1, x2).as_text()
    np.testing.assert_allclose(f(x1, x2), x1 * x2**2, rtol=1e-12)
    assert record == [((3,), (3,))] * 4  # one row at a time, unbatched arg as is


def test_vectorized_sees_leading_batch_axis_and_size_one_for_unbatched():
    record = []
    op = _recording("vectorized", record)
    x1, x2 = randn((4, 3)), randn(3, seed=1)
    f = jax.jit(jax.vmap(op, in_axes=(0, None)))
    assert host_call_count(f.lower(x1, x2)) == 1
    np.testing.assert_allclose(f(x1, x2), x1 * x2**2, rtol=1e-12)
    assert record == [((4, 3), (1, 3))]


def test_vectorized_nested_vmap_merges_into_one_axis():
    record = []
    op = _recording("vectorized", record)
    x1, x2 = randn((2, 4, 3)), randn((4, 3), seed=1)
    out = jax.vmap(jax.vmap(op), in_axes=(0, None))(x1, x2)
    np.testing.assert_allclose(out, x1 * x2[None] ** 2, rtol=1e-12)
    assert record == [((8, 3), (8, 3))]


@pytest.mark.parametrize("traced", [False, True])
def test_vmap_rule_gets_axis_size_and_in_batched(traced):
    seen = []
    xp = jnp if traced else np

    def rule(axis_size, in_batched, x, *, w, k):
        seen.append((axis_size, tuple(in_batched), dict(in_batched.kwargs), k))
        x = x if in_batched[0] else x[None]
        w = w if in_batched.kwargs["w"] else w[None]
        return xp.broadcast_to(x * w + k, (axis_size,) + x.shape[1:]), True

    op = ab.bind(lambda x, *, w, k: x * w + k, shape=ab.like(0), traced=traced, vmap=rule,
                 name=f"ruled_{traced}")
    x, w = randn((5, 3)), randn(3, seed=1)
    out = jax.vmap(lambda x: op(x, w=w, k=2.0))(x)
    np.testing.assert_allclose(out, x * w + 2.0, rtol=1e-12)
    out = jax.vmap(lambda w: op(x[0], w=w, k=2.0))(x)
    np.testing.assert_allclose(out, x[0] * x + 2.0, rtol=1e-12)
    # (a traced rule is also traced abstractly, once, to read its out_batched)
    distinct = [s for i, s in enumerate(seen) if s not in seen[:i]]
    assert distinct == [(5, (True,), {"w": False}, 2.0), (5, (False,), {"w": True}, 2.0)]


@pytest.mark.parametrize("traced", [False, True])
def test_vmap_rule_may_return_unbatched_output(traced):
    """out_batched=False: the result is the same for every row and is broadcast."""
    xp = jnp if traced else np

    def rule(axis_size, in_batched, x, y):
        # the op ignores y; batched only in y, the output is unbatched
        assert not in_batched[0] and in_batched[1]
        return 2 * x, False

    op = ab.bind(lambda x, y: 2 * x, shape=ab.like(0), traced=traced, vmap=rule,
                 name=f"ignores_y_{traced}")
    x, ys = randn(3), randn((4, 3), seed=1)
    out = jax.vmap(op, in_axes=(None, 0))(x, ys)
    np.testing.assert_allclose(out, xp.broadcast_to(2 * x, (4, 3)), rtol=1e-12)


def test_vmap_rule_with_pytree_out_batched():
    def fn(x):
        return {"row": x * 2, "const": np.ones(2)}

    def rule(axis_size, in_batched, x):
        return {"row": x * 2, "const": np.ones(2)}, {"row": True, "const": False}

    op = ab.bind(fn, shape=lambda x: {"row": x, "const": jax.ShapeDtypeStruct((2,), x.dtype)},
                 vmap=rule, name="tree_rule")
    x = randn((3, 4))
    out = jax.vmap(op)(x)
    np.testing.assert_allclose(out["row"], 2 * x, rtol=1e-12)
    np.testing.assert_allclose(out["const"], np.ones((3, 2)))


@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_derived_primitives_batch_in_the_ops_mode(mode):
    """The jvp and vjp rules of a vectorized op see the batch axis; a sequential op's see rows."""
    shapes = {"jvp": [], "vjp": []}

    def jvp(primals, tangents):
        shapes["jvp"].append(tangents[0].shape)
        return 2 * primals[0] * tangents[0]

    def vjp(primals, ct):
        shapes["vjp"].append(ct.shape)
        return (2 * primals[0] * ct,)

    op = ab.bind(np.square, shape=ab.like(0), jvp=jvp, vjp=vjp, vmap=mode, name=f"sq_{mode}")
    x, c = randn((4, 3)), randn((4, 3), seed=1)
    g = jax.vmap(lambda x, c: jax.vjp(op, x)[1](c)[0])(x, c)
    t = jax.vmap(lambda x: jax.jvp(op, (x,), (x,))[1])(x)
    np.testing.assert_allclose(g, 2 * x * c, rtol=1e-12)
    np.testing.assert_allclose(t, 2 * x * x, rtol=1e-12)
    expect = [(4, 3)] if mode == "vectorized" else [(3,)] * 4
    assert shapes == {"jvp": expect, "vjp": expect}


@pytest.mark.parametrize("mode", VMAP_MODES)
def test_sequential_vmap_of_scalar_rows(mode):
    """Rows that are scalars, in and out (the output buffer's rows are 0-d)."""
    total = ab.bind(lambda x: np.sum(x, axis=-1), vmap=_mode_arg(mode), name=f"total_{mode}",
                    shape=lambda x: jax.ShapeDtypeStruct(x.shape[:-1], x.dtype))
    neg = ab.bind(np.negative, shape=ab.like(0), vmap=_mode_arg(mode), name=f"neg_{mode}")
    if mode == "rule":
        total.def_vmap(lambda n, b, x: (np.sum(x, axis=-1), True))
        neg.def_vmap(lambda n, b, x: (np.negative(x), True))
    x = randn((4, 3))
    np.testing.assert_allclose(jax.vmap(total)(x), x.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(neg)(x[:, 0]), -x[:, 0], rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.vmap(neg))(x), -x, rtol=1e-12)


def _mode_arg(mode):
    return "sequential" if mode == "rule" else mode


# ------------------------------------------------- outputs a vmap rule leaves unbatched

def _pair_rule(xp):
    """(x, y) ↦ (2x, x·y); 2x is unbatched whenever x is."""
    def rule(axis_size, in_batched, x, y):
        xb = x if in_batched[0] else x[None]
        yb = y if in_batched[1] else y[None]
        prod = xp.broadcast_to(xb * yb, (axis_size,) + x.shape[in_batched[0]:])
        return (2 * x, prod), (in_batched[0], True)
    return rule


def _pair_ref(x, y):
    return 2 * x, x * y


@pytest.mark.parametrize("kind", ["traced", "host_declared", "host_declared_callable"])
def test_out_axes_none_for_outputs_the_vmap_rule_leaves_unbatched(kind):
    traced = kind == "traced"
    op = ab.bind(lambda x, y: (2 * x, x * y), shape=lambda x, y: (x, x), traced=traced,
                 name=f"pair_{kind}")
    declared = {"traced": None, "host_declared": (False, True),
                "host_declared_callable": lambda ib: (ib[0], True)}[kind]
    if traced:
        op.def_vmap(_pair_rule(jnp), traced=True)
    else:
        op.def_vmap(_pair_rule(np), out_batched=declared)
    x, ys, yss = randn(3), randn((4, 3), seed=1), randn((4, 2, 3), seed=2)
    once = lambda o: jax.vmap(o, in_axes=(None, 0), out_axes=(None, 0))
    twice = lambda o: jax.vmap(once(o), in_axes=(None, 1), out_axes=(None, 1))
    for f, y in ((once, ys), (lambda o: jax.jit(once(o)), ys), (twice, yss)):
        assert_tree_close(f(op)(x, y), f(_pair_ref)(x, y), rtol=1e-12, atol=1e-12)
    # differentiating through it: the unbatched output's tangent stays unbatched
    g = lambda o: jax.vmap(lambda x, y: jax.jvp(lambda a: o(a, y), (x,), (x,)),
                           in_axes=(None, 0), out_axes=((None, 0), (None, 0)))
    if kind != "traced":
        op.def_jvp(lambda p, t: (2 * t[0], t[0] * p[1] + p[0] * t[1]))
    assert_tree_close(g(op)(x, ys), g(_pair_ref)(x, ys), rtol=1e-12, atol=1e-12)
    if kind == "host_declared":  # the declaration is about this in_batched pattern only
        with pytest.raises(Exception, match=r"(?s)'pair_host_declared'.*vmap rule.*output 0.*"
                                            r"out_batched"):
            jax.block_until_ready(jax.vmap(op)(ys, ys))


def test_host_vmap_rule_without_declaration_batches_every_output():
    op = ab.bind(lambda x, y: (2 * x, x * y), shape=lambda x, y: (x, x), name="pair_undeclared")
    op.def_vmap(_pair_rule(np))
    x, ys = randn(3), randn((4, 3), seed=1)
    out = jax.vmap(op, in_axes=(None, 0))(x, ys)
    assert_tree_close(out, jax.vmap(_pair_ref, in_axes=(None, 0), out_axes=0)(x, ys))


def test_out_batched_declaration_is_for_host_rules_and_must_match_the_output():
    op = ab.bind(lambda x: x, traced=True, name="decl_traced")
    with pytest.raises(TypeError, match=r"'decl_traced'.*out_batched=.*host"):
        op.def_vmap(lambda n, ib, x: (x, True), traced=True, out_batched=True)
    op = ab.bind(lambda x: (x, x), shape=lambda x: (x, x), name="decl_tree")
    op.def_vmap(lambda n, ib, x: ((x, x), True), out_batched=(True,))
    with pytest.raises(TypeError, match=r"'decl_tree'.*out_batched declaration"):
        jax.vmap(op)(randn((2, 3)))


# a vmap rule's out_batched shaped unlike the output (one flag in a tuple for a single
# array) is a structure error naming out_batched, not a shape mismatch; a host rule's
# comes as a HostError (host code returned the wrong thing) whose cause is the TypeError
@pytest.mark.parametrize("traced", [False, True])
def test_out_batched_of_the_wrong_structure_is_named(traced):
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), traced=traced,
                 name=f"wrong_out_batched_{traced}")
    op.def_vmap(lambda n, ib, x: (2 * x, (True,)), traced=traced)
    error = TypeError if traced else ab.HostError
    with pytest.raises(error, match=r"(?s)'wrong_out_batched_.*vmap rule returned out_batched "
                                    r"of structure PyTreeDef\(\(\*,\)\), but PyTreeDef\(\*\) "
                                    r"was expected"):
        jax.block_until_ready(jax.vmap(op)(randn((2, 3))))
