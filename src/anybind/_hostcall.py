"""How host code runs inside a compiled program.

A host primitive lowers straight to one custom call on the CPU: the callback
receives NumPy views of XLA's own input and output buffers without copying,
runs the user's code, checks every result against the declared shape and
dtype, and writes it into the output buffer. The callback is registered with
the module being compiled, so the executable keeps the user's function and
rules alive for as long as it exists.

====================  ===========================================================
piece                 what it does
====================  ===========================================================
``make_host_runner``  ``runner(ins, outs)`` of a role: calls the user's code (per
                      batch mode), checks and stores its results
``host_callback``     ``guarded(ins, outs)``: the runner, a failure turned into
                      the op's ``HostError`` (kept for eager callers, ``ab.debug``)
``register``          the CPU route of a guarded runner: anybind's FFI handler
                      (``_hostffi``, target ``anybind_python``) where it is
                      built, else XLA's buffer callback
                      (``xla_buffer_python_cpu_callback``, via ``buffer_callback``)
``emit``              the custom call to a registered runner
``lower_host``        a role's lowering: GPU programs go to ``_gpu``, the CPU to
                      ``register`` and ``emit``
====================  ===========================================================
"""
from __future__ import annotations

import dataclasses
import functools
import os
import threading
import traceback
from typing import Callable, Sequence

import numpy as np
import jax.ffi
from jax._src import config

from . import _debug, _gpu, _hostffi, _impls, _inplace, _lifetime
from ._batching import declared_out_batched
from ._spec import Batch, Call, Rule

_TARGETS = {"cpu": "xla_buffer_python_cpu_callback"}


class HostError(RuntimeError):
    """An error raised by, or about, host code while a compiled program ran.

    An eager call raises it itself, with the user's exception as its cause.
    Inside ``jit`` XLA turns it into ``jax.errors.JaxRuntimeError``, whose
    message ends with ``HostError: anybind op '…': …`` (see the README);
    ``with ab.debug():`` re-raises the HostError itself there too.
    """


HostError.__module__ = "anybind"  # as users name it: anybind.HostError
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
_RECENT: dict = {}  # the last few HostErrors, by message
_RECENT_LOCK = threading.Lock()


_NARROWED = {np.dtype(w): np.dtype(n) for w, n in ((np.int64, np.int32), (np.uint64, np.uint32),
                                                   (np.float64, np.float32),
                                                   (np.complex128, np.complex64))}


def _as_result(call: Call, what: str, r, aval, shape: tuple, allow_lead_one: bool,
               narrow: bool = False, xp=np) -> np.ndarray:
    """Check one returned value against the declared aval; never cast or broadcast silently.

    With ``narrow`` (x64 off: JAX narrowed the declared 64-bit dtype to 32
    bits, as it narrows every array), a 64-bit result is narrowed the same way,
    integers only where every value fits.
    """
    if r is None:
        raise HostError(f"anybind op '{call.op.name}': {what} is None; expected "
                        f"{np.dtype(aval.dtype).name}{list(shape)}")
    if _impls.is_python_scalar(r):
        v = _impls.exact_python_scalar(r, aval.dtype)
        if v is None:
            raise HostError(
                f"anybind op '{call.op.name}': {what} is the Python {type(r).__name__} {r!r}, "
                f"which {np.dtype(aval.dtype).name} cannot hold exactly; declared shape "
                f"{shape} and dtype {np.dtype(aval.dtype).name}")
        r = xp.asarray(v)
    else:
        r = xp.asarray(r)
    if narrow and _NARROWED.get(r.dtype) == aval.dtype:
        v = r.astype(aval.dtype)
        if r.dtype.kind in "iu" and not bool(xp.array_equal(v, r)):
            raise HostError(
                f"anybind op '{call.op.name}': {what} has dtype {r.dtype} and values that "
                f"{np.dtype(aval.dtype).name} (its declared dtype with x64 off) cannot hold")
        r = v
    ok_shape = r.shape == shape or (allow_lead_one and r.shape == (1,) + shape[1:])
    if not ok_shape or r.dtype != aval.dtype:
        raise HostError(
            f"anybind op '{call.op.name}': {what} has shape {r.shape} and dtype {r.dtype}; "
            f"declared shape {shape} and dtype {np.dtype(aval.dtype).name}")
    return r


