"""``ab.from_torch(..., mode="translate" | "auto")``: torch programs as JAX code.

=================  ==========================================================================
piece              what it does
=================  ==========================================================================
``Translated``     the op's traced function: per call signature (the tree and avals of the
                   inputs, the static keywords), one ``Program``; calls it on JAX values
``Program``        one capture: ``torch.export.export`` on zeros shaped like the call,
                   ``run_decompositions()`` to the core ATen op set, and what each
                   placeholder and output of the graph is (a parameter, a buffer, an
                   input, a constant; an output, a buffer's new value)
``lower``          the graph as JAX: each node by its rule in ``_aten.RULES``; in
                   ``"auto"``, a node without one runs as a torch call (an op of
                   ``mode="call"`` made for that node)
``verify``         ``check=True``: a new program is compared with torch once, on sampled
                   inputs (values and, for floating inputs, a vjp)
=================  ==========================================================================

The op is ``ab.bind(Translated(...), traced=True)``: jit, every order of grad,
jvp, vmap, ``jax.export`` (of a program with no torch call) and sharding are
JAX's own. Capturing never runs the module's code on data and never changes
it: ``torch.export`` traces with fake tensors.

Random draws. A translated random op (``dropout``, ``rand``, ``randn``,
``bernoulli``, ``randint``) draws from the op's ``key=`` keyword operand (a
``jax.random.key`` or a raw ``PRNGKey``), node ``i`` of the graph from
``jax.random.fold_in(key, i)``. Without ``key=``, ``"translate"`` raises,
naming the random ops, and ``"auto"`` runs each as a torch call, drawing from
torch's generator as ``mode="call"`` does (its derivatives replay its draws).
"""
from __future__ import annotations

import functools
import inspect
import re
import threading
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import tree_util
from torch.export.graph_signature import TensorArgument

from .. import _api
from ..core._op import core_of
from . import _aten, _draws, _purity, _torch, _trees
from ._run import _NP_TO_TORCH, _TORCH_TO_NP

MODES = ("auto", "translate", "call")
_BRIDGES = None  # the module _bridges, which imports this one (from_torch hands it down)


class Untranslatable(TypeError):
    """``mode="translate"`` met torch ops (or a program) that have no JAX translation."""


# ----------------------------------------------------------------- the op

def from_torch(fn, *, mode: str, check: bool, torch_only: list, bridges, **opts) -> _api.Op:
    """``ab.from_torch(fn, mode=mode)`` for ``"translate"`` and ``"auto"``: an op whose
    traced function is ``Translated``; ``op.torch`` is the torch code itself, as for
    ``mode="call"``, which ``"auto"`` falls back to where nothing can be captured.
    ``bridges``: the module ``_bridges`` (``mode="call"``'s ops), handed down by it."""
    global _BRIDGES
    _BRIDGES = _bridges = bridges
    if mode not in MODES:
        raise ValueError(f"ab.from_torch: mode must be one of {MODES}, got {mode!r}")
    if mode == "call":
        raise ValueError("ab.from_torch: check=True compares a translated program with torch "
                         "(mode='translate' or 'auto'); mode='call' runs torch itself")
    if torch_only:
        raise ValueError(f"ab.from_torch: {'=, '.join(torch_only)}= describe a torch call "
                         f"(mode='call', which mode='auto' becomes when given them), not a "
                         f"translated program (mode={mode!r}, check={check})")
    module = isinstance(fn, torch.nn.Module)
    for k in ("return_state", "discard_state"):
        if opts[k] and not module:
            raise TypeError(f"ab.from_torch: {k}=True is for an nn.Module (its buffers "
                            f"after the call), got {type(fn).__name__}")
    if not callable(fn):
        raise TypeError(f"ab.from_torch expects a function of torch tensors or an "
                        f"nn.Module, got {type(fn).__name__}")
    name = opts["name"] or (type(fn).__name__ if module else None) or getattr(
        fn, "__name__", None) or "torch_fn"
    name = re.sub(r"\W", "_", name)
    call = functools.partial(_bridges.from_torch, fn, **{**opts, "name": name}, mode="call")
    t = Translated(fn, name, mode, opts["return_state"], opts["discard_state"], check, call)
    handle = _api.bind(t, traced=True, name=name, examples=opts["examples"])
    core = core_of(handle)  # op.torch: the torch code itself
    b = _bridges.BRIDGES[core] = _bridges.Bridge(
        _bridges.TORCH, _bridges._module_function(fn, opts["return_state"],
                                                  opts["discard_state"], name) if module
        else fn,
        None)
    b.version = core.version
    handle = _api.subclassed(handle, Auto if mode == "auto" else Captured)
    return _api.pickled_as(handle, _bridges.from_torch, (fn,), dict(opts, mode=mode,
                                                                   check=check))


_FLAGS = "__anybind_training__"  # the settings a capture bakes in, as a static keyword
_OWN_KEY = "__anybind_key__"  # key= meant for a torch function that takes a `key` (attention)


def _is_prng_key(v) -> bool:
    return jnp.issubdtype(getattr(v, "dtype", None), jax.dtypes.prng_key)


