"""What every route of host code shares: the runner of a role, and its guard.

Host code gets NumPy views of XLA's own input and output buffers without
copying, runs the user's code, and every result is checked against the
declared shape and dtype before it is written into the output buffer. The
runner is registered with the module being compiled, so the executable keeps
the user's function and rules alive for as long as it exists.

====================  ===========================================================
piece                 what it does
====================  ===========================================================
``runner_for``        ``build(call, batch)`` of a site: the host runner of its
                      role for that call (a shard's, under ``shard=``)
``make_host_runner``  ``runner(ins, outs)`` of a role: calls the user's code (per
                      batch mode), checks and stores its results
``host_callback``     ``guarded(ins, outs)``: the runner, a failure turned into
                      the op's ``HostError`` (kept for eager callers, ``ab.debug``)
``kept_views``        the error of a call whose host code kept views of XLA's
                      buffers past its end (found by the routes, by reference counts)
``repoint_kept``      kept views (and views derived from them) that Python can
                      find, pointed at private copies of the buffers they view
``release_frames``    what a failed call's traceback holds of XLA's buffers, let go
``not_exported``      Python code in a program for ``jax.export``: a clear error
``platform``          the one platform of a lowering
``Slot``, ``emit``    a registered runner, and the custom call that runs it
====================  ===========================================================
"""
from __future__ import annotations

import contextvars
import ctypes
import dataclasses
import gc
import os
import threading
from collections.abc import Callable, Sequence

import jax.ffi
import numpy as np

from ..core import _debug, _frontends, _jax
from ..core._batching import declared_out_batched, host_mode
from ..core._errors import (
    HostError,
    describe,
    message_of,
    remember_host_error,
    remember_recent_host_error,
    where,
)
from ..core._lowering import Site
from ..core._spec import Batch, Call, Rule
from ..core.roles import make_run, out_avals, out_names
from ..core.roles._common import exact_python_scalar, is_python_scalar
from ..core.roles._primal import call_vmap_rule, vmap_rule_inplace

GPU_PLATFORMS = ("cuda", "rocm")

_NARROWED = {np.dtype(w): np.dtype(n) for w, n in ((np.int64, np.int32), (np.uint64, np.uint32),
                                                   (np.float64, np.float32),
                                                   (np.complex128, np.complex64))}


def _as_result(call: Call, what: str, r, aval, shape: tuple, allow_lead_one: bool,
               narrow: bool = False, xp=np) -> np.ndarray:
    """Check one returned value against the declared aval; never cast or broadcast silently.

    With ``narrow`` (x64 off, and this result declared 64-bit: JAX narrowed the
    declaration to 32 bits, its one narrowing), a 64-bit result is narrowed the
    same way, integers only where every value fits. Nothing else is cast.
    """
    if r is None:
        raise HostError(f"anybind op '{call.op.name}': {what} is None; expected "
                        f"{np.dtype(aval.dtype).name}{list(shape)}")
    if is_python_scalar(r):
        v = exact_python_scalar(r, aval.dtype)
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
        why = ""
        if ok_shape and _NARROWED.get(r.dtype) == aval.dtype:
            why = (" (with x64 off, only a result whose output spec declares a 64-bit "
                   "dtype is narrowed to 32 bits, as JAX narrows that declaration)")
        raise HostError(
            f"anybind op '{call.op.name}': {what} has shape {r.shape} and dtype {r.dtype}; "
            f"declared shape {shape} and dtype {np.dtype(aval.dtype).name}{why}")
    return r


def runner_for(site: Site, xp=np) -> Callable[[Call, Batch | None], Callable]:
    """``build(call, batch)``: the host runner of ``site``'s role for ``call`` and ``batch``.

    The batching is the site's: a vmap rule replaces the batched primal, rules
    batch by their own ``vmap=`` or the op's mode (``host_mode``).
    """
    role, rule, lin, need = site.role, site.rule, site.lin, site.need
    if site.by_vmap_rule:
        mode = rule
    elif site.batch is not None:
        rule, mode = host_mode(role, rule, site.op)
    else:
        mode = None
    names = out_names(role, site.call, need)
    if site.batch is not None:
        _check_batched_rank(site)

    def build(call: Call, batch: Batch | None) -> Callable:
        return make_host_runner(
            call, site.name, lambda lead: make_run(role, call, rule, lin, need, xp, lead),
            out_avals(role, call, lin, need), names, batch, mode, inplace=rule.out, xp=xp,
            wide=declared_wide(role, call))
    return build


