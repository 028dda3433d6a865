"""Bridges: torch code as anybind ops (``from_torch``), JAX code as torch operations (``to_torch``).

A bridge is an adapter, not a second library: an ``ab.bind`` host op whose
code is written for another framework and runs by that framework's engine
(``_torch_engine``, ``_jax_engine``), with the same spec, roles and runners as
every op:

=================  =====================================================================
piece              what it does
=================  =====================================================================
``from_torch``     torch code (a function or an ``nn.Module``) as an op; its ``op.torch``
                   is the torch code itself (a round trip adds nothing)
``to_torch``       JAX code as a torch operation: ``ab.bind(fn, traced=True).torch``,
                   run by JAX (``jax_bridge``); a bridge of torch code goes back as itself
``bridge``         the op: the engine's host code, its vmap rule, and traced jvp and vjp
                   rules that call the derived bridges of the function
``derived``        the bridge of the engine's jvp or vjp of the function, made once per
                   op on first use: itself a bridge, so every order works
``jax_bridge``     what ``op.torch`` runs for an op whose code is JAX (``to_torch``, and
                   the torch front end's fallback for jax.numpy code)
=================  =====================================================================

A derived bridge's spec and shard rule come from its parent's: the jvp maps
tangents like the inputs to tangents like the floating outputs; the vjp maps
cotangents like the outputs to cotangents like the floating inputs, and may
split only factors that every input has (one broadcast over a split factor
would get a per-shard partial sum).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from collections.abc import Callable

import jax
import numpy as np
import torch
from jax import tree_util

from .. import _api
from .._api import Op
from ..core import _closures, _frontends, _sharding
from ..core._errors import HostError
from ..core._jax import ShapedArray
from ..core._op import MODES, core_of, is_mode
from ..core._spec import infer_outputs, is_float, like as ab_like
from . import _draws, _effects, _jax_engine, _torch, _torch_engine, _trees
from ._front import TorchOp, _compiled_entry, front_of
from ._run import _NP_TO_TORCH, _TORCH_TO_NP
from ._trees import OutputError


@dataclasses.dataclass(frozen=True)
class Engine:
    """One framework's way of running and transforming its own code (its ``_*_engine``)."""
    name: str
    host: Callable  # (fn, name) -> host function on NumPy views
    device: Callable | None  # (fn, name) -> device function on CuPy views, or None
    vmap: Callable  # (fn, name) -> host vmap rule
    vmap_device: Callable | None
    jvp_of: Callable
    vjp_of: Callable
    native: bool  # whether the code is torch code, so that op.torch is the code itself


TORCH = Engine("torch", _torch_engine.TorchHost, _torch_engine.TorchDevice,
               _torch_engine.TorchVmap, _torch_engine.TorchVmapDevice,
               _torch_engine.torch_jvp_of, _torch_engine.torch_vjp_of, True)
JAX = Engine("jax", _jax_engine.JaxHost, None, _jax_engine.JaxVmap, None,
             _jax_engine.jax_jvp_of, _jax_engine.jax_vjp_of, False)


class Bridge:
    """What a bridge op keeps: its engine, function, batching and derived bridges."""

    def __init__(self, engine: Engine, fn: Callable, vmap):
        self.engine, self.fn, self.vmap = engine, fn, vmap
        self.derived: dict = {}
        self.version = -1  # the op's version once the bridge's own rules are set
        self.drawn: dict = {}  # call signature -> whether its calls draw random numbers
        self.draws = None  # the generators of its draws (``_draws.Draws``)


# each bridge op's Bridge, kept as long as the op lives
BRIDGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------- public API