class Captured(_api.Op):
    """The handle of a translated op: its calls carry the settings a capture bakes in
    (``_settings``: a module's train/eval flags and attributes, a function's closed-over
    numbers) as a static keyword, so that changing one after a call makes another
    ``Call`` of the op, and so another capture (a compiled program keeps its own)."""

    def __call__(self, *args, **kw):
        core = core_of(self)
        t = core.fn
        leaves = tree_util.tree_leaves((args, kw))
        if any(isinstance(a, torch.Tensor) for a in leaves):  # op.torch's call: torch's own
            return core(*args, **kw)
        if t.takes_key and "key" in kw and not _is_prng_key(kw["key"]):  # the function's
            kw[_OWN_KEY] = kw.pop("key")                                # own argument
        settings = _settings(t.fn)
        if t.mode == "auto":  # key= is JAX's: a torch call draws from torch's generator
            plain = {"key" if k == _OWN_KEY else k: v for k, v in kw.items() if k != "key"}
            if t.impure:
                return t.call_op()(*args, **plain)
            operands = tree_util.tree_map(  # numbers as the op takes them
                lambda a: jnp.asarray(a) if isinstance(a, int | float | complex) else a, args)
            prog, _ = t.capture(operands, plain, kw.get("key"), settings)
            if prog.whole_call:  # mode="call"'s op itself, with its draws and rules
                return t.call_op()(*args, **plain)
            if prog.drawing is not None:  # the call's seeds, carried as mode="call" does
                kw[_draws.DRAWS] = t.draws.seeds_for([a for a in leaves
                                                     if hasattr(a, "dtype")])
        if settings:
            kw[_FLAGS] = settings
        return core(*args, **kw)


class Auto(Captured):
    """The handle of a ``mode="auto"`` op. A rule the user gives (``op.def_jvp`` and
    friends) describes the torch function as ``mode="call"`` runs it, with torch's
    derived rules for the others: the first one makes this handle ``mode="call"``'s op
    (pickled as such, with the user's rules), and sets the rule there. Programs traced
    before keep what they traced, as for every op whose rules change after a call."""

    def _define(self, name: str, rule, kwargs: dict):
        t = core_of(self).fn
        call = t.make_call_op()
        object.__setattr__(self, "__class__", type(call))
        self.__dict__.clear()
        self.__dict__.update(call.__dict__)
        return self._define(name, rule, kwargs)


class Translated:
    """The traced function of a translated op: ``(*args, key=None, **kw) -> outputs``.

    In ``"auto"``, the whole program runs as one torch call (``call_op``, an op of
    ``mode="call"``) where a capture could differ from it: the code is not a function
    of its arguments alone (``_purity``), it draws from torch's generator more than
    once, or ``torch.export`` cannot capture it. (The user's rules: ``Auto``.)"""

    def __init__(self, fn, name: str, mode: str, return_state: bool, discard_state: bool,
                 check: bool, call_op: Callable[[], _api.Op]):
        self.fn, self.name, self.mode = fn, name, mode
        self.module = fn if isinstance(fn, torch.nn.Module) else None
        self.return_state, self.discard_state = return_state, discard_state
        self.check, self.make_call_op = check, call_op
        self.programs: dict = {}
        self.lock = threading.Lock()
        self._call_op = None
        self.impure = _purity.impure(fn) if mode == "auto" else None
        forward = fn.forward if self.module is not None else fn
        try:
            self.takes_key = "key" in inspect.signature(forward).parameters
        except (TypeError, ValueError):  # a builtin
            self.takes_key = False
        self.draws = _draws.Draws(fn, name)  # torch's generator, for "auto"'s random node
        self.__name__ = name

    def __repr__(self) -> str:
        return f"<torch program {self.name}, mode={self.mode!r}>"

    def call_op(self) -> _api.Op:
        if self._call_op is None:
            self._call_op = self.make_call_op()
        return self._call_op

    def capture(self, args, kw: dict, key, settings: tuple) -> tuple:
        """(the ``Program`` for a call with these arguments and ``_settings``, captured on
        first use, and the call's array keywords)."""
        arrays, static, sig = _signature(args, kw, key, settings)
        with self.lock:
            prog = self.programs.get(sig)
            if prog is None:
                prog = self.programs[sig] = Program(self, args, arrays, static, key is not None)
        return prog, arrays

    def __call__(self, *args, key=None, **kw):
        settings = kw.pop(_FLAGS, ())  # what the op's call was made for (Captured)
        if _OWN_KEY in kw:
            kw["key"] = kw.pop(_OWN_KEY)
        seeds = kw.pop(_draws.DRAWS, None)
        if self.impure:
            return self.call_op()(*args, **kw)
        prog, arrays = self.capture(args, kw, key, settings)
        if prog.whole_call:  # "auto" where nothing of the program can be captured
            return self.call_op()(*args, **kw)
        return prog.run(args, arrays, key, seeds)

    def program(self, *args, key=None, **kw) -> Program:
        """The ``Program`` a call with these arguments runs (captured on first use)."""
        settings = _settings(self.fn)
        jax.eval_shape(lambda a, k: self(*a, key=key, **k, **{_FLAGS: settings}), args, kw)
        return self.programs[_signature(args, kw, key, settings)[2]]


