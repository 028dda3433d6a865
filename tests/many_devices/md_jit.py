"""Plain jit with NamedSharding inputs: one host call per device on its shard.

On Auto mesh axes (``jax.sharding.Mesh``'s default) XLA propagates shardings;
on Explicit ones (``jax.make_mesh``'s default) the op's types carry them.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import N_DEV, collectives, hlo, mesh, put, spec
from jax.sharding import PartitionSpec as P
from sharded_ops import REC, cube, cube_ref, scale, scale_ref, stats, stats_ref

from helpers import assert_close, randn

AXES = ("auto", "explicit")


@pytest.fixture(params=AXES)
def m(request):
    mm = mesh(request.param)
    with jax.set_mesh(mm):
        yield mm


def test_one_host_call_per_device_on_its_shard(m):
    op = scale()
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    REC.take()
    out = jax.jit(op)(x, w)
    assert_close(out, scale_ref(np.asarray(x), np.asarray(w)))
    # each device: its (2, 4) rows of x, and the replicated weight whole
    assert REC.take("f") == [("f", ((2, 4), (4,)))] * N_DEV
    assert spec(out) == ("x", None)
    assert collectives(hlo(op, x, w)) == []


def test_explicit_types_carry_the_rule():
    m = mesh("explicit")
    with jax.set_mesh(m):
        x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
        assert jax.typeof(jax.jit(scale())(x, w)).sharding.spec == P("x", None)
        y, s = jax.jit(stats())(x, w=w)
        assert jax.typeof(s).sharding.spec == P("x")
        # an elementwise op takes both axes of its operands
        x2 = put(randn((16, 4)), mesh("explicit", (4, 2), ("a", "b")), "a", "b")
    with jax.set_mesh(x2.sharding.mesh):
        assert jax.typeof(jax.jit(cube())(x2)).sharding.spec == P("a", "b")


def test_explicit_conflicting_splits_are_a_type_error():
    m = mesh("explicit", (4, 2), ("a", "b"))
    op = jax.jit(lambda x, y: ab_add(x, y))
    with jax.set_mesh(m):
        x, y = put(randn((8, 4)), m, "a", "b"), put(randn((8, 4)), m, "b", "a")
        with pytest.raises(TypeError, match=r"anybind op 'add_ew'.*split one factor"):
            op(x, y)


def ab_add(x, y):
    import anybind as ab
    global _ADD
    try:
        add = _ADD
    except NameError:
        add = _ADD = ab.bind(np.add, shape=ab.like(0), shard="elementwise", name="add_ew")
    return add(x, y)


def test_two_mesh_axes_and_elementwise(m):
    mm = mesh(m.axis_types[0].name.lower(), (4, 2), ("a", "b"))
    with jax.set_mesh(mm):
        x = put(randn((16, 4)), mm, "a", "b")
        REC.take()
        out = jax.jit(cube())(x)
        assert_close(out, cube_ref(np.asarray(x)))
        assert REC.take("f") == [("f", ((4, 2),))] * N_DEV
        assert spec(out) == ("a", "b")
        assert collectives(hlo(cube(), x)) == []


def test_keyword_operand_and_an_output_without_the_replicated_factor(m):
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    REC.take()
    y, s = jax.jit(lambda x, w: stats()(x, w=w))(x, w)
    for a, b in zip((y, s), stats_ref(np.asarray(x), np.asarray(w))):
        assert_close(a, b)
    assert REC.take("f") == [("f", ((2, 4), (4,)))] * N_DEV
    assert spec(s) == ("x",)


def test_a_split_replicated_factor_is_gathered():
    """Inputs split along the FFT-like axis n: the rule keeps n whole, so XLA gathers it."""
    m = mesh("auto", (4, 2), ("a", "b"))
    x, w = put(randn((16, 4)), m, "a", "b"), put(randn(4, seed=1), m, "b")
    REC.take()
    assert_close(jax.jit(scale())(x, w), scale_ref(np.asarray(x), np.asarray(w)))
    assert set(REC.take("f")) == {("f", ((4, 4), (4,)))}


def test_sizes_that_do_not_divide_run_whole():
    m = mesh("auto")
    x = put(randn((12, 3)), m)  # 12 rows over 8 devices: not split
    x = jax.device_put(x, jax.sharding.NamedSharding(m, jax.sharding.PartitionSpec()))
    REC.take()
    f = jax.jit(cube(), in_shardings=jax.sharding.NamedSharding(
        m, jax.sharding.PartitionSpec()))
    assert_close(f(x), cube_ref(np.asarray(x)))
    assert set(REC.take("f")) == {("f", ((12, 3),))}


def test_replicated_inputs_run_whole_on_every_device():
    """What an op without shard= does too: each device computes the whole result."""
    m = mesh("auto")
    x = put(randn((16, 4)), m)
    REC.take()
    assert_close(jax.jit(cube())(x), cube_ref(np.asarray(x)))
    assert set(REC.take("f")) == {("f", ((16, 4),))}


def test_inside_larger_programs(m):
    """The per-shard op composes with XLA's own sharded ops around it."""
    op = scale()
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    f = jax.jit(lambda x, w: jnp.tanh(op(2 * x, w)) + op(x, w + 1))
    ref = jnp.tanh(scale_ref(2 * np.asarray(x), np.asarray(w))) + scale_ref(np.asarray(x),
                                                                            np.asarray(w) + 1)
    REC.take()
    assert_close(f(x, w), ref)
    assert len(REC.take("f")) == 2 * N_DEV
    assert collectives(hlo(f, x, w)) == []


def test_a_plain_mesh_without_a_mesh_context():
    """``jax.sharding.Mesh`` (Auto axes) and NamedSharding inputs alone, no set_mesh."""
    m = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    REC.take()
    out = jax.jit(scale())(x, w)
    assert_close(out, scale_ref(np.asarray(x), np.asarray(w)))
    assert REC.take("f") == [("f", ((2, 4), (4,)))] * N_DEV
    assert spec(out) == ("x", None)


@functools.cache  # one function per stable name: every test uses the same op
def _compiled_mul():
    numba = pytest.importorskip("numba")
    import anybind as ab

    @numba.cfunc(ab.numba_signature())
    def mul(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        n = 1
        for d in range(ranks[0]):
            n *= shapes[0][d]
        x1, x2 = numba.carray(ins[0], n, np.float64), numba.carray(ins[1], n, np.float64)
        y = numba.carray(outs[0], n, np.float64)
        for i in range(n):
            y[i] = x1[i] * x2[i] ** 2
        return 0
    return ab.bind(mul, shape=ab.like(0), shard="elementwise", name="compiled_mul")


def test_compiled_functions_run_per_shard_too(m):
    op = _compiled_mul()
    x1, x2 = put(randn((16, 4)), m, "x"), put(randn((16, 4), seed=1), m, "x")
    out = jax.jit(op)(x1, x2)
    assert_close(out, np.asarray(x1) * np.asarray(x2) ** 2)
    assert spec(out) == ("x", None)
    text = hlo(op, x1, x2)
    assert collectives(text) == []
    assert "f64[2,4]" in text and "f64[16,4]" not in text  # the FFI call sees the shard