def remember_host_error(op, err: HostError) -> None:
    """Keep a failed call's HostError, keyed by its message, for an eager caller to re-raise.

    The runtime error that reaches the caller carries the message, so each
    caller finds its own error, whichever thread ran the callback.
    """
    with op._lock:
        errors = op._host_errors
        errors[str(err)] = err
        while len(errors) > 64:  # errors of jitted calls are never collected by a caller
            errors.pop(next(iter(errors)))
    with _RECENT_LOCK:  # for ab.debug(), which re-raises them from jitted calls too
        _RECENT.pop(str(err), None)
        _RECENT[str(err)] = err
        while len(_RECENT) > 8:
            _RECENT.pop(next(iter(_RECENT)))


def _where(e: BaseException) -> str:
    """Where the user's code raised: the outermost frame below anybind's own."""
    frames = traceback.extract_tb(e.__traceback__)
    inside = [i for i, f in enumerate(frames) if f.filename.startswith(_PACKAGE)]
    if not inside or inside[-1] + 1 >= len(frames):
        return ""
    f = frames[inside[-1] + 1]
    return f" (in {f.name}, {f.filename}:{f.lineno})"


def find_host_error(runtime_error: BaseException) -> HostError | None:
    """The HostError whose message a runtime error of a compiled program carries, if recent."""
    text = str(runtime_error)
    with _RECENT_LOCK:
        for msg in reversed(_RECENT):
            if msg in text:
                return _RECENT[msg]
    return None


def pop_host_error(op, runtime_error: BaseException) -> HostError | None:
    text = str(runtime_error)
    with op._lock:
        for msg in op._host_errors:
            if msg in text:
                return op._host_errors.pop(msg)
    mark = f"anybind op '{op.name}': the compiled "  # an error of compiled code (_shim.c)
    if mark in text:
        return HostError(text[text.index(mark):])
    return None


def _in_views(buffers) -> list:
    """Read-only NumPy views of XLA's input buffers.

    ``Buffer.__array__()`` is called directly: ``np.asarray(buffer)`` reaches
    the same method only after probing the other array protocols, which costs
    ≈ 0.3 µs a buffer, more than the view and the read-only flag together.
    """
    views = [b.__array__() for b in buffers]
    for v in views:
        v.setflags(write=False)  # XLA owns these; a host function must not write into them
    return views