def _settings(fn) -> tuple:
    """The plain Python values a capture bakes in and a later call could see changed: each
    module's numbers, strings and flags (``training``, ``negative_slope``, ...), or the
    numbers and strings a function closes over."""
    if isinstance(fn, torch.nn.Module):
        return tuple(item for m in fn.modules() for item in m.__dict__.items()
                     if _baked(item[1]))
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if _baked(v):
            found.append(v)
    return tuple(found)


_PLAIN = frozenset({type(None), bool, int, float, str})


def _baked(v) -> bool:
    return type(v) in _PLAIN or (type(v) is tuple and all(map(_baked, v)))


def _signature(args, kw, key, settings: tuple) -> tuple:
    """(array keywords, static keywords, the call signature a program is captured for:
    with the settings its capture bakes in, ``_settings``)."""
    arrays = {k: v for k, v in kw.items() if _is_array(v)}
    static = {k: v for k, v in kw.items() if k not in arrays}
    sig = (tree_util.tree_structure((args, arrays)),
           tuple((tuple(np.shape(a)), np.dtype(a.dtype))
                 for a in tree_util.tree_leaves((args, arrays))),
           _static_key(static), key is not None, settings)
    return arrays, static, sig


def _is_array(v) -> bool:
    return isinstance(v, jax.Array | np.ndarray) or hasattr(v, "aval") or (
        isinstance(v, list | tuple | dict) and bool(tree_util.tree_leaves(v))
        and all(_is_array(x) for x in tree_util.tree_leaves(v)))


def _static_key(static: dict):
    try:
        hash(tuple(sorted(static.items())))
        return tuple(sorted(static.items()))
    except TypeError:
        return repr(sorted(static.items()))


def _torch_dtype(d) -> torch.dtype:
    return _NP_TO_TORCH[np.dtype(d)]


# ------------------------------------------------------------------ capture

class _Wrapper(torch.nn.Module):
    """A function as a module, for ``torch.export`` (its static keywords bound)."""

    def __init__(self, fn, static):
        super().__init__()
        self.fn, self.static = fn, static

    def forward(self, *args, **kw):
        return self.fn(*args, **kw, **self.static)


_CAPTURING = threading.Lock()

# torch.export's notice about LSTM's internal weight list, which it lifts as it should
_LSTM_NOTICE = r"The tensor attributes .*_flat_weights.* were assigned during export"
# torch 2.13's export calls its own deprecated ``isinstance(treespec, LeafSpec)`` (gone by
# 2.15): a notice about torch's code, which no user can change
_LEAFSPEC_NOTICE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


