"""anybind.contrib.ducc0 against independent references: jnp.fft, brute-force sums,
scipy's spherical harmonics, the wgridder's explicit DFT and direct ducc0 calls."""
from __future__ import annotations

import doctest
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, check_first_order, host_call_count, jvp_and_vjp, randn, tree_inner

ducc0 = pytest.importorskip("ducc0")
dj = pytest.importorskip("anybind.contrib.ducc0")
special = pytest.importorskip("scipy.special")

OPS = [name for name in dj.__all__ if isinstance(getattr(dj, name), ab.Op)]


@pytest.mark.slow  # ab.check's whole battery on every op; other tests here touch each module
@pytest.mark.parametrize("name", OPS)
def test_ab_check_passes_on_examples(name):
    report = ab.check(getattr(dj, name))
    skipped = [r for r in report.rows if r.status == "skipped"
               and r.note != "the rule splits no factor: the op runs whole"]
    assert report.ok and not skipped, str(report)


def run_docstrings(objects):
    """Run the examples in each object's docstring (Op instances included)."""
    parser = doctest.DocTestParser()
    for obj in objects:
        name = getattr(obj, "name", getattr(obj, "__name__", repr(obj)))
        test = parser.get_doctest(obj.__doc__ or "", {}, name, None, 0)
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
        assert result.failed == 0, f"docstring example of {name} failed"


def test_docstring_examples_run():
    import anybind.contrib as contrib
    from anybind.contrib import _ducc0_fft, _ducc0_nufft, _ducc0_sht, _ducc0_wgridder
    run_docstrings([contrib, contrib.require, dj, _ducc0_fft, _ducc0_nufft, _ducc0_sht,
                    _ducc0_wgridder, *[getattr(dj, n) for n in dj.__all__]])


# ------------------------------------------------------------------------ FFT

FFT_CASES = [((6,), None), ((4, 5), (0, 1)), ((3, 4, 5), (2, 0)), ((4, 7), (1,))]


def _norm(inorm, forward):
    return {0: "backward" if forward else "forward", 1: "ortho",
            2: "forward" if forward else "backward"}[inorm]


def _ref_fft(x, axes, forward, inorm):
    fn = jnp.fft.fftn if forward else jnp.fft.ifftn
    return fn(x, axes=axes, norm=_norm(inorm, forward))


def _values_and_transposes(fs, x, ybar):
    """[(f(x), fᵀ·ȳ) for each linear f], in one compiled program."""
    return jax.jit(lambda x, ybar: [(f(x), jax.linear_transpose(f, x)(ybar)[0])
                                    for f in fs])(x, ybar)


@pytest.mark.parametrize("shape,axes", FFT_CASES)
@pytest.mark.parametrize("forward,inorm", [(True, 0), (False, 2), (True, 1)])
def test_c2c_matches_jnp_fft(shape, axes, forward, inorm):
    x, ybar = randn(shape, np.complex128), randn(shape, np.complex128, seed=1)
    ours, ref = _values_and_transposes(
        [lambda v: dj.c2c(v, axes=axes, forward=forward, inorm=inorm),
         lambda v: _ref_fft(v, axes, forward, inorm)], x, ybar)
    assert_close(ours, ref)


@pytest.mark.parametrize("shape,axes", FFT_CASES)
def test_r2c_c2r_match_jnp_fft_and_its_transposes(shape, axes):
    x = randn(shape)
    ax = tuple(range(len(shape))) if axes is None else axes
    ref = lambda v: jnp.fft.rfftn(v, axes=ax)                      # noqa: E731
    ybar = randn(jax.eval_shape(ref, x).shape, np.complex128, seed=2)
    ours, want = _values_and_transposes([lambda v: dj.r2c(v, axes=axes), ref], x, ybar)
    assert_close(ours, want)
    n = shape[ax[-1]]
    s = [shape[a] for a in ax]
    inv = lambda y: dj.c2r(y, axes=axes, lastsize=n, forward=False, inorm=2)  # noqa: E731
    inv_ref = lambda y: jnp.fft.irfftn(y, s=s, axes=ax)           # noqa: E731
    (back, t), (_, t_ref) = _values_and_transposes([inv, inv_ref], want[0], randn(shape, seed=3))
    assert_close(back, x)
    assert_close(t, t_ref)


