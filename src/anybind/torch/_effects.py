"""What a torch function may do besides computing: write into its inputs, draw random numbers.

The bridges run torch code on views of XLA's buffers, which no code may change,
and rerun it for its derivatives, which must see the random draws its value saw:

===============  ===================================================================
piece            what it does
===============  ===================================================================
``effects``      one run of the function on fake tensors (no data): the input leaves
                 it writes into (through any alias: a view, ``.data``, ``out=``, a
                 batch norm's running statistics), whether it draws random numbers,
                 and from which ``torch.Generator`` objects
``Effects``      the answer, per call signature; where the fake run fails (``.numpy()``,
                 ``.item()``, ``data_ptr()``, a C extension without a fake kernel)
                 every leaf may be written and every draw may be random: the safe answer
===============  ===================================================================

``from_torch`` asks it whether a call signature draws random numbers (its draws
are then carried, by ``_draws``) and from which generators. Writes need no
answer: ``_torch_engine`` hands every input to the function as a private copy.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import torch
import torch.overrides

from . import _torch


@dataclasses.dataclass(frozen=True)
class Effects:
    """A torch function's effects on one call signature (see the module)."""
    writes: frozenset | None  # input leaves written into; None: any may be
    random: bool
    generators: tuple = ()  # the generators its draws name (None: torch's global one)

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


class Watch(_torch.TorchDispatchMode):
    """Records, for each op run on the fake inputs, writes into them and random draws."""

    def __init__(self, inputs: list):
        super().__init__()
        self.inputs, self.writes, self.random, self.generators = inputs, set(), False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random = True
            g = kwargs.get("generator")
            if g is not None and not any(g is h for h in self.generators):
                self.generators.append(g)
        for t in _written(func, args, kwargs):
            if isinstance(t, torch.Tensor):
                self.writes.update(i for i, x in enumerate(self.inputs)
                                   if _torch.is_alias_of(t, x))
        return func(*args, **kwargs)


class NoData(torch.overrides.TorchFunctionMode):
    """Fake runs: ``data_ptr()`` of a fake tensor fails at once, as ``.numpy()`` does,
    rather than handing C code (ctypes) an address that is no memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) == "data_ptr" and args and _torch.is_fake(args[0]):
            raise RuntimeError("data_ptr() of a fake tensor: it has no memory")
        return func(*args, **(kwargs or {}))


class Buffers(torch.overrides.TorchFunctionMode):
    """Derivative runs that torch refused once: the running statistics of batch and
    instance norms go to torch detached. torch defines no derivative through them
    (its kernels refuse an argument there that requires grad, or carries a tangent)
    and records none for their update in place, which lands in the same memory; so
    torch's derivative in every other input is unchanged, and a statistic keeps what
    derivative it had before the update."""

    _AT = {torch.batch_norm: (3, 4), torch.instance_norm: (3, 4),
           torch.nn.functional.batch_norm: (1, 2), torch.nn.functional.instance_norm: (1, 2)}
    _NAMES = ("running_mean", "running_var")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        at = self._AT.get(func)
        if at is not None:
            args = tuple(_detached(a) if i in at else a for i, a in enumerate(args))
            kwargs = {k: _detached(v) if k in self._NAMES else v for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _detached(t):
    return t.detach() if isinstance(t, torch.Tensor) else t


def effects(fn, leaves: list, rebuild) -> Effects:
    """``fn``'s effects on inputs like ``leaves`` (arrays or ShapeDtypeStructs, and other
    values), called as ``fn(*args, **kw)`` with ``(args, kw) = rebuild(tensors)``."""
    try:
        with _torch.FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fakes = [mode.from_tensor(_empty(a)) if _is_array(a) else a for a in leaves]
            inputs = [f for f in fakes if isinstance(f, torch.Tensor)]
            index = [i for i, f in enumerate(fakes) if isinstance(f, torch.Tensor)]
            watch = Watch(inputs)
            args, kw = rebuild(fakes)
            with NoData(), watch, torch.no_grad():
                fn(*args, **kw)
    except Exception:  # noqa: BLE001  (what fake tensors cannot run: assume the worst)
        return UNKNOWN
    if not watch.writes and not watch.random:
        return NONE  # (the hot path tests for it by identity)
    return Effects(frozenset(index[i] for i in watch.writes), watch.random,
                   tuple(watch.generators))


def _is_array(a) -> bool:
    return isinstance(a, (np.ndarray, np.generic, jax.ShapeDtypeStruct))


def _empty(a) -> torch.Tensor:
    dtype = np.dtype(a.dtype)
    if dtype == _BF16:
        return torch.empty(tuple(a.shape), dtype=torch.bfloat16)
    return torch.empty(tuple(a.shape), dtype=torch.from_numpy(np.empty(0, dtype)).dtype)


_BF16 = np.dtype(jax.numpy.bfloat16)