def declared_wide(role: str, call: Call) -> list:
    """Per result of ``role``: whether its output spec declared a 64-bit dtype that x64
    off made 32-bit. Cotangents take their inputs' dtypes, which JAX gave them."""
    if role == "primal":
        return list(call.out_wide)
    if role == "fwd":
        return list(call.out_wide) + list(call.res_wide)
    if role == "jvp":
        return [w for w, f in zip(call.out_wide, call.float_out) if f]
    return []


_MAX_RANK = 64  # NumPy's


def _check_batched_rank(site: Site) -> None:
    """Host code gets a batched call's operands with the batch axis: NumPy must hold them."""
    rank = max((a.ndim for a in [*site.ctx.avals_in, *site.ctx.avals_out]), default=0)
    if rank > _MAX_RANK:
        raise TypeError(
            f"anybind op '{site.op.name}': under vmap its {site.name} gets arrays of rank "
            f"{rank} (the batch axis leads every operand), over NumPy's limit of {_MAX_RANK} "
            f"dimensions for host code; vmap over fewer axes or bind a traced function")


def make_host_runner(call: Call, role_name: str, make_run: Callable, out_avals: Sequence,
                     out_names: Sequence[str], batch: Batch | None, mode,
                     inplace: bool = False, xp=np, wide: Sequence[bool] = ()) -> Callable:
    """Returns ``runner(inputs, outputs)`` that fills the output arrays in place.

    ``xp``: the module of the arrays (NumPy; CuPy for device code, see ``routes._gpu_device``);
    ``wide``: per result, whether its output spec declared a 64-bit dtype that x64 off
    made 32-bit (``declared_wide``): the one case where a result is narrowed.
    """
    if inplace:  # the user's function writes into XLA's output buffers itself
        runner = _inplace_runner(call, make_run, batch, mode)
        if call.debug:
            runner = _debug.check_written(runner, call.op.name, role_name, out_names)
        return runner
    # x64 off: a 64-bit result narrows where JAX narrowed its declared 64-bit dtype (read
    # here, while lowering, in the caller's context; the callback may run on another thread).
    x64 = _jax.enable_x64.value
    narrows = [not x64 and j < len(wide) and bool(wide[j]) for j in range(len(out_avals))]

    def as_result(call, what, r, aval, shape, allow_lead_one, j):
        return _as_result(call, what, r, aval, shape, allow_lead_one, narrows[j], xp)
    ndarray, arrays = xp.ndarray, (xp.ndarray, np.generic)

    def what(j, b=None):
        row = "" if b is None else f" at batch index {b}"
        return f"the {role_name}'s {out_names[j]}{row}"

    expected = [(a.shape, np.dtype(a.dtype)) for a in out_avals]

    def store(o, r, j, shape, b=None, allow_lead_one=False):
        """Write one result, after checking it (cheaply when it is already right)."""
        if not (type(r) is ndarray and r.shape == shape and r.dtype == expected[j][1]):
            r = as_result(call, what(j, b), r, out_avals[j], shape, allow_lead_one, j)
        o[...] = r

    if batch is None:
        run = make_run(())
        put = _putter(xp)
        if len(expected) == 1:  # the hot path, inlined
            e = expected[0]

            def runner(ins, outs):
                (r,) = run(*ins)
                if not (type(r) is ndarray and (r.shape, r.dtype) == e):
                    r = as_result(call, what(0), r, out_avals[0], e[0], False, 0)
                put(outs[0], r)
            return runner

        checks = [(j, e[0], e[1]) for j, e in enumerate(expected)]

        def runner(ins, outs):  # the hot path of VJPs, inlined
            res = run(*ins)
            for j, shape, dtype in checks:
                r = res[j]
                if not (type(r) is ndarray and r.shape == shape and r.dtype == dtype):
                    r = as_result(call, what(j), r, out_avals[j], shape, False, j)
                put(outs[j], r)
        return runner

    size, mask = batch.size, batch.mask
    if mode in ("expand_dims", "broadcast_all"):
        run = make_run((1,))
        shapes = [(size,) + e[0] for e in expected]
        widen = broadcaster(batch) if mode == "broadcast_all" else None

        def runner(ins, outs):
            for j, (r, o) in enumerate(zip(run(*(widen(ins) if widen else ins)), outs)):
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
                        r = as_result(call, what(j, b), r, out_avals[j], e[0], False, j)
                    outs[j][b] = r
        return runner

    # A user vmap rule for the primal function.
    declared = declared_out_batched(call, batch)

    def runner(ins, outs):
        leaves, flags = call_vmap_rule(call, mode.fn, batch, ins)
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
                                shape, False, j)
    return runner