def from_torch(fn: Callable, *, shape=None, name: str | None = None, vmap=None,
               shard: str | None = None, replicated: tuple[str, ...] = (),
               examples: Callable[[], tuple] | None = None,
               return_state: bool = False, discard_state: bool = False, mode: str = "auto",
               check: bool = False) -> Op:
    """PyTorch code as an anybind op: a JAX primitive, with torch's own derivatives.

    Args:
      fn: a function that takes and returns torch tensors (in pytrees), or an
        ``nn.Module``: the op is then called as ``op(params, *inputs)``, with
        ``params`` a dict from the names in ``module.state_dict()`` to arrays, and
        runs ``torch.func.functional_call``; gradients flow to the parameters,
        never to the buffers (a batch norm's running statistics). Of tied names,
        the first given is used.
      shape: the output spec, as for ``ab.bind``; by default torch's fake tensors
        infer it (no data is touched), or, where they cannot run the function
        (``.item()``, a module made inside), one run on example inputs.
      name: the primitive's name; by default the function's (or module class's).
      vmap: how ``jax.vmap`` batches it: ``None`` (``torch.vmap``, one call per
        batch), ``"sequential"``, ``"expand_dims"``, ``"broadcast_all"`` (as for
        ``ab.bind``), or a rule
        ``(axis_size, in_batched, *args, **kw) -> (out, out_batched)`` on tensors.
      shard: a sharding rule, as for ``ab.bind``: run per shard on many devices.
      replicated: names of ``shard``'s axes that are not split, as for ``ab.bind``.
      examples: a callable that returns example arguments, as for ``ab.bind``
        (``ab.check(op)`` then runs without arguments).
      return_state: for a module: the op returns ``(out, state)``, ``state`` the
        buffers after the call, so that a module in train mode (a batch norm
        updating its running statistics) trains functionally. Without it, a call
        that updates buffers (train mode) is an error naming them, as in flax.
      discard_state: for a module in train mode: drop its buffer updates on purpose
        (no error); the buffers you pass are used as they are at every call.
      mode: ``"auto"`` (the default): the program captured by ``torch.export``
        (once per shape, dtype, static keyword and train/eval flags), decomposed
        to torch's core ATen ops, becomes JAX code (``jax.numpy``/``lax`` with
        torch's dtypes), so jit, every transformation, sharding and
        ``jax.export`` are JAX's own; a node with no translation runs as a
        torch call inside the program. Where a capture could give another
        number than running torch at each call, the whole program runs as
        ``"call"`` does: ``torch.export`` cannot capture it (a branch on a
        value, ``.item()``, ``.numpy()``, a shape that depends on the data); its
        code is not a function of its arguments alone (it writes globals or
        attributes, prints, reads a global that is data or a module such as
        NumPy or ``random``, closes over a tensor, holds a ``torch.Generator``,
        has non-persistent buffers); it takes or returns complex numbers; it
        draws from torch's generator more than once without ``key=``;
        ``shape=``, ``vmap=`` or ``shard=`` is given (they describe a torch
        call); or the user sets a rule (``op.def_jvp`` and friends: the op
        becomes ``"call"``'s). ``"call"``: torch runs, as
        described below. ``"translate"``: JAX code only; an op with no
        translation, or a program that cannot be captured, is an error naming
        it. Random ops translate when the op is called with ``key=`` (a JAX
        key; node i draws from ``jax.random.fold_in(key, i)``); without it,
        ``"auto"`` runs a single random node as a torch call seeded as
        ``"call"`` seeds the whole function (the same numbers), and
        ``"translate"`` raises.
      check: with ``"translate"`` or ``"auto"``: each newly captured program is
        compared once with torch on sampled inputs (outputs, and gradients in
        the floating inputs and parameters); a difference raises ValueError.

    What follows is how torch runs (``"call"``, and the torch calls of ``"auto"``).
    No torch code changes a JAX array: an input the function writes into (found
    by running it once on fake tensors) is handed to it as a private copy, so
    ``x.add_(1)`` acts as ``x + 1`` (torch2jax's out-of-place semantics); other
    inputs are views, with no copy. Random draws: each derivative of a call
    starts from torch's RNG state that the call started from, so a dropout's
    gradient uses the mask of its value.

    On the CPU, ``fn`` runs on tensors over XLA's own buffers (no copy), and
    its results are written into XLA's output buffers. In a program for a GPU it
    runs on XLA's device buffers and stream (``torch.cuda.ExternalStream``; this
    needs CuPy and a CUDA build of torch). The jvp comes from ``torch.func.jvp``,
    the vjp from ``torch.func.vjp`` and batching from ``torch.vmap``; each
    derived rule is again such an op, so ``jax.hessian`` and ``jacfwd(jacrev)``
    work. Rules given with ``op.def_jvp`` and friends replace the derived ones.
    ``op.torch`` is ``fn`` itself (for a module, its ``functional_call``), with
    torch's own derivatives: nothing of JAX runs in it.

    >>> import anybind as ab, jax, jax.numpy as jnp, torch
    >>> cube = ab.from_torch(lambda x: torch.sin(x) ** 3)
    >>> float(jax.grad(cube)(1.0))  # 3 sin² cos at 1
    1.1477...
    >>> float(jax.hessian(cube)(1.0))  # 6 sin cos² - 3 sin³
    -0.3135...
    >>> net = torch.nn.Linear(3, 2)
    >>> op = ab.from_torch(net)
    >>> params = {k: jnp.array(v.detach().numpy()) for k, v in net.state_dict().items()}
    >>> jax.grad(lambda p, x: op(p, x).sum())(params, jnp.ones(3))["bias"]
    Array([1., 1.], dtype=float32)
    >>> exact = ab.from_torch(net, mode="call")  # torch itself at run time
    >>> jax.jit(jax.grad(lambda p, x: exact(p, x).sum()))(params, jnp.ones(3))["bias"]
    Array([1., 1.], dtype=float32)
    """
    if isinstance(fn, _api.Op):
        return fn  # already an op, with its own op.torch
    if isinstance(fn, TorchOp):
        return _api.handle_of(fn.op)  # JAX code sent to torch and back: the op itself
    torch_only = [k for k, v in (("shape", shape), ("vmap", vmap), ("shard", shard))
                  if v is not None]  # options that describe a torch call
    if mode == "auto" and torch_only and not check:
        mode = "call"  # the whole program runs as a torch call, as those options say
    if mode != "call" or check:  # the program as JAX code: _translate
        from . import _translate
        return _translate.from_torch(fn, shape=shape, name=name, vmap=vmap, shard=shard,
                                     replicated=replicated, examples=examples,
                                     return_state=return_state, discard_state=discard_state,
                                     mode=mode, check=check, torch_only=torch_only,
                                     bridges=sys.modules[__name__])
    given = fn
    if isinstance(fn, torch.nn.Module):
        fn = _module_function(fn, return_state, discard_state,
                              name or type(fn).__name__)
    elif return_state or discard_state:
        raise TypeError(f"ab.from_torch: {'return' if return_state else 'discard'}_state=True "
                        f"is for an nn.Module (its buffers "
                        f"after the call), got {type(fn).__name__}")
    if not callable(fn):
        raise TypeError(f"ab.from_torch expects a function of torch tensors or an "
                        f"nn.Module, got {type(fn).__name__}")
    if not (vmap is None or is_mode(vmap) or callable(vmap)):
        raise ValueError(f"ab.from_torch: vmap must be None (torch.vmap), one of {MODES} or a "
                         f"rule on tensors, got {vmap!r}")
    name = name or getattr(fn, "__name__", None) or "torch_fn"
    spec = FakeSpec(fn, name) if shape is None else _without_draws(shape)
    op = bridge(TORCH, fn, name=name, shape=spec, vmap=vmap, shard=shard,
                replicated=replicated, examples=examples)
    op = FromTorch.of(op)
    return _api.pickled_as(op, from_torch, (given,), dict(
        shape=shape, name=name, vmap=vmap, shard=shard, replicated=replicated,
        examples=examples, return_state=return_state, discard_state=discard_state,
        mode="call"))


