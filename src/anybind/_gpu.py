"""How an op's host and device code run in a program compiled for a GPU.

=============  ================================================================
route          how a role lowers for a GPU
=============  ================================================================
host code      XLA's GPU Python callback (``xla_ffi_python_gpu_callback``, the
               target of ``jax.pure_callback``): XLA copies the operands to the
               host and the outputs back; the runner is the CPU route's, filling
               host arrays allocated here
device code    XLA's GPU buffer callback (``xla_buffer_python_gpu_callback``):
               the runner gets CuPy views of XLA's device buffers and runs with
               CuPy's current stream set to XLA's stream; nothing reaches the
               host and nothing synchronises the device
=============  ================================================================

Device code is declared at bind time (``device=True`` on ``ab.bind`` and every
``def_*``), the platform is the lowering's: in a program compiled for the CPU a
device function's host fallback (``host=``) runs by the CPU route, and without
one the lowering raises. Batching, checks of results and in-place functions
work as on the CPU, on CuPy arrays. Host code per shard (``shard=``) and
compiled functions run on the CPU only.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import numpy as np
import jax.ffi

from ._spec import Call, Rule

GPU_PLATFORMS = ("cuda", "rocm")
_HOST_TARGET = "xla_ffi_python_gpu_callback"
_DEVICE_TARGET = "xla_buffer_python_gpu_callback"


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


def platform(ctx, call: Call) -> str:
    """The one platform of this lowering (host and device code need one)."""
    platforms = ctx.module_context.platforms
    if len(platforms) != 1:
        raise NotImplementedError(
            f"anybind op '{call.op.name}': host and device code lower for one platform at "
            f"a time; this program is lowered for {list(platforms)} at once (lower it for "
            f"each platform)")
    return platforms[0]


def for_platform(ctx, call: Call, rule: Rule, role_name: str) -> Rule:
    """A device rule as it runs here: itself on a GPU, its host fallback elsewhere."""
    where = platform(ctx, call)
    if where in GPU_PLATFORMS:
        return dataclasses.replace(rule, fn=with_stream(rule.fn, array_module(call)))
    if rule.host is None:
        raise NotImplementedError(
            f"anybind op '{call.op.name}': its {role_name} is device code (device=True) and "
            f"this program is compiled for {where}; give it a host fallback (host=... on "
            f"ab.bind or the def_* of the rule) or compile the program for a GPU")
    return dataclasses.replace(rule, fn=rule.host, device=False, host=None)


def array_module(call: Call):
    """CuPy, which device code gets its arrays from: a clear error where it is missing."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError(
            f"anybind op '{call.op.name}' has device code (device=True), which runs on "
            f"CuPy views of XLA's buffers; install CuPy (pip install cupy-cuda12x)") from e
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


def lower(ctx, *args, guarded: Callable, device: bool, xp, has_side_effect: bool):
    """One host or device role as XLA's GPU callback; see the table above.

    ``guarded(ins, outs)`` is the CPU route's runner: it runs the role on
    arrays and turns a failure into the op's HostError.
    """
    n_out = len(ctx.avals_out)
    if device:
        def callback(exec_ctx, *buffers):
            with xp.cuda.ExternalStream(stream_of(exec_ctx)):
                views = [xp.asarray(b) for b in buffers]
                guarded(views[:len(views) - n_out], views[len(views) - n_out:])
            return ()
        target = _DEVICE_TARGET
    else:
        avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in ctx.avals_out]

        def callback(*ins):  # host copies of the operands; the outputs go back the same way
            outs = [np.empty(s, d) for s, d in avals]
            ins = [np.asarray(x) for x in ins]
            for x in ins:
                x.setflags(write=False)  # as XLA's buffers on the CPU route
            guarded(ins, outs)
            return tuple(outs)
        target = _HOST_TARGET
    from . import _lifetime
    ctx.module_context.add_host_callback(_lifetime.held(ctx, callback))
    index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
    rule = jax.ffi.ffi_lowering(target, has_side_effect=has_side_effect)
    return rule(ctx, *args, index=index)