class Program:
    """One captured program: its graph, where each input comes from, where each
    output goes, and which nodes have no translation."""

    def __init__(self, t: Translated, args, arrays: dict, static: dict, keyed: bool):
        self.t, self.keyed, self.whole_call = t, keyed, False
        self.drawing = None  # "auto"'s one random node run by torch (its seeds: the call's)
        self.fallback: dict = {}  # fx node -> the mode="call" op that runs it
        if t.module is not None:
            if not args or not isinstance(args[0], dict):
                got = type(args[0]).__name__ if args else "no arguments"
                raise TypeError(f"anybind op '{t.name}': a module op is called as "
                                f"op(params, *inputs), params a dict keyed as "
                                f"module.state_dict(); got {got} first")
            params, inputs = args[0], args[1:]
        else:
            params, inputs = None, args
        ex = tree_util.tree_map(lambda a: torch.zeros(np.shape(a), dtype=_torch_dtype(a.dtype)),
                                (tuple(inputs), arrays))
        leaves = tree_util.tree_leaves((inputs, arrays))
        where = {id(e): i for i, e in enumerate(tree_util.tree_leaves(ex))}
        module = t.module if t.module is not None else _Wrapper(t.fn, static)
        kwargs = {**ex[1], **(static if t.module is not None else {})}
        try:
            # torch.export sets process-wide state, and so do warning filters: one
            # capture at a time
            with _CAPTURING, warnings.catch_warnings():
                warnings.filterwarnings("ignore", _LSTM_NOTICE, UserWarning)
                warnings.filterwarnings("ignore", _LEAFSPEC_NOTICE, FutureWarning)
                kept = {k: v.detach().clone() for k, v in module.state_dict().items()}
                captured = torch.export.export(module, ex[0], kwargs)
                ep = _without_unruled(_torch.to_core_aten(captured, keep=_aten.KEPT))
                for k, v in module.state_dict().items():  # capture changes nothing
                    if not torch.equal(v, kept[k]):
                        v.copy_(kept[k])
        except Exception as e:  # noqa: BLE001  (dynamo's and export's errors are many)
            if t.mode == "auto":
                self.whole_call = True
                return
            raise Untranslatable(
                f"anybind op '{t.name}': mode='translate' captures the program with "
                f"torch.export, which failed ({type(e).__name__}: {_first_line(e)}). "
                f"mode='auto' runs such a program as one torch call (as mode='call')") from e
        if _outputs(ep) != _outputs(captured):  # a decomposition of torch's that is wrong
            self._cannot_translate(
                f"torch's decompositions of the captured program change its outputs' "
                f"shapes or dtypes ({_outputs(captured)} become {_outputs(ep)})")
            return
        self.ep, self.graph = ep, ep.graph_module.graph
        blocks = _torch.no_grad_blocks(captured)
        if blocks and t.mode == "auto":  # torch's forward mode goes through a no_grad
            self.whole_call = True        # block, which one JAX derivative cannot follow
            return
        self.stopped = _not_differentiated(blocks, self.graph)
        self.passed, other = _written_through_detach(self.graph, self.stopped)
        other += [name for name, nodes in blocks.items()  # torch keeps the derivatives of a
                  if any(map(_writes, nodes))]  # tensor written there, which the block's
        if other:                               # nodes here have lost
            self._cannot_translate(
                f"node(s) {other[:4]} write in place into a tensor in a torch.no_grad() "
                f"block, or through a detached view that the program reads again")
            return
        flat_ex, _ = _torch.tree_flatten((ex[0], kwargs))
        self.user = [where.get(id(e)) for e in flat_ex if isinstance(e, torch.Tensor)]
        self.leaves_n = len(leaves)
        if not self._inputs(ep, params):  # "auto": mode="call"'s op says what is wrong
            self.whole_call = True
            return
        self._outputs(ep)
        self._state()
        self._scan()
        if t.check and not self.whole_call:  # on a thread of its own: no trace is active
            failed: list = []                  # there (JAX's trace state is per thread)
            th = threading.Thread(target=_catching(failed, verify),
                                  args=(self, args, arrays, static))
            th.start()
            th.join()
            if failed:
                raise failed[0]

    def _cannot_translate(self, why: str) -> None:
        """A program that cannot be translated as it is: an error saying ``why``
        (``mode="translate"``), or the whole program as one torch call (``"auto"``)."""
        if self.t.mode == "translate":
            raise Untranslatable(f"anybind op '{self.t.name}': {why}; mode='auto' runs "
                                 f"such a program as one torch call")
        self.whole_call = True

    # where each placeholder comes from
    def _inputs(self, ep, params) -> bool:
        t, sig = self.t, ep.graph_signature
        self.sources = []  # per placeholder: ("param"|"buffer", name) / ("user", i) / ("const", v)
        user = iter(self.user)
        names = _tied_names(t.module) if t.module is not None else {}
        self.buffer_names = []
        missing = []
        for spec, placeholder in zip(sig.input_specs, ep.graph.find_nodes(op="placeholder"),
                                     strict=True):
            kind = spec.kind.name
            if kind == "USER_INPUT" and not isinstance(spec.arg, TensorArgument):
                self.sources.append(("value", getattr(spec.arg, "value", None)))  # None,
            elif kind == "USER_INPUT":                         # a static keyword's number
                self.sources.append(("user", next(user)))
            elif kind in ("PARAMETER", "BUFFER"):
                given = [n for n in names.get(spec.target, [spec.target]) if n in params]
                if given:
                    _check_param(t.name, given[0], params[given[0]], placeholder)
                    self.sources.append((kind.lower(), given[0]))
                elif spec.target in ep.constants:  # a buffer kept out of state_dict
                    self.sources.append(("const", ep.constants[spec.target]))
                else:
                    missing.append(spec.target)
                    self.sources.append(None)
            elif kind in ("CONSTANT_TENSOR",):
                self.sources.append(("const", ep.constants[spec.target]))
            elif kind == "TOKEN":  # orders torch's checks of error flags (_aten.CHECKS)
                self.sources.append(("token", None))
            elif t.mode == "auto":  # a torch.Generator, a script object: torch runs it
                return False
            else:
                raise Untranslatable(f"anybind op '{t.name}': the captured program takes a "
                                     f"{kind} input ({spec.target}), which has no JAX form")
        if t.module is not None:
            known = {n for group in names.values() for n in group}
            unknown = sorted(set(params) - known)
            if (missing or unknown) and t.mode == "auto":
                return False
            if missing or unknown:
                raise KeyError(
                    f"anybind op '{t.name}': params must hold the names of "
                    f"module.state_dict(); missing: {sorted(missing)}, unknown: {unknown}")
            buffers = {n for n, _ in t.module.named_buffers(remove_duplicate=False)}
            self.buffer_names = [n for n in params if n in buffers]
        return True

    def _outputs(self, ep):
        self.sinks = []  # per graph output: ("user", i) / ("buffer", name) / None (ignored)
        u = 0
        for spec in ep.graph_signature.output_specs:
            kind = spec.kind.name
            if kind == "USER_OUTPUT":
                self.sinks.append(("user", u))
                u += 1
            elif kind == "BUFFER_MUTATION":
                self.sinks.append(("buffer", spec.target))
            else:  # USER_INPUT_MUTATION: out-of-place, as JAX arrays never change
                self.sinks.append(None)
        self.out_spec = ep.call_spec.out_spec

    def _state(self):
        """Buffer updates must come back (``return_state``) or be dropped on purpose
        (``discard_state``), as in ``mode="call"``: otherwise a ``StateError``."""
        t = self.t
        written = sorted(s[1] for s in self.sinks if s is not None and s[0] == "buffer")
        if written and not (t.return_state or t.discard_state):
            raise _BRIDGES.StateError(
                f"anybind op '{t.name}': the module is in train mode and its call updates "
                f"the buffer(s) {written}, which the op would drop. Take them back with "
                f"ab.from_torch(module, return_state=True) (the op returns (out, state)), "
                f"or call module.eval() first; ab.from_torch(module, discard_state=True) "
                f"drops them on purpose")

    def _scan(self):
        """The nodes without a translation: an error (translate), or torch calls (auto)."""
        t = self.t
        missing: dict[str, list[str]] = {}
        random: dict[str, list[str]] = {}
        dynamic = [n.name for n in self.graph.nodes if not _static_shapes(n)]
        if dynamic:  # a shape that depends on the data (nonzero, .item() as a size)
            self._cannot_translate(
                f"mode='translate' found node(s) {dynamic[:4]} whose shape depends on the "
                f"values of the data, which a JAX program cannot have")
            return
        foreign = {f"{n.name} ({d})" for n in self.graph.nodes for d in _foreign_dtypes(n)}
        if foreign:  # complex32, quantized, ...: no JAX array holds them
            self._cannot_translate(f"mode='translate' found node(s) {sorted(foreign)[:4]} "
                                   f"of a dtype JAX has no arrays of")
            return
        ends = [n for n in self.graph.nodes if n.op == "placeholder"] + [
            a for n in self.graph.nodes if n.op == "output" for a in _tensor_inputs(n)]
        if t.mode == "auto" and any(_complex(n) for n in ends):
            self.whole_call = True  # complex inputs or outputs: JAX's conventions for their
            return                  # derivatives are not checked against torch's: torch runs
        for node in self.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            name = _aten.name_of(node.target)
            ok = node.op == "call_function" and name in _aten.RULES and (
                name not in _aten.SUPPORTS or _aten.SUPPORTS[name](node)) and (
                name not in _aten.CHECKS or t.mode == "translate")
            if ok and _aten.draws(node) and not self.keyed:
                random.setdefault(name, []).append(node.name)
                ok = False
            if not ok:
                missing.setdefault(name, []).append(node.name)
        if not missing:
            return
        if t.mode == "translate":
            raise Untranslatable(_missing_message(t.name, missing, random))
        if sum(map(len, random.values())) > 1:  # torch's stream of numbers as mode="call"
            self.whole_call = True                # draws it: one seed for all the draws
            return
        for node in self.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            name = _aten.name_of(node.target)
            if node.name in missing.get(name, ()):
                op = _node_op(t.name, node)
                if op is None:  # not a tensor function: the whole program as one call
                    self.whole_call = True
                    return
                self.fallback[node] = op
                if name in random:
                    self.drawing = node

    # -------------------------------------------------------------- running

    def run(self, args, arrays: dict, key, seeds=None):
        t = self.t
        params = args[0] if t.module is not None else None
        inputs = args[1:] if t.module is not None else args
        leaves = tree_util.tree_leaves((tuple(inputs), arrays))
        values = []
        for src in self.sources:
            kind, what = src
            if kind == "user":
                values.append(leaves[what])
            elif kind == "parameter":
                values.append(params[what])
            elif kind == "buffer":  # never differentiated, as in mode="call"
                values.append(jax.lax.stop_gradient(params[what]))
            elif kind == "token":
                values.append(jnp.zeros((0,), jnp.float32))
            elif kind == "value":
                values.append(what)
            else:
                values.append(_constant(what))
        with jax.numpy_rank_promotion("allow"):  # torch broadcasts across ranks
            outs = lower(self.graph, values, key, self.fallback, t.name, self.drawing, seeds,
                         self.stopped, self.passed)
        user, state = [], {}
        for sink, v in zip(self.sinks, outs):
            if sink is None:
                continue
            if sink[0] == "user":
                user.append(v)
            else:
                state[sink[1]] = v
        out = _plain(_torch.tree_unflatten(user, self.out_spec))
        _trees.check_leaves(t.name, out, (jax.Array, np.ndarray))
        if t.module is not None and t.return_state:
            new = {n: jax.lax.stop_gradient(params[n]) for n in self.buffer_names}
            for n in self.buffer_names:
                for alias in _tied_names(t.module).get(n, [n]):
                    if alias in state:
                        new[n] = state[alias]
            return out, new
        return out