def _putter(xp) -> Callable:
    """``put(o, r)``: a checked result (its output's shape and dtype) into its output.

    For device arrays (CuPy) a C-contiguous result goes by one asynchronous copy on
    the current stream (XLA's, in the device route): about 6 µs of host time against
    15 for CuPy's ``o[...] = r`` (H100, CuPy 14; ``benchmarks/gpu_compiled.py``)."""
    if xp is np:
        def put(o, r):
            o[...] = r
        return put

    def put(o, r):
        copy = getattr(r.data, "copy_from_device_async", None)
        if copy is not None and r.flags.c_contiguous and o.flags.c_contiguous:
            if r.nbytes and r.data.ptr != o.data.ptr:
                o.data.copy_from_device_async(r.data, r.nbytes)
        else:
            o[...] = r
    return put


def _inplace_runner(call: Call, make_run: Callable, batch: Batch | None, mode) -> Callable:
    if batch is None:
        return make_run(())
    if isinstance(mode, Rule):  # an in-place vmap rule: one call for the whole batch
        return vmap_rule_inplace(call, mode.fn, batch)
    if mode == "expand_dims":
        return make_run((1,))
    if mode == "broadcast_all":
        run, widen = make_run((1,)), broadcaster(batch)
        return lambda ins, outs: run(widen(ins), outs)
    run, mask = make_run(()), batch.mask

    def runner(ins, outs):
        for b in range(batch.size):
            run([x[b] if m else x[0] for x, m in zip(ins, mask)], [o[b, ...] for o in outs])
    return runner


def broadcaster(batch: Batch) -> Callable:
    """``widen(ins)``: unbatched inputs (a leading axis of 1) as read-only views
    broadcast to the batch's length, for ``vmap="broadcast_all"``; nothing is copied."""
    size, mask = batch.size, batch.mask

    def widen(ins):
        return [x if m else np.broadcast_to(x, (size,) + x.shape[1:])
                for x, m in zip(ins, mask)]
    return widen


# Host code that calls ops whose host code runs on the same thread nests; without a base
# case it would nest until Python's recursion limit, whose errors then nest in turn.
MAX_NESTING = 16
_nesting: contextvars.ContextVar[int] = contextvars.ContextVar("anybind_host_nesting",
                                                                default=0)  # per thread
# Each host call that runs holds one of the computations XLA runs at once on a device
# (32 on the CPU), and waits for those its host code starts: threads whose nested host
# calls hold all of them wait on each other forever. A host call nested in another is
# refused once this many run in the process, leaving room for the JAX operations that
# host code runs in between.
MAX_RUNNING = 24
_running = [0]
_running_lock = threading.Lock()


def in_host_call() -> bool:
    """Whether host code of an op runs on this thread now (for front ends' guards)."""
    return _nesting.get() > 0


