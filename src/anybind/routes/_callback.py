"""The buffer-callback route: host code on the CPU through XLA's buffer callback.

The fallback of Python host code on the CPU, where anybind's own FFI handler
(``_pyffi``) was not built or an operand has a dtype NumPy cannot view: XLA's
``xla_buffer_python_cpu_callback`` (``jax.experimental.buffer_callback``'s
target) calls back into Python with a ``Buffer`` per operand; the runner gets
NumPy views of them, read-only for the inputs.

=================  ==============================================================
piece              what it does
=================  ==============================================================
``claims``         host code (the last route: others are tried first)
``slot``           a guarded runner registered with the program being lowered
``lower``          ``slot`` and the custom call that runs it
=================  ==============================================================
"""
from __future__ import annotations

import gc
from collections.abc import Callable
from sys import getrefcount

import numpy as np

from ..core import _jax, _lifetime
from ..core._lowering import Site
from ._host import (
    Slot,
    cpu_only,
    emit,
    host_callback,
    kept_views,
    not_exported,
    platform,
    release_frames,
    repoint_kept,
    runner_for,
)

TARGET = "xla_buffer_python_cpu_callback"


class _ReadOnly:
    """The base of an input view on this route: a read-only window on the buffer's address.

    It holds nothing of jaxlib's: a ``Buffer`` gives a writable array to anyone
    who asks (``np.asarray(buffer)``), and NumPy lets a view's WRITEABLE flag be
    set again only where a base is writable or exports a writable buffer, which
    this object does not. So no flag host code sets, on a view or on anything it
    reaches from one, makes the caller's array writable.
    """

    __slots__ = ("__array_interface__",)

    def __init__(self, interface: dict) -> None:
        self.__array_interface__ = interface


def _read_only(buffer) -> np.ndarray:
    v = buffer.__array__()
    interface = v.__array_interface__
    interface["data"] = (interface["data"][0], True)
    w = np.asarray(_ReadOnly(interface))
    return w if w.dtype == v.dtype else w.view(v.dtype)  # ml_dtypes' types travel as void


def _in_views(buffers) -> list:
    """Read-only NumPy views of XLA's input buffers, which no flag makes writable.

    ``Buffer.__array__()`` is called directly: ``np.asarray(buffer)`` reaches
    the same method only after probing the other array protocols.
    """
    return [_read_only(b) for b in buffers]


def _held(views: list) -> bool:
    """Whether anyone but the list holds one of the views."""
    for v in views:
        if getrefcount(v) > 3:  # the list, the name v, and getrefcount's argument
            return True
    return False


def _to_copies(ins: list, outs: list) -> None:
    """Point the held views, and the views derived from them, at private copies."""
    kept = []
    for views in (ins, outs):
        for v in views:
            if getrefcount(v) > 3:  # the list, the name v, and getrefcount's argument
                base = v.base if isinstance(v.base, np.ndarray) else v  # (ml_dtypes' views)
                kept.append((base, v.__array_interface__["data"][0], v.nbytes, v.copy()))
    if kept:  # the walk of Python's heap, for the views derived from them
        repoint_kept(kept)


def buffer_callback(guarded: Callable, n_out: int) -> Callable:
    """``guarded`` as XLA's buffer callback: ``callback(exec_ctx, *ins, *outs)`` on Buffers.

    A view's base is not an array (a Buffer of jaxlib's own for an output, a
    ``_ReadOnly`` window for an input), so every view NumPy derives from it
    holds the view itself: a view that host code keeps past the call, or one
    derived from it, shows as a reference to the view that the call did not
    give back, and the call fails with an error naming it; the views held, and
    those derived from them that Python can find, are pointed at private copies.
    A failed call's traceback lets go of the views it holds.
    """
    what = getattr(guarded, "what", "anybind host code")

    def callback(exec_ctx, *buffers):
        del exec_ctx
        n = len(buffers) - n_out
        ins, outs = _in_views(buffers[:n]), [b.__array__() for b in buffers[n:]]
        try:
            guarded(ins, outs)
        except BaseException as e:
            if _held(ins) or _held(outs):
                release_frames(e, False)
                if _held(ins) or _held(outs):
                    release_frames(e, True)
                    _to_copies(ins, outs)
            raise
        if _held(ins) or _held(outs):
            _jax.collect_garbage()  # jaxlib's garbage (what a transfer held) may hold them,
            if _held(ins) or _held(outs):
                gc.collect()  # or garbage awaiting the collector (reference cycles)
            if _held(ins) or _held(outs):
                kept_in = [i for i in range(n) if getrefcount(ins[i]) > 2]  # list, argument
                kept_out = [j for j in range(n_out) if getrefcount(outs[j]) > 2]
                _to_copies(ins, outs)
                kept_views(what, kept_in, kept_out)
        return ()
    return callback


def slot(ctx, guarded: Callable) -> Slot:
    """Register ``guarded(ins, outs)`` with the program being lowered."""
    callback = buffer_callback(guarded, len(ctx.avals_out))
    ctx.module_context.add_host_callback(_lifetime.held(ctx, callback))
    index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
    return Slot(TARGET, (("index", index),))


class Route:
    name = "callback"

    def claims(self, site: Site) -> bool:
        return True

    def lower(self, site: Site, *args):
        ctx, call = site.ctx, site.call
        not_exported(ctx, call, site.name)
        platform(ctx, call)  # one platform: a clear error for several
        cpu_only(ctx, call)
        guarded = host_callback(call, site.name, runner_for(site)(call, site.batch))
        return emit(ctx, *args, slot=slot(ctx, guarded), has_side_effect=site.effect)
