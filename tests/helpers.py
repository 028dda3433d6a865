"""Shared numerical checks and reference ops for the test suite."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

SEED = 0


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(shape, dtype=np.float64, seed: int = SEED) -> np.ndarray:
    r = rng(seed)
    if np.issubdtype(dtype, np.complexfloating):
        return (r.normal(size=shape) + 1j * r.normal(size=shape)).astype(dtype)
    return r.normal(size=shape).astype(dtype)


def assert_close(a, b, rtol=1e-10, atol=1e-10):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def central_difference(f, x, dx, eps=None):
    """(f(x + h·dx) - f(x - h·dx)) / 2h with a step scaled to x."""
    if eps is None:
        scale = max(1.0, float(jnp.max(jnp.abs(jnp.asarray(x)))) if np.size(x) else 1.0)
        eps = 1e-6 * scale
    return jax.tree_util.tree_map(lambda p, m: (p - m) / (2 * eps), f(x + eps * dx),
                                  f(x - eps * dx))


def check_jvp_fd(f, x, dx, rtol=1e-6, atol=1e-6):
    """The JVP of f at x along dx matches central finite differences."""
    _, t = jax.jvp(f, (x,), (dx,))
    assert_close(t, central_difference(f, x, dx), rtol=rtol, atol=atol)


def check_transpose_identity(f, x, dx, ybar, rtol=1e-10, atol=1e-10):
    """⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩ for f at x (real inner product on re/im parts)."""
    _, jdx = jax.jvp(f, (x,), (dx,))
    _, pullback = jax.vjp(f, x)
    (jt_ybar,) = pullback(ybar)
    lhs = _inner(ybar, jdx)
    rhs = _inner(jt_ybar, dx)
    np.testing.assert_allclose(lhs, rhs, rtol=rtol, atol=atol)


def _inner(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.sum(a.real * b.real) + np.sum(a.imag * b.imag))
