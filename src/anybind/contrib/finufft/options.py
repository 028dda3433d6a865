"""jax-finufft's options, where jax-finufft has them (``jax_finufft.options``).

The same objects as ``anybind.contrib.finufft.Opts`` and the rest; what each
option becomes in ducc0 is tabled in ``anybind.contrib._finufft_options``.

>>> from anybind.contrib.finufft.options import Opts    # was: from jax_finufft.options import Opts
>>> Opts(modeord=1).modeord
1
"""
from __future__ import annotations

from .._finufft_options import (
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

__all__ = ["Opts", "NestedOpts", "unpack_opts", "DebugLevel", "GpuDebugLevel", "FftwFlags",
           "SpreadSort", "SpreadThread", "GpuMethod"]