def host_callback(call: Call, role_name: str, runner: Callable,
                  device: bool = False) -> Callable:
    """``guarded(ins, outs)``: runs ``runner`` on arrays, keeps a failure's HostError.

    ``ins`` are read-only views of XLA's input buffers (copies in debug mode);
    ``device``: they are device arrays already (``routes._gpu_device``), used as they are.
    ``guarded.what`` says what it runs ("anybind op 'f': the jvp rule").
    """
    op_name, op = call.op.name, call.op
    copy = call.debug and not device
    _frontends.load_present()  # their guards (torch's wrappers of read-only inputs)

    def guarded(ins, outs):
        depth = _nesting.get() + 1
        token = _nesting.set(depth)
        with _running_lock:
            _running[0] += 1
            running = _running[0]
        try:
            if depth > MAX_NESTING:
                raise HostError(
                    f"anybind op '{op_name}': its {role_name} runs inside {MAX_NESTING} calls "
                    f"of host code on this thread, each called by the one before: host code "
                    f"that calls an op whose host code calls it again, with no base case "
                    f"(anybind.routes._host.MAX_NESTING is the limit)")
            if depth > 1 and running > MAX_RUNNING:
                raise HostError(
                    f"anybind op '{op_name}': its {role_name}, called from host code, would be "
                    f"host call {running} running at once in this process (threads whose host "
                    f"code calls ops): each holds one of the few computations XLA runs at once "
                    f"on a device (32 on the CPU), and nested calls that hold them all wait on "
                    f"each other forever (anybind.routes._host.MAX_RUNNING is the limit)")
            _jax.without_mesh(runner, _debug.inputs(ins) if copy else ins, outs)
        except BaseException as e:  # KeyboardInterrupt too: re-raised itself by eager calls
            # Under jit only the message reaches the caller (XLA drops the cause, the
            # notes and the frames), so the message says where the user's code failed;
            # the cause keeps the whole story. Its text is made safe to carry: a
            # __str__ that raises, or a lone surrogate, must not lose the op's name.
            if not (isinstance(e, HostError) and message_of(e) is not None):
                err = HostError(f"anybind op '{op_name}': the {role_name} raised "
                                f"{describe(e)}{where(e)}")
                err.__cause__ = e
                e = err
            remember_host_error(op, e)
            raise e.with_traceback(None)  # noqa: B904  (e's cause is set above)
        finally:
            with _running_lock:
                _running[0] -= 1
            _nesting.reset(token)
    guarded.what = f"anybind op '{op_name}': the {role_name}"
    return guarded


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # anybind/


def kept_views(what: str, inputs: Sequence[int], outputs: Sequence[int]) -> None:
    """Raise the error of a call whose host code kept views of XLA's buffers past its end.

    ``what``: "anybind op 'f': the function"; ``inputs``, ``outputs``: the
    indices of the operands whose views (or views derived from them) were kept.
    """
    kept = [f"input {i}" for i in inputs] + [f"output {j}" for j in outputs]
    err = HostError(
        f"{what} kept a reference to {' and '.join(kept)} past the end of the call: a NumPy "
        f"view of XLA's buffer, valid only while the call runs (XLA reuses the memory "
        f"after it). Keep a copy instead (np.array(x))")
    remember_recent_host_error(err)
    raise err


def repoint_kept(kept: list) -> None:
    """Point the kept views of XLA's buffers that Python can find at private copies.

    ``kept``: ``(base, start, size, copy)`` per operand whose views host code
    kept past the call: the base its views share (the FFI handler's lease, the
    buffer callback's view itself), the address and size of the buffer they
    view, and a byte-for-byte copy of it. Every array reachable from an object
    that Python's collector tracks (lists, dicts, frames, closures, instances;
    tuples and dicts it stopped tracking are looked into) whose chain of bases
    reaches one of those bases is found; an array reachable only from C, or a
    ``memoryview`` that holds a buffer's address itself, is not. This walks
    Python's heap once, on the error path only.
    """
    by_base = {id(entry[0]): entry for entry in kept}
    seen: set[int] = set()

    def look(r, depth: int) -> None:
        if issubclass(type(r), np.ndarray):  # type(), not isinstance: no __class__ is run
            if id(r) in seen:
                return
            seen.add(id(r))
            base = r
            while issubclass(type(base), np.ndarray):
                entry = by_base.get(id(base))
                if entry is not None:
                    _, start, size, copy = entry
                    _repoint(r, start, size, copy)
                    return
                base = base.base
        elif depth < 4 and type(r) in (tuple, dict, list) and not gc.is_tracked(r):
            for x in (r.values() if type(r) is dict else r):
                look(x, depth + 1)

    for o in gc.get_objects():
        for r in gc.get_referents(o):
            look(r, 0)
    for entry in kept:  # the views themselves, wherever they are held
        look(entry[0], 0)


