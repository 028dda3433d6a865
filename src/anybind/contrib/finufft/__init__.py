"""A drop-in for jax-finufft, on ducc0: change the import, keep the code.

>>> from anybind.contrib import finufft as jax_finufft      # was: import jax_finufft

=================================  ============================================================
name                               what it is
=================================  ============================================================
nufft1(output_shape, source,       type 1, points ↦ modes (iflag=1 by default)
  *points, eps, iflag, opts)
nufft2(source, *points, ...)       type 2, modes ↦ points (iflag=−1)
nufft3(source, *points, ...)       type 3, points ↦ points: D source arrays, then D targets
Opts, NestedOpts, unpack_opts      jax-finufft's options, also in ``options`` (as
                                   ``jax_finufft.options``); what each becomes in ducc0 is in
                                   its table (no equivalent: an error at trace time)
Plan, Plan3                        transforms on points fixed once (ducc0's plans), as ops
=================================  ============================================================

Signatures, defaults (eps=1e-6, every core), batching and broadcasting of
leading axes are jax-finufft's. Every function works under ``jit``, ``vmap``,
``jvp``, ``vjp``/``grad`` in the source and the points, to every order; single
precision below ducc0's single-precision limit (eps < 2.4e-7 in 1-D, 4.5e-7
in 2-D, 8.1e-7 in 3-D) is computed in double and rounded. GPU (cuFINUFFT) is not built:
on a GPU the transforms run on the host.

>>> import numpy as np, jax, jax.numpy as jnp
>>> from anybind.contrib.finufft import nufft1
>>> x = np.linspace(-3, 3, 40); c = np.ones(40, complex)
>>> g = jax.grad(lambda x: jnp.sum(jnp.abs(nufft1(8, c, x)) ** 2))(x)
>>> g.shape
(40,)
"""
from __future__ import annotations

from .. import require
from .._finufft_ops import nufft1, nufft2, nufft3
from .._finufft_plan import Plan, Plan3
from . import options
from .options import (
    DebugLevel,
    FftwFlags,
    GpuDebugLevel,
    GpuMethod,
    NestedOpts,
    Opts,
    SpreadSort,
    SpreadThread,
    unpack_opts,
)

require("ducc0", "anybind.contrib.finufft")

__all__ = ["nufft1", "nufft2", "nufft3", "Opts", "NestedOpts", "unpack_opts", "Plan", "Plan3",
           "DebugLevel", "GpuDebugLevel", "FftwFlags", "SpreadSort", "SpreadThread",
           "GpuMethod", "options"]
