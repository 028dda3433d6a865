"""ab.from_torch under shard=: the torch code runs per shard, and so do its derived rules.

The derived jvp shards like the function; the derived vjp splits only the
factors every input has (an input broadcast over a split factor would get a
per-shard partial sum), so its cotangents stay exact. Numbers against JAX's own.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import N_DEV, collectives, hlo, mesh, put, spec

from helpers import assert_close, randn

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402

import anybind as ab  # noqa: E402

SHAPES: list = []  # the shapes the torch code runs on (not those of shape inference)


def _record(x):
    if not isinstance(x, FakeTensor):
        SHAPES.append(tuple(x.shape))


def _scale(x, w):
    _record(x)
    return x * torch.sin(w)


def _scale_ref(x, w):
    return x * jnp.sin(w)[None]


def _cube(x):
    _record(x)
    return x ** 3


@pytest.fixture(params=("auto", "explicit"))
def m(request):
    mm = mesh(request.param)
    with jax.set_mesh(mm):
        yield mm


def test_forward_and_forward_mode_per_shard(m):
    op = ab.from_torch(_scale, shard="b n, n -> b n", replicated=("n",), name="tscale")
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    SHAPES.clear()
    out = jax.jit(op)(x, w)
    assert_close(out, _scale_ref(np.asarray(x), np.asarray(w)))
    assert SHAPES == [(2, 4)] * N_DEV and spec(out) == ("x", None)
    assert collectives(hlo(op, x, w)) == []
    dx, dw = put(randn((16, 4), seed=2), m, "x"), put(randn(4, seed=3), m)
    jvp = lambda x, w, dx, dw: jax.jvp(op, (x, w), (dx, dw))
    SHAPES.clear()
    got = jax.jit(jvp)(x, w, dx, dw)
    assert_close(got, jax.jvp(_scale_ref, *[tuple(map(np.asarray, a)) for a in
                                            ((x, w), (dx, dw))]))
    assert set(SHAPES) == {(2, 4)}  # the jvp (torch.func.jvp of the code) per shard
    # grad: w̄ sums over the rows, so the vjp keeps them whole; exact either way
    loss = lambda f: lambda x, w: jnp.sum(f(x, w) ** 2)
    g = jax.jit(jax.grad(loss(op), argnums=(0, 1)))(x, w)
    assert_close(g, jax.grad(loss(_scale_ref), argnums=(0, 1))(np.asarray(x), np.asarray(w)))


def test_elementwise_grad_and_hessian_per_shard(m):
    op = ab.from_torch(_cube, shard="elementwise", name="tcube")
    x = put(randn((16, 4)), m, "x")
    SHAPES.clear()
    g = jax.jit(jax.grad(lambda x: jnp.sum(op(x))))(x)
    assert_close(g, 3 * np.asarray(x) ** 2)
    assert set(SHAPES) == {(2, 4)} and spec(g) == ("x", None)
    hvp = jax.jit(lambda x, v: jax.jvp(jax.grad(lambda x: jnp.sum(op(x))), (x,), (v,))[1])
    assert_close(hvp(x, x), 6 * np.asarray(x) ** 2)
    assert collectives(hlo(jax.grad(lambda x: jnp.sum(op(x))), x)) == []
