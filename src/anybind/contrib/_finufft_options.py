"""jax-finufft's option objects, and what each option becomes in ducc0.

``Opts`` and ``NestedOpts`` have jax-finufft's fields and defaults (frozen,
hashable: they are static arguments). When a transform is traced, the options
that apply to it are translated into ducc0's keywords:

==========================  ==============================================  ===============
jax-finufft option          ducc0                                           not default
==========================  ==============================================  ===============
modeord                     ``fft_order``                                   mapped
nthreads                    ``nthreads`` (0: every hardware thread, both)   mapped
upsampfac                   ``sigma_min``/``sigma_max``: upsampfac ± 0.01   mapped
debug                       ``verbosity`` (1 for Verbose and Noisy)         mapped
spread_debug, showwarn,     no equivalent: ducc0 chooses its own kernel,    ``ValueError``
fftw, spread_sort, the      sorting, FFT plans and threading                when traced
other spread_* options
gpu_*                       cuFINUFFT's; a CPU transform ignores them, as   ignored
                            jax-finufft does
==========================  ==============================================  ===============
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Opts", "NestedOpts", "unpack_opts", "DebugLevel", "GpuDebugLevel", "FftwFlags",
           "SpreadSort", "SpreadThread", "GpuMethod"]


class DebugLevel(IntEnum):
    Silent = 0
    Verbose = 1
    Noisy = 2


class GpuDebugLevel(IntEnum):
    Silent = 0
    Verbose = 1


class FftwFlags(IntEnum):
    """FFTW's planner flags (FFTW's own values)."""
    Estimate = 64
    Measure = 0
    Patient = 32
    Exhaustive = 8
    WisdomOnly = 1 << 21


class SpreadSort(IntEnum):
    NoSort = 0
    Sort = 1
    Heuristic = 2


class SpreadThread(IntEnum):
    Auto = 0
    Sequential = 1
    Parallel = 2


class GpuMethod(IntEnum):
    Auto = 0
    Driven = 1
    Shared = 2


@dataclass(frozen=True)
class Opts:
    """FINUFFT's options, with jax-finufft's fields and defaults.

    >>> from anybind.contrib.finufft import Opts
    >>> Opts(modeord=True).nthreads        # 0: every core
    0
    """

    modeord: bool = False
    debug: DebugLevel = DebugLevel.Silent
    spread_debug: DebugLevel = DebugLevel.Silent
    showwarn: bool = False
    nthreads: int = 0
    fftw: int = FftwFlags.Estimate
    spread_sort: SpreadSort = SpreadSort.Heuristic
    spread_kerevalmeth: bool = True
    spread_kerpad: bool = True
    upsampfac: float = 0.0
    spread_thread: SpreadThread = SpreadThread.Auto
    maxbatchsize: int = 0
    spread_nthr_atomic: int = -1
    spread_max_sp_size: int = 0

    gpu_upsampfac: float = 2.0
    gpu_method: GpuMethod = GpuMethod.Auto
    gpu_sort: bool = True
    gpu_binsizex: int = 0
    gpu_binsizey: int = 0
    gpu_binsizez: int = 0
    gpu_obinsizex: int = 0
    gpu_obinsizey: int = 0
    gpu_obinsizez: int = 0
    gpu_maxsubprobsize: int = 1024
    gpu_kerevalmeth: bool = True
    gpu_spreadinterponly: bool = False
    gpu_maxbatchsize: int = 0
    gpu_debug: GpuDebugLevel = GpuDebugLevel.Silent


@dataclass(frozen=True)
class NestedOpts:
    """Options per transform type and per direction, as in jax-finufft.

    ``forward`` (or ``type1``/``type2``/``type3``) applies to the transform
    called; ``backward`` to the transposed transforms reverse mode runs (an
    ``Opts`` or a further ``NestedOpts``).

    >>> from anybind.contrib.finufft import NestedOpts, Opts, unpack_opts
    >>> o = NestedOpts(type1=Opts(nthreads=1), backward=Opts(nthreads=2))
    >>> unpack_opts(o, 1, True).nthreads, unpack_opts(o, 1, False).nthreads
    (1, 2)
    """

    type1: Opts | None = None
    type2: Opts | None = None
    type3: Opts | None = None

    forward: Opts | None = None
    backward: Opts | NestedOpts | None = None


def unpack_opts(opts, finufft_type: int, forward: bool):
    """The options that apply to a transform of ``finufft_type`` in this direction
    (jax-finufft's rule: ``forward``, else the type's entry; ``backward``, else
    the options themselves).

    >>> from anybind.contrib.finufft import NestedOpts, Opts, unpack_opts
    >>> unpack_opts(NestedOpts(type2=Opts(modeord=True)), 2, True).modeord
    True
    """
    if opts is None or isinstance(opts, Opts):
        return opts
    if not isinstance(opts, NestedOpts):
        raise TypeError(f"anybind.contrib.finufft: opts must be an Opts, a NestedOpts or "
                        f"None, got {type(opts).__name__}")
    if forward:
        if opts.forward is not None:
            return opts.forward
        return {1: opts.type1, 2: opts.type2, 3: opts.type3}[finufft_type]
    if opts.backward is not None:
        return opts.backward
    return opts


# ------------------------------------------------------------ onto ducc0

_DEFAULT = Opts()
_MAPPED = ("modeord", "nthreads", "upsampfac", "debug")


def ducc0_keywords(opts: Opts | None, where: str) -> dict:
    """ducc0's keywords for one transform's options; a ``ValueError`` naming any
    option set to a value ducc0 has no equivalent for."""
    if opts is None:
        opts = _DEFAULT
    if not isinstance(opts, Opts):
        raise TypeError(f"{where}: opts must be an Opts, a NestedOpts or None, got "
                        f"{type(opts).__name__}")
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if f.name in _MAPPED or f.name.startswith("gpu_") or value == f.default:
            continue
        raise ValueError(
            f"{where}: the FINUFFT option {f.name}={value!r} has no equivalent in ducc0, "
            f"which anybind.contrib.finufft runs on (it chooses its own kernel, sorting, FFT "
            f"plans and threading); leave it at its default {f.default!r}. Mapped options: "
            f"{', '.join(_MAPPED)}")
    if not (isinstance(opts.nthreads, int) and opts.nthreads >= 0):
        raise ValueError(f"{where}: Opts.nthreads must be an int >= 0 (0: every core), "
                         f"got {opts.nthreads!r}")
    kw = {"fft_order": bool(opts.modeord), "nthreads": int(opts.nthreads)}
    if opts.debug:
        kw["verbosity"] = 1
    if opts.upsampfac:
        u = float(opts.upsampfac)
        if not 1.2 <= u <= 2.5:
            raise ValueError(f"{where}: Opts.upsampfac must be 0 (chosen per call) or in "
                             f"[1.2, 2.5] (ducc0's oversampling factors), got {u}")
        kw["sigma_min"], kw["sigma_max"] = max(1.19, u - 0.01), min(2.51, u + 0.01)
    return kw