def _repoint(a: np.ndarray, start: int, size: int, copy: np.ndarray) -> bool:
    """Point ``a``, whose data lies in the ``size`` bytes at ``start``, at the same place
    in ``copy``; whether it did. The FFI handler's own function where it is built; else
    the same two stores into NumPy's public array struct (``PyArrayObject_fields``:
    ``data`` after the object header, ``base`` after ``nd``, ``dimensions`` and
    ``strides``), with the references counted as NumPy counts them."""
    try:
        from . import _pycall
    except ImportError:
        pass
    else:
        return bool(_pycall.repoint(a, start, size, copy))
    word = ctypes.sizeof(ctypes.c_void_p)
    data = ctypes.c_void_p.from_address(id(a) + 2 * word)
    at = data.value or 0
    if not (start <= at < start + size or at == start):
        return False
    base = ctypes.c_void_p.from_address(id(a) + 6 * word)
    old = base.value
    _incref(id(copy))
    data.value = copy.ctypes.data + (at - start)
    base.value = id(copy)
    if old:
        _decref(old)
    return True


_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes, _incref.restype = [ctypes.c_void_p], None
_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes, _decref.restype = [ctypes.c_void_p], None


def release_frames(exc: BaseException, everything: bool) -> None:
    """Clear the frames of a failed call's tracebacks, which hold views of XLA's buffers:
    anybind's own, or ``everything`` (the user's too, where they still hold views)."""
    seen: set = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if everything or tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
                try:
                    tb.tb_frame.clear()
                except RuntimeError:  # still running
                    pass
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def not_exported(ctx, call: Call, role_name: str) -> None:
    """Python code cannot be serialised: a clear error when the program is for export."""
    if ctx.module_context.lowering_parameters.for_export:
        raise ValueError(
            f"anybind op '{call.op.name}': its {role_name} is Python host code, which "
            f"jax.export cannot serialise; bind a compiled function (a Numba @cfunc, a "
            f"ctypes or cffi function of anybind's C calling convention) or a traced one "
            f"to export programs that use it")


def single_platform(ctx) -> str | None:
    """The platform of a lowering for one platform, else None."""
    platforms = ctx.module_context.platforms
    return platforms[0] if len(platforms) == 1 else None


def platform(ctx, call: Call) -> str:
    """The one platform of this lowering (host and device code need one)."""
    platforms = ctx.module_context.platforms
    if len(platforms) != 1:
        raise NotImplementedError(
            f"anybind op '{call.op.name}': host and device code lower for one platform at "
            f"a time; this program is lowered for {list(platforms)} at once (lower it for "
            f"each platform)")
    return platforms[0]


def cpu_only(ctx, call: Call, what: str = "host code") -> None:
    """A clear error unless this lowering is for the CPU alone."""
    platforms = ctx.module_context.platforms
    if list(platforms) != ["cpu"]:
        raise NotImplementedError(
            f"anybind op '{call.op.name}': {what} runs on the CPU backend only; this "
            f"program is compiled for {list(platforms)}. Bind a traced (JAX) function, or "
            f"place the computation on the CPU (jax.jit(..., device=jax.devices('cpu')[0])).")


@dataclasses.dataclass(frozen=True)
class Slot:
    """How a program's custom call reaches a registered host callback."""
    target: str
    attrs: tuple  # ((name, value), ...)


def emit(ctx, *args, slot: Slot, has_side_effect: bool):
    """The custom call that runs the host callback registered as ``slot`` on ``args``."""
    rule = jax.ffi.ffi_lowering(slot.target, has_side_effect=has_side_effect)
    return rule(ctx, *args, **dict(slot.attrs))
