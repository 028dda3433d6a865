"""Random draws of torch code, carried as data with each call.

A ``from_torch`` op whose function draws random numbers gets one more keyword
operand, ``DRAWS``: one 64-bit seed (two uint32 words) per generator the
function draws from, torch's global generator first. The seeds are drawn from
those generators when the call is made (eagerly: at once; in a traced program:
by the op's ``draws`` op, a host call with a side effect, one per call site and
per row of a batch); the call runs the function with each generator seeded
from its seed, and so does every derivative of that call, since a derived
rule receives the call's keyword operands as JAX hands them over. So the
value and its jvp and vjp use the same draws by construction, under ``jit``,
``scan``, ``vmap`` and in threads, with no table of past calls.

===============  ===================================================================
piece            what it does
===============  ===================================================================
``generators``   the ``torch.Generator`` objects a function can be seen to use: in its
                 closure, globals, default arguments, a module's attributes
``Draws``        per op: its generators, its ``draws`` op, and ``seeds_for`` a call
``replay``       the function run with its generators seeded from a call's seeds,
                 each put back as it was afterwards (as ``torch.utils.checkpoint``
                 does), under one lock: a generator is process-wide state
===============  ===================================================================

Each call thus moves each generator on by one seed's draw; the function's own
draws come from a stream seeded by it.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
from collections.abc import Callable

import jax
import numpy as np
import torch

from ..core._jax import Tracer

DRAWS = "__anybind_draws__"  # the keyword operand that carries a call's seeds

# generators are process-wide: one run at a time sets and draws from them. Reentrant:
# a random function may call another on its own thread.
_LOCK = threading.RLock()


# ------------------------------------------------------------------ generators

def generators(fn) -> list:
    """The CPU ``torch.Generator`` objects ``fn`` can be seen to hold, in a fixed order."""
    found: dict = {}
    seen: set = set()

    def visit(obj, depth: int) -> None:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            if obj.device.type == "cpu" and obj is not torch.default_generator:
                found.setdefault(id(obj), obj)
            return
        if isinstance(obj, torch.nn.Module):
            for m in obj.modules():
                for v in vars(m).values():
                    visit(v, depth + 1)
            visit(type(obj).forward, depth + 1)
            return
        if isinstance(obj, functools.partial):
            for v in (obj.func, *obj.args, *obj.keywords.values()):
                visit(v, depth + 1)
            return
        if isinstance(obj, types.MethodType):
            visit(obj.__self__, depth + 1)
            visit(obj.__func__, depth + 1)
            return
        if isinstance(obj, (list, tuple)):
            for v in obj:
                visit(v, depth + 1)
            return
        if isinstance(obj, dict):
            for v in obj.values():
                visit(v, depth + 1)
            return
        if isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
            for v in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
                visit(v, depth + 1)
            names = obj.__code__.co_names
            g = obj.__globals__
            for n in names:
                if n in g:
                    visit(g[n], depth + 1)
            for c in obj.__code__.co_consts:  # nested functions' globals
                if isinstance(c, types.CodeType):
                    for n in c.co_names:
                        if n in g:
                            visit(g[n], depth + 1)
            return
        inner = getattr(obj, "module", None)  # a module function (``_module_function``)
        if isinstance(inner, torch.nn.Module):
            visit(inner, depth + 1)
        call = vars(type(obj)).get("__call__")  # a callable object: its own code and state
        if isinstance(call, types.FunctionType) and not isinstance(obj, type):
            visit(vars(obj) if hasattr(obj, "__dict__") else (), depth + 1)
            visit(call, depth + 1)

    visit(fn, 0)
    return list(found.values())


# ----------------------------------------------------------------------- draws

class Draws:
    """What an op whose function draws needs: its generators and its ``draws`` op."""

    def __init__(self, fn: Callable, name: str):
        self.name = name
        self.generators = [torch.default_generator, *generators(fn)]
        self._op = None

    @property
    def n(self) -> int:
        return len(self.generators)

    def known(self, g) -> bool:
        """Whether generator ``g`` (as torch's dispatch hands it over: another Python
        object over the same generator) is one of the op's."""
        return g is None or any(_same(g, h) for h in self.generators)

    def fresh(self) -> np.ndarray:
        """One seed per generator, drawn from it: ``(n, 2)`` uint32."""
        with _LOCK:
            words = [torch.randint(0, 1 << 32, (2,), dtype=torch.int64, generator=g).numpy()
                     for g in self.generators]
        return np.stack(words).astype(np.uint32)

    def seeds_for(self, leaves: list):
        """The seeds of one call: drawn now (eager), or by the ``draws`` op (traced)."""
        if not any(isinstance(a, Tracer) for a in leaves):
            return self.fresh()
        return self.op(*[a for a in leaves if hasattr(a, "shape")])

    @property
    def op(self):
        """A host op with a side effect: fresh seeds per call, and per row under vmap (its
        operands, the call's arrays, only say which rows there are: they are not read)."""
        if self._op is None:
            from .. import _api
            n = self.n

            def draws(*_):
                return self.fresh()

            def rows(axis_size, in_batched, *_):
                return np.stack([self.fresh() for _ in range(axis_size)]), True
            draws.__name__ = f"{self.name}_draws"
            op = _api.bind(draws, shape=jax.ShapeDtypeStruct((n, 2), np.uint32),
                           has_side_effect=True, name=f"{self.name}_draws")
            op.def_vmap(rows)
            self._op = op
        return self._op


def _same(a: torch.Generator, b: torch.Generator) -> bool:
    """Whether two generator objects are one generator: seeding one moves the other."""
    if a is b:
        return True
    if a.device != b.device:
        return False
    with _LOCK:
        saved = b.get_state()
        try:
            for seed in (1, 2):
                b.manual_seed(seed)
                if not torch.equal(a.get_state(), b.get_state()):
                    return False
            return True
        finally:
            b.set_state(saved)


def seeds_of(draws: np.ndarray, n: int) -> np.ndarray:
    """A call's ``(n, 2)`` seeds from its operand (a batched call's: its first row; the
    rows of one call that runs the whole batch at once share its draws)."""
    return np.asarray(draws).reshape(-1, n, 2)[0]


@contextlib.contextmanager
def replay(gens: list, seeds: np.ndarray):
    """Run with each generator seeded from its seed; each is put back afterwards."""
    with _LOCK:
        saved = [g.get_state() for g in gens]
        outer = getattr(_REPLAY, "now", None)
        try:
            _REPLAY.now = (gens, seeds)
            rewind()
            yield
        finally:
            _REPLAY.now = outer
            for g, s in zip(gens, saved):
                g.set_state(s)


_REPLAY = threading.local()  # per thread: the generators and seeds of the replay in progress


def rewind() -> None:
    """Seed the generators of the replay in progress again from its seeds, so that a run
    retried after a failure (a derivative that torch.func refused, run again on copies)
    draws what the value drew, not what follows the failed run's draws."""
    now = getattr(_REPLAY, "now", None)
    if now is None:
        return
    gens, seeds = now
    for g, (hi, lo) in zip(gens, seeds.astype(np.uint64)):
        g.manual_seed(int((hi << np.uint64(32)) | lo) & ((1 << 63) - 1))
