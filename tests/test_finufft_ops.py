"""anybind.contrib.finufft: jax-finufft 1.3.1's tests/ops_test.py, ported.

Each port names its source test. Values are checked against a direct NUDFT sum
(``nudft1``/``nudft2``/``nudft3`` below, JAX code, so its derivatives are
references too) and, where jax-finufft imports and the case runs there,
against jax-finufft. Derivatives are checked by central differences and the
transpose identity (``check_first_order``) where jax-finufft's tests call
``jax._src.test_util.check_grads``. Sizes are jax-finufft's unless a comment
says otherwise.
"""
from __future__ import annotations

import doctest
from functools import partial
from itertools import product

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import check_first_order

pytestmark = pytest.mark.slow  # a ported suite: jax-finufft's own ops tests

pytest.importorskip("ducc0")
finufft = pytest.importorskip("anybind.contrib.finufft")
nufft1, nufft2, nufft3, Opts = finufft.nufft1, finufft.nufft2, finufft.nufft3, finufft.Opts

try:
    import jax_finufft
except ImportError:  # the reference library is optional: the direct sums still check
    jax_finufft = None


# ----------------------------------------------------------- direct sums

def freqs(n: int, modeord) -> np.ndarray:
    """The frequencies of a grid axis: from −n/2 (modeord 0) or in FFT order (1)."""
    return np.fft.fftfreq(n, 1 / n) if modeord else np.arange(-(n // 2), (n + 1) // 2)


def _phases(n, x, iflag, modeord):
    """exp(i·sign(iflag)·k·x) for the n frequencies k: (..., n, M) from x (..., M)."""
    x = jnp.asarray(x)
    k = jnp.asarray(freqs(n, modeord)).reshape((1,) * (x.ndim - 1) + (n, 1))
    return jnp.exp(1j * (1 if iflag >= 0 else -1) * k * x[..., None, :])


def nudft1(c, xs, shape, iflag, modeord=0):
    """f_k = Σ_j c_j exp(i·sign(iflag)·k·x_j): c (..., M), xs D arrays (..., M)."""
    es = [_phases(n, x, iflag, modeord) for n, x in zip(shape, xs)]
    grid = "abc"[:len(xs)]
    return jnp.einsum(f"...m,{',' .join(f'...{g}m' for g in grid)}->...{grid}", c, *es)


def nudft2(f, xs, iflag, modeord=0):
    """c_j = Σ_k f_k exp(i·sign(iflag)·k·x_j): f (..., *modes)."""
    shape = f.shape[f.ndim - len(xs):]
    es = [_phases(n, x, iflag, modeord) for n, x in zip(shape, xs)]
    grid = "abc"[:len(xs)]
    return jnp.einsum(f"...{grid},{','.join(f'...{g}m' for g in grid)}->...m", f, *es)


def nudft3(c, xs, ss, iflag):
    """f_k = Σ_j c_j exp(i·sign(iflag)·s_k·x_j)."""
    s = 1j * (1 if iflag >= 0 else -1)
    phase = sum(t[..., :, None] * x[..., None, :] for x, t in zip(xs, ss))
    return jnp.einsum("...m,...km->...k", c, jnp.exp(s * phase))


def cases(*values):
    """The parameter grid, 3-D cases marked slow (their compiles dominate the file's time)."""
    return [pytest.param(*v, marks=pytest.mark.slow) if v[0] == 3 else v
            for v in product(*values)]


def check_close(a, b, rtol=None):
    """Close relative to b's largest entry (jax-finufft's tolerances by dtype)."""
    a, b = np.asarray(a), np.asarray(b)
    if rtol is None:
        rtol = {np.complex128: 1e-7, np.complex64: 1e-4}.get(b.dtype.type, 1e-7)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(), 1e-30))


def against_jax_finufft(name, args, kwargs, ours, rtol=None):
    """Compare with jax-finufft's own result, where it imports."""
    if jax_finufft is not None:
        with their_rules():
            check_close(ours, getattr(jax_finufft, name)(*args, **kwargs), rtol)


def their_rules():
    """jax-finufft's derivative rules rely on NumPy's rank promotion, which the suite
    makes an error for anybind's code."""
    return jax.numpy_rank_promotion("allow")


