"""The GPU device route: device code (``device=True``) on XLA's device buffers.

Compiled device code (a launcher of ``ab.GPU_SIGNATURE``, compiled ahead of
time: a ctypes function of a library nvcc built, or a cffi pointer) runs with
no Python in the call: the compiled route's custom call, which the shim's CUDA
handler (``_shim.c``) serves by calling the launcher with XLA's stream and
device buffers.

For Python device code, XLA's GPU buffer callback
(``xla_buffer_python_gpu_callback``) gives the runner CuPy views of XLA's
device buffers, and it runs with CuPy's current stream set to XLA's stream:
nothing reaches the host and nothing synchronises the device. Device code is
declared at bind time (``device=True`` on ``ab.bind`` and every ``def_*``), the
platform is the lowering's: in a program compiled for the CPU a device
function's host fallback (``host=``) runs by the routes of host code, and
without one the lowering raises. Batching, checks of results and in-place
functions work as on the CPU, on CuPy arrays.

===================  ==============================================================
piece                what it does
===================  ==============================================================
``claims``           device code, on every platform
``lower``            on a GPU: the compiled route's custom call (a launcher), or
                     the device callback (Python); elsewhere: the host fallback,
                     handed back to the other routes
``check_declaration``  ``device=``/``host=`` of ``ab.bind`` or a ``def_*``, at once
===================  ==============================================================
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import jax.ffi
import numpy as np

from ..core import _lifetime, _lowering
from ..core._code import is_compiled
from ..core._lowering import Site
from ..core._spec import Call
from . import _compiled, _host
from ._host import host_callback, not_exported, platform, runner_for

TARGET = "xla_buffer_python_gpu_callback"
COMPILED_PLATFORMS = ("cuda",)  # where compiled device code runs: the shim has a CUDA handler


def check_declaration(name: str, where: str, traced: bool, device: bool, host) -> None:
    """``device=`` and ``host=`` of ``ab.bind`` or a ``def_*``: a TypeError at once if wrong."""
    if device and traced:
        raise TypeError(f"anybind op '{name}': {where}(device=True) is for GPU code called "
                        f"on XLA's device buffers; traced code runs on every platform as it is")
    if host is not None and not device:
        raise TypeError(f"anybind op '{name}': {where}(host=...) is the host fallback of a "
                        f"device=True function; without device=True the function is host "
                        f"code already")
    if host is not None and not callable(host):
        raise TypeError(f"anybind op '{name}': {where}(host=...) must be a callable, got "
                        f"{type(host).__name__}")
    if host is not None and is_compiled(host):
        raise TypeError(f"anybind op '{name}': {where}(host=...) is compiled code; the host "
                        f"fallback of device code is Python host code (NumPy, SciPy, ...)")


def array_module(call: Call):
    """CuPy, which device code gets its arrays from: a clear error where it is missing."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            f"anybind op '{call.op.name}' has device code (device=True), which runs on "
            f"CuPy views of XLA's buffers; install CuPy (pip install cupy-cuda13x; "
            f"cupy-cuda12x for CUDA 12)") from e
    return cupy


def with_stream(fn: Callable, xp) -> Callable:
    """``fn`` given the current (XLA's) stream as ``stream=`` if it has that parameter."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    if "stream" not in params:
        return fn
    return lambda *args, **kw: fn(*args, stream=xp.cuda.get_current_stream().ptr, **kw)


def stream_of(exec_ctx) -> int:
    """XLA's stream for this call (a cudaStream_t, as an int)."""
    return exec_ctx.stream


def views_of(xp, buffers, avals) -> list:
    """CuPy views of XLA's buffers (of these avals): no copy, no synchronisation."""
    return [xp.asarray(b) for b in buffers]


class _StreamHandle:
    """A cudaStream_t by the CUDA stream protocol (``__cuda_stream__``: version, pointer)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.ptr


def external_stream(xp, ptr: int):
    """XLA's stream as a CuPy stream: ``Stream.from_external`` (CuPy 14 deprecates
    ``ExternalStream``), ``ExternalStream`` on older CuPy."""
    from_external = getattr(xp.cuda.Stream, "from_external", None)
    if from_external is None:
        return xp.cuda.ExternalStream(ptr)
    return from_external(_StreamHandle(ptr))


class Route:
    name = "gpu-device"

    def claims(self, site: Site) -> bool:
        return site.rule.device

    def adopt(self, op, kind: str, fn, traced: bool, device: bool, host, where: str) -> None:
        if "." not in kind:  # the code itself, not a rule's batched variant
            check_declaration(op.name, where, traced, device, host)

    def lower(self, site: Site, *args):
        ctx, call, rule = site.ctx, site.call, site.rule
        where = platform(ctx, call)
        if where not in _host.GPU_PLATFORMS:
            if rule.host is None:
                raise NotImplementedError(
                    f"anybind op '{call.op.name}': its {site.name} is device code (device=True) "
                    f"and this program is compiled for {where}; give it a host fallback "
                    f"(host=... on ab.bind or the def_* of the rule) or compile the program "
                    f"for a GPU")
            host = dataclasses.replace(rule, fn=rule.host, device=False, host=None)
            return _lowering.lower(site.replace(rule=host), *args)
        if is_compiled(rule.fn):
            if where not in COMPILED_PLATFORMS:
                raise NotImplementedError(
                    f"anybind op '{call.op.name}': its {site.name} is compiled device code, "
                    f"a launcher given a CUDA stream; this program is compiled for {where}")
            return _compiled.Route().lower(site, *args, gpu=True)
        xp = array_module(call)
        site = site.replace(rule=dataclasses.replace(rule, fn=with_stream(rule.fn, xp)))
        not_exported(ctx, call, site.name)
        guarded = host_callback(call, site.name, runner_for(site, xp)(call, site.batch),
                                device=True)
        n_out = len(ctx.avals_out)
        avals = [*ctx.avals_in, *ctx.avals_out]

        def callback(exec_ctx, *buffers):
            with external_stream(xp, stream_of(exec_ctx)):
                views = views_of(xp, buffers, avals)
                guarded(views[:len(views) - n_out], views[len(views) - n_out:])
            return ()
        ctx.module_context.add_host_callback(_lifetime.held(ctx, callback))
        index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
        rule = jax.ffi.ffi_lowering(TARGET, has_side_effect=site.effect)
        return rule(ctx, *args, index=index)
