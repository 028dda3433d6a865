"""The vmap modes by JAX's ``vmap_method`` names: how host code batches under ``jax.vmap``.

``"sequential"`` (one call per row), ``"expand_dims"`` (one call, unbatched
arguments with a leading axis of 1; ``"vectorized"`` is its older name) and
``"broadcast_all"`` (one call, unbatched arguments broadcast to the batch), for the
function and for each rule, checked against jax.numpy references.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import check_first_order, randn

MODES = ("sequential", "expand_dims", "broadcast_all", "vectorized")


def _matvec(mode: str, seen: list):
    """y = x @ W, written once for every mode with einsum's ellipsis: one row and one
    matrix, a stack of rows with one matrix of leading axis 1, or a stack of each."""
    def fn(x, w):
        seen.append((x.shape, w.shape))
        return np.einsum("...i,...ij->...j", x, w)

    def jvp(primals, tangents):
        (x, w), (dx, dw) = primals, tangents
        return np.einsum("...i,...ij->...j", dx, w) + np.einsum("...i,...ij->...j", x, dw)

    def vjp(primals, ct):  # per-row cotangents of an unbatched w: anybind sums them
        x, w = primals
        return np.einsum("...j,...ij->...i", ct, w), np.einsum("...i,...j->...ij", x, ct)

    return ab.bind(fn, shape=lambda x, w: jax.ShapeDtypeStruct(x.shape[:-1] + w.shape[-1:],
                                                               x.dtype),
                   jvp=jvp, vjp=vjp, vmap=mode, name=f"matvec_{mode}")


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_batches_an_unbatched_matrix_as_jax_does(mode):
    seen: list = []
    op = _matvec(mode, seen)
    x, w = randn((4, 3)), randn((3, 2), seed=1)
    got = jax.jit(jax.vmap(op, in_axes=(0, None)))(x, w)
    np.testing.assert_allclose(got, x @ w, rtol=1e-12)
    expected = {"sequential": [((3,), (3, 2))] * 4,
                "expand_dims": [((4, 3), (1, 3, 2))], "vectorized": [((4, 3), (1, 3, 2))],
                "broadcast_all": [((4, 3), (4, 3, 2))]}[mode]
    assert seen == expected


@pytest.mark.parametrize("mode", ("expand_dims", "broadcast_all"))
def test_vectorized_is_expand_dims_and_the_op_says_its_mode(mode):
    op = ab.bind(np.sin, shape=ab.like(0), vmap=mode if mode != "expand_dims" else "vectorized")
    assert op.vmap == mode
    assert f"vmap={mode!r}" in repr(op)


def test_broadcast_all_gives_read_only_views_not_copies():
    """Unbatched arguments are broadcast as views of XLA's one row: nothing to write into."""
    seen = []

    def fn(x, w):
        seen.append((w.strides[0], w.flags.writeable))
        return x + w

    op = ab.bind(fn, shape=ab.like(0), vmap="broadcast_all", name="bcast_views")
    jax.vmap(op, in_axes=(0, None))(jnp.ones((5, 3)), jnp.arange(3.0))
    assert seen == [(0, False)]


@pytest.mark.parametrize("mode", ("sequential", "expand_dims", "broadcast_all"))
def test_derivatives_under_vmap_in_each_mode(mode):
    """The rules batch by the op's mode too; jvp and vjp checked against finite
    differences and the transpose identity, row by row, under vmap."""
    x, w = randn((4, 3), seed=2), randn((4, 3, 2), seed=3)
    op = _matvec(mode, [])
    f = jax.vmap(op)
    check_first_order(f, (x, w))


@pytest.mark.parametrize("mode", ("sequential", "expand_dims", "broadcast_all"))
def test_a_rules_own_vmap_mode(mode):
    """``def_jvp(vmap=mode)`` batches that rule by ``mode`` whatever the op's mode is."""
    seen = []

    def jvp(primals, tangents):
        (x, c), (dx, dc) = primals, tangents
        seen.append(c.shape)
        return c * dx + x * dc

    op = ab.bind(lambda x, c: x * c, shape=ab.like(0), vmap="expand_dims", name="scale")
    op.def_jvp(jvp, vmap=mode)
    x, c = jnp.ones((4, 3)), jnp.full(3, 2.0)
    _, t = jax.vmap(lambda a: jax.jvp(op, (a, c), (jnp.ones(3), jnp.zeros(3))))(x)
    np.testing.assert_allclose(t, np.full((4, 3), 2.0))
    assert seen == {"sequential": [(3,)] * 4, "expand_dims": [(1, 3)],
                    "broadcast_all": [(4, 3)]}[mode]


def test_an_unknown_mode_names_the_modes():
    with pytest.raises(ValueError, match="broadcast_all"):
        ab.bind(np.sin, shape=ab.like(0), vmap="legacy_vectorized", name="bad_mode")
    op = ab.bind(np.sin, shape=ab.like(0), name="bad_rule_mode")
    with pytest.raises(ValueError, match="def_jvp's vmap"):
        op.def_jvp(lambda p, t: t[0], vmap="batched")


def test_compiled_code_refuses_broadcast_all_by_name():
    """A compiled function gets every operand's dims and indexes an unbatched one's single
    row itself; broadcasting is for Python host code, and saying so beats a wrong batch."""
    from compiled_ops import clib

    op = ab.bind(clib("ctypes")["mul"], shape=ab.like(0), vmap="broadcast_all",
                 name="mul_broadcast_all")
    x = jnp.ones((4, 3), jnp.float32)
    with pytest.raises(TypeError, match="mul_broadcast_all.*'broadcast_all' is for Python"):
        jax.jit(jax.vmap(op, in_axes=(0, None)))(x, x[0])