class FromTorch(_api.Op):
    """The handle ``from_torch`` gives: a call of a function that draws random numbers
    carries its seeds (``_draws``) as one more keyword operand, which its derivatives
    receive with the others. Whether a call signature draws is found once, by running
    the function on fake tensors; a draw from a generator that cannot be carried (not
    torch's global one, and not one the function holds where ``_draws.generators``
    looks) is an error naming the op, at the first call."""

    @staticmethod
    def of(handle: _api.Op) -> FromTorch:
        """The handle on a bridge op (its own rules, set by ``bridge``, are not recorded:
        ``from_torch`` makes them again when unpickled; the user's ``def_*`` calls are)."""
        return _api.subclassed(handle, FromTorch)

    def __call__(self, *args, **kw):
        core = core_of(self)
        b = BRIDGES.get(core)
        if b is None or b.version != core.version:  # the user's own rules: as they are
            return core(*args, **kw)
        if not kw and all(isinstance(a, jax.Array) for a in args):  # the common case
            key = tuple([(a.shape, a.dtype) for a in args])
            leaves = args
        else:
            leaves, tree = tree_util.tree_flatten((args, kw))
            key = (tree, tuple([(a.shape, a.dtype) if hasattr(a, "dtype") else a
                                for a in leaves]))
        try:
            drawn = b.drawn.get(key)
        except TypeError:  # an unhashable static keyword
            key, drawn = None, None
        if drawn is None:
            drawn = _draws_of(core, b, args, kw)
            if key is not None:
                b.drawn[key] = drawn
        if not drawn:
            return core(*args, **kw)
        seeds = b.draws.seeds_for([a for a in leaves if hasattr(a, "dtype")])
        return core(*args, **kw, **{_draws.DRAWS: seeds})


