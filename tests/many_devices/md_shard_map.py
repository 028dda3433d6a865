"""Inside shard_map: outputs vary over the manual axes of their operands (vma typing)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import N_DEV, mesh, put
from jax.sharding import PartitionSpec as P
from sharded_ops import REC, cube, scale, scale_ref

import anybind as ab
from anybind.core._jax import varying_axes
from helpers import assert_close, randn


@pytest.fixture(params=("auto", "explicit"))
def m(request):
    mm = mesh(request.param)
    with jax.set_mesh(mm):
        yield mm


def smap(f, m, in_specs=(P("x"), P()), out_specs=P("x")):
    return jax.shard_map(f, mesh=m, in_specs=in_specs, out_specs=out_specs)


def loss(f):
    return lambda x, w: jnp.sum(jnp.sin(f(x, w)))


@pytest.mark.parametrize("make", [lambda: scale(), lambda: scale(traced_rules=True),
                                  lambda: ab.bind(lambda x, w: x * np.sin(w)[None, :],
                                                  shape=ab.like(0), name="unsharded_scale",
                                                  jvp=lambda p, t: t[0] * np.sin(p[1])[None, :]
                                                  + p[0] * (np.cos(p[1]) * t[1])[None, :],
                                                  vjp=lambda p, ct: (
                                                      ct * np.sin(p[1])[None, :],
                                                      (ct * p[0] * np.cos(p[1])).sum(0)))],
                         ids=["shard", "traced", "no_shard"])
def test_grad_jvp_vmap_with_vma_checks(m, make):
    """x varies over 'x', w does not: w̄ sums the shards' cotangents (JAX's psum)."""
    op = make()
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    xs, ws = np.asarray(x), np.asarray(w)
    f = smap(op, m)
    REC.take()
    assert_close(jax.jit(f)(x, w), scale_ref(xs, ws))
    if op.name.startswith("scale"):
        assert set(REC.take("f")) == {("f", ((2, 4), (4,)))}
    g = jax.jit(jax.grad(loss(f), argnums=(0, 1)))(x, w)
    assert_close(g, jax.grad(loss(scale_ref), argnums=(0, 1))(xs, ws))
    t = jax.jit(lambda x, w: jax.jvp(f, (x, w), (x, w))[1])(x, w)
    assert_close(t, jax.jvp(scale_ref, (xs, ws), (xs, ws))[1])
    wb = put(randn((3, 4), seed=2), m)
    vb = jax.jit(jax.vmap(f, in_axes=(None, 0)))(x, wb)
    assert_close(vb, jax.vmap(scale_ref, in_axes=(None, 0))(xs, np.asarray(wb)))


def assert_vma(y, axes):
    assert varying_axes(jax.typeof(y)) == frozenset(axes), jax.typeof(y)
    return y


def test_outputs_carry_the_operands_varying_axes(m):
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)

    def body(x, w):
        assert_vma(scale()(x, w), {"x"})
        assert_vma(cube()(w), set())  # an invariant operand gives an invariant output
        return scale()(x, w)
    jax.jit(smap(body, m))(x, w)


def test_out_specs_that_drop_a_varying_axis_are_rejected(m):
    """Before vma typing this returned one device's shard silently."""
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    with pytest.raises(ValueError, match="out_specs"):
        jax.jit(smap(scale(), m, out_specs=P()))(x, w)


def test_each_device_runs_the_whole_local_block(m):
    x = put(randn((16, 4)), m, "x")
    REC.take()
    assert_close(jax.jit(smap(cube(), m, in_specs=P("x")))(x), np.asarray(x) ** 3)
    assert REC.take("f") == [("f", ((2, 4),))] * N_DEV
