"""The op: a bound function's code, rules, primitives and calls.

An op (``CoreOp``) is what JAX keeps: primitive parameters, jaxprs and compiled
programs refer to it, never to the ``Op`` handle a user holds (``_api``). Its
interface to the layers above, which never read its private state:

==========================  ==========================================================
member                      what it is
==========================  ==========================================================
``call_of(*args, **kw)``    the ``Call`` of calling the op on these inputs
``call_for(...)``           the ``Call`` for given trees, static keywords and avals
``primitive(role)``         the op's primitive for a role (``"primal"``, ``"jvp"``, …)
``version``                 how many times a rule was set: front ends key caches on it
``state(key, make)``        a front end's or route's cache of this op, made by
                            ``make(op)`` at first use and dropped when a rule changes
``on_change(listener)``     ``listener()`` runs after a rule changes on an op that
                            has been called (what was traced with the old rule goes)
``set_rule(kind, rule)``    store a validated rule and notify; ``def_*`` call it
``declare_vmap(mode)``      the mode host rules batch by, as if given to ``bind``
==========================  ==========================================================

``Options`` is the one table of ``bind``'s options, checked where it is made.
"""
from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import tree_util

from . import _closures, _debug, _jax, _lowering, _sharding
from ._code import is_compiled
from ._errors import pop_host_error, raise_for
from ._frontends import FRONT_ENDS, LIVE_OPS, front
from ._primitive import Family
from ._spec import Call, Rule, infer_outputs, split_kwargs, to_aval
from .roles import check_symmetric
from .roles._op_rule import ROLES as OP_RULE_ROLES, is_op

# How host code batches under ``jax.vmap``, with JAX's ``vmap_method`` names:
# one call per row, one call with unbatched arguments given a leading axis of
# length 1 (``"vectorized"`` is its older name), or one call with them broadcast.
MODES = ("sequential", "expand_dims", "broadcast_all", "vectorized")
VmapMode = Literal["sequential", "expand_dims", "broadcast_all", "vectorized"] | Callable[..., Any]
RuleVmap = VmapMode | None


# The signatures (``Call``s) an op keeps, the oldest dropped first. Static keywords are
# keyed by hash and equality, as jax.jit's static arguments: an object that compares by
# identity, or a NaN, is a new signature at every call.
MAX_CALLS = 1024


def is_mode(vmap: Any) -> bool:
    """Whether ``vmap`` names a batching mode (a string, never an array compared to one)."""
    return isinstance(vmap, str) and vmap in MODES


def canonical_mode(mode: str) -> str:
    """``"vectorized"`` is ``"expand_dims"``; every other mode is itself."""
    return "expand_dims" if mode == "vectorized" else mode


@dataclasses.dataclass(frozen=True)
class Options:
    """``ab.bind``'s options, one field each, as ``bind`` documents them."""
    shape: Any = None
    jvp: Callable | None = None
    vjp: Callable | None = None
    transpose: Any = None
    linear: bool | tuple[int, ...] = False
    multilinear: bool = False
    vmap: VmapMode | None = None
    traced: bool = False
    has_side_effect: bool = False
    name: str | None = None
    examples: Callable[[], tuple] | None = None
    out: bool = False
    shard: str | None = None
    replicated: tuple[str, ...] = ()
    symmetric: bool = False
    device: bool = False
    host: Callable | None = None
    export_version: str | int | None = None
    order: str | None = None
    state: Any = None