def _without_draws(shape):
    """A user's output spec callable, called without the draws a call carries."""
    if not callable(shape) or isinstance(shape, ab_like):
        return shape
    return _SpecWithoutDraws(shape)


class _SpecWithoutDraws:
    def __init__(self, shape: Callable):
        self.shape = shape

    def __repr__(self) -> str:
        return repr(self.shape)

    def __call__(self, *args, **kw):
        kw.pop(_draws.DRAWS, None)
        return self.shape(*args, **kw)


def _draws_of(core, b: Bridge, args: tuple, kw: dict) -> bool:
    """Whether calls like this one draw random numbers (the fake run's answer)."""
    operands, static = _torch_engine.split_static(kw)
    leaves, tree = tree_util.tree_flatten((args, operands))
    specs = [jax.ShapeDtypeStruct(np.shape(a), _dtype_of(a)) for a in leaves]

    def rebuild(ts):
        a, k = tree.unflatten(ts)
        return a, {**k, **static}
    eff = _effects.effects(b.fn, specs, rebuild)
    if not eff.random:
        return False
    lost = [g for g in eff.generators if not b.draws.known(g)]
    if lost:
        raise TypeError(
            f"anybind op '{core.name}': its torch function draws from a torch.Generator "
            f"({lost[0]!r}) that anybind cannot find, so the draws of a call cannot be "
            f"carried to its derivatives. Keep the generator where it can be found (a "
            f"global, a closure variable, a default argument, or an attribute of the "
            f"module), or draw from torch's global generator")
    if core.shard is not None:
        raise TypeError(
            f"anybind op '{core.name}': its torch function draws random numbers, which a "
            f"call run per shard (shard=) cannot carry to its derivatives; drop shard=")
    return True


def _dtype_of(a):
    if hasattr(a, "dtype"):
        return np.dtype(a.dtype)
    return np.asarray(a).dtype


def to_torch(fn: Callable, *, name: str | None = None) -> TorchOp:
    """JAX code as a PyTorch operation: ``ab.bind(fn, traced=True).torch``, run by JAX.

    ``fn`` runs compiled (``jax.jit``, once per shape and dtype) on zero-copy
    views of the tensors, with x64 on so that float64 stays float64. Its
    ``backward`` comes from ``jax.vjp``, forward AD from ``jax.jvp`` and
    ``torch.vmap`` from ``jax.vmap``; each is again such an operation, so
    every order works, under autograd, ``torch.func``, ``gradcheck`` and
    ``gradgradcheck``, and under ``torch.compile`` as one opaque operation.
    An anybind op goes as its own ``op.torch``: ``to_torch(ab.from_torch(g))``
    is ``g``.

    >>> import anybind as ab, jax.numpy as jnp, torch
    >>> f = ab.to_torch(lambda x: jnp.sum(jnp.sin(x) ** 2))
    >>> x = torch.tensor([0.5, 1.0], dtype=torch.float64, requires_grad=True)
    >>> f(x).backward(); x.grad  # 2 sin cos = sin 2x
    tensor([0.8415, 0.9093], dtype=torch.float64)
    >>> torch.func.hessian(f)(x.detach()).diagonal()  # 2 cos 2x
    tensor([ 1.0806, -0.8323], dtype=torch.float64)
    """
    if isinstance(fn, _api.Op):
        return fn.torch
    if isinstance(fn, TorchOp):
        return fn
    if not callable(fn):
        raise TypeError(f"ab.to_torch expects a JAX function, got {type(fn).__name__}")
    front = _api.bind(fn, traced=True, name=name).torch
    front.bridge = jax_bridge(front.op)  # explicit: JAX runs it, whatever the code is
    front.pickled = (to_torch, (fn,), {"name": name})
    return front


