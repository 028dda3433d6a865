"""ducc0 bound into JAX: FFTs, spherical harmonics, the NUFFT and the wgridder.

Every name here is an ``ab.Op`` with example inputs, so ``ab.check(op)`` and
``python -m anybind check anybind.contrib.ducc0`` run without arguments.

=============================  ==========================================  ===============
op                             maps                                        derivatives
=============================  ==========================================  ===============
c2c, r2c, c2r, hartley         ducc0.fft over ``axes``                      linear, any order
healpix_(adjoint_)synthesis    packed real a_lm ↔ HEALPix maps              linear, any order
nu2u, u2nu                     NUFFT type 1 / type 2                        values and points,
                                                                            any order; linear
                                                                            in the values
nu2nu                          NUFFT type 3                                 values and both
                                                                            point sets, any
                                                                            order
dirty2vis, vis2dirty           image ↔ visibilities (wgridder)              linear, any order
=============================  ==========================================  ===============

Static parameters (axes, forward/inorm, epsilon, nthreads, …) are keywords as in
ducc0; array keywords (coordinates such as ``uvw``) are non-differentiable.
Transposes follow JAX's convention for complex maps (transpose, not adjoint).

>>> import numpy as np, jax
>>> from anybind.contrib import ducc0 as dj
>>> x = np.arange(8.0)
>>> g = jax.grad(lambda x: dj.r2c(x).real.sum())(x)       # = ∂/∂x Σ Re rfft(x)
>>> bool(np.allclose(g, np.fft.rfft(np.eye(8)).real.sum(axis=1)))
True
"""
from __future__ import annotations

from . import require

require("ducc0", "anybind.contrib.ducc0")

from ._ducc0_fft import c2c, c2r, hartley, r2c  # noqa: E402
from ._ducc0_nufft import nu2u, u2nu  # noqa: E402
from ._ducc0_nufft3 import nu2nu  # noqa: E402
from ._ducc0_sht import (  # noqa: E402
                         alm2realalm,
                         healpix_adjoint_synthesis,
                         healpix_synthesis,
                         n_real_alm,
                         nalm,
                         realalm2alm,
)
from ._ducc0_wgridder import dirty2vis, vis2dirty  # noqa: E402

__all__ = ["c2c", "r2c", "c2r", "hartley", "healpix_synthesis", "healpix_adjoint_synthesis",
           "nalm", "n_real_alm", "alm2realalm", "realalm2alm", "nu2u", "u2nu", "nu2nu", "dirty2vis",
           "vis2dirty"]