def test_docstring_examples_run():
    from anybind.contrib import _finufft_ops, _finufft_options, _finufft_plan, _finufft_shapes
    for mod in (finufft, _finufft_ops, _finufft_options, _finufft_plan, _finufft_shapes):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"a docstring example of {mod.__name__} failed"


# ---------------------------------------------------------------- forward

# ported from jax-finufft tests/ops_test.py::test_nufft1_forward
@pytest.mark.parametrize("ndim, x64, num_nonnuniform, num_uniform, iflag",
                         list(product([1, 2, 3], [False, True], [50], [75], [-1, 1])))
def test_nufft1_forward(ndim, x64, num_nonnuniform, num_uniform, iflag):
    random = np.random.default_rng(657)
    eps = 1e-10 if x64 else 1e-7
    dtype, cdtype = (np.double, np.cdouble) if x64 else (np.single, np.csingle)
    num_uniform = tuple(num_uniform // ndim + 5 * np.arange(ndim))
    x = random.uniform(-np.pi, np.pi, size=(ndim, num_nonnuniform)).astype(dtype)
    c = (random.normal(size=num_nonnuniform)
         + 1j * random.normal(size=num_nonnuniform)).astype(cdtype)
    f_expect = np.asarray(nudft1(c.astype(complex), x.astype(float), num_uniform, iflag))
    with jax.enable_x64(x64):
        f_calc = nufft1(num_uniform, c, *x, eps=eps, iflag=iflag)
        assert f_calc.dtype == cdtype
        check_close(f_calc, f_expect.astype(cdtype))
        f_calc = jax.jit(nufft1, static_argnums=(0,), static_argnames=("eps", "iflag"))(
            num_uniform, c, *x, eps=eps, iflag=iflag)
        check_close(f_calc, f_expect.astype(cdtype))
        against_jax_finufft("nufft1", (num_uniform, c, *x), dict(eps=eps, iflag=iflag), f_calc)


# ported from jax-finufft tests/ops_test.py::test_nufft2_forward
@pytest.mark.parametrize("ndim, x64, num_nonnuniform, num_uniform, iflag",
                         list(product([1, 2, 3], [False, True], [50], [75], [-1, 1])))
def test_nufft2_forward(ndim, x64, num_nonnuniform, num_uniform, iflag):
    random = np.random.default_rng(657)
    eps = 1e-10 if x64 else 1e-7
    dtype, cdtype = (np.double, np.cdouble) if x64 else (np.single, np.csingle)
    num_uniform = tuple(num_uniform // ndim + 5 * np.arange(ndim))
    x = [random.uniform(-np.pi, np.pi, size=num_nonnuniform).astype(dtype)
         for _ in range(ndim)]
    f = (random.normal(size=num_uniform) + 1j * random.normal(size=num_uniform)).astype(cdtype)
    c_expect = np.asarray(nudft2(f.astype(complex), [p.astype(float) for p in x], iflag))
    with jax.enable_x64(x64):
        c_calc = nufft2(f, *x, eps=eps, iflag=iflag)
        assert c_calc.dtype == cdtype
        check_close(c_calc, c_expect.astype(cdtype))
        c_calc = jax.jit(nufft2, static_argnames=("eps", "iflag"))(f, *x, eps=eps, iflag=iflag)
        check_close(c_calc, c_expect.astype(cdtype))
        against_jax_finufft("nufft2", (f, *x), dict(eps=eps, iflag=iflag), c_calc)


# ported from jax-finufft tests/ops_test.py::test_nufft3_forward
@pytest.mark.parametrize("ndim, x64, num_sources, num_targets, iflag",
                         list(product([1, 2, 3], [False, True], [25], [20], [-1, 1])))
def test_nufft3_forward(ndim, x64, num_sources, num_targets, iflag):
    random = np.random.default_rng(657)
    eps = 1e-10 if x64 else 1e-7
    dtype, cdtype = (np.double, np.cdouble) if x64 else (np.single, np.csingle)
    x = [random.uniform(-1.0, 1.0, size=num_sources).astype(dtype) for _ in range(ndim)]
    s = [random.uniform(-1.0, 1.0, size=num_targets).astype(dtype) for _ in range(ndim)]
    c = (random.normal(size=num_sources) + 1j * random.normal(size=num_sources)).astype(cdtype)
    f_expect = np.asarray(nudft3(c.astype(complex), [p.astype(float) for p in x],
                                 [p.astype(float) for p in s], iflag)).astype(cdtype)
    rtol = {np.cdouble: 1e-7, np.csingle: 1e-3}[cdtype]
    with jax.enable_x64(x64):
        f_calc = nufft3(c, *x, *s, eps=eps, iflag=iflag)
        check_close(f_calc, f_expect, rtol)
        f_calc = jax.jit(nufft3, static_argnames=("eps", "iflag"))(c, *x, *s, eps=eps,
                                                                  iflag=iflag)
        check_close(f_calc, f_expect, rtol)
        against_jax_finufft("nufft3", (c, *x, *s), dict(eps=eps, iflag=iflag), f_calc, rtol)


# ------------------------------------------------------------ gradients

def _grads_agree(func, args):
    """jax-finufft's second check: the gradient of ‖f‖ in all arguments at once equals
    the gradient in each alone; and both match the direct sum's gradient."""
    def scalar_func(*a):
        return jnp.linalg.norm(func(*a))
    expect = jax.grad(scalar_func, argnums=tuple(range(len(args))))(*args)
    for n, g in enumerate(expect):
        check_close(jax.grad(scalar_func, argnums=(n,))(*args)[0], g)
    return expect


def _grad_case(ndim, n_uniform, num_nonnuniform):
    random = np.random.default_rng(657)
    shape = tuple(n_uniform // ndim + 5 * np.arange(ndim))
    x = [random.uniform(-np.pi, np.pi, size=num_nonnuniform) for _ in range(ndim)]
    return random, shape, x


# ported from jax-finufft tests/ops_test.py::test_nufft1_grad
@pytest.mark.parametrize("ndim, num_nonnuniform, num_uniform, iflag",
                         cases([1, 2, 3], [50], [35], [-1, 1]))
def test_nufft1_grad(ndim, num_nonnuniform, num_uniform, iflag):
    random, shape, x = _grad_case(ndim, num_uniform, num_nonnuniform)
    c = random.normal(size=num_nonnuniform) + 1j * random.normal(size=num_nonnuniform)
    func = jax.jit(partial(nufft1, shape, eps=1e-10, iflag=iflag))
    check_first_order(func, (c, *x), rtol=1e-5, atol=1e-5)
    got = _grads_agree(func, (c, *x))
    ref = jax.grad(lambda c, *x: jnp.linalg.norm(nudft1(c, x, shape, iflag)),
                   argnums=tuple(range(ndim + 1)))(c, *x)
    for g, r in zip(got, ref):
        check_close(g, r, 1e-7)
    if jax_finufft is not None:
        with their_rules():
            theirs = jax.grad(lambda *a: jnp.linalg.norm(jax_finufft.nufft1(
                shape, *a, eps=1e-10, iflag=iflag)), argnums=tuple(range(ndim + 1)))(c, *x)
        for g, t in zip(got, theirs):
            check_close(g, t, 1e-7)


# ported from jax-finufft tests/ops_test.py::test_nufft2_grad
@pytest.mark.parametrize("ndim, num_nonnuniform, num_uniform, iflag",
                         cases([1, 2, 3], [50], [35], [-1, 1]))
def test_nufft2_grad(ndim, num_nonnuniform, num_uniform, iflag):
    random, shape, x = _grad_case(ndim, num_uniform, num_nonnuniform)
    f = random.normal(size=shape) + 1j * random.normal(size=shape)
    func = jax.jit(partial(nufft2, eps=1e-10, iflag=iflag))
    check_first_order(func, (f, *x), rtol=1e-5, atol=1e-5)
    got = _grads_agree(func, (f, *x))
    ref = jax.grad(lambda f, *x: jnp.linalg.norm(nudft2(f, x, iflag)),
                   argnums=tuple(range(ndim + 1)))(f, *x)
    for g, r in zip(got, ref):
        check_close(g, r, 1e-7)
    if jax_finufft is not None:
        with their_rules():
            theirs = jax.grad(lambda *a: jnp.linalg.norm(jax_finufft.nufft2(
                *a, eps=1e-10, iflag=iflag)), argnums=tuple(range(ndim + 1)))(f, *x)
        for g, t in zip(got, theirs):
            check_close(g, t, 1e-7)


# ported from jax-finufft tests/ops_test.py::test_nufft3_grad
@pytest.mark.parametrize("ndim, num_source, num_target, iflag",
                         cases([1, 2, 3], [50], [35], [-1, 1]))
def test_nufft3_grad(ndim, num_source, num_target, iflag):
    random = np.random.default_rng(657)
    x = [random.uniform(-1.0, 1.0, size=num_source) for _ in range(ndim)]
    s = [random.uniform(-1.0, 1.0, size=num_target) for _ in range(ndim)]
    c = random.normal(size=num_source) + 1j * random.normal(size=num_source)
    func = jax.jit(partial(nufft3, eps=1e-10, iflag=iflag))
    check_first_order(func, (c, *x, *s), rtol=1e-5, atol=1e-5)
    got = _grads_agree(func, (c, *x, *s))
    ref = jax.grad(lambda c, *p: jnp.linalg.norm(nudft3(c, p[:ndim], p[ndim:], iflag)),
                   argnums=tuple(range(2 * ndim + 1)))(c, *x, *s)
    for g, r in zip(got, ref):
        check_close(g, r, 1e-7)
    if jax_finufft is not None:
        with their_rules():
            theirs = jax.grad(lambda *a: jnp.linalg.norm(jax_finufft.nufft3(
                *a, eps=1e-10, iflag=iflag)), argnums=tuple(range(2 * ndim + 1)))(c, *x, *s)
        for g, t in zip(got, theirs):
            check_close(g, t, 1e-7)


@pytest.mark.parametrize("nufft_type", [1, pytest.param(2, marks=pytest.mark.slow),
                                        pytest.param(3, marks=pytest.mark.slow)])
def test_second_order_in_values_and_points(nufft_type):
    """Not in jax-finufft: hessians (forward over reverse, reverse over reverse) of
    ‖f‖² in the points and values against the direct sum's, every type, 2-D."""
    r = np.random.default_rng(3)
    x = [r.uniform(-np.pi, np.pi, 7) for _ in range(2)]
    s = [r.uniform(-1.5, 1.5, 5) for _ in range(2)]
    if nufft_type == 1:
        a = r.normal(size=7) + 1j * r.normal(size=7)
        ours = lambda a, *p: nufft1((4, 3), a, *p, eps=1e-12)              # noqa: E731
        ref = lambda a, *p: nudft1(a, p, (4, 3), 1)                        # noqa: E731
        pts = x
    elif nufft_type == 2:
        a = r.normal(size=(4, 3)) + 1j * r.normal(size=(4, 3))
        ours = lambda a, *p: nufft2(a, *p, eps=1e-12)                      # noqa: E731
        ref = lambda a, *p: nudft2(a, p, -1)                               # noqa: E731
        pts = x
    else:
        a = r.normal(size=7) + 1j * r.normal(size=7)
        ours = lambda a, *p: nufft3(a, *p, eps=1e-12)                      # noqa: E731
        ref = lambda a, *p: nudft3(a, p[:2], p[2:], -1)                    # noqa: E731
        pts = x + s

    def loss(f):
        def scalar(a_re, a_im, *p):
            return jnp.sum(jnp.abs(f(a_re + 1j * a_im, *p)) ** 2)
        return scalar
    args = (a.real, a.imag, *pts)
    argnums = tuple(range(len(args)))
    h_ref = jax.jit(jax.hessian(loss(ref), argnums))(*args)
    got = jax.jit(lambda *a: (jax.hessian(loss(ours), argnums)(*a),
                              jax.jacrev(jax.jacrev(loss(ours), argnums), argnums)(*a)))(*args)
    scale = max(float(np.abs(h).max()) for h in jax.tree.leaves(h_ref))
    for h in got:
        for g, w in zip(jax.tree.leaves(h), jax.tree.leaves(h_ref)):
            np.testing.assert_allclose(g, w, rtol=1e-7, atol=1e-9 * scale)


# ------------------------------------------------------------------ vmap

def _vmap_checks(func, source, x, s=()):
    """jax-finufft's four vmap cases: all mapped, other in_axes, unmapped source,
    one unmapped point array."""
    n, nd = source.shape[0], len(x)
    calc = jax.vmap(func)(source, *x, *s)
    for i in range(n):
        check_close(calc[i], func(source[i], *(p[i] for p in x), *(p[i] for p in s)))
    calc_ax = jax.vmap(func, in_axes=(1,) + (0,) * (nd + len(s)))(
        jnp.moveaxis(source, 0, 1), *x, *s)
    check_close(calc_ax, calc)
    calc_unmap = jax.vmap(func, in_axes=(None,) + (0,) * (nd + len(s)))(source[0], *x, *s)
    for i in range(n):
        check_close(calc_unmap[i], func(source[0], *(p[i] for p in x), *(p[i] for p in s)))
    last = (0,) * (nd - 1) + (None,)
    in_axes = (0,) + last + (last if s else ())
    parts = (*x[:-1], x[-1][0]) + ((*s[:-1], s[-1][0]) if s else ())
    calc_unmap_pt = jax.vmap(func, in_axes=in_axes)(source, *parts)
    for i in range(n):
        row = (*(p[i] for p in x[:-1]), x[-1][0])
        if s:
            row += (*(p[i] for p in s[:-1]), s[-1][0])
        check_close(calc_unmap_pt[i], func(source[i], *row))
    return calc


# ported from jax-finufft tests/ops_test.py::test_nufft1_vmap
@pytest.mark.parametrize("ndim, num_nonnuniform, num_uniform, iflag",
                         list(product([1, 2, 3], [50], [35], [-1, 1])))
def test_nufft1_vmap(ndim, num_nonnuniform, num_uniform, iflag):
    random = np.random.default_rng(657)
    num_repeat = 5
    shape = tuple(num_uniform // ndim + 5 * np.arange(ndim))
    x = [random.uniform(-np.pi, np.pi, size=(num_repeat, num_nonnuniform)) for _ in range(ndim)]
    c = (random.normal(size=(num_repeat, num_nonnuniform))
         + 1j * random.normal(size=(num_repeat, num_nonnuniform)))
    func = partial(nufft1, shape, iflag=iflag)
    calc = _vmap_checks(func, c, x)
    check_close(calc, jax.vmap(lambda c, *x: nudft1(c, x, shape, iflag))(c, *x), 1e-5)


# ported from jax-finufft tests/ops_test.py::test_nufft2_vmap
@pytest.mark.parametrize("ndim, num_nonnuniform, num_uniform, iflag",
                         list(product([1, 2, 3], [50], [35], [-1, 1])))
def test_nufft2_vmap(ndim, num_nonnuniform, num_uniform, iflag):
    random = np.random.default_rng(657)
    num_repeat = 5
    shape = tuple(num_uniform // ndim + 5 * np.arange(ndim))
    x = [random.uniform(-np.pi, np.pi, size=(num_repeat, num_nonnuniform)) for _ in range(ndim)]
    f = (random.normal(size=(num_repeat,) + shape)
         + 1j * random.normal(size=(num_repeat,) + shape))
    func = partial(nufft2, iflag=iflag)
    calc = _vmap_checks(func, f, x)
    check_close(calc, jax.vmap(lambda f, *x: nudft2(f, x, iflag))(f, *x), 1e-5)


# ported from jax-finufft tests/ops_test.py::test_nufft3_vmap
@pytest.mark.parametrize("ndim, num_source, num_target, iflag",
                         list(product([1, 2, 3], [50], [35], [-1, 1])))
def test_nufft3_vmap(ndim, num_source, num_target, iflag):
    random = np.random.default_rng(657)
    num_repeat = 5
    x = [random.uniform(-np.pi, np.pi, size=(num_repeat, num_source)) for _ in range(ndim)]
    s = [random.uniform(-1.0, 1.0, size=(num_repeat, num_target)) for _ in range(ndim)]
    c = (random.normal(size=(num_repeat, num_source))
         + 1j * random.normal(size=(num_repeat, num_source)))
    func = partial(nufft3, iflag=iflag)
    calc = _vmap_checks(func, c, x, s)
    check_close(calc, jax.vmap(lambda c, *p: nudft3(c, p[:ndim], p[ndim:], iflag))(c, *x, *s),
                1e-5)


def test_vmap_of_gradients_and_gradients_of_vmap():
    """Not in jax-finufft: vmap(grad) and grad(vmap) with batched points, every type."""
    r = np.random.default_rng(11)
    x = r.uniform(-np.pi, np.pi, (3, 2, 9))
    s = r.uniform(-2, 2, (3, 2, 6))
    c = r.normal(size=(3, 9)) + 1j * r.normal(size=(3, 9))
    cases = [(lambda c, x: nufft1((5, 4), c, *x, eps=1e-12),
              lambda c, x: nudft1(c, x, (5, 4), 1)),
             (lambda c, x: nufft3(c, *x, *s[0], eps=1e-12),
              lambda c, x: nudft3(c, x, s[0], -1))]
    for ours, ref in cases:
        per_row = [jax.jit(jax.vmap(jax.grad(lambda c, x, f=f: jnp.sum(jnp.abs(f(c, x)) ** 2),
                                             argnums=(0, 1))))(c, x) for f in (ours, ref)]
        of_sum = [jax.jit(jax.grad(lambda c, x, f=f: jnp.sum(jnp.abs(jax.vmap(f)(c, x)) ** 2),
                                   argnums=(0, 1)))(c, x) for f in (ours, ref)]
        for got, want in zip(per_row[0] + of_sum[0], per_row[1] + of_sum[1]):
            check_close(got, want, 1e-8)


# ------------------------------------------------------ batching, issues

# ported from jax-finufft tests/ops_test.py::test_multi_transform
def test_multi_transform():
    random = np.random.default_rng(314)
    n_tot, n_tr, n_j, n_k, n_target = 5, 1, 50, 12, 35
    f = random.standard_normal((n_tot, n_tr, n_k)) + 1j * random.standard_normal(
        (n_tot, n_tr, n_k))
    c = random.standard_normal((n_tot, n_tr, n_j)) + 1j * random.standard_normal(
        (n_tot, n_tr, n_j))
    x = random.uniform(-np.pi, np.pi, (n_tot, n_j))
    x_target = random.uniform(-1.0, 1.0, (n_tot, n_target))
    calc1 = nufft1(n_k, c, x)
    calc2 = nufft2(f, x)
    calc3 = nufft3(c, x, x_target)
    for n in range(n_tr):
        check_close(calc1[:, n], nufft1(n_k, c[:, n], x), rtol=1e-4)
        check_close(calc2[:, n], nufft2(f[:, n], x), rtol=1e-4)
        check_close(calc3[:, n], nufft3(c[:, n], x, x_target), rtol=1e-4)
    # and the direct sums, each row its own points (eps = 1e-6)
    check_close(calc1, nudft1(c, [x[:, None]], (n_k,), 1), rtol=1e-5)
    check_close(calc2, nudft2(f, [x[:, None]], -1), rtol=1e-5)
    check_close(calc3, nudft3(c, [x[:, None]], [x_target[:, None]], -1), rtol=1e-5)


def test_stacked_and_broadcast_points():
    """jax-finufft's README: points (P, 1, M) with values (P, S, M) are P sets of points,
    each shared by S transforms; points (M,) are shared by every leading axis (jax-finufft
    takes one implicit axis only)."""
    r = np.random.default_rng(4)
    P, S, M = 3, 4, 20
    x = r.uniform(-np.pi, np.pi, (P, 1, M))
    y = r.uniform(-np.pi, np.pi, (P, 1, M))
    c = r.normal(size=(P, S, M)) + 1j * r.normal(size=(P, S, M))
    got = nufft1((6, 5), c, x, y, eps=1e-12)
    check_close(got, nudft1(c, [x, y], (6, 5), 1), 1e-9)
    shared = nufft1((6, 5), c, x[0, 0], y[0, 0], eps=1e-12)
    check_close(shared, nudft1(c, [x[0, 0], y[0, 0]], (6, 5), 1), 1e-9)
    g = r.normal(size=(P, S, 6, 5)) + 1j * r.normal(size=(P, S, 6, 5))
    check_close(nufft2(g, x, y, eps=1e-12), nudft2(g, [x, y], -1), 1e-9)
    # the points' last leading axis left out: an implicit axis of size 1 before M
    check_close(nufft2(g, x[:, 0], y[:, 0], eps=1e-12), nudft2(g, [x, y], -1), 1e-9)
    # gradients in broadcast points sum over the transforms that share them
    gx = jax.grad(lambda x: jnp.sum(jnp.abs(nufft1((6, 5), c, x, y, eps=1e-12)) ** 2))(x)
    gr = jax.grad(lambda x: jnp.sum(jnp.abs(nudft1(c, [x, y], (6, 5), 1)) ** 2))(x)
    check_close(gx, gr, 1e-8)


# ported from jax-finufft tests/ops_test.py::test_gh14
def test_gh14():
    M, N = 100, 200
    random = np.random.default_rng(14)
    x = 2 * np.pi * random.uniform(size=M)
    c = random.normal(size=M) + 1j * random.normal(size=M)

    def norm_nufft1(c, x, f=nufft1):
        return jnp.linalg.norm(f(N, c, x, eps=1e-6, iflag=1))

    def norm_nufft2(c, x, f=nufft2):
        return jnp.linalg.norm(f(c, x, eps=1e-6, iflag=1))

    ref1 = partial(norm_nufft1, f=lambda n, c, x, **_: nudft1(c, [x], (n,), 1))
    ref2 = partial(norm_nufft2, f=lambda c, x, **_: nudft2(c, [x], 1))
    # jax-finufft's test only runs these; they are checked against the direct sums here
    check_close(jax.grad(norm_nufft2, argnums=1)(c, x), jax.grad(ref2, argnums=1)(c, x), 1e-5)
    for argnums in ((0,), (0, 1), (1,)):
        for g, r in zip(jax.grad(norm_nufft1, argnums=argnums)(c, x),
                        jax.grad(ref1, argnums=argnums)(c, x)):
            check_close(g, r, 1e-5)


# ported from jax-finufft tests/ops_test.py::test_gh37 (kernel 8³×4×4 and 40 points,
# not 32³×16×16 and 100: the same code paths at a tenth of the time)
def test_gh37():
    @partial(jax.vmap, in_axes=(0, 0, None))
    def cconv_test(f, xs, kernel):
        ndim = xs.shape[-1]
        k_grid_shape = kernel.shape[:-2]
        f_ = f.astype({np.float32: np.complex64, np.float64: np.complex128}[f.dtype.type])
        coords = [xs[..., i] for i in range(ndim)]
        f_hat = nufft1(k_grid_shape, f_.T, *coords, iflag=-1)
        c_hat = jnp.einsum("a...,...ab->b...", f_hat, kernel)
        return nufft2(c_hat, *coords, iflag=1)

    r = np.random.default_rng(37)
    kernel = jnp.array(r.standard_normal((8, 8, 8, 4, 4)))
    f = jnp.array(r.standard_normal((3, 40, 4)))
    x = jnp.array(r.uniform(low=-np.pi, high=np.pi, size=(3, 40, 3)))
    a = cconv_test(f, x, kernel)
    b = jax.jit(cconv_test)(f, x, kernel)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    check_close(a, b)


# ported from jax-finufft tests/ops_test.py::test_gh54
def test_gh54():
    @jax.vmap
    def aux(f, x):
        return jnp.real(nufft1((32, 32, 32), f, *x, iflag=-1)).mean()

    def test(f, x):
        return aux(f, x).mean()

    r = np.random.default_rng(54)
    f = r.standard_normal((8, 1000)).astype(complex)
    x = r.standard_normal((8, 3, 1000))
    assert test(f, x).shape == jax.jvp(partial(test, f), (x,), (jnp.ones_like(x),))[0].shape
    assert jax.grad(test, argnums=0)(f, x).shape == f.shape
    assert jax.grad(test, argnums=1)(f, x).shape == x.shape


# ported from jax-finufft tests/ops_test.py::test_gh54_type2 (modes 16³, not 32³)
def test_gh54_type2():
    @jax.vmap
    def aux(f, x):
        return jnp.real(nufft2(f, *x, iflag=-1)).mean()

    def test(f, x):
        return aux(f, x).mean()

    r = np.random.default_rng(54)
    f = r.standard_normal((8, 16, 16, 16)).astype(complex)
    x = r.standard_normal((8, 3, 1000))
    assert test(f, x).shape == jax.jvp(partial(test, f), (x,), (jnp.ones_like(x),))[0].shape
    assert jax.grad(test, argnums=0)(f, x).shape == f.shape
    assert jax.grad(test, argnums=1)(f, x).shape == x.shape


# ported from jax-finufft tests/ops_test.py::test_modeord
@pytest.mark.parametrize("modeord", [0, 1], ids=["mo0", "mo1"])
@pytest.mark.parametrize("Nf", [16, 17], ids=["even", "odd"])
@pytest.mark.parametrize("ndim", [1, 2, 3], ids=["1D", "2D", "3D"])
@pytest.mark.parametrize("nufft_type", [1, 2], ids=["t1", "t2"])
def test_modeord(modeord, Nf, ndim, nufft_type):
    random = np.random.default_rng(657)
    iflag, eps = 1, 1e-10
    shape = tuple(Nf // ndim + 5 * np.arange(ndim))
    x = random.uniform(-np.pi, np.pi, size=(ndim, 50))
    opts = Opts(modeord=modeord)
    if nufft_type == 1:
        c = random.normal(size=50) + 1j * random.normal(size=50)
        check_close(nufft1(shape, c, *x, eps=eps, iflag=iflag, opts=opts),
                    nudft1(c, x, shape, iflag, modeord))
        func = jax.jit(partial(nufft1, shape, eps=eps, iflag=iflag, opts=opts))
        check_first_order(func, (c, *x), rtol=1e-5, atol=1e-5)
    else:
        f = random.normal(size=shape) + 1j * random.normal(size=shape)
        check_close(nufft2(f, *x, eps=eps, iflag=iflag, opts=opts),
                    nudft2(f, x, iflag, modeord))
        func = jax.jit(partial(nufft2, eps=eps, iflag=iflag, opts=opts))
        check_first_order(func, (f, *x), rtol=1e-5, atol=1e-5)


# ported from jax-finufft tests/ops_test.py::test_batched_points_grad
def test_batched_points_grad():
    M, N, D, B = 100, 200, 3, 4
    random = np.random.default_rng(123)
    xyz = 2 * np.pi * random.uniform(size=(B, D, M))
    stu = random.uniform(-1.0, 1.0, size=(B, D, N))
    c = random.normal(size=(B, M)) + 1j * random.normal(size=(B, M))

    def norm_nufft3(c, xyz, stu, f=nufft3):
        return jnp.linalg.norm(f(c, *(xyz[:, i, :] for i in range(D)),
                                 *(stu[:, i, :] for i in range(D))))

    ref = partial(norm_nufft3, f=lambda c, *p: nudft3(c, p[:D], p[D:], -1))
    # jax-finufft's test only runs these; they are checked against the direct sums here
    for argnums in (0, 1, 2):
        check_close(jax.grad(norm_nufft3, argnums=argnums)(c, xyz, stu),
                    jax.grad(ref, argnums=argnums)(c, xyz, stu), 1e-5)


# ported from jax-finufft tests/ops_test.py::test_batched_points_grad, as it runs there
# (x64 off): single precision at the default eps 1e-6, which for a 3-D type 3 is below
# ducc0's single-precision limit (type 3 spends half of eps on each spreading stage)
def test_batched_points_grad_single_precision():
    M, N, D, B = 100, 200, 3, 4
    random = np.random.default_rng(123)
    xyz = (2 * np.pi * random.uniform(size=(B, D, M))).astype(np.float32)
    stu = random.uniform(-1.0, 1.0, size=(B, D, N)).astype(np.float32)
    c = (random.normal(size=(B, M)) + 1j * random.normal(size=(B, M))).astype(np.complex64)

    def norm_nufft3(c, xyz, stu, f=nufft3):
        return jnp.linalg.norm(f(c, *(xyz[:, i, :] for i in range(D)),
                                 *(stu[:, i, :] for i in range(D))))

    wide = [a.astype(np.complex128 if a.dtype == np.complex64 else np.float64)
            for a in (c, xyz, stu)]
    ref = partial(norm_nufft3, f=lambda c, *p: nudft3(c, p[:D], p[D:], -1))
    for argnums in (0, 1, 2):
        got = jax.grad(norm_nufft3, argnums=argnums)(c, xyz, stu)
        assert got.dtype == (np.complex64 if argnums == 0 else np.float32)
        check_close(got, jax.grad(ref, argnums=argnums)(*wide), 1e-4)


# ------------------------------------------------------------------ errors

def test_bad_input_is_a_clear_error():
    x = np.zeros(4)
    with pytest.raises(TypeError, match="nufft1: the source must be complex"):
        nufft1(3, np.ones(4), x)
    with pytest.raises(TypeError, match="nufft2: point array 0 must be float64"):
        nufft2(np.ones(3, complex), x.astype(np.float32))
    with pytest.raises(ValueError, match="nufft1: output_shape must give 2"):
        nufft1(3, np.ones(4, complex), x, x)
    with pytest.raises(ValueError, match="nufft3: needs the source points and then"):
        nufft3(np.ones(4, complex), x, x, x)
    with pytest.raises(ValueError, match="nufft1: the source has 5 values per transform but "
                                         "the points number 4"):
        nufft1(3, np.ones(5, complex), x)