class CoreOp:
    """What an op is and does: its code, rules, primitives and calls (see the module)."""

    anybind_op = True  # an op, also as another op's rule (``roles._op_rule``)

    def __init__(self, fn: Callable, options: Options):
        if not callable(fn):
            raise TypeError(f"ab.bind expects a callable, got {type(fn).__name__}")
        o = options
        self.fn = fn
        self.name = _primitive_name(o.name or getattr(fn, "__name__", None) or "op")
        self.export_version = o.export_version  # in an exported call's fingerprint
        self.compiled_state = o.state  # an ab.State that compiled code gets (see routes)
        if o.order not in (None, "C", "F"):
            raise TypeError(f"anybind op '{self.name}': order must be 'C' (row-major), 'F' "
                            f"(column-major: Fortran's order) or None, got {o.order!r}")
        self.order = o.order  # the memory order of compiled code's arrays
        _lowering.adopt(self, "function", fn, o.traced, o.device, o.host, "ab.bind")
        self.shape = o.shape
        if isinstance(o.linear, (tuple, list)):
            if not all(isinstance(i, int) and i >= 0 for i in o.linear):
                raise TypeError(f"anybind op '{self.name}': linear must be a bool or a tuple of "
                                f"positional argument indices, got {o.linear!r}")
            self.linear, self.linear_argnums = False, tuple(sorted(set(o.linear)))
        else:
            self.linear, self.linear_argnums = bool(o.linear), ()
        self.multilinear = bool(o.multilinear)
        if self.multilinear and (self.linear or self.linear_argnums):
            raise TypeError(f"anybind op '{self.name}': multilinear=True (linear in each "
                            f"argument separately) and linear={o.linear!r} exclude each other")
        self.transpose_rules: dict = {}  # argnum -> Rule, for a multilinear op
        self.traced = bool(o.traced)
        self.device, self.host = bool(o.device), o.host  # GPU code, and its host fallback
        self.symmetric = bool(o.symmetric)  # ∂f(x) = ∂f(x)ᵀ: the jvp rule serves as the vjp
        self.has_side_effect = bool(o.has_side_effect)
        self.examples = o.examples
        self._calls: dict = {}
        self._rules_version = 0
        self._lock = threading.Lock()
        self._host_errors: dict = {}  # see core._errors.remember_host_error
        self._state: dict = {}
        self._listeners: list = []
        self.inplace = bool(o.out)
        self.shard = _sharding.parse_rule(self.name, o.shard, o.replicated)
        if self.shard is not None and self.has_side_effect:
            raise TypeError(f"anybind op '{self.name}': has_side_effect=True runs the function "
                            f"exactly once per execution, so it cannot also run per shard "
                            f"(shard=)")
        if self.inplace and self.traced:
            raise TypeError(f"anybind op '{self.name}': out=True is for host functions that "
                            f"write into preallocated outputs; a traced function returns them")
        self.jvp_rule: Rule | None = None
        self.vjp_rule: Rule | None = None
        self.transpose_rule: Rule | None = None
        self.fwd_rule: Rule | None = None
        self.bwd_rule: Rule | None = None
        self.vmap_rule: Rule | None = None
        self.vmap_out_batched = None  # a host vmap rule's declared out_batched
        self.residuals = None
        # self.vmap: how host code without a batching of its own batches: "sequential"
        # unless declared, or "expand_dims" once the function has a vmap rule (its host
        # rules are then taken to be written for batched arrays too).
        self.vmap: str = "sequential"
        self._vmap_declared = isinstance(o.vmap, str)
        if o.vmap is None or isinstance(o.vmap, str) and is_mode(o.vmap):
            self.vmap = canonical_mode(o.vmap or "sequential")
        elif callable(o.vmap):
            self.def_vmap(o.vmap, traced=o.traced, device=o.device)
        else:
            raise ValueError(f"anybind op '{self.name}': vmap must be one of {MODES} or a "
                             f"rule, got {o.vmap!r}")
        if o.jvp is not None:
            self.def_jvp(o.jvp, traced=o.traced, device=o.device)
        if o.vjp is not None:
            self.def_vjp(o.vjp, traced=o.traced, device=o.device)
        if o.transpose is not None and self.multilinear:
            if not isinstance(o.transpose, (tuple, list)):
                raise TypeError(f"anybind op '{self.name}' is multilinear: transpose= takes a "
                                f"tuple with one rule per positional argument (None where "
                                f"there is none), got {type(o.transpose).__name__}")
            for i, t in enumerate(o.transpose):
                if t is not None:
                    self.def_transpose(t, traced=o.traced, argnum=i, device=o.device)
        elif o.transpose is not None:
            self.def_transpose(o.transpose, traced=o.traced, device=o.device)
        self._family = Family(self)
        LIVE_OPS[id(self)] = self

    def __repr__(self) -> str:
        rules = [k for k in ("jvp", "vjp", "transpose", "vmap")
                 if getattr(self, f"{k}_rule") is not None]
        rules += [f"transpose in {i}" for i in sorted(self.transpose_rules)]
        kind = " linear" if self.linear else " multilinear" if self.multilinear else ""
        kind += " symmetric" if self.symmetric else ""
        code = "traced" if self.traced else "compiled" if is_compiled(self.fn) \
            else "device" if self.device else "host"
        return (f"<anybind op '{self.name}' {code}"
                f"{kind} rules={rules} vmap={self.vmap!r}>")

    @property
    def torch(self) -> Any:
        """This op as a PyTorch operation (``Op.torch``), made at first use."""
        made = self._state.get("torch")  # the hot path
        if made is None:
            made = self.state("torch", lambda op: front("torch", op))
        return made

    # ------------------------------------------------------ the interface above

    @property
    def version(self) -> int:
        """How many times a rule was set on this op."""
        return self._rules_version

    def primitive(self, role: str) -> _jax.Primitive:
        """The op's primitive for ``role`` (``"primal"``, ``"jvp"``, ``"vjp"``, …)."""
        return self._family[role]

    def state(self, key: str, make: Callable[[CoreOp], Any]) -> Any:
        """A cache of a front end or route for this op: ``make(op)`` at first use, made
        again after a rule changes."""
        got = self._state.get(key)
        if got is None:
            got = self._state.setdefault(key, make(self))
        return got

    def on_change(self, listener: Callable[[], None]) -> None:
        """Run ``listener()`` after each rule change on this op once it has been called."""
        self._listeners.append(listener)

    def declare_vmap(self, mode: str) -> None:
        """The mode this op's host code batches by, as if ``bind(vmap=mode)`` had said it."""
        if not is_mode(mode):
            raise ValueError(f"anybind op '{self.name}': vmap must be one of {MODES}, "
                             f"got {mode!r}")
        self._vmap_declared, self.vmap = True, canonical_mode(mode)

    # ---------------------------------------------------------------- rules

    def set_rule(self, kind: str, rule, traced: bool, symbolic_zeros: bool = False,
                 input_shapes: bool = False, vmap=None, argnum: int | None = None,
                 out: bool = False, device: bool = False, host: Callable | None = None):
        """Store the rule of ``kind`` (``"jvp"``, …), or return a decorator that does."""
        if not (vmap is None or is_mode(vmap) or callable(vmap)):
            raise ValueError(f"anybind op '{self.name}': def_{kind}'s vmap must be one of "
                             f"{MODES}, a host function with the rule's signature for batched "
                             f"arrays, or None, got {vmap!r}")
        if is_mode(vmap):
            vmap = canonical_mode(vmap)
        if self.multilinear and kind in ("jvp", "vjp", "fwd", "bwd"):
            raise TypeError(f"anybind op '{self.name}' is multilinear: its jvp (Σᵢ f(…, ẋᵢ, "
                            f"…)) and vjp (the transposes) are derived, so def_{kind} does "
                            f"not apply; give op.def_transpose(rule, argnum=i) per argument")
        if out and traced:
            raise TypeError(f"anybind op '{self.name}': def_{kind}(out=True) is for host rules "
                            f"that write into preallocated outputs; a traced rule returns them")

        def register(r):
            nonlocal traced
            if not callable(r):
                raise TypeError(f"anybind op '{self.name}': def_{kind} expects a callable, "
                                f"got {type(r).__name__}")
            if is_op(r):  # a rule of the rule: run as traced code, differentiated by its rules
                if kind not in OP_RULE_ROLES or vmap is not None or out or device:
                    raise TypeError(
                        f"anybind op '{self.name}': an op ('{r.name}') may be the jvp, vjp "
                        f"or transpose rule, without vmap=, out= or device=; def_{kind} got it")
                traced = True
            else:
                _lowering.adopt(self, kind, r, traced, device, host, f"def_{kind}")
            if callable(vmap):  # a batched variant of the rule
                _lowering.adopt(self, f"{kind}.vmap", vmap, traced, device, host,
                                f"def_{kind}")
            if out and is_compiled(r):
                raise TypeError(f"anybind op '{self.name}': def_{kind}(out=True) is for "
                                f"Python host rules; a compiled rule always writes into "
                                f"XLA's buffers (anybind's C calling convention)")
            made = Rule(r, bool(traced), bool(symbolic_zeros), bool(input_shapes), vmap,
                        bool(out), bool(device), host)
            with self._lock:
                if argnum is None:
                    setattr(self, f"{kind}_rule", made)
                else:
                    self.transpose_rules[argnum] = made
                used = bool(self._calls)
                self._rules_version += 1
                self._calls.clear()
                self._state.clear()
            if used:  # every program traced with the old rule is traced again at its next call
                for listener in self._listeners:
                    listener()
            return r
        return register if rule is None else register(rule)

    def def_jvp(self, rule=None, *, traced=False, symbolic_zeros=False, vmap=None,
                out=False, device=False, host=None):
        return self.set_rule("jvp", rule, traced, symbolic_zeros, vmap=vmap, out=out,
                             device=device, host=host)

    def def_vjp(self, rule=None, *, traced=False, symbolic_zeros=False, vmap=None,
                out=False, device=False, host=None):
        return self.set_rule("vjp", rule, traced, symbolic_zeros, vmap=vmap, out=out,
                             device=device, host=host)

    def def_transpose(self, rule=None, *, traced=False, symbolic_zeros=False,
                      input_shapes=False, vmap=None, argnum=None, out=False, device=False,
                      host=None):
        if self.multilinear:
            if not (isinstance(argnum, int) and argnum >= 0):
                raise TypeError(f"anybind op '{self.name}' is multilinear: def_transpose needs "
                                f"argnum=i, the positional argument it transposes in; got "
                                f"argnum={argnum!r}")
            if symbolic_zeros or input_shapes or out:
                raise TypeError(f"anybind op '{self.name}': a multilinear op's transpose "
                                f"rules take neither symbolic_zeros, input_shapes nor out=True "
                                f"(they get every argument's value and return a cotangent)")
            return self.set_rule("transpose", rule, traced, vmap=vmap, argnum=argnum,
                                 device=device, host=host)
        if argnum is not None:
            raise TypeError(f"anybind op '{self.name}': def_transpose(argnum=...) is for ops "
                            f"bound with multilinear=True")
        if not self.linear:
            raise TypeError(f"anybind op '{self.name}': def_transpose needs an op bound "
                            f"with linear=True (or multilinear=True, with argnum=)")
        return self.set_rule("transpose", rule, traced, symbolic_zeros, input_shapes, vmap,
                             out=out, device=device, host=host)

    def def_fwd(self, rule=None, *, residuals, vmap=None, device=False, host=None):
        self.residuals = residuals
        return self.set_rule("fwd", rule, False, vmap=vmap, device=device, host=host)

    def def_bwd(self, rule=None, *, vmap=None, out=False, device=False, host=None):
        return self.set_rule("bwd", rule, False, vmap=vmap, out=out, device=device, host=host)

    def def_vmap(self, rule=None, *, traced=False, out=False, out_batched=None, device=False,
                 host=None):
        if out_batched is not None and traced:
            raise TypeError(f"anybind op '{self.name}': out_batched= is for host vmap rules; "
                            f"a traced rule's out_batched is read while tracing")
        self.vmap_out_batched = out_batched
        if not self._vmap_declared:
            self.vmap = "expand_dims"
        return self.set_rule("vmap", rule, traced, out=out, device=device, host=host)

    # ---------------------------------------------------------------- calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if FRONT_ENDS:
            front = _front_end(args, kwargs)
            if front is not None:
                return front(self, *args, **kwargs)
        xs, ks, call = self._operands_and_call(args, kwargs)
        if _debug.enabled():
            call = call.debugging
        if call.closed or any(isinstance(x, _jax.Tracer) for x in (*xs, *ks)):
            # inside shard_map: one set of varying axes
            ops = _sharding.vary([*xs, *ks, *call.closed])
            outs = self._family["primal"].bind(*ops, call=call, batch=None)
        else:  # eager: a failing host call surfaces as the HostError it raised
            try:
                outs = self._family["primal"].bind(*xs, *ks, call=call, batch=None)
            except Exception as e:
                err = pop_host_error(self, e)
                if err is None:
                    raise
                raise_for(err)
        return tree_util.tree_unflatten(call.out_tree, outs)

    def call_of(self, *args: Any, **kwargs: Any) -> Call:
        """The ``Call`` of calling the op on these inputs (as calling it makes it)."""
        return self._operands_and_call(args, kwargs)[2]

    def _operands_and_call(self, args: tuple, kwargs: dict) -> tuple:
        operands, static = split_kwargs(self, kwargs)
        xs, args_tree = tree_util.tree_flatten(args)
        ks, kw_tree = tree_util.tree_flatten(operands)
        xs = [_as_operand(self, x, f"positional input leaf {i}") for i, x in enumerate(xs)]
        ks = [_as_operand(self, k, f"keyword operand leaf {i}") for i, k in enumerate(ks)]
        key = (args_tree, kw_tree, static, tuple(to_aval(x) for x in xs),
               tuple(to_aval(k) for k in ks), tuple(type(v) for _, v in static))
        call = self._calls.get((key, _jax.enable_x64.value))  # x64 decides declared dtypes
        return xs, ks, call if call is not None else self.call_for(*key)

    def call_for(self, args_tree, kw_tree, static: tuple, in_avals: tuple, kw_avals: tuple,
                 static_types: tuple) -> Call:
        """The ``Call`` for these trees, sorted static keywords, avals and static types."""
        key = ((args_tree, kw_tree, static, in_avals, kw_avals, static_types),
               _jax.enable_x64.value)
        call = self._calls.get(key)
        if call is not None:
            return call
        out_wide: list = []
        res_wide: list = []
        out_tree, out_avals, paths = infer_outputs(
            self, args_tree, kw_tree, static, in_avals, kw_avals, wide=out_wide)
        kw_paths = tuple(tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(
            kw_tree.unflatten(range(len(kw_avals))))[0])
        res_tree, res_avals = None, ()
        if (self.fwd_rule is None) != (self.bwd_rule is None):
            given, missing = ("fwd", "bwd") if self.bwd_rule is None else ("bwd", "fwd")
            raise TypeError(f"anybind op '{self.name}' has a {given} rule but no {missing} "
                            f"rule; def_fwd and def_bwd go together")
        if self.fwd_rule is not None and self.residuals is None:  # fwd saves nothing
            res_tree, res_avals = tree_util.tree_structure(None), ()
        elif self.fwd_rule is not None:
            res_tree, res_avals, _ = infer_outputs(
                self, args_tree, kw_tree, static, in_avals, kw_avals, self.residuals,
                "residual spec", wide=res_wide)
        call = Call(self, args_tree, kw_tree, static, in_avals, kw_avals, out_tree,
                    out_avals, paths, kw_paths, res_tree, res_avals, static_types,
                    out_wide=tuple(out_wide), res_wide=tuple(res_wide))
        if self.shard is not None:
            _sharding.factors_of(call)  # the rule must fit: a TypeError at the first call
        nested = False
        if _closures.under_trace():  # the op's code may close over tracers of this trace
            _closures.check_host(self)
            nested = _closures.converting(self)  # its own rule, traced: not again
            call = _closures.nested(call) if nested else _closures.convert(call)
        if self.symmetric:
            check_symmetric(call)
        if nested:  # not kept: a later call of this signature converts for itself
            return call
        with self._lock:
            calls = self._calls
            calls[key] = call
            while len(calls) > MAX_CALLS:  # static keywords that equal no earlier one
                calls.pop(next(iter(calls)), None)
        return call