def _vals(node) -> tuple:
    """What torch recorded of a node's output(s), as a tuple."""
    val = node.meta.get("val")
    return tuple(val) if isinstance(val, list | tuple) else (val,)


def _outputs(ep) -> list:
    """The shapes and dtypes of an exported program's user outputs, as torch recorded
    them (not its buffers' updates or tokens, which decomposing may add)."""
    out = next(n for n in ep.graph.nodes if n.op == "output")
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in out.args[0]]
    return [(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None
            for v, spec in zip(vals, ep.graph_signature.output_specs, strict=True)
            if spec.kind.name == "USER_OUTPUT"]


def _complex(node) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in _vals(node))


def _foreign_dtypes(node) -> list:
    return [v.dtype for v in _vals(node)
            if isinstance(v, torch.Tensor) and v.dtype not in _TORCH_TO_NP]


def _static_shapes(node) -> bool:
    """Whether every tensor the node gives has a shape known before the data is."""
    for v in _vals(node):
        if isinstance(v, torch.Tensor) and not all(isinstance(s, int) for s in v.shape):
            return False
        if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
            return False
    return True


def _without_unruled(ep):
    """``ep`` with each op that has no rule replaced by torch's own decomposition of it,
    where torch has one and every op that gives has a rule (core ATen keeps some ops
    torch knows how to decompose, ``grid_sampler_2d`` among them; others decompose to
    ``prims``, which are kept out)."""
    def unruled(ep):
        return {n.target for n in ep.graph.nodes
                if n.op == "call_function" and _aten.name_of(n.target) not in _aten.RULES}
    for op, decomposition in _torch.decompositions(unruled(ep)).items():
        decomposed = ep.run_decompositions({op: decomposition})
        if unruled(decomposed) <= unruled(ep) - {op}:
            ep = decomposed
    return ep


