"""The ducc0 layer under anybind.contrib.finufft: ``anybind.contrib.ducc0.nu2nu`` (type 3)
against its direct sum, ducc0 keywords for reverse mode (``reverse_options``), and single
precision below ducc0's single-precision limit, computed in double, for the three types."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, check_first_order, jvp_and_vjp, randn

pytest.importorskip("ducc0")
dj = pytest.importorskip("anybind.contrib.ducc0")


def _nu2nu_ref(c, x, s, forward=True):
    """y_k = Σ_j c_j exp(∓i s_k·x_j), by its definition."""
    return jnp.exp((-1j if forward else 1j) * (s @ x.T)) @ c


@pytest.mark.parametrize("nd,forward", [(1, True), (2, False), (3, True)])
def test_nu2nu_values_and_derivatives_match_the_direct_sum(nd, forward):
    r = np.random.default_rng(nd)
    x, s = r.uniform(-2, 2, (9, nd)), r.uniform(-4, 4, (6, nd))
    c = randn((2, 9), np.complex128)
    ours = lambda c, x, s: dj.nu2nu(c, x, s, forward=forward, epsilon=1e-12)  # noqa: E731
    ref = lambda c, x, s: _nu2nu_ref(c.T, x, s, forward).T                  # noqa: E731
    dargs = (randn(c.shape, np.complex128, seed=1), randn(x.shape, seed=2), randn(s.shape, seed=3))
    ybar = randn((2, 6), np.complex128, seed=4)
    got, want = jvp_and_vjp([ours, ref], (c, x, s), dargs, ybar)
    assert_close(got, want, rtol=1e-9, atol=1e-9)
    check_first_order(jax.jit(ours), (c, x, s), rtol=1e-5, atol=1e-6)
    # linear in the values: the transpose runs from the targets back to the sources
    ct = jax.linear_transpose(lambda c: ours(c, x, s), c)(ybar)[0]
    assert_close(ct, dj.nu2nu(ybar, s, x, forward=forward, epsilon=1e-12), rtol=1e-12)


def test_reverse_options_reach_the_transposed_transforms(monkeypatch):
    """The transforms reverse mode runs get ``reverse_options``; the forward ones do not."""
    import anybind.contrib._ducc0_nufft as nufft
    seen = []
    real = nufft.run

    def spy(transform, dtype, ndim, kw, out, **arrays):
        seen.append((transform.__name__, kw.get("nthreads")))
        return real(transform, dtype, ndim, kw, out, **arrays)
    monkeypatch.setattr(nufft, "run", spy)
    r = np.random.default_rng(0)
    x, c = r.uniform(-3, 3, (8, 1)), randn((8,), np.complex128)
    loss = lambda c: jnp.sum(jnp.abs(dj.nu2u(c, x, n_modes=(5,), nthreads=1,  # noqa: E731
                                             reverse_options=(("nthreads", 2),))) ** 2)
    g = jax.grad(loss)(c)
    assert ("nu2u", 1) in seen and ("u2nu", 2) in seen and ("u2nu", 1) not in seen
    ref = jax.grad(lambda c: jnp.sum(jnp.abs(dj.nu2u(c, x, n_modes=(5,))) ** 2))(c)
    assert_close(g, ref, rtol=1e-9, atol=1e-9)


def test_single_precision_below_the_limit_runs_in_double():
    """complex64 at epsilon 1e-7 (ducc0 reaches ~3e-7 in single): in double, rounded."""
    r = np.random.default_rng(5)
    x, s = r.uniform(-3, 3, (30, 2)), r.uniform(-3, 3, (7, 2))
    c, g = randn((30,), np.complex128), randn((6, 5), np.complex128)
    x32, s32 = x.astype(np.float32), s.astype(np.float32)
    c32, g32 = c.astype(np.complex64), g.astype(np.complex64)
    cases = [(dj.nu2u(c32, x32, n_modes=(6, 5), epsilon=1e-7),
              dj.nu2u(c32.astype(complex), x32.astype(float), n_modes=(6, 5), epsilon=1e-13)),
             (dj.u2nu(g32, x32, epsilon=1e-7),
              dj.u2nu(g32.astype(complex), x32.astype(float), epsilon=1e-13)),
             (dj.nu2nu(c32, x32, s32, epsilon=1e-7),
              dj.nu2nu(c32.astype(complex), x32.astype(float), s32.astype(float),
                       epsilon=1e-13))]
    for got, want in cases:
        assert got.dtype == np.complex64
        want = np.asarray(want)
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-7 * np.abs(want).max())


def test_nu2nu_bad_input_is_a_clear_error():
    with pytest.raises(Exception, match="ducc0_nu2nu.*coord_in and coord_out need the same"):
        dj.nu2nu(np.ones(3, complex), np.zeros((3, 1)), np.zeros((4, 2)))
    with pytest.raises(Exception, match="ducc0_nu2nu.*coord_out must be a .* of float64"):
        dj.nu2nu(np.ones(3, complex), np.zeros((3, 1)), np.zeros((4, 1), np.float32))