def make_host_runner(call: Call, role_name: str, make_run: Callable, out_avals: Sequence,
                     out_names: Sequence[str], batch: Batch | None, mode,
                     inplace: bool = False, xp=np) -> Callable:
    """Returns ``runner(inputs, outputs)`` that fills the output arrays in place.

    ``xp``: the module of the arrays (NumPy; CuPy for device code, see ``_gpu``).
    """
    if inplace:  # the user's function writes into XLA's output buffers itself
        runner = _inplace_runner(call, make_run, batch, mode)
        if call.debug:
            runner = _debug.check_written(runner, call.op.name, role_name, out_names)
        return runner
    # x64 off: 64-bit results narrow as JAX narrowed their declared dtypes (read here, while
    # lowering, in the caller's context; the callback may run on another thread).
    as_result = functools.partial(_as_result, narrow=not config.enable_x64.value, xp=xp)
    ndarray, arrays = xp.ndarray, (xp.ndarray, np.generic)

    def what(j, b=None):
        row = "" if b is None else f" at batch index {b}"
        return f"the {role_name}'s {out_names[j]}{row}"

    expected = [(a.shape, np.dtype(a.dtype)) for a in out_avals]

    def store(o, r, j, shape, b=None, allow_lead_one=False):
        """Write one result, after checking it (cheaply when it is already right)."""
        if not (type(r) is ndarray and r.shape == shape and r.dtype == expected[j][1]):
            r = as_result(call, what(j, b), r, out_avals[j], shape, allow_lead_one)
        o[...] = r

    if batch is None:
        run = make_run(())
        if len(expected) == 1:  # the hot path, inlined
            e = expected[0]

            def runner(ins, outs):
                (r,) = run(*ins)
                if not (type(r) is ndarray and (r.shape, r.dtype) == e):
                    r = as_result(call, what(0), r, out_avals[0], e[0], False)
                outs[0][...] = r
            return runner

        checks = [(j, e[0], e[1]) for j, e in enumerate(expected)]

        def runner(ins, outs):  # the hot path of VJPs, inlined
            res = run(*ins)
            for j, shape, dtype in checks:
                r = res[j]
                if not (type(r) is ndarray and r.shape == shape and r.dtype == dtype):
                    r = as_result(call, what(j), r, out_avals[j], shape, False)
                outs[j][...] = r
        return runner

    size, mask = batch.size, batch.mask
    if mode == "vectorized":
        run = make_run((1,))
        shapes = [(size,) + e[0] for e in expected]

        def runner(ins, outs):
            for j, (r, o) in enumerate(zip(run(*ins), outs)):
                store(o, r, j, shapes[j], allow_lead_one=True)
        return runner

    if mode == "sequential":
        run = make_run(())
        batched = [i for i, m in enumerate(mask) if m]
        checks = list(enumerate(expected))

        def runner(ins, outs):
            row = [x[0, ...] for x in ins]  # unbatched inputs keep their one row
            for b in range(size):
                for i in batched:
                    row[i] = ins[i][b, ...]  # a view, 0-d for scalar rows
                res = run(*row)
                for j, e in checks:
                    r = res[j]
                    if not (isinstance(r, arrays) and r.shape == e[0] and r.dtype == e[1]):
                        r = as_result(call, what(j, b), r, out_avals[j], e[0], False)
                    outs[j][b] = r
        return runner

    # A user vmap rule for the primal function.
    declared = declared_out_batched(call, batch)

    def runner(ins, outs):
        leaves, flags = _impls.call_vmap_rule(call, mode.fn, batch, ins)
        if declared is not None:
            for j, (f, d) in enumerate(zip(flags, declared)):
                if f and not d:
                    raise HostError(
                        f"anybind op '{call.op.name}': the vmap rule returned {out_names[j]} "
                        f"batched, but its out_batched= declaration says it is unbatched "
                        f"for in_batched {batch.mask}")
        for j, (r, f, o) in enumerate(zip(leaves, flags, outs)):
            shape = ((size,) if f else ()) + expected[j][0]
            o[...] = as_result(call, f"the vmap rule's {out_names[j]}", r, out_avals[j],
                                shape, False)
    return runner


def _inplace_runner(call: Call, make_run: Callable, batch: Batch | None, mode) -> Callable:
    if batch is None:
        return make_run(())
    if isinstance(mode, Rule):  # an in-place vmap rule: one call for the whole batch
        return _inplace.vmap_rule(call, mode.fn, batch)
    if mode == "vectorized":
        return make_run((1,))
    run, mask = make_run(()), batch.mask

    def runner(ins, outs):
        for b in range(batch.size):
            run([x[b] if m else x[0] for x, m in zip(ins, mask)], [o[b, ...] for o in outs])
    return runner


def cpu_only(ctx, call: Call, what: str = "host code") -> str:
    """The CPU target of this lowering, or a clear error for other platforms."""
    platforms = ctx.module_context.platforms
    target = _TARGETS.get(platforms[0]) if len(platforms) == 1 else None
    if target is None:
        raise NotImplementedError(
            f"anybind op '{call.op.name}': {what} runs on the CPU backend only; this "
            f"program is compiled for {list(platforms)}. Bind a traced (JAX) function, or "
            f"place the computation on the CPU (jax.jit(..., device=jax.devices('cpu')[0])).")
    return target