def _constant(v):
    if isinstance(v, torch.Tensor):
        v = v.detach()
        if v.dtype == torch.bfloat16:
            return jnp.asarray(v.float().numpy()).astype(jnp.bfloat16)
        return jnp.array(v.numpy())
    return v


def _plain(out):
    """torch's structures as the matching JAX pytrees (``_trees.jax_tree``), numbers as
    the arrays ``jax.jit`` makes of them."""
    return _trees.jax_tree(out, lambda v: np.asarray(v, _trees.number_dtype(v)))


def _tied_names(module) -> dict[str, list[str]]:
    """Each name of ``state_dict`` (and of a buffer left out of it) -> every name of
    the same tensor, in ``state_dict``'s order."""
    names = dict(module.named_parameters(remove_duplicate=False))
    names.update(module.named_buffers(remove_duplicate=False))
    by_id: dict[int, list[str]] = {}
    for n, v in names.items():
        by_id.setdefault(id(v), []).append(n)
    return {n: by_id[id(v)] for n, v in names.items()}


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else ""


def _missing_message(name: str, missing: dict, random: dict) -> str:
    lines = [f"  {op}: {len(ns)} node{'s' * (len(ns) > 1)} ({', '.join(ns[:4])}"
             f"{', ...' if len(ns) > 4 else ''})" for op, ns in sorted(missing.items())]
    msg = (f"anybind op '{name}': mode='translate' found {len(missing)} torch op"
           f"{'s' * (len(missing) > 1)} with no JAX translation:\n" + "\n".join(lines))
    if random:
        msg += (f"\n{', '.join(sorted(random))} draw random numbers: they translate when the "
                f"op is given key= (a jax.random.key), or run by torch's generator in "
                f"mode='auto' or mode='call'")
    return msg + "\nmode='auto' runs the untranslated ops as torch calls; mode='call' runs it all."


# ------------------------------------------------------------------ lowering

class Node:
    """What a rule sees of its fx node: the dtypes and shapes torch recorded, its key."""

    def __init__(self, node, index: int, key):
        self.node, self.index, self._key = node, index, key
        val, vals = node.meta.get("val"), _vals(node)
        self.dtypes = tuple(_np(v.dtype) if isinstance(v, torch.Tensor) else None
                            for v in vals)
        self.shapes = tuple(tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor)
                            else None for v in vals)
        self.dtype, self.shape = self.dtypes[0], self.shapes[0]
        if isinstance(val, list | tuple):
            self.shape = self.shapes

    def key(self):
        return jax.random.fold_in(self._key, self.index)

    @property
    def promoted(self):
        """torch's promoted dtype of the node's operands (for comparisons)."""
        ops = []
        for a in self.node.args:
            v = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            if isinstance(v, torch.Tensor):
                ops.append(torch.empty((0,) if v.ndim else (), dtype=v.dtype))
            elif isinstance(v, bool | int | float | complex):
                ops.append(v)
        if not ops:
            return self.dtype
        d = ops[0] if isinstance(ops[0], torch.Tensor) else torch.tensor(ops[0])
        d = d.dtype
        if len(ops) > 1:
            d = torch.result_type(*ops[:2]) if isinstance(ops[0], torch.Tensor) else \
                torch.result_type(ops[1], ops[0]) if isinstance(ops[1], torch.Tensor) else d
        return _np(d)


def _check_param(op: str, name: str, given, placeholder) -> None:
    """A parameter or buffer given as the module's own is: the capture computes with the
    module's shapes and dtypes, not the given array's."""
    own = placeholder.meta.get("val")
    if not isinstance(own, torch.Tensor):
        return
    want = (tuple(own.shape), _np(own.dtype))
    got = (tuple(np.shape(given)), jax.dtypes.canonicalize_dtype(given.dtype))
    if got != want:
        raise TypeError(f"anybind op '{op}': params['{name}'] has shape {got[0]} and dtype "
                        f"{got[1]}; the module's is {want[0]}, {want[1]}")


def _np(d) -> np.dtype:
    return jax.dtypes.canonicalize_dtype(_TORCH_TO_NP[d])


