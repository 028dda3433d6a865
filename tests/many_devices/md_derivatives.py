"""Derivatives and batching of per-shard ops: every derived primitive shards by the op's rule.

Numbers are checked against the ops' pure-JAX references (and the transpose
identity for the linear op); the compiled programs have no gathers, and host
rules run once per device on the shard's shape.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import N_DEV, collectives, hlo, mesh, put, spec
from sharded_ops import (
    MODES,
    REC,
    cube,
    cube_ref,
    cube_traced,
    rowfft,
    rowfft_ref,
    saved,
    saved_ref,
    scale,
    scale_ref,
    stats,
    stats_ref,
)

from helpers import assert_close, check_transpose_identity, randn


@pytest.fixture(params=("auto", "explicit"))
def m(request):
    mm = mesh(request.param)
    with jax.set_mesh(mm):
        yield mm


def loss(f):
    return lambda x, w: jnp.sum(f(x, w) ** 2)


@pytest.mark.parametrize("traced_rules", [False, True])
def test_jit_grad_per_shard(m, traced_rules):
    op = scale(traced_rules=traced_rules)
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)
    g = jax.jit(jax.grad(loss(op), argnums=(0, 1)))
    REC.take()
    got = g(x, w)
    assert_close(got, jax.grad(loss(scale_ref), argnums=(0, 1))(np.asarray(x), np.asarray(w)))
    calls = REC.take()
    assert {c[1][0] for c in calls} == {(2, 4)}  # every host call on a (2, 4) shard of x
    if not traced_rules:  # the vjp rule runs per shard; w̄ is the sum over shards
        assert len([c for c in calls if c[0] == "vjp"]) == N_DEV
    assert spec(got[0]) == ("x", None)
    assert collectives(hlo(jax.grad(loss(op), argnums=(0, 1)), x, w)) == []


@pytest.mark.parametrize("mode", MODES)
def test_jit_vmap_every_mode(m, mode):
    op = scale(mode)
    x = put(randn((8, 16, 4)), m, None, "x")  # the op's own rows split, the batch whole
    w = put(randn((8, 4), seed=1), m)
    v = jax.jit(jax.vmap(op))
    REC.take()
    assert_close(v(x, w), jax.vmap(scale_ref)(np.asarray(x), np.asarray(w)))
    shapes = {c[1][0] for c in REC.take("f")}
    assert shapes == ({(16 // N_DEV, 4)} if mode == "sequential" else {(8, 16 // N_DEV, 4)})
    assert collectives(hlo(jax.vmap(op), x, w)) == []
    # the batch axis split instead: each device runs its slice of the batch
    xb, wb = put(randn((8, 16, 4)), m, "x"), put(w, m, "x")  # Explicit: batch split alike
    REC.take()
    assert_close(v(xb, wb), jax.vmap(scale_ref)(np.asarray(xb), np.asarray(wb)))
    assert collectives(hlo(jax.vmap(op), xb, wb)) == []
    # and grad of vmap keeps the rules per shard
    gv = jax.jit(jax.grad(lambda x, w: jnp.sum(jax.vmap(op)(x, w) ** 2), argnums=(0, 1)))
    ref = jax.grad(lambda x, w: jnp.sum(jax.vmap(scale_ref)(x, w) ** 2), argnums=(0, 1))
    assert_close(gv(x, w), ref(np.asarray(x), np.asarray(w)))


def test_vmap_with_an_unbatched_operand(m):
    op = scale("vectorized")
    x, w = put(randn((8, 16, 4)), m, "x"), put(randn(4, seed=1), m)
    f = jax.vmap(op, in_axes=(0, None))
    assert_close(jax.jit(f)(x, w), jax.vmap(scale_ref, in_axes=(0, None))(np.asarray(x),
                                                                          np.asarray(w)))
    g = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)))
    ref = jax.grad(lambda x, w: jnp.sum(jax.vmap(scale_ref, in_axes=(0, None))(x, w) ** 2),
                   argnums=(0, 1))
    assert_close(g(x, w), ref(np.asarray(x), np.asarray(w)))
    assert collectives(hlo(jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)),
                           x, w)) == []


@pytest.mark.parametrize("make", [cube, cube_traced], ids=["host", "traced"])
def test_forward_mode_and_linearize(m, make):
    op = make()
    x, dx = put(randn((16, 4)), m, "x"), put(randn((16, 4), seed=2), m, "x")
    REC.take()
    y, t = jax.jit(lambda x, dx: jax.jvp(op, (x,), (dx,)))(x, dx)
    y_ref, t_ref = jax.jvp(cube_ref, (np.asarray(x),), (np.asarray(dx),))
    assert_close(y, y_ref)
    assert_close(t, t_ref)
    assert {c[1][0] for c in REC.take()} == {(2, 4)}
    _, lin = jax.linearize(op, x)
    assert_close(jax.jit(lin)(dx), t_ref)
    assert collectives(hlo(lambda x, dx: jax.jvp(op, (x,), (dx,)), x, dx)) == []


def test_jacfwd_and_jacrev(m):
    x = put(randn((8, 2)), m, "x")
    for jac in (jax.jacfwd, jax.jacrev):
        assert_close(jax.jit(jac(cube()))(x), jac(cube_ref)(np.asarray(x)))
        assert_close(jax.jit(jac(cube_traced()))(x), jac(cube_ref)(np.asarray(x)))
    w = put(randn(2, seed=1), m)
    for jac in (jax.jacfwd, jax.jacrev):
        got = jax.jit(jac(scale(), argnums=(0, 1)))(x, w)
        assert_close(got, jac(scale_ref, argnums=(0, 1))(np.asarray(x), np.asarray(w)))


def test_linear_op_transpose_per_shard(m):
    op = rowfft()
    x = put(randn((16, 8), np.complex128), m, "x")
    ybar = put(randn((16, 8), np.complex128, seed=3), m, "x")
    REC.take()
    (got,) = jax.block_until_ready(jax.jit(jax.linear_transpose(op, x))(ybar))
    assert [c for c in REC.take() if c[0] == "transpose"] == [("transpose", ((2, 8),))] * N_DEV
    (want,) = jax.linear_transpose(rowfft_ref, np.asarray(x))(np.asarray(ybar))
    assert_close(got, want)
    assert collectives(hlo(jax.linear_transpose(op, x), ybar)) == []
    check_transpose_identity(jax.jit(op), x, put(randn((16, 8), np.complex128, seed=4), m, "x"),
                             ybar)
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.abs(op(x)) ** 2)))
    assert_close(g(x), jax.grad(lambda x: jnp.sum(jnp.abs(rowfft_ref(x)) ** 2))(np.asarray(x)))


def test_keyword_operand_and_two_outputs_under_grad(m):
    x, w = put(randn((16, 4)), m, "x"), put(randn(4, seed=1), m)

    def loss(f):
        return lambda x, w: sum(jnp.sum(jnp.sin(o)) for o in f(x, w))
    g = jax.jit(jax.grad(loss(lambda x, w: stats()(x, w=w))))
    assert_close(g(x, w), jax.grad(loss(stats_ref))(np.asarray(x), np.asarray(w)))
    assert collectives(hlo(jax.grad(loss(lambda x, w: stats()(x, w=w))), x, w)) == []


def test_fwd_and_bwd_with_residuals(m):
    x = put(randn((16, 4)), m, "x")
    REC.take()
    g = jax.jit(jax.grad(lambda x: jnp.sum(saved()(x))))
    assert_close(g(x), jax.grad(lambda x: jnp.sum(saved_ref(x)))(np.asarray(x)))
    calls = REC.take()
    assert calls.count(("fwd", ((2, 4),))) == N_DEV
    assert calls.count(("bwd", ((2, 4), (2, 4)))) == N_DEV
    assert collectives(hlo(jax.grad(lambda x: jnp.sum(saved()(x))), x)) == []