def jax_bridge(core) -> TorchOp:
    """``op.torch`` of an op whose code is JAX: its bridge run by JAX (made once per op).

    The bridge's function is the op itself called in JAX, so its own rules (a
    custom jvp, a traced transpose) are what JAX differentiates.
    """
    return core.state("torch.jax_bridge", _make_jax_bridge)


def _make_jax_bridge(core) -> TorchOp:
    return core_of(bridge(JAX, core, name=core.name, shape=EvalShape(core), vmap=None)).torch


# ------------------------------------------------------------------ the bridge

def bridge(engine: Engine, fn: Callable, *, name: str, shape, vmap=None, shard=None,
           replicated=(), examples=None, parent=None) -> _api.Op:
    """An op running ``fn`` by ``engine``, with rules from the engine's transforms;
    ``parent``: the ``Bridge`` whose function's derivative ``fn`` is."""
    opts = dict(shape=shape, name=name, shard=shard, replicated=replicated, examples=examples,
                vmap=vmap if is_mode(vmap) else None)
    host = engine.host(fn, name)
    draws = None
    if engine.native:  # the generators its draws come from: its root's
        draws = parent.draws if parent is not None else _draws.Draws(fn, name)
        host.draws = draws
    if engine.device is not None:
        handle = _api.bind(engine.device(fn, name), device=True, host=host, **opts)
    else:
        handle = _api.bind(host, **opts)
    core = core_of(handle)
    if vmap is None or callable(vmap):  # the engine's vmap rule, or the user's on tensors
        user = None if vmap is None else vmap
        kw = {"out_batched": True} if user is None else {}
        if engine.vmap_device is not None:
            vm = engine.vmap(fn, name, user)
            vm.draws = draws
            handle.def_vmap(engine.vmap_device(fn, name, user), device=True, host=vm, **kw)
        else:
            handle.def_vmap(engine.vmap(fn, name), **kw)
        core.declare_vmap("sequential")  # for host rules the user adds
    b = BRIDGES[core] = Bridge(engine, fn, vmap)
    b.host, b.draws = host, draws
    handle.def_jvp(_rule(core, "jvp"), traced=True)
    handle.def_vjp(_rule(core, "vjp"), traced=True)
    b.version = core.version  # op.torch is the torch code itself until a rule changes
    return handle


def torch_op(op):
    """``op.torch``: the torch code itself for a bridge from torch, else the op's
    ``TorchOp`` (under torch.compile, its opaque entry)."""
    native = native_code(op)
    if native is not None:  # torch code: under torch.compile, dynamo sees it
        return native
    if torch.compiler.is_compiling():  # dynamo must not build objects it would pass on
        return functools.partial(_compiled_entry, op)
    return front_of(op)


def native_code(core):
    """The torch code of a bridge from torch whose rules are still its own, or None."""
    b = BRIDGES.get(core)
    if b is not None and b.engine.native and b.version == core.version:
        return b.fn
    return None


def _rule(core, kind: str) -> Callable:
    """The op's jvp or vjp rule: its derived bridge, called on (primals, tangents or ȳ)."""
    def rule(primals, second, **kw):
        return derived(core, kind)(primals, second, **kw)
    rule.__name__ = f"{core.name}_{kind}_rule"
    if kind == "vjp":
        rule.tensor_vjp = functools.partial(_tensor_vjp, core)
    return _closures.closes_over_nothing(rule)


