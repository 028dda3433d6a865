"""State for compiled code: ``ab.State``, an object of the user's compiled code that
an op's compiled functions get as a tenth argument, and that is freed once the op
and every program using it are gone.

==================  ===============================================================
piece               what it does
==================  ===============================================================
``State``           a pointer and the function that frees it; registered with the
                    shim under an unguessable id, which a program carries as the
                    attribute ``anybind_state`` (no operand, so no x64 needed)
``hold``            at lowering: the program being compiled holds the state
                    (JAX's keepalives), so it lives as long as any program that
                    passes it, and the call gets its id
==================  ===============================================================

What holds a state: the op (``ab.bind(state=)``), and each program lowered
with it; when the last goes, the shim drops its id (a program that still
named it would get an error, never a freed pointer) and ``free`` runs once, in
the thread where Python collects the last holder. The pointer cannot travel:
``jax.export`` of a program with a stateful op is an error naming the op.
"""
from __future__ import annotations

import ctypes
import pickle
import secrets
import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _shimlib

_lock = threading.Lock()
_ids: set = set()  # the ids of live states


def _address(pointer: Any) -> int:
    """The address of a pointer given as an int, a ctypes pointer or a cffi pointer."""
    if isinstance(pointer, int):
        return pointer
    if isinstance(pointer, ctypes.c_void_p):
        return pointer.value or 0
    if isinstance(pointer, ctypes._Pointer):
        return ctypes.cast(pointer, ctypes.c_void_p).value or 0
    if type(pointer).__module__ == "_cffi_backend":
        from ..core._code import cffi_ffi
        return int(cffi_ffi().cast("uintptr_t", pointer))
    raise TypeError(f"ab.State: the pointer must be an int, a ctypes pointer (c_void_p, "
                    f"POINTER(...)) or a cffi pointer, got {type(pointer).__name__}")


class State:
    """An object of compiled code that lives as long as the ops and programs using it.

    ``pointer``: the object (an int address, a ctypes or a cffi pointer), as
    the user's own C code made it. ``free``: called once with ``pointer`` when
    nothing holds the state any more (a ctypes or cffi function, or any
    callable); ``None`` if the object needs no freeing.

    Bound with ``ab.bind(fn, state=ab.State(...))``, each compiled function and
    compiled rule of the op is called with the pointer as a tenth argument,
    ``void *state``, after ``err_size`` (``ab.numba_signature(state=True)``,
    ``ab.ctypes_signature(state=True)``). Calls may run at once on several
    threads with the same pointer: the code must only read the object, or lock.

    >>> import anybind as ab, ctypes
    >>> freed = []
    >>> s = ab.State(ctypes.c_void_p(1234), free=lambda p: freed.append(p.value))
    >>> s.address, freed
    (1234, [])
    >>> del s; freed
    [1234]
    """

    __slots__ = ("address", "id", "_finalizer", "__weakref__")

    def __init__(self, pointer: Any, free: Callable[[Any], Any] | None = None) -> None:
        address = _address(pointer)
        if not address:
            raise ValueError("ab.State: the pointer is NULL")
        if free is not None and not callable(free):
            raise TypeError(f"ab.State: free must be callable (or None), got "
                            f"{type(free).__name__}")
        lib = _shimlib.load()
        with _lock:
            state_id = 0
            while state_id == 0 or state_id in _ids:
                state_id = secrets.randbits(63)
            status = lib.anybind_state_set(state_id, address)
            if status != 0:
                raise MemoryError(f"ab.State: the FFI shim could not register it "
                                  f"(status {status})")
            _ids.add(state_id)
        self.address, self.id = address, state_id
        self._finalizer = weakref.finalize(self, _release, lib, state_id, pointer, free)

    def __repr__(self) -> str:
        return f"<ab.State at 0x{self.address:x}>"

    def __reduce__(self):
        raise pickle.PicklingError(
            "ab.State is a pointer into this process's memory: it cannot be pickled; "
            "build the object again where the op is bound")


def _release(lib, state_id: int, pointer, free) -> None:
    with _lock:
        lib.anybind_state_drop(state_id)  # from now on a call naming it is refused
        _ids.discard(state_id)
    if free is not None:
        free(pointer)


def hold(ctx, op, state: State) -> int:
    """The id a call of ``op`` passes; the program being lowered holds ``state``."""
    if ctx.module_context.lowering_parameters.for_export:
        raise ValueError(
            f"anybind op '{op.name}' has compiled state (ab.State at 0x{state.address:x}), a "
            f"pointer into this process that a program for jax.export cannot carry to "
            f"another process. Export a program without this op, or bind one that builds "
            f"what it needs from array operands")
    ctx.module_context.add_keepalive(state)
    return state.id
