"""contrib ops on 8 devices: each runs per shard by its declared rule, derivatives included."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import collectives, hlo, mesh, put, spec

from helpers import assert_close, randn

pytest.importorskip("ducc0")
pytest.importorskip("scipy")
from anybind.contrib._ducc0_sht import n_real_alm  # noqa: E402
from anybind.contrib.ducc0 import c2c, healpix_synthesis, r2c  # noqa: E402
from anybind.contrib.scipy import gammaln, spsolve  # noqa: E402


@pytest.fixture(scope="module")
def m():
    return mesh("auto")


def test_ffts_split_rows_and_keep_the_transformed_axis_whole(m):
    z = put(randn((16, 8), np.complex128), m, "x")
    f = lambda z: c2c(z, axes=(1,))
    assert_close(jax.jit(f)(z), np.fft.fft(np.asarray(z), axis=1))
    assert spec(jax.jit(f)(z)) == ("x", None)
    power = lambda f: (lambda z: jnp.sum(jnp.abs(f(z)) ** 2))
    g = jax.jit(jax.grad(power(f)))(z)
    assert_close(g, jax.grad(power(lambda z: jnp.fft.fft(z, axis=1)))(np.asarray(z)))
    for fn in (f, jax.grad(power(f))):
        assert collectives(hlo(fn, z)) == []
    x = put(randn((16, 8)), m, "x")
    assert_close(jax.jit(lambda x: r2c(x, axes=(1,)))(x), np.fft.rfft(np.asarray(x), axis=1))
    assert collectives(hlo(lambda x: r2c(x, axes=(1,)), x)) == []


def test_special_functions_are_elementwise(m):
    x = put(np.linspace(0.5, 4.0, 64), m, "x")
    assert_close(jax.jit(gammaln)(x), jax.scipy.special.gammaln(np.asarray(x)))
    g = jax.jit(jax.grad(lambda x: jnp.sum(gammaln(x))))(x)
    assert_close(g, jax.scipy.special.digamma(np.asarray(x)), rtol=1e-8)
    assert collectives(hlo(jax.grad(lambda x: jnp.sum(gammaln(x))), x)) == []


def test_sht_splits_leading_axes(m):
    alm = put(randn((8, 1, n_real_alm(3))), m, "x")
    f = lambda a: healpix_synthesis(a, nside=2, lmax=3)
    got = jax.jit(f)(alm)
    want = jnp.stack([f(np.asarray(alm)[i]) for i in range(8)])
    assert_close(got, want)
    assert collectives(hlo(f, alm)) == []


def test_spsolve_stays_whole(m):
    from scipy import sparse
    a = sparse.csr_matrix(np.diag(np.arange(2.0, 10.0)) + np.diag(np.ones(7), 1))
    b = put(randn(8), m, "x")
    x = jax.jit(lambda d, b: spsolve(d, b, indices=a.indices.astype(np.int32),
                                     indptr=a.indptr.astype(np.int32)))(a.data, b)
    assert_close(x, np.linalg.solve(a.toarray(), np.asarray(b)))
