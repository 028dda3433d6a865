"""Debug mode: host code gets copies of its inputs, and unwritten outputs are named.

Outside debug mode a host function sees read-only views of XLA's own input
buffers, valid only while the call runs (XLA reuses the memory afterwards), and
an ``out=True`` function writes straight into XLA's output buffers, which hold
whatever was there before. In debug mode (``ANYBIND_DEBUG=1`` in the
environment, or inside ``with ab.debug():``) every host call instead

=====================  ======================================================
piece                  what it does
=====================  ======================================================
``inputs``             hands host code copies of its inputs, so that a
                       reference kept past the call keeps its values
``check_written``      fills an ``out=True`` function's outputs with a
                       sentinel before the call, and raises a ``HostError``
                       naming every output element still holding it after
                       (compiled functions: the shim does the same, told by
                       the attribute ``anybind_debug`` of their custom call)
``DEBUG``              the switch: a JAX configuration state, part of every
                       compilation cache key, so programs compiled outside
                       debug mode are compiled again inside it
=====================  ======================================================

The sentinel is a NaN with the payload 0xA5… for floating and complex dtypes
and the byte 0xA5 repeated for the others (an element is "unwritten" when all
its bytes still hold it; a complex element when either part does).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from . import _jax
from ._errors import HostError, find_host_error

DEBUG = _jax.bool_state(
    name="anybind_debug", default=False, include_in_jit_key=True,
    include_in_trace_context=True,
    help="anybind debug mode: host code gets copies of its inputs, and outputs that an "
         "out=True or compiled function leaves unwritten raise an error naming them.")

_BYTE = 0xA5
_SHOWN = 10  # unwritten elements named in a message, at most


@contextlib.contextmanager
def debug(enabled: bool = True) -> Iterator[None]:
    """Run host code in debug mode inside this block (``ANYBIND_DEBUG=1`` does it everywhere).

    Host functions and rules get copies of their inputs instead of views of
    XLA's buffers, and an ``out=True`` function or a compiled function that
    leaves output elements unwritten raises ``ab.HostError`` naming them. A host call failing inside
    a compiled program raises its ``ab.HostError`` (with the user's exception as
    its cause) instead of ``jax.errors.JaxRuntimeError``. Programs compiled outside
    the block are compiled again inside it (the mode is part of JAX's
    compilation cache key), so use it while looking for a bug, not in a hot loop.

    >>> import anybind as ab, numpy as np
    >>> def half(x, *, out):
    ...     out[: x.size // 2] = x[: x.size // 2]      # forgets the second half
    >>> op = ab.bind(half, shape=ab.like(0), out=True, name="half")
    >>> with ab.debug():
    ...     try:
    ...         op(np.ones(4))
    ...     except ab.HostError as e:
    ...         print(str(e).splitlines()[0])
    anybind op 'half': the function left 2 of 4 elements of output 0 unwritten: [2], [3]
    """
    with DEBUG(bool(enabled)):
        try:
            yield
        except jax.errors.JaxRuntimeError as e:  # a host call failed inside a program
            err = find_host_error(e) if enabled else None
            if err is None:
                raise
            raise err from err.__cause__


def enabled() -> bool:
    return bool(DEBUG.value)


def inputs(buffers) -> list:
    """Read-only copies of the input buffers."""
    copies = [np.asarray(b).copy() for b in buffers]
    for c in copies:
        c.setflags(write=False)
    return copies


def _sentinel(dtype: np.dtype) -> tuple[np.dtype, int]:
    """(unsigned integer dtype of one component, its sentinel bit pattern)."""
    kind = dtype.kind
    size = dtype.itemsize // (2 if kind == "c" else 1)
    udt = np.dtype(f"u{size}")
    byte_pattern = int.from_bytes(bytes([_BYTE]) * size, "little")
    if kind in "fc":  # a NaN: exponent all ones, top mantissa bit clear, payload 0xA5…
        bits = size * 8
        exp_bits = {2: 5, 4: 8, 8: 11}.get(size, 11)
        mant = bits - 1 - exp_bits
        exp = ((1 << exp_bits) - 1) << mant
        payload = byte_pattern & ((1 << (mant - 1)) - 1) | 1
        return udt, exp | payload
    return udt, byte_pattern


def _components(o: np.ndarray, udt: np.dtype) -> np.ndarray:
    """A view of the output's raw bits with a trailing axis: 2 components for complex, else 1."""
    return o.reshape(o.shape + (1,)).view(udt)  # XLA's buffers are contiguous: no copy


def check_written(run: Callable, op_name: str, role_name: str,
                  out_names: Sequence[str]) -> Callable:
    """``run(ins, outs)`` with its outputs filled by the sentinel first and checked after."""

    def runner(ins, outs):
        patterns = []
        for o in outs:
            udt, bits = _sentinel(o.dtype)
            _components(o, udt)[...] = bits
            patterns.append((udt, bits))
        run(ins, outs)
        for j, (o, (udt, bits)) in enumerate(zip(outs, patterns)):
            left = (_components(o, udt) == bits).any(axis=-1)
            if left.any():
                left = left.get() if hasattr(left, "get") else left  # CuPy (device code)
                where = np.argwhere(left)
                shown = ", ".join(str(list(map(int, w))) for w in where[:_SHOWN])
                more = f" and {len(where) - _SHOWN} more" if len(where) > _SHOWN else ""
                raise HostError(
                    f"anybind op '{op_name}': the {role_name} left {len(where)} of {left.size} "
                    f"elements of {out_names[j]} unwritten: {shown}{more}\n(debug mode: "
                    f"outputs are filled with a sentinel before an out=True function runs)")
    return runner