@pytest.mark.parametrize("n", [6, 7])
def test_fft_first_order_and_hessian(n):
    x = randn((2, n))
    for f in (lambda v: dj.r2c(v, inorm=1), lambda v: dj.hartley(v, axes=(1,)),
              lambda v: dj.c2r(dj.r2c(v), lastsize=n, forward=False)):
        check_first_order(jax.jit(f), (x,))
    loss = lambda v: jnp.sum(jnp.abs(dj.r2c(v)) ** 2 * jnp.cos(v[:, :n // 2 + 1]))  # noqa
    ref = lambda v: jnp.sum(jnp.abs(jnp.fft.rfftn(v)) ** 2 * jnp.cos(v[:, :n // 2 + 1]))  # noqa
    h, h_ref = jax.jit(lambda x: (jax.hessian(loss)(x), jax.hessian(ref)(x)))(x)
    assert_close(h, h_ref, rtol=1e-9, atol=1e-9)


def test_hartley_matches_real_minus_imaginary_fft():
    x = randn((4, 6))
    cases = [(None, 24), ((1,), 6), ((1, 0), 24)]                    # (axes, N)

    def both(x):
        return [(dj.hartley(x, axes=axes, inorm=2), jnp.fft.fftn(x, axes=axes) / n)
                for axes, n in cases]
    for h, f in jax.jit(both)(x):
        assert_close(h, f.real - f.imag)


def test_fft_vmap_is_one_call_over_the_batch_and_matches_a_loop():
    x = randn((3, 4, 6), np.complex128)
    f = lambda v: dj.c2c(v, axes=(1,))                             # noqa: E731

    def vmapped_and_looped(x):
        return [(jax.vmap(f, in_axes=a)(x), jnp.stack([f(v) for v in jnp.moveaxis(x, a, 0)]))
                for a in (0, 1, 2)]
    for got, want in jax.jit(vmapped_and_looped)(x):
        assert_close(got, want)
    lowered = jax.jit(jax.vmap(jax.grad(lambda v: dj.r2c(v).real.sum()))).lower(x.real)
    assert host_call_count(lowered) == 1
    g = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(jnp.abs(dj.r2c(v, axes=(0,))) ** 2))))
    ref = jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.rfft(v, axis=0)) ** 2))))
    assert_close(g(x.real), ref(x.real))


def test_fft_errors_name_the_op_and_argument():
    with pytest.raises(TypeError, match="ducc0_c2c.*complex"):
        dj.c2c(np.ones(4))
    with pytest.raises(Exception, match="axis 3 is out of range"):
        dj.c2c(np.ones(4, complex), axes=(3,))
    with pytest.raises(Exception, match="lastsize=9 does not fit"):
        dj.c2r(np.ones(4, complex), lastsize=9)


# ------------------------------------------------------------------------ SHT

def _sht_reference(ralm, nside, lmax, mmax):
    """Σ_l a_l0 Y_l0 + 2 Re Σ_{m>0} a_lm Y_lm at the HEALPix pixel centres (scipy)."""
    theta, phi = ducc0.healpix.Healpix_Base(nside, "RING").pix2ang(
        np.arange(12 * nside**2)).T
    alm = dj.realalm2alm(ralm, lmax)
    out, i = np.zeros(theta.shape), 0
    for m in range(mmax + 1):
        for ell in range(m, lmax + 1):
            y = special.sph_harm_y(ell, m, theta, phi)
            out += (1 if m == 0 else 2) * (alm[..., i] * y).real
            i += 1
    return out


@pytest.mark.parametrize("lmax,mmax", [(4, None), (5, 3)])
def test_healpix_synthesis_matches_scipy_spherical_harmonics(lmax, mmax):
    nside = 2
    ralm = randn((1, dj.n_real_alm(lmax, mmax)))
    got = dj.healpix_synthesis(ralm, nside=nside, lmax=lmax, mmax=mmax)
    assert_close(got[0], _sht_reference(ralm[0], nside, lmax, lmax if mmax is None else mmax))
    assert dj.nalm(lmax, mmax) * 2 - lmax - 1 == ralm.shape[-1]
    assert_close(dj.alm2realalm(dj.realalm2alm(ralm, lmax), lmax), ralm)


def test_healpix_spin2_matches_ducc0_and_transposes_into_the_adjoint():
    kw = dict(nside=2, lmax=4, mmax=4, spin=2)
    ralm = randn((3, 2, dj.n_real_alm(4)))                 # leading axis: 3 transforms
    got = dj.healpix_synthesis(ralm, **kw)
    info = ducc0.healpix.Healpix_Base(2, "RING").sht_info()
    direct = ducc0.sht.experimental.synthesis(alm=dj.realalm2alm(ralm, 4), lmax=4, mmax=4,
                                              spin=2, **info)
    assert_close(got, direct)
    check_first_order(lambda a: dj.healpix_synthesis(a, **kw), (ralm,))
    check_first_order(lambda m: dj.healpix_adjoint_synthesis(m, **kw), (np.asarray(got),))
    m = randn(got.shape, seed=4)
    assert_close(jax.linear_transpose(lambda a: dj.healpix_synthesis(a, **kw), ralm)(m),
                 (dj.healpix_adjoint_synthesis(m, **kw),))
    assert_close(jax.vmap(lambda a: dj.healpix_synthesis(a, **kw))(ralm),
                 jnp.stack([dj.healpix_synthesis(a, **kw) for a in ralm]))