def lower_host(ctx, *args, runner: Callable, call: Call, role_name: str,
               has_side_effect: bool, device: bool = False, xp=np):
    """Host code (or ``device`` code, on ``xp``'s arrays) as a callback of the program."""
    not_exported(ctx, call, role_name)
    guarded = host_callback(call, role_name, runner, device)
    if device or _gpu.platform(ctx, call) in _gpu.GPU_PLATFORMS:
        return _gpu.lower(ctx, *args, guarded=guarded, device=device, xp=xp,
                          has_side_effect=has_side_effect)
    slot = register(ctx, call, role_name, guarded)
    return emit(ctx, *args, slot=slot, has_side_effect=has_side_effect)


def host_callback(call: Call, role_name: str, runner: Callable,
                  device: bool = False) -> Callable:
    """``guarded(ins, outs)``: runs ``runner`` on arrays, keeps a failure's HostError.

    ``ins`` are read-only views of XLA's input buffers (copies in debug mode);
    ``device``: they are device arrays already (``_gpu``), used as they are.
    """
    op_name, op = call.op.name, call.op
    copy = call.debug and not device

    def guarded(ins, outs):
        try:
            runner(_debug.inputs(ins) if copy else ins, outs)
        except Exception as e:
            # Under jit only the message reaches the caller (XLA drops the cause, the
            # notes and the frames), so the message says where the user's code failed;
            # the cause keeps the whole story.
            if not isinstance(e, HostError):
                err = HostError(f"anybind op '{op_name}': the {role_name} raised "
                                f"{type(e).__name__}: {e}{_where(e)}")
                err.__cause__ = e
                e = err
            remember_host_error(op, e)
            raise e.with_traceback(None)
    return guarded


def buffer_callback(guarded: Callable, n_out: int) -> Callable:
    """``guarded`` as XLA's buffer callback: ``callback(exec_ctx, *ins, *outs)`` on Buffers."""
    def callback(exec_ctx, *buffers):
        del exec_ctx
        n = len(buffers) - n_out
        guarded(_in_views(buffers[:n]), [b.__array__() for b in buffers[n:]])
        return ()
    return callback


@dataclasses.dataclass(frozen=True)
class Slot:
    """How a program's custom call reaches a registered host callback."""
    target: str
    attrs: tuple  # ((name, value), ...)


def register(ctx, call: Call, role_name: str, guarded: Callable) -> Slot:
    """Register ``guarded(ins, outs)`` with the program being lowered, by the CPU route:
    anybind's FFI handler (``_hostffi``) where it is built, else XLA's buffer callback."""
    not_exported(ctx, call, role_name)
    cpu_only(ctx, call, "host code per shard (shard=)")  # other host code: lower_host
    if _hostffi.usable([*ctx.avals_in, *ctx.avals_out]):
        key = _hostffi.register(ctx.module_context, _lifetime.held(ctx, guarded))
        return Slot(_hostffi.TARGET, ((_hostffi.ATTRIBUTE, np.int64(key)),))
    callback = buffer_callback(guarded, len(ctx.avals_out))
    ctx.module_context.add_host_callback(_lifetime.held(ctx, callback))
    index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
    return Slot(_TARGETS[ctx.module_context.platforms[0]], (("index", index),))


def not_exported(ctx, call: Call, role_name: str) -> None:
    """Python code cannot be serialised: a clear error when the program is for export."""
    if ctx.module_context.lowering_parameters.for_export:
        raise ValueError(
            f"anybind op '{call.op.name}': its {role_name} is Python host code, which "
            f"jax.export cannot serialise; bind a compiled function (a Numba @cfunc, a "
            f"ctypes or cffi function of anybind's C calling convention) or a traced one "
            f"to export programs that use it")


def emit(ctx, *args, slot: Slot, has_side_effect: bool):
    """The custom call that runs the host callback registered as ``slot`` on ``args``."""
    rule = jax.ffi.ffi_lowering(slot.target, has_side_effect=has_side_effect)
    return rule(ctx, *args, **dict(slot.attrs))