def _tensor_vjp(core, call, ct_lin, need):
    """What torch's first-order backward runs for a bridge whose code is JAX:
    ``vjp(xs, ks, cts) -> x̄`` of the inputs ``need`` marks (JAX's convention), the
    derived vjp bridge's code run on the tensors directly, with none of the front
    end's dispatch in between; None for torch code (whose ``op.torch`` is itself)."""
    if BRIDGES[core].engine.native:
        return None
    d = derived(core, "vjp")
    ct = call.out_tree.unflatten([a if f else None for a, f in zip(call.out_avals,
                                                                     call.float_out)])
    leaves, args_tree = tree_util.tree_flatten((call.args(list(call.in_avals)), ct))
    with jax.enable_x64(True):  # torch's dtypes, as the front end makes its calls
        dcall = d.call_for(args_tree, call.kw_tree, call.static, tuple(leaves),
                           call.kw_avals, call.static_types)
    run = BRIDGES[d].host.tensor_runner(dcall)
    floats = [i for i, f in enumerate(call.float_in) if f]
    pick = [floats.index(i) for i, k in enumerate(need) if k]
    zeros = [None if p else (a.shape, _torch_dtype(a.dtype))
             for p, a, f in zip(ct_lin, call.out_avals, call.float_out) if f]

    def vjp(xs, ks, cts):
        it = iter(cts)
        full = [next(it) if z is None else torch.zeros(z[0], dtype=z[1]) for z in zeros]
        try:
            outs = run([*xs, *full, *ks])
        except HostError:
            raise
        except Exception as e:  # the front end's nodes name the op and rule: so does this
            raise HostError(f"anybind op '{core.name}': the vjp rule (jax.vjp of its JAX "
                            f"code, in torch's backward) raised {type(e).__name__}: "
                            f"{e}").with_traceback(e.__traceback__) from e
        return [outs[j] for j in pick]
    return vjp


def derived(core, kind: str):
    """The bridge of the engine's jvp or vjp of the op's function (made on first use)."""
    b = BRIDGES[core]
    made = b.derived.get(kind)
    if made is None:
        fn = (b.engine.jvp_of if kind == "jvp" else b.engine.vjp_of)(b.fn)
        vmap = b.vmap if is_mode(b.vmap) else None
        shard = Shard(core, kind) if core.shard is not None else None
        h = bridge(b.engine, fn, name=f"{core.name}_{kind}", shape=Spec(core, kind),
                   vmap=vmap, shard=shard, parent=b)
        made = b.derived.setdefault(kind, core_of(h))
    return made


# ---------------------------------------------------------------- specs, rules

_DTYPES = {torch.bfloat16: np.dtype(jax.numpy.bfloat16)}


def _np_dtype(t: torch.Tensor) -> np.dtype:
    got = _TORCH_TO_NP.get(t.dtype) or _DTYPES.get(t.dtype)
    if got is None:
        raise TypeError(f"the torch dtype {t.dtype} has no JAX counterpart")
    return got


def _torch_dtype(d) -> torch.dtype:
    d = np.dtype(d)
    got = _NP_TO_TORCH.get(d) or {v: k for k, v in _DTYPES.items()}.get(d)
    if got is None:
        raise TypeError(f"the dtype {d} has no torch counterpart")
    return got


class FakeSpec:
    """``shape=None`` of ``from_torch``: the output spec from torch's fake tensors."""

    def __init__(self, fn: Callable, name: str):
        self.fn, self.name = fn, name

    def __repr__(self) -> str:
        return "(inferred with torch's fake tensors)"

    def __call__(self, *args, **kw):
        kw.pop(_draws.DRAWS, None)
        try:
            with _torch.FakeTensorMode(allow_non_fake_inputs=True), _effects.NoData():
                return self._spec(args, kw, torch.empty)
        except _torch.DynamicOutputShapeException as e:  # the shape depends on the data
            raise self._error(e) from None
        except (StateError, OutputError):
            raise
        except Exception:  # noqa: BLE001  (.item(), a module made inside: real inputs)
            pass
        try:  # as wrap-torch2jax does: one run on example inputs, ones
            state = torch.get_rng_state()
            try:
                with torch.no_grad():
                    return self._spec(args, kw, torch.ones)
            finally:
                torch.set_rng_state(state)
        except (StateError, OutputError):
            raise
        except Exception as e:
            raise self._error(e) from None

    def _spec(self, args, kw, make):
        a, k = tree_util.tree_map(
            lambda s: make(s.shape, dtype=_torch_dtype(s.dtype))
            if isinstance(s, jax.ShapeDtypeStruct) else s, (args, kw))
        out = _torch_engine.plain_tree(self.fn(*a, **k))
        _trees.check_leaves(self.name, out, torch.Tensor)
        return tree_util.tree_map(
            lambda t: jax.ShapeDtypeStruct(tuple(t.shape), _np_dtype(t)), out)

    def _error(self, e: Exception) -> TypeError:
        return TypeError(
            f"anybind op '{self.name}': with shape=None the output spec comes from running "
            f"the torch function on fake tensors (or, where those fail, on example inputs), "
            f"which failed ({type(e).__name__}: {e}). Give shape= to ab.from_torch (ab.like(i), "
            f"a jax.ShapeDtypeStruct pytree, or a callable of the inputs' ShapeDtypeStructs)")


