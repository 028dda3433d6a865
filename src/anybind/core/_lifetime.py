"""How long an op lives, and what may hold it.

An op counts as used while a Python reference or a live compiled program
holds it; once neither does, it is collected whole: its primitives leave
JAX's rule tables and its compiled executables are freed.

==================  =============================================================
piece               what it does
==================  =============================================================
``eager_impl``      impl rule of every primitive: one application runs through a
                    jitted function kept in the op's own eager cache, never in
                    JAX's global ``xla_primitive_callable`` cache (which holds
                    its parameters, so the op, for the life of the process); a
                    failing host call raises its ``HostError``
``held``            how a lowered program holds the host callbacks it calls:
                    strongly, or weakly when the program is one of the op's
                    eager programs, which the op's eager cache holds instead
``unregister``      drops a collected op's primitives from JAX's rule tables
(``Call``)          a weak key of JAX's multi-weakref caches, so that caches of
                    abstract evaluation keyed on primitive parameters forget it
==================  =============================================================

What holds what: the user's reference holds the op; the op holds its family
(primitives, eager cache) and its ``Call``s; a ``Call`` (a primitive
parameter) holds the op, so a jaxpr that uses the op keeps it alive. A
compiled program holds its host callbacks, which hold the op; an eager
program is held by the op instead, through a weak reference in its callback,
so that the cycle op → eager program → op has no root in JAX's global caches.
"""
from __future__ import annotations

import contextvars
import functools
import itertools
import threading
import weakref
from collections.abc import Callable

import jax

from . import _jax
from ._errors import find_host_error, raise_for
from ._spec import Call

_jax.weakref_cache_key_types.add(Call)

_tokens = itertools.count()  # one per op, never reused: its identity in ``Call``
# The list of bodies of the eager program being compiled in this thread, if any.
_compiling_for: contextvars.ContextVar = contextvars.ContextVar("anybind_eager_owner",
                                                                default=None)


MAX_PROGRAMS = 128  # eager programs an op keeps, the oldest dropped first


class EagerCache:
    """An op's compiled programs for eager calls, and the code they call.

    ``programs`` maps (primitive, parameters) to a jitted function of that one
    application and the host callbacks' bodies that it reaches only through
    weak references. At most ``MAX_PROGRAMS`` are kept: a static keyword that
    equals no earlier one (an object compared by identity, a NaN) makes a new
    program at every call, and the oldest goes. A call holds its program's
    bodies while it runs, so that a rule set meanwhile (which clears the cache)
    or an eviction never leaves a running program without them.
    """

    def __init__(self) -> None:
        self.token = next(_tokens)
        self.programs: dict = {}
        self.tangents: dict = {}

    def clear(self) -> None:
        self.programs.clear()
        self.tangents.clear()

    def compiled(self, key, core: Callable) -> Callable:
        """``core``, the traced code of a derivative rule applied eagerly, as one jitted
        function kept per ``key`` (the rule's parameters): JAX would otherwise run it
        op by op, compiling each of its operations (and, in reverse mode, each of
        their transposes) for every new shape. At most ``MAX_PROGRAMS`` are kept."""
        f = self.tangents.get(key)
        if f is None:
            f = self.tangents[key] = jax.jit(core)
            while len(self.tangents) > MAX_PROGRAMS:
                self.tangents.pop(next(iter(self.tangents)), None)
        return f


@functools.cache
def _accelerated() -> bool:
    """Whether this process has an accelerator, where XLA runs an eager call's program
    after the call returns; on the CPU a failing host call raises in the call itself."""
    return any(d.platform != "cpu" for d in jax.devices())


