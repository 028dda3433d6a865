"""The ``contrib`` group: anybind.contrib.ducc0 against JAXbind's jaxducc0, side by side.

The same ducc0 transform, on the same inputs, through each library:

==================  =================================  =========================================
case                anybind                            JAXbind
==================  =================================  =========================================
c2c, n              ``dj.c2c(x)``                      ``jaxducc0.c2c(x)``
hartley, n          ``dj.hartley(x)``                  ``jaxducc0.genuine_fht(x)``
SHT lmax, nside     ``dj.healpix_synthesis(alm, ...)``  ``jaxducc0.get_healpix_sht(...)(alm)``
wgridder            ``dj.dirty2vis(img, uvw=, ...)``    ``jaxducc0.get_wgridder(...)(uvw, f, img)``
==================  =================================  =========================================

Each case is timed forward, ``jit(f)``, and reverse, ``jit(grad(‖f(x)‖²))``,
which runs the op and its transpose (c2c: c2c again; SHT: the adjoint
synthesis; wgridder: vis2dirty). Both libraries get the same keywords (one
thread). Before timing, each route is checked against the first one.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

try:
    import ducc0
    from anybind.contrib import ducc0 as dj
except ImportError:  # the optional `examples` extra
    ducc0 = dj = None
try:
    from jaxbind.contrib import jaxducc0
except ImportError:  # the optional `bench` extra
    jaxducc0 = None

AVAILABLE = dj is not None
Cases = dict[str, tuple[Callable[..., Any], tuple]]

C2C_SIZES = (1_000, 1_000_000)
SHT_CASES = ((16, 8), (128, 64))  # (lmax, nside)


def _loss(f: Callable) -> Callable:
    """‖f(x)‖², whose gradient needs f and its transpose."""
    return lambda x: jnp.sum(jnp.abs(f(x)) ** 2)


def _pair(ab_f: Callable, jb_f: Callable | None, args: tuple, grad: bool) -> Cases:
    routes = {"anybind": ab_f}
    if jb_f is not None:
        routes["JAXbind"] = jb_f
    wrap = (lambda f: jax.jit(jax.grad(_loss(f)))) if grad else jax.jit
    return {k: (wrap(f), args) for k, f in routes.items()}


def c2c(n: int, grad: bool) -> Cases:
    r = np.random.default_rng(0)
    x = jnp.asarray(r.standard_normal(n) + 1j * r.standard_normal(n))
    jb = (lambda x: jaxducc0.c2c(x)[0]) if jaxducc0 is not None else None
    return _pair(lambda x: dj.c2c(x), jb, (x,), grad)


def hartley(n: int, grad: bool) -> Cases:
    x = jnp.asarray(np.random.default_rng(0).standard_normal(n))
    jb = (lambda x: jaxducc0.genuine_fht(x)[0]) if jaxducc0 is not None else None
    return _pair(lambda x: dj.hartley(x), jb, (x,), grad)


def sht(lmax: int, nside: int, grad: bool) -> Cases:
    alm = jnp.asarray(np.random.default_rng(0).standard_normal((1, dj.n_real_alm(lmax))))
    jb = None
    if jaxducc0 is not None:
        op = jaxducc0.get_healpix_sht(nside, lmax, lmax, 0)
        jb = lambda a: op(a)[0]
    return _pair(lambda a: dj.healpix_synthesis(a, nside=nside, lmax=lmax), jb, (alm,), grad)


def wgridder(npix: int = 64, nrow: int = 1000, nchan: int = 4, grad: bool = False) -> Cases:
    r = np.random.default_rng(0)
    uvw = r.uniform(-300.0, 300.0, size=(nrow, 3)) * np.array([1.0, 1.0, 0.1])
    freq = np.linspace(1.0e9, 1.2e9, nchan)
    opts = dict(pixsize_x=3e-4, pixsize_y=3e-4, epsilon=1e-10, do_wgridding=True, nthreads=1)
    img = jnp.asarray(r.standard_normal((npix, npix)))
    jb = None
    if jaxducc0 is not None:
        op = jaxducc0.get_wgridder(npix_x=npix, npix_y=npix, **opts)
        jb = lambda d: op(uvw, freq, d)[0]
    return _pair(lambda d: dj.dirty2vis(d, uvw=uvw, freq=freq, **opts), jb, (img,), grad)


def cases() -> dict[str, Callable[[bool], Cases]]:
    """Case label ↦ builder of the forward (False) or reverse (True) routes."""
    out: dict[str, Callable[[bool], Cases]] = {}
    for n in C2C_SIZES:
        out[f"c2c, n={n:,}"] = lambda g, n=n: c2c(n, g)
    out["hartley, n=1,000"] = lambda g: hartley(1_000, g)
    for lmax, nside in SHT_CASES:
        out[f"SHT, lmax={lmax}, nside={nside}"] = lambda g, l=lmax, s=nside: sht(l, s, g)
    out["wgridder, 64², 1000×4 vis"] = lambda g: wgridder(grad=g)
    return out
