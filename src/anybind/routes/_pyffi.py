"""Python host code through anybind's own FFI handler (``_pycall.c``) on the CPU.

XLA's buffer callback reaches a host function through jaxlib's Python layer:
a ``Buffer`` object per operand, a call with an execution context, then
anybind's views. anybind's handler takes the GIL, makes NumPy arrays over
XLA's buffers itself and calls the guarded runner (``_host``) with them,
at about a third of the cost per call (benchmarks/README.md). Where the
handler was not built (no C compiler at install) or an operand has a dtype
NumPy cannot view, host code takes XLA's buffer callback (``_callback``).

=================  ==============================================================
piece              what it does
=================  ==============================================================
``handler``        the extension, with the registry and the dtype table handed to
                   it, and the target registered with XLA; ``None`` if not built
``usable``         whether a custom call with these avals can take this route
``claims``         host code in a CPU program whose operands NumPy can view
``slot``           ``register``, as the slot of a custom call
``register``       hands the program being lowered the callable (as one of its
                   host callbacks, which XLA's route would call and this one never
                   does) and a weak reference to it to the registry, under a fresh
                   random key, with the operands it takes: the program holds its
                   callbacks exactly as XLA's own route does, so ops are collected
                   as before (``_lifetime``)
=================  ==============================================================

The key is passed as the attribute ``anybind_callback``; it is meaningful in
this process only, which is why ``jax.export`` refuses host code before
lowering reaches here (``_host.not_exported``). It is a random 63-bit number,
and the handler checks each call's operands against those registered with the
callable before host code runs, so that a crafted program can neither guess a
key nor hand host code operands it was not written for.
"""
from __future__ import annotations

import secrets
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from ..core import _jax, _lifetime
from ..core._lowering import Site
from . import _dtypes
from ._host import (
    Slot,
    emit,
    host_callback,
    kept_views,
    not_exported,
    release_frames,
    repoint_kept,
    runner_for,
    single_platform,
)

TARGET = "anybind_python"
ATTRIBUTE = "anybind_callback"
enabled = True  # False: every host call takes XLA's buffer callback (benchmarks compare both)

# key -> (weakref to the callable, its signature, what it is), read by the handler under the GIL
_registry: dict[int, tuple] = {}
_viewable: set[str] = set()  # the dtypes of _CODES that this NumPy and ml_dtypes have
_lock = threading.Lock()

_CODES = _dtypes.CODES  # XLA_FFI_DataType codes of the dtypes NumPy views directly


class _Held:
    """The callable as the compiled program holds it (among its host callbacks)."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable) -> None:
        self.callback = callback

    def __call__(self, *args):
        raise RuntimeError("anybind: a callable of anybind's Python FFI handler was called "
                           "as XLA's buffer callback")


_loaded: list = []  # [the extension, or None], once loaded


def handler():
    """The handler's extension module, ready to use, or ``None`` where it was not built."""
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0]


def _load():
    try:
        from . import _pycall
    except ImportError as e:
        warnings.warn(
            f"anybind: its Python FFI handler (anybind.routes._pycall) was not built when "
            f"anybind was installed ({e}), so host code runs through XLA's buffer callback, "
            f"at about twice the cost per call. Reinstall anybind where a C compiler is found "
            f"(ANYBIND_REQUIRE_HANDLERS=1 makes a build without it fail)",
            RuntimeWarning, stacklevel=2)
        return None
    import jax
    import jax.ffi
    import ml_dtypes
    _pycall.set_registry(_registry)
    _pycall.set_hooks(kept_views, release_frames, repoint_kept, _jax.collect_garbage)
    for name, code in _CODES.items():
        dtype = getattr(ml_dtypes, name, None) if name.startswith(("bfloat", "float8")) \
            else np.dtype(name)
        if dtype is not None:  # a float8 type that this ml_dtypes lacks is left out
            _pycall.set_dtype(code, dtype)
            _viewable.add(name)
    jax.devices("cpu")  # XLA asks the handler for its version: only once a backend exists
    jax.ffi.register_ffi_target(TARGET, _pycall.handler(), platform="cpu")
    return _pycall


def usable(avals: Sequence) -> bool:
    """Whether a host call on operands and results of these avals can take this route."""
    return (enabled and handler() is not None
            and all(np.dtype(a.dtype).name in _viewable for a in avals))


def signature(avals_in: Sequence, avals_out: Sequence, shapes: bool = True) -> bytes:
    """The operands a callable takes, as the handler checks them (see ``_pycall.c``).

    ``shapes=False``: any extent along each axis (a callable run per shard).
    """
    words = [len(avals_in), len(avals_out)]
    for a in (*avals_in, *avals_out):
        words += [_CODES[np.dtype(a.dtype).name], len(a.shape)]
        words += [int(d) for d in a.shape] if shapes else [-1] * len(a.shape)
    return np.asarray(words, np.int64).tobytes()


def register(module_context, callback: Callable, sig: bytes, what: str) -> int:
    """Register ``callback(ins, outs)`` for the program being lowered; its key.

    ``sig``: the operands it takes (``signature``); ``what``: what it is, for
    messages ("anybind op 'f': the function").
    """
    module_context.add_host_callback(_Held(callback))
    with _lock:
        key = 0
        while key == 0 or key in _registry:
            key = secrets.randbits(63)
        _registry[key] = (weakref.ref(callback, lambda _, key=key: _registry.pop(key, None)),
                          sig, what)
    return key


def slot(ctx, guarded: Callable, shapes: bool = True) -> Slot:
    """Register ``guarded(ins, outs)`` with the program being lowered, as a custom call's slot.

    ``shapes=False``: calls of any extents (per shard) reach it.
    """
    sig = signature(ctx.avals_in, ctx.avals_out, shapes)
    key = register(ctx.module_context, _lifetime.held(ctx, guarded), sig,
                   getattr(guarded, "what", "anybind host code"))
    return Slot(TARGET, ((ATTRIBUTE, np.int64(key)),))


class Route:
    name = "pyffi"

    def claims(self, site: Site) -> bool:
        ctx = site.ctx
        return (single_platform(ctx) == "cpu"
                and usable([*ctx.avals_in, *ctx.avals_out]))

    def lower(self, site: Site, *args):
        ctx, call = site.ctx, site.call
        not_exported(ctx, call, site.name)
        guarded = host_callback(call, site.name, runner_for(site)(call, site.batch))
        return emit(ctx, *args, slot=slot(ctx, guarded), has_side_effect=site.effect)