def lower(graph, inputs: list, key, fallback: dict, name: str, drawing=None,
          seeds=None, stopped=frozenset(), passed=None) -> list:
    """The graph's outputs, each node lowered by its rule (or run by its fallback op;
    ``drawing``, a random node run by torch, with the call's ``seeds``); the nodes in
    ``stopped`` see their inputs as constants (``lax.stop_gradient``), and each node in
    ``passed``, a write, has the derivative of the tensor it writes."""
    passed = passed or {}
    env: dict = {}
    it = iter(inputs)
    for index, node in enumerate(graph.nodes):
        get = (lambda n: jax.lax.stop_gradient(env[n])) if node in stopped else env.__getitem__
        load = lambda a, get=get: torch.fx.node.map_arg(a, get)  # noqa: E731
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "output":
            return list(load(node.args[0]))
        elif node in fallback:
            tensors = [get(n) for n in _tensor_inputs(node)]
            if node is drawing and seeds is not None:  # the draws the call carries
                env[node] = core_of(fallback[node])(*tensors, **{_draws.DRAWS: seeds})
            else:
                env[node] = fallback[node](*tensors)
        else:
            info = Node(node, index, key)
            args, kwargs = load(node.args), load(node.kwargs)
            kwargs = {k: v for k, v in kwargs.items()
                      if k not in ("device", "layout", "pin_memory", "memory_format")}
            out = _aten.RULES[_aten.name_of(node.target)](info, *args, **kwargs)
            env[node] = _as_recorded(out, info, name)
        if node in passed:
            base = env[passed[node]]
            env[node] = base + jax.lax.stop_gradient(env[node] - base)
    raise AssertionError("an fx graph ends with its output node")


def _as_recorded(out, info: Node, name: str):
    """``out`` cast to the dtypes torch recorded, its shapes checked against torch's."""
    if info.node.target.__module__ == "_operator":
        return out
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    got = []
    for v, d, s in zip(outs, info.dtypes, info.shapes, strict=False):
        if v is None or d is None:
            got.append(v)
            continue
        v = jnp.asarray(v)
        if v.dtype != d:
            v = v.astype(d)
        if tuple(v.shape) != s:
            raise AssertionError(f"anybind op '{name}': the translation of "
                                 f"{_aten.name_of(info.node.target)} (node {info.node.name}) "
                                 f"gave shape {tuple(v.shape)}, torch's is {s}")
        got.append(v)
    return got[0] if single else tuple(got)


def _not_differentiated(blocks, graph) -> set:
    """The nodes of the decomposed ``graph`` whose results torch's reverse mode records no
    derivative of: a ``detach`` (an ``alias`` after decomposition), and every node made
    from a ``torch.no_grad()`` block (a ``wrap_with_set_grad_enabled(False, ...)`` node of
    the captured program named in ``blocks``, inlined by decomposition; named in each
    node's provenance)."""
    stopped = {n for n in graph.nodes if n.op == "call_function" and (
        _torch.is_detach(n) or any(_torch.from_block(s, blocks) for s in _torch.made_from(n)))}
    if blocks and all(map(_torch.is_detach, stopped)):
        raise AssertionError(f"torch {torch.__version__} named no node made from the "
                             f"torch.no_grad() block(s) {sorted(blocks)}")
    return stopped


def _written_through_detach(graph, stopped: set) -> tuple[dict, list]:
    """In-place writes through a detached view (``x.detach().clamp_(...)``), which change
    the tensor and keep its derivative, as torch's autograd does: each such node with the
    tensor it writes (``x + stop_gradient(new - x)`` at run time). And the names of the
    writes into what torch does not differentiate that are not of that form (a detached
    view read again after the write, a write into a write)."""
    passed, other = {}, []
    for n in graph.nodes:
        if (n.op != "call_function" or n in stopped
                or not any(i in stopped for i in _tensor_inputs(n))
                or not any(map(_writes, _torch.made_from(n)))):
            continue
        view = n.args[0] if n.args else None
        again = [u for u in n.users if str(u.target) == "aten.alias.default"]
        if view in stopped and _torch.is_detach(view) and not again:
            passed[n] = view.args[0]
        else:
            other.append(n.name)
    return passed, other


def _writes(source) -> bool:
    """Whether the ATen op of an fx node, or of a provenance source (which names it as
    ``"aten.add_.Tensor"``), writes into one of its arguments (``x.add_``, ``out=``)."""
    name, _, overload = str(getattr(source, "target", "")).removeprefix("aten.").partition(".")
    try:
        schema = _torch.schema_of(getattr(getattr(torch.ops.aten, name), overload))
    except (AttributeError, RuntimeError):  # not an ATen op: a placeholder, a block
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _tensor_inputs(node) -> list:
    found: list = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n) or n)
    return found


def _node_op(name: str, node) -> _api.Op | None:
    """``node`` as a ``mode="call"`` op of its tensor inputs, or None where it is not a
    function of tensors to tensors."""
    val, vals = node.meta.get("val"), _vals(node)
    if node.op != "call_function" or not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    if _aten.name_of(node.target).startswith("anybind::"):  # JAX code run by torch
        return None  # (ab.to_torch inside the function): the program runs as one call
    if _aten.name_of(node.target) in _aten.LAYOUT:  # reads memory by strides, which a
        return None  # JAX array, handed to torch as a new contiguous tensor, does not keep
    ins = _tensor_inputs(node)
    if not all(isinstance(n.meta.get("val"), torch.Tensor) for n in ins):
        return None
    target, args, kwargs = node.target, node.args, node.kwargs

    spec = tuple(jax.ShapeDtypeStruct(tuple(int(s) for s in v.shape), _np(v.dtype))
                 for v in vals)
    kinds = [_torch_dtype(s.dtype) for s in spec]  # int64 is int32 where x64 is off

    def call(*tensors):
        got = dict(zip(ins, tensors))
        a, k = torch.fx.node.map_arg((args, kwargs), lambda n: got[n])
        out = target(*a, **k)
        outs = [o.to(d) for o, d in zip(out if isinstance(out, list | tuple) else [out], kinds)]
        return tuple(outs) if isinstance(out, list | tuple) else outs[0]  # as the spec says
    op_name = re.sub(r"\W", "_", f"{name}_{node.name}")
    call.__name__ = op_name
    return _BRIDGES.from_torch(call, shape=spec if isinstance(val, list | tuple) else spec[0],
                               name=op_name, mode="call")