def eager_impl(prim, *args, **params):
    """Run ``prim.bind(*args, **params)`` outside any trace, compiled once per parameters.

    The cache is found through the ``call`` parameter: a primitive, which
    JAX's rule tables hold, must not hold its op's programs.
    """
    cache = params["call"].op._family.eager
    key = (prim, *params.items())
    entry = cache.programs.get(key)
    prev = _jax.disable_jit.swap_local(False)  # as jax's own apply_primitive
    try:
        if entry is None:
            entry = _Program(prim, params)
            owner = _compiling_for.set(entry.kept)  # the callbacks lowered now are its own
            try:
                entry.fun.lower(*args)  # JAX keeps the lowering for the call below
            finally:
                _compiling_for.reset(owner)
            programs = cache.programs
            programs[key] = entry
            while len(programs) > MAX_PROGRAMS:
                programs.pop(next(iter(programs)), None)
        out = entry(args)  # ``entry``, its bodies among it, held while the program runs
        if _accelerated():  # a failing host call raises its HostError here, not at a wait
            jax.block_until_ready(out)
        return out
    except jax.errors.JaxRuntimeError as e:  # a failing host call raises its HostError
        err = find_host_error(e)
        if err is None:
            raise
        raise_for(err)
    finally:
        _jax.disable_jit.set_local(prev)


class _Program:
    """One eager program: ``fun``, a jitted function of one application, and ``kept``,
    the host callbacks its program calls.

    jit's own cache makes the first call of a signature a lock while the program
    runs: host code that calls the same program again on the same thread gets
    ``RecursionError: Recursively calling jit``, and on another thread waits for
    it, so two threads whose nested host calls wait on each other's first calls
    deadlock. Until one call of ``fun`` has returned, a call made while another
    runs goes through a ``Compiled`` of its own (lowered and compiled again: both
    come from JAX's caches), which nothing else waits on.
    """

    def __init__(self, prim, params: dict) -> None:
        # The program's jaxpr, which JAX's caches keep, names the op weakly.
        params = {**params, "call": params["call"].weak()}

        def run(*args):
            with _jax.eager_constant_folding(False):
                return prim.bind(*args, **params)
        # One name for every op's programs: JAX's bounded caches keyed by a program's
        # debug info (its name among it) then hold one entry per shape, not one per op.
        run.__name__ = run.__qualname__ = "anybind_eager_call"
        self.fun = jax.jit(run)
        self.kept: list = []
        self.ready = False  # a call of ``fun`` has returned: its cache entry is complete
        self._first = threading.Lock()  # held by the call that completes that entry

    def __call__(self, args: tuple):
        if self.ready:
            return self.fun(*args)
        if not self._first.acquire(blocking=False):  # a first call runs: never wait on it
            owner = _compiling_for.set(self.kept)
            try:
                return self.fun.lower(*args).compile()(*args)
            finally:
                _compiling_for.reset(owner)
        try:
            out = self.fun(*args)
            self.ready = True
            return out
        finally:
            self._first.release()


def held(ctx, callback: Callable) -> Callable:
    """``callback``, or, in one of an op's eager programs, a stand-in that reaches it
    through a weak reference while the eager cache that owns the program holds it."""
    owner = _compiling_for.get()
    if owner is None:
        return callback
    owner.append(callback)
    ref = weakref.ref(callback)

    def weak_callback(*args):
        return ref()(*args)
    return weak_callback


_TABLES: tuple = (_jax.primitive_jvps, _jax.primitive_transposes, _jax.primitive_linearizations,
           _jax.fancy_primitive_batchers, _jax.lowerings)


def unregister(prims) -> None:
    """Drop a collected op's primitives from JAX's rule tables."""
    tables = _TABLES + tuple(_jax.platform_specific_lowerings.values())
    for prim in prims:
        for table in tables:
            table.pop(prim, None)
        _jax.requires_devices_during_lowering.discard(prim)


def table_sizes() -> dict:
    """The sizes of JAX's rule tables (how many primitives have each kind of rule)."""
    names = ("jvps", "transposes", "linearizations", "batchers", "lowerings")
    return {name: len(table) for name, table in zip(names, _TABLES)}

