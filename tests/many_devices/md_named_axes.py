"""A traced op whose code uses shard_map's manual axes (lax.psum, lax.axis_index),
against the same code written with jax.custom_jvp."""
import jax
import jax.numpy as jnp
import pytest
from devices import mesh, put
from jax import lax
from jax.sharding import PartitionSpec as P

import anybind as ab
from helpers import assert_close


def _pair(fn, rule):
    op = ab.bind(fn, traced=True, jvp=rule, name="manual")
    ref = jax.custom_jvp(fn)
    ref.defjvp(lambda p, t: (fn(*p), rule(p, t)))
    return op, ref


def _psum():
    return _pair(lambda x: lax.psum(x, "x"), lambda p, t: lax.psum(t[0], "x"))


def _ramp():
    def fn(x):
        return x * (1. + lax.axis_index("x").astype(x.dtype))
    return _pair(fn, lambda p, t: fn(t[0]))


@pytest.mark.parametrize("make", [_psum, _ramp], ids=["psum", "axis_index"])
@pytest.mark.parametrize("transform", ["jit", "jvp", "grad", "vmap_named"])
def test_manual_axes(make, transform):
    op, ref = make()
    m = mesh()
    with jax.set_mesh(m):
        x = put(jnp.arange(16.), m, "x")

        def run(f):
            sm = jax.shard_map(f, mesh=m, in_specs=P("x"), out_specs=P("x"))
            return {
                "jit": lambda: jax.jit(sm)(x),
                "jvp": lambda: jax.jvp(sm, (x,), (jnp.cos(x),)),
                "grad": lambda: jax.grad(lambda y: jnp.sum(jnp.sin(sm(y))))(x),
                "vmap_named": lambda: jax.jit(jax.shard_map(
                    jax.vmap(f, axis_name="v"), mesh=m,
                    in_specs=P("x"), out_specs=P("x")))(x.reshape(8, 2)),
            }[transform]()
        assert_close(run(op), run(ref))