class EvalShape:
    """The output spec of an op whose code is JAX: ``jax.eval_shape`` of the op."""

    def __init__(self, core):
        self.core = core

    def __repr__(self) -> str:
        return "(jax.eval_shape)"

    def __call__(self, *args, **kw):
        operands, static = _torch_engine.split_static(kw)
        core = self.core
        return jax.eval_shape(lambda a, k: core(*a, **k, **static), args, operands)


def _parent_call(core, primals, kw):
    """The parent op's ``Call`` for positional ShapeDtypeStructs ``primals`` and ``kw``."""
    operands, static = _torch_engine.split_static(kw)
    xs, args_tree = tree_util.tree_flatten(tuple(primals))
    ks, kw_tree = tree_util.tree_flatten(operands)
    static = tuple(sorted(static.items()))
    aval = lambda s: ShapedArray(tuple(s.shape), np.dtype(s.dtype))
    return core.call_for(args_tree, kw_tree, static, tuple(map(aval, xs)),
                           tuple(map(aval, ks)), tuple(type(v) for _, v in static))


def _float_or_none(s):
    return s if is_float(s) else None


class Spec:
    """A derived bridge's output spec from its parent's: floating leaves only."""

    def __init__(self, core, kind: str):
        self.core, self.kind = core, kind

    def __repr__(self) -> str:
        return f"(the {self.kind} of {self.core.name}'s spec)"

    def __call__(self, primals, second, **kw):
        if self.kind == "vjp":
            return tuple(tree_util.tree_map(_float_or_none, tuple(primals)))
        operands, static = _torch_engine.split_static(kw)
        xs, args_tree = tree_util.tree_flatten(tuple(primals))
        ks, kw_tree = tree_util.tree_flatten(operands)
        aval = lambda s: ShapedArray(tuple(s.shape), np.dtype(s.dtype))
        out_tree, out_avals, _ = infer_outputs(
            self.core, args_tree, kw_tree, tuple(sorted(static.items())),
            tuple(map(aval, xs)), tuple(map(aval, ks)))
        return out_tree.unflatten([_float_or_none(jax.ShapeDtypeStruct(a.shape, a.dtype))
                                   for a in out_avals])


class Shard:
    """A derived bridge's shard rule, written out per call from its parent's factors.

    jvp: (x, ẋ, k) -> ẏ, every factor the parent may split; vjp: (x, ȳ, k) -> x̄,
    only the factors every x̄ has (others stay whole, so no partial sums arise).
    """

    def __init__(self, core, kind: str):
        self.core, self.kind = core, kind
        self.__name__ = f"the {kind} of {core.name}'s shard rule"

    def __call__(self, primals, second, **kw):
        call = _parent_call(self.core, primals, kw)
        fs = _sharding.factors_of(call)
        xs, ks, outs = fs.ins[:fs.n_in], fs.ins[fs.n_in:], fs.outs
        fx = [x for x, f in zip(xs, call.float_in) if f]
        fy = [o for o, f in zip(outs, call.float_out) if f]
        if self.kind == "jvp":
            ops, res, keep = (*xs, *fx, *ks), fy, set(fs.splittable)
        else:
            ops, res = (*xs, *fy, *ks), fx
            keep = {f for f in fs.splittable if all(f in r for r in res)}
        if len(res) == 1 and not res[0]:
            raise TypeError(f"anybind op '{self.core.name}': the {self.kind} of its shard rule "
                            f"has one scalar output, which a rule cannot write")
        side = lambda vs: ", ".join(" ".join(v) for v in vs)
        ids = {f for v in (*ops, *res) for f in v}
        return f"{side(ops)} -> {side(res)}", tuple(sorted(ids - keep))


# ------------------------------------------------------------------- helpers

class StateError(TypeError):
    """A module op's params dict or buffer updates break the module-state contract."""