def test_healpix_errors_name_the_op():
    with pytest.raises(Exception, match="healpix_synthesis.*shape \\(\\.\\.\\., 1, 25\\)"):
        dj.healpix_synthesis(np.ones((1, 24)), nside=2, lmax=4)


# ----------------------------------------------------------------------- NUFFT

def _phases(x, modes, forward=True, fft_order=False, period=2 * np.pi):
    """The matrix E_kj = exp(s·i·2π/P·k·x_j), k over the grid's frequencies (flat, C order),
    as cos θ + i sin θ (real sines compile faster than a complex exponential)."""
    ks = [np.fft.fftfreq(n, 1 / n) if fft_order else np.arange(n) - n // 2 for n in modes]
    k = np.stack([g.ravel() for g in np.meshgrid(*ks, indexing="ij")], axis=-1)   # (K, D)
    theta = ((-1 if forward else 1) * 2 * np.pi / period) * (k @ x.T)           # (K, M)
    return jax.lax.complex(jnp.cos(theta), jnp.sin(theta))


def _nu2u_ref(c, x, modes, **kw):
    """Type 1 by its definition: f = E·c on the grid."""
    return jnp.reshape(_phases(x, modes, **kw) @ c, modes)


def _u2nu_ref(g, x, **kw):
    """Type 2 by its definition: y = Eᵀ·g at the points."""
    return jnp.reshape(g, -1) @ _phases(x, g.shape, **kw)


NUFFT_CASES = [((5,), dict()), ((4, 3), dict(forward=False)),
               ((4, 5), dict(fft_order=True, periodicity=3.0))]


@pytest.mark.parametrize("modes,kw", NUFFT_CASES)
def test_nufft_values_derivatives_and_transposes_match_direct_sums(modes, kw):
    r = np.random.default_rng(5)
    m, d = 9, len(modes)
    x = r.uniform(-3.0, 3.0, size=(m, d))
    c, g = randn((m,), np.complex128), randn(modes, np.complex128, seed=1)
    ref_kw = dict(forward=kw.get("forward", True), fft_order=kw.get("fft_order", False),
                  period=kw.get("periodicity", 2 * np.pi))
    t1 = lambda c, x: dj.nu2u(c, x, n_modes=modes, epsilon=1e-12, **kw)  # noqa: E731
    r1 = lambda c, x: _nu2u_ref(c, x, modes, **ref_kw)                 # noqa: E731
    t2 = lambda g, x: dj.u2nu(g, x, epsilon=1e-12, **kw)               # noqa: E731
    r2 = lambda g, x: _u2nu_ref(g, x, **ref_kw)                        # noqa: E731
    # (op, reference, values, the other type, the output's shape)
    for f, ref, a, other, out in ((t1, r1, c, t2, modes), (t2, r2, g, t1, (m,))):
        dargs = (randn(a.shape, np.complex128, seed=2), randn(x.shape, seed=3))
        ybar = randn(out, np.complex128, seed=4)
        (y, t, vjp), (y_ref, t_ref, vjp_ref) = jvp_and_vjp([f, ref], (a, x), dargs, ybar)
        assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
        assert_close((t, vjp), (t_ref, vjp_ref), rtol=1e-8, atol=1e-8)
        check_first_order(jax.jit(f), (a, x), rtol=1e-5, atol=1e-6)
        # linear in the values: the transpose there is the reference's vjp in the values,
        # and the other type with the same sign (E·c ↦ Eᵀ·ȳ)
        a_bar, a_other = jax.jit(lambda x, ybar: (
            jax.linear_transpose(lambda a: f(a, x), a)(ybar)[0], other(ybar, x)))(x, ybar)
        assert_close(a_bar, vjp_ref[0], rtol=1e-8, atol=1e-8)
        assert_close(a_bar, a_other, rtol=1e-12, atol=1e-12)


def test_nufft_second_order_in_the_points():
    r = np.random.default_rng(6)
    x = r.uniform(-3.0, 3.0, size=(6, 2))
    c, g = randn((6,), np.complex128), randn((4, 3), np.complex128)
    for loss, ref in (
        (lambda x: jnp.sum(jnp.abs(dj.nu2u(c, x, n_modes=(4, 3), epsilon=1e-12)) ** 2),
         lambda x: jnp.sum(jnp.abs(_nu2u_ref(c, x, (4, 3))) ** 2)),
        (lambda x: jnp.sum(jnp.abs(dj.u2nu(g, x, epsilon=1e-12)) ** 2),
         lambda x: jnp.sum(jnp.abs(_u2nu_ref(g, x)) ** 2)),
    ):
        h = jax.jit(jax.hessian(ref))(x)
        scale = float(np.abs(h).max())
        # forward over reverse and reverse over reverse, in one compiled program
        both = jax.jit(lambda x: (jax.hessian(loss)(x), jax.jacrev(jax.jacrev(loss))(x)))(x)
        assert_close(both, (h, h), rtol=1e-7, atol=1e-8 * scale)


def test_nufft_vmap_shared_and_batched_points():
    r = np.random.default_rng(7)
    x = r.uniform(-3.0, 3.0, size=(3, 8, 1))
    c = randn((3, 8), np.complex128)
    f = lambda c, x: dj.nu2u(c, x, n_modes=(6,), epsilon=1e-12)       # noqa: E731

    def vmapped_and_looped(c, x):
        out = []
        for in_axes in ((0, None), (None, 0), (0, 0)):
            cs = c if in_axes[0] == 0 else c[0]
            xs = x if in_axes[1] == 0 else x[0]
            out.append((jax.vmap(f, in_axes)(cs, xs),
                        jnp.stack([f(cs[i] if in_axes[0] == 0 else cs,
                                     xs[i] if in_axes[1] == 0 else xs) for i in range(3)])))
        # leading axes of the values are transforms sharing the points: one ducc0 call
        out.append((f(c, x[0]), jnp.stack([f(ci, x[0]) for ci in c])))
        return out
    for got, want in jax.jit(vmapped_and_looped)(c, x):
        assert_close(got, want)
    grads, ref = jax.jit(lambda x, c: [
        jax.vmap(jax.grad(lambda x, c: jnp.sum(jnp.abs(h(c, x)) ** 2)))(x, c)
        for h in (f, lambda c, x: _nu2u_ref(c, x, (6,)))])(x, c)
    assert_close(grads, ref, rtol=1e-8, atol=1e-8)
    # the transpose in the values under vmap: shared points (one host call), batched points
    ybars = randn((3, 6), np.complex128, seed=8)

    def transposed(x, ybar):
        return jax.linear_transpose(lambda c: f(c, x), c[0])(ybar)[0]

    shared = jax.jit(jax.vmap(transposed, (None, 0)))
    assert host_call_count(shared.lower(x[0], ybars)) == 1
    got = jax.jit(lambda x, ybars: (shared(x[0], ybars), jax.vmap(transposed)(x, ybars)))
    want = jax.jit(lambda x, ybars: (jax.vmap(_u2nu_ref, (0, None))(ybars, x[0]),
                                     jax.vmap(_u2nu_ref)(ybars, x)))
    assert_close(got(x, ybars), want(x, ybars), rtol=1e-9, atol=1e-9)


def test_nufft_errors_name_the_op():
    with pytest.raises(Exception, match="ducc0_nu2u.*complex"):
        dj.nu2u(np.ones(3), np.zeros((3, 1)), n_modes=(4,))
    with pytest.raises(Exception, match="ducc0_u2nu.*coord"):
        dj.u2nu(np.ones(4, complex), np.zeros((3, 1), np.float32))


def test_nufft_is_linear_in_the_values_only():
    assert (dj.nu2u.linear, dj.nu2u.linear_argnums) == (False, (0,))
    assert (dj.u2nu.linear, dj.u2nu.linear_argnums) == (False, (0,))
    x = np.random.default_rng(9).uniform(-3.0, 3.0, size=(5, 1))
    c, g = randn((5,), np.complex128), randn((4,), np.complex128, seed=1)
    message = r"not declared linear in positional input leaf 1.*declared linear in .*\(0,\) only"
    with pytest.raises(TypeError, match="ducc0_nu2u.*" + message):
        jax.linear_transpose(lambda x: dj.nu2u(c, x, n_modes=(4,)), x)(g)
    with pytest.raises(TypeError, match="ducc0_u2nu.*" + message):         # jointly in both
        jax.linear_transpose(lambda g, x: dj.u2nu(g, x), g, x)(c)


# -------------------------------------------------------------------- wgridder

def _observation(nrow=5, nchan=2):
    r = np.random.default_rng(8)
    return dict(uvw=r.uniform(-300, 300, size=(nrow, 3)) * np.array([1, 1, 0.1]),
                freq=np.linspace(1.0e9, 1.3e9, nchan), pixsize_x=3e-4, pixsize_y=2e-4,
                epsilon=1e-12)


def _explicit_vis2dirty(vis, uvw, freq, nx, ny, px, py, apply_w):
    """The wgridder's defining sum (ducc0's own test reference), divided by n."""
    x, y = np.meshgrid(-nx / 2 + np.arange(nx), -ny / 2 + np.arange(ny), indexing="ij")
    x, y = x * px, y * py
    eps = x**2 + y**2
    nm1 = -eps / (np.sqrt(1.0 - eps) + 1.0) if apply_w else np.zeros_like(x)
    out = np.zeros((nx, ny))
    for row in range(vis.shape[0]):
        for ch in range(vis.shape[1]):
            phase = freq[ch] / 299792458.0 * (x * uvw[row, 0] + y * uvw[row, 1]
                                             - uvw[row, 2] * nm1)
            out += (vis[row, ch] * np.exp(2j * np.pi * phase)).real
    return out / (nm1 + 1.0)


@pytest.mark.parametrize("do_wgridding", [False, True])
def test_wgridder_matches_explicit_sum_and_direct_ducc0(do_wgridding):
    obs = _observation()
    vis = randn((5, 2), np.complex128)
    got = dj.vis2dirty(vis, npix_x=32, npix_y=34, do_wgridding=do_wgridding, **obs)
    ref = _explicit_vis2dirty(vis, obs["uvw"], obs["freq"], 32, 34, obs["pixsize_x"],
                              obs["pixsize_y"], do_wgridding)
    assert_close(got, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    img = randn((32, 34), seed=9)
    direct = ducc0.wgridder.experimental.dirty2vis(dirty=img, do_wgridding=do_wgridding, **obs)
    assert_close(dj.dirty2vis(img, do_wgridding=do_wgridding, **obs), direct)


def test_wgridder_transposes_and_vmap():
    obs = _observation()
    img = randn((32, 32))
    fwd = lambda im: dj.dirty2vis(im, do_wgridding=True, **obs)        # noqa: E731
    adj = lambda v: dj.vis2dirty(v, npix_x=32, npix_y=32, do_wgridding=True, **obs)  # noqa
    vis = np.asarray(fwd(img))
    check_first_order(jax.jit(fwd), (img,))
    check_first_order(jax.jit(adj), (vis,))
    ybar = randn(vis.shape, np.complex128, seed=10)
    (t,) = jax.linear_transpose(fwd, img)(ybar)
    np.testing.assert_allclose(tree_inner(t, img), tree_inner(ybar, vis), rtol=1e-10)
    assert_close(t, adj(np.conj(ybar)))
    imgs = np.stack([img, 2 * img + 1])
    assert_close(jax.vmap(fwd)(imgs), jnp.stack([fwd(i) for i in imgs]))
    assert_close(jax.jit(jax.vmap(jax.grad(lambda i: jnp.sum(jnp.abs(fwd(i)) ** 2))))(imgs),
                 jnp.stack([2 * adj(fwd(i)) for i in imgs]), rtol=1e-9, atol=1e-9)


def test_single_precision_images_and_points():
    obs = dict(_observation(), epsilon=None)
    img = randn((32, 32))
    vis32 = dj.dirty2vis(img.astype(np.float32), **obs)     # coordinates stay float64
    assert vis32.dtype == np.complex64
    assert_close(vis32, dj.dirty2vis(img, **obs), rtol=1e-3, atol=1e-3 * np.abs(vis32).max())
    x = np.random.default_rng(11).uniform(-3, 3, size=(5, 1))
    c = randn((5,), np.complex64)
    g, ref = jax.jit(lambda x32, x: (
        jax.grad(lambda x: jnp.sum(jnp.abs(dj.nu2u(c, x, n_modes=(4,))) ** 2))(x32),
        jax.grad(lambda x: jnp.sum(jnp.abs(_nu2u_ref(c.astype(complex), x, (4,))) ** 2))(x)))(
        x.astype(np.float32), x)
    assert g.dtype == np.float32
    assert_close(g, ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


# ---------------------------------------------------------------- optional extra

def test_missing_ducc0_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ducc0", None)
    for name in [m for m in sys.modules if m.startswith("anybind.contrib.")
                 and "ducc0" in m]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"anybind\[examples\]"):
        import anybind.contrib.ducc0  # noqa: F401


@pytest.mark.slow  # starts a process
def test_contrib_package_imports_nothing_heavy():
    code = ("import sys, anybind.contrib; "
            "print(any(m in sys.modules for m in ('ducc0', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stderr