class Handle:
    """The base of what a user holds (``ab.Op``): a handle on a ``CoreOp``.

    JAX keys caches by a function weakly and keeps what tracing it made, so
    programs refer to the op, never to a handle: the op goes when its handles and
    the programs using it do. ``core_of`` gives the op behind a handle.
    """
    _core: CoreOp


def core_of(op: Handle | CoreOp) -> CoreOp:
    """The ``CoreOp`` behind a handle (or the op itself)."""
    return op._core if isinstance(op, Handle) else op


def _front_end(args, kwargs):
    """The front end whose arrays appear among the arguments, if any."""
    for leaf in tree_util.tree_leaves((args, kwargs)):
        for kind, run in FRONT_ENDS.items():
            if isinstance(leaf, kind):
                return run
    return None


def _as_operand(op: CoreOp, x, what: str):
    if isinstance(x, (jax.Array, _jax.Tracer)):
        return x
    try:
        return jnp.asarray(x)
    except TypeError:
        raise TypeError(f"anybind op '{op.name}': {what} must be an array or a number, got "
                        f"{type(x).__name__}") from None
    except OverflowError as e:  # a Python int beyond JAX's default integer
        raise OverflowError(f"anybind op '{op.name}': {what} is the Python int {x}, which no "
                            f"integer dtype JAX gives it can hold ({e}); pass an array of a "
                            f"dtype that holds it (np.uint64, or np.int64 with x64 on)") from None


def _primitive_name(name: str) -> str:
    cleaned = re.sub(r"\W+", "_", name).strip("_")
    return cleaned or "op"