def _module_function(module: torch.nn.Module, return_state: bool,
                     discard_state: bool, name: str) -> Callable:
    """``(params, *inputs, **kw) -> module(*inputs, **kw)`` with ``params`` swapped in.

    ``params`` must hold the names of ``module.state_dict()``: an unknown name, or a
    tensor none of whose names is given, is a ``StateError`` naming them (of tied
    names, one tensor under several names, the first given is used, in every place
    the tensor is; a submodule held twice is one place). Buffers (a batch norm's
    running statistics) are never differentiated: they go in detached. The module's
    own tensors are never touched: in train mode every buffer goes in as a copy, and
    buffers outside ``state_dict`` (non-persistent ones) as copies of the module's.
    A buffer that a call updates must come back (``return_state``: the result is
    ``(out, state)``, the buffers after the call) or be dropped on purpose
    (``discard_state``); otherwise the call is a ``StateError`` naming the buffers.
    """
    names = dict(module.named_parameters(remove_duplicate=False))
    names.update(module.named_buffers(remove_duplicate=False))
    first: dict = {}  # id of a tensor -> its first name
    group = {n: first.setdefault(id(t), n) for n, t in names.items()}
    places: dict = {}  # (id of the owning module, attribute) -> its first name
    for n in names:
        prefix, _, attr = n.rpartition(".")
        places.setdefault((id(module.get_submodule(prefix)), attr), n)
    slots = list(places.values())  # one name per place the module keeps a tensor
    buffers = {n for n, _ in module.named_buffers(remove_duplicate=False)}
    keys = set(module.state_dict().keys())
    required: dict = {}  # tie group -> its names in state_dict
    for n in keys:
        required.setdefault(group.get(n, n), []).append(n)
    hidden = [n for n in buffers if n not in keys]  # non-persistent: the module's own, copied
    owners = [m for m in module.modules() if any(True for _ in m.buffers(recurse=False))]

    def check(params) -> None:
        if not isinstance(params, dict):
            raise StateError(f"anybind op '{name}': a module op is called as op(params, "
                             f"*inputs), params a dict keyed as module.state_dict(); got "
                             f"{type(params).__name__}")
        unknown = sorted(k for k in params if k not in keys)
        missing = sorted(ns[0] if len(ns) == 1 else " / ".join(sorted(ns))
                         for ns in required.values() if not any(n in params for n in ns))
        if unknown or missing:
            parts = ([f"unknown key(s) {unknown}"] if unknown else []) + \
                ([f"missing key(s) {missing}"] if missing else [])
            raise StateError(
                f"anybind op '{name}': its params dict must hold exactly the keys of the "
                f"module's state_dict() (parameters and buffers; of tied names, one is "
                f"enough); it has {' and '.join(parts)}. Build it as "
                f"{{k: jnp.array(v.numpy()) for k, v in module.state_dict().items()}}")

    def call_module(params, *inputs, **kw):
        check(params)
        training = any(m.training for m in owners)
        chosen, copies = {}, {}
        for n, v in params.items():
            g = group.get(n, n)
            if g in chosen:
                continue
            if n in buffers:
                v = v.detach()
                if return_state or training:
                    v = copies[n] = v.clone()
            chosen[g] = v
        given = {n: chosen[group[n]] for n in slots if group[n] in chosen}
        for n in hidden:
            if group[n] == n:
                given[n] = names[n].detach().clone()
        if return_state or discard_state or not training or _torch.transforms_active():
            out = torch.func.functional_call(module, given, inputs, kw, tie_weights=False)
            return (out, copies) if return_state else out
        watch = _effects.Watch(list(copies.values()))  # which buffers the call updates
        with watch:
            out = torch.func.functional_call(module, given, inputs, kw, tie_weights=False)
        if watch.writes:
            written = sorted(n for i, n in enumerate(copies) if i in watch.writes)
            if written:
                raise StateError(
                    f"anybind op '{name}': the module is in train mode and its call updates "
                    f"the buffer(s) {written}, which the op would drop. Take them back with "
                    f"ab.from_torch(module, return_state=True) (the op returns (out, state)), "
                    f"or call module.eval() first; ab.from_torch(module, discard_state=True) "
                    f"drops them on purpose")
        return out
    call_module.__name__ = type(module).__name__
    call_module.module = module
    return call_module


_frontends.MAKERS["torch"] = torch_op
_frontends.MAKERS["torch.jax"] = _make_jax_bridge  # what op.torch runs JAX code by
