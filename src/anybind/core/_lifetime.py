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

import itertools
import re
import weakref
from typing import Any, Callable

import jax
from . import _jax
from ._errors import find_host_error
from ._spec import Call

_jax.weakref_cache_key_types.add(Call)

_EAGER_PREFIX = "anybind_eager_"
_EAGER_NAME = re.compile(_EAGER_PREFIX + r"(\d+)_")
_owners: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_tokens = itertools.count()


class EagerCache:
    """An op's compiled programs for eager calls, and the code they call.

    ``programs`` maps (primitive, parameters) to a jitted function of that one
    application; ``kept`` holds the host callbacks' bodies that those
    programs reach only through weak references.
    """

    def __init__(self) -> None:
        self.token = next(_tokens)
        self.programs: dict = {}
        self.kept: list = []
        _owners[self.token] = self


def eager_impl(prim, *args, **params):
    """Run ``prim.bind(*args, **params)`` outside any trace, compiled once per parameters.

    The cache is found through the ``call`` parameter: a primitive, which
    JAX's rule tables hold, must not hold its op's programs.
    """
    cache = params["call"].op._family.eager
    key = (prim, *params.items())
    fun = cache.programs.get(key)
    if fun is None:
        fun = cache.programs[key] = _program(cache, prim, params)
    prev = _jax.disable_jit.swap_local(False)  # as jax's own apply_primitive
    try:
        return fun(*args)
    except jax.errors.JaxRuntimeError as e:  # a failing host call raises its HostError
        err = find_host_error(e)
        if err is None:
            raise
        raise err from err.__cause__
    finally:
        _jax.disable_jit.set_local(prev)


def _program(cache: EagerCache, prim, params: dict) -> Callable:
    # The program's jaxpr, which JAX's caches keep, names the op weakly.
    params = {**params, "call": params["call"].weak()}

    def run(*args):
        with _jax.eager_constant_folding(False):
            return prim.bind(*args, **params)
    # The program's name tells ``keep`` which eager cache owns it.
    run.__name__ = run.__qualname__ = f"{_EAGER_PREFIX}{cache.token}_{prim.name}"
    return jax.jit(run)


def held(ctx, callback: Callable) -> Callable:
    """``callback``, or, in one of an op's eager programs, a stand-in that reaches it
    through a weak reference while the eager cache that owns the program holds it."""
    owner = _eager_owner(ctx)
    if owner is None:
        return callback
    owner.kept.append(callback)
    ref = weakref.ref(callback)

    def weak_callback(*args):
        return ref()(*args)
    return weak_callback


def _eager_owner(ctx) -> EagerCache | None:
    try:
        attr = ctx.module_context.module.operation.attributes["sym_name"]
        name = _jax.string_attr_value(attr)
    except (KeyError, AttributeError, ValueError):
        return None
    m = _EAGER_NAME.search(name)
    return _owners.get(int(m.group(1))) if m else None


_TABLES = (_jax.primitive_jvps, _jax.primitive_transposes, _jax.primitive_linearizations,
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
    return dict(zip(names, map(len, _TABLES)))