# ------------------------------------------------------------------ check=True

_TOL = {np.dtype(np.float64): (1e-7, 1e-9), np.dtype(np.float32): (2e-4, 1e-5)}


def _catching(failed: list, fn: Callable) -> Callable:
    def run(*args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  (raised again by the calling thread)
            failed.append(e)
    return run


def verify(prog: Program, args, arrays: dict, static: dict) -> None:
    """``check=True``: the new program against torch, once, on sampled inputs.

    Floating inputs are standard normal (seed 0), integers and bools zeros; a
    module's parameters and buffers are its own. Compared: the outputs, and the
    gradient of ``Σ ȳ·y`` (ȳ standard normal) in every floating input and
    parameter, JAX's against torch's autograd. A program whose random ops are
    translated (``key=``) draws other numbers than torch and is not compared.
    """
    t = prog.t
    if any(_aten.draws(n) for n in prog.graph.nodes if n not in prog.fallback):
        return
    r = np.random.default_rng(0)

    def sample(a):
        d = np.dtype(a.dtype)
        if jnp.issubdtype(d, jnp.floating):
            return r.standard_normal(np.shape(a)).astype(d)
        return np.zeros(np.shape(a), d)
    params = None
    if t.module is not None:
        params = {k: _constant(v) for k, v in t.module.state_dict().items()
                  if k in args[0]}
        args = (params, *tree_util.tree_map(sample, args[1:]))
    else:
        args = tree_util.tree_map(sample, args)
    arrays = tree_util.tree_map(sample, arrays)
    floats = lambda tree: [x for x in tree_util.tree_leaves(tree)  # noqa: E731
                           if jnp.issubdtype(np.dtype(x.dtype), jnp.floating)]
    out = prog.run(args, arrays, None)
    outs = floats(out[0] if t.return_state and t.module is not None else out)
    cts = [jnp.asarray(r.standard_normal(o.shape)).astype(o.dtype) for o in outs]

    def scalar(a):
        o = prog.run(a, arrays, None)
        o = o[0] if t.return_state and t.module is not None else o
        return sum(jnp.sum((y * c).astype(jnp.float32)) for y, c in
                   zip(floats(o), cts, strict=True))
    grads = jax.grad(scalar, allow_int=True)(args) if outs else None
    # torch, on the same values
    to_t = lambda x: _to_tensor(x)  # noqa: E731
    targs, tarrays = tree_util.tree_map(to_t, (args, arrays))
    leaves = [x for x in tree_util.tree_leaves(targs) if x.is_floating_point()]
    for x in leaves:
        x.requires_grad_(True)
    if t.module is not None:
        buffers = {n for n, _ in t.module.named_buffers(remove_duplicate=False)}
        p = {k: (v.detach().clone() if k in buffers else v) for k, v in targs[0].items()}
        tout = torch.func.functional_call(t.module, p, tuple(targs[1:]), {**tarrays, **static},
                                          tie_weights=False)
    else:
        tout = t.fn(*targs, **tarrays, **static)
    touts = [o for o in _torch.tree_flatten(tout)[0]
             if isinstance(o, torch.Tensor) and o.is_floating_point()]
    _compare(t.name, "outputs", outs, touts)
    if not outs:
        return
    s = sum((o.double() * _to_tensor(c).double()).sum() for o, c in zip(touts, cts))
    need = [x for x in leaves if x.requires_grad]
    tg = torch.autograd.grad(s, need, allow_unused=True)
    jg = [g for g, x in zip(tree_util.tree_leaves(grads), tree_util.tree_leaves(targs))
          if isinstance(x, torch.Tensor) and x.is_floating_point()]
    tg = [torch.zeros_like(x) if g is None else g for g, x in zip(tg, need)]
    _compare(t.name, "gradients", jg, tg)


def _to_tensor(x) -> torch.Tensor:
    x = np.asarray(x)
    if x.dtype == np.dtype(jnp.bfloat16):
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(x))


def _compare(name: str, what: str, got: list, expected: list) -> None:
    if len(got) != len(expected):
        raise ValueError(f"anybind op '{name}': check=True: the translated program has "
                         f"{len(got)} floating {what}, torch's {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        g = np.asarray(g, np.float64)
        e = e.detach().double().numpy()
        rtol, atol = _TOL.get(np.dtype(np.asarray(got[i]).dtype), (3e-2, 3e-2))
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        if g.shape != e.shape or not np.allclose(g, e, rtol=rtol, atol=atol * scale):
            diff = float(np.max(np.abs(g - e))) if g.shape == e.shape else None
            raise ValueError(
                f"anybind op '{name}': check=True: the translated program's {what} differ "
                f"from torch's on the same inputs ({what[:-1]} {i}: shape {g.shape} vs "
                f"{e.shape}, max |difference| {diff}, tolerance rtol={rtol}, atol={atol}·"
                f"{scale:.3g}). Run it with mode='call', and report the op")
