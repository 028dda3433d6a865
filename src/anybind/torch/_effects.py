"""What a torch function may do besides computing: write into its inputs, draw random numbers.

The bridges run torch code on views of XLA's buffers, which no code may change,
and rerun it for its derivatives, which must see the random draws its value saw:

===============  ===================================================================
piece            what it does
===============  ===================================================================
``effects``      one run of the function on fake tensors (no data): the input leaves
                 it writes into (through any alias: a view, ``.data``, ``out=``, a
                 batch norm's running statistics) and whether it draws random numbers
``Effects``      the answer, per call signature; where the fake run fails (``.numpy()``,
                 ``.item()``, a C extension without a fake kernel) every leaf may be
                 written and every draw may be random: the safe answer
``Draws``        torch's RNG state per call: a call records the state it started from,
                 keyed by its primal inputs' values; the derivatives of that call (the
                 derived bridges, run later on the same values) start from the same
                 state and leave the generator as they found it (as
                 ``torch.utils.checkpoint`` does)
===============  ===================================================================

A leaf written into is handed to the function as a private copy (torch2jax's
out-of-place semantics); the others are views, with no copy.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

import jax
import numpy as np
import torch

from . import _torch


@dataclasses.dataclass(frozen=True)
class Effects:
    """A torch function's effects on one call signature (see the module)."""
    writes: frozenset | None  # input leaves written into; None: any may be
    random: bool

    def copies(self, i: int) -> bool:
        return self.writes is None or i in self.writes


UNKNOWN = Effects(None, True)
NONE = Effects(frozenset(), False)

# ops whose schema does not mark what they write: (argument positions, the flag that
# makes them write). native_batch_norm updates its running statistics when training.
_UNMARKED = {"aten::native_batch_norm": ((3, 4), 5)}


def _written(func, args, kwargs) -> list:
    """The tensors an aten op writes into, from its schema."""
    schema = _torch.schema_of(func)
    out = []
    unmarked = _UNMARKED.get(schema.name)
    if unmarked is not None:
        positions, flag = unmarked
        if len(args) > flag and args[flag]:
            out += [args[p] for p in positions if len(args) > p]
    if not schema.is_mutable:
        return out
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            out += list(v) if isinstance(v, (list, tuple)) else [v]
    return out


class _Watch(_torch.TorchDispatchMode):
    """Records, for each op run on the fake inputs, writes into them and random draws."""

    def __init__(self, inputs: list):
        super().__init__()
        self.inputs, self.writes, self.random = inputs, set(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
        for t in _written(func, args, kwargs):
            if isinstance(t, torch.Tensor):
                self.writes.update(i for i, x in enumerate(self.inputs)
                                   if _torch.is_alias_of(t, x))
        return func(*args, **kwargs)


def effects(fn, leaves: list, rebuild) -> Effects:
    """``fn``'s effects on inputs like ``leaves`` (NumPy arrays and other values), called
    as ``fn(*args, **kw)`` with ``(args, kw) = rebuild(tensors)``."""
    try:
        with _torch.FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = [mode.from_tensor(_empty(a)) if isinstance(a, np.ndarray) else a
                     for a in leaves]
            inputs = [f for f in fakes if isinstance(f, torch.Tensor)]
            index = [i for i, f in enumerate(fakes) if isinstance(f, torch.Tensor)]
            watch = _Watch(inputs)
            args, kw = rebuild(fakes)
            with watch, torch.no_grad():
                fn(*args, **kw)
    except Exception:  # noqa: BLE001  (what fake tensors cannot run: assume the worst)
        return UNKNOWN
    if not watch.writes and not watch.random:
        return NONE  # (the hot path tests for it by identity)
    return Effects(frozenset(index[i] for i in watch.writes), watch.random)


def _empty(a: np.ndarray) -> torch.Tensor:
    if a.dtype == _BF16:
        return torch.empty(a.shape, dtype=torch.bfloat16)
    return torch.empty(a.shape, dtype=torch.from_numpy(np.empty(0, a.dtype)).dtype)


_BF16 = np.dtype(jax.numpy.bfloat16)


# ------------------------------------------------------------------- draws

class Draws:
    """torch's RNG state at the start of each random call, keyed by its primal inputs."""

    SIZE = 256  # calls remembered; the oldest go first

    def __init__(self):
        self._states: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def record(self, key) -> None:
        """A call of the function itself: remember where its draws start."""
        state = torch.get_rng_state()
        with self._lock:
            self._states[key] = state
            self._states.move_to_end(key)
            while len(self._states) > self.SIZE:
                self._states.popitem(last=False)

    def start(self, key):
        """A derived call: the state its primal call started from, or None if none ran."""
        with self._lock:
            return self._states.get(key)


DRAWS = Draws()


def buffers(leaves) -> tuple:
    """The key of a call's primal inputs: each array's shape, dtype and a sample of its
    values (XLA may hand a derivative a copy of the value's input, at another address)."""
    return tuple((a.shape, a.dtype.str, _sample(a)) if isinstance(a, np.ndarray) else a
                 for a in leaves)


def _sample(a: np.ndarray) -> bytes:
    flat = a.reshape(-1)
    if flat.size > 1024:
        flat = flat[::flat.size // 1024]
    return flat.tobytes()
