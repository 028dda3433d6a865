"""The PyTorch front end: ``op.torch``, the same op as a PyTorch operation.

The op's ``Call`` (structure, avals, static keywords), its rules and the
role runners (``core.roles``) are shared with JAX; only the runtime differs. Every
application is a *node*, the torch counterpart of one primitive of the op's
family, with the same parameters (``role``, ``call``, ``batch``, ``lin``,
``need``) and the same operand layout (``core.roles.Layout``):

===============  ==================================================================
piece            what it does
===============  ==================================================================
``TorchOp``      ``op.torch``: flattens pytrees, splits keywords, caches the ``Call``;
                 runs the node directly when nothing tracks gradients (fast path)
``Node``         one primitive application: host code on NumPy views of the
                 tensors (``routes._host`` runner: checks, vmap modes), or a traced
                 rule on torch tensors
``_Fn``          the ``torch.autograd.Function`` of every node: ``forward``,
                 ``setup_context``, ``backward``, ``jvp``, ``vmap``; one subclass
                 per op and role, named after them (``grad_fn``: ``FooBarBackward``)
``_ad``          what ``backward`` and ``jvp`` compute (the JVP and transpose
                 rules of ``_derivatives``, on torch tensors)
``anybind::run`` the ``torch.library`` op that ``forward`` calls under ``torch.compile``,
                 with a fake implementation from the output spec
===============  ==================================================================

Traced rules (``traced=True``) run on torch tensors, so they must be written
with plain array arithmetic and bound ops: a bound op called on torch tensors
dispatches here, so such rules give derivatives of every order, as in JAX.
Host rules give first derivatives; differentiating one raises, naming it.
Complex numbers: rules keep JAX's convention (vjp ȳ ↦ Jᵀ·ȳ); torch's
gradients are the conjugates (x̄ = conj(Jᵀ·conj(ȳ))), converted at ``backward``.
"""
from __future__ import annotations

import functools
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch
from jax import tree_util

from ..core import _batching, _frontends
from ..core._batching import declared_out_batched
from ..core._code import is_compiled
from ..core._errors import HostError, MissingRuleError
from ..core._jax import ShapedArray
from ..core._spec import Batch, Call, is_float, split_kwargs
from ..core.roles import (
    Layout,
    _primal,
    make_run,
    missing_rule_message,
    out_avals,
    out_names,
    role_name,
    rule_of,
    uses_residuals,
)
from ..core.roles._primal import call_vmap_rule
from ..routes import _host
from . import _torch

# ----------------------------------------------------------------- dtypes

_TORCH_TO_NP = {t: np.dtype(n) for t, n in [
    (torch.float16, "float16"), (torch.float32, "float32"), (torch.float64, "float64"),
    (torch.complex64, "complex64"), (torch.complex128, "complex128"),
    (torch.int8, "int8"), (torch.int16, "int16"), (torch.int32, "int32"),
    (torch.int64, "int64"), (torch.uint8, "uint8"), (torch.bool, "bool")]}
_BF16 = np.dtype(jnp.bfloat16)  # ml_dtypes' bfloat16, which NumPy views as int16 bits
_TORCH_TO_NP[torch.bfloat16] = _BF16
_NP_TO_TORCH = {n: t for t, n in _TORCH_TO_NP.items()}


def _numpy(t: torch.Tensor) -> np.ndarray:
    """``t.numpy()``, bfloat16 included."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(a)``, bfloat16 included."""
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def np_dtype(op_name: str, t: torch.Tensor, what: str) -> np.dtype:
    try:
        return _TORCH_TO_NP[t.dtype]
    except KeyError:
        raise TypeError(f"anybind op '{op_name}': {what} has dtype {t.dtype}, which NumPy "
                        f"cannot view; supported: {sorted(str(d) for d in _TORCH_TO_NP)}"
                        ) from None


def torch_dtype(op_name: str, dtype) -> torch.dtype:
    try:
        return _NP_TO_TORCH[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"anybind op '{op_name}': dtype {np.dtype(dtype)} has no torch "
                        f"counterpart") from None


class _TorchXP:
    """The array namespace ``_ad`` makes zeros with, for rules run on torch tensors."""

    @staticmethod
    def zeros(shape, dtype):
        return torch.zeros(tuple(shape), dtype=_NP_TO_TORCH[np.dtype(dtype)])


TXP = _TorchXP()


# ------------------------------------------------------------------ nodes

_NODES: weakref.WeakValueDictionary[int, Node] = weakref.WeakValueDictionary()
_NEXT_ID = iter(range(1, 1 << 62))
_ID_LOCK = threading.Lock()


class Node:
    """One primitive application of an op on torch tensors (see the module table)."""

    def __init__(self, front: TorchOp, role: str, call: Call, batch: Batch | None,
                 lin=None, need=None):
        self.front, self.role, self.call, self.batch = front, role, call, batch
        self.lin, self.need = lin, need
        op = call.op
        self.by_vmap_rule = batch is not None and role == "primal" and op.vmap_rule is not None
        self.rule = op.vmap_rule if self.by_vmap_rule else rule_of(role, call, need)
        if self.rule is not None and is_compiled(self.rule.fn):
            raise NotImplementedError(
                f"anybind op '{op.name}': its {role_name(role, call)} is a compiled function "
                f"(the compiled route, through XLA's FFI); op.torch runs Python callables only")
        self.name = "vmap rule" if self.by_vmap_rule else role_name(role, call)
        self.fn = front.function(role)
        lead = () if batch is None else (batch.size,)
        self.avals = out_avals(role, call, lin, need)
        self.names = out_names(role, call, need)
        self.shapes = [lead + a.shape for a in self.avals]
        self.dtypes = [torch_dtype(op.name, a.dtype) for a in self.avals]
        # differentiable outputs: floating ones, never the residuals of a fwd rule
        n_res = len(call.res_avals) if role == "fwd" else 0
        self.float_out = [is_float(a) for a in self.avals[:len(self.avals) - n_res]] \
            + [False] * n_res
        self._runner = self._run = None
        self._out_batched = None  # a traced vmap rule's out_batched, once it has run
        # host code that also runs on tensors itself (a bridge's JAX code): no NumPy round trip
        maker = getattr(self.rule.fn, "tensor_runner", None) if (
            role == "primal" and batch is None and self.rule is not None
            and not self.rule.traced and not self.rule.out) else None
        self.direct = None if maker is None else maker(call)
        self._layouts: dict = {}
        self.plans: dict = {}  # backward plans by pattern of zeros (_ad)
        if self.rule is not None and self.rule.out:  # out=True: the runner hands out buffers
            self._run_unbatched = lambda ins: self._run_inplace(ins)
        with _ID_LOCK:
            self.id = next(_NEXT_ID)
        _NODES[self.id] = self

    def __repr__(self) -> str:
        return f"<node {self.call.op.name}:{self.role} batch={self.batch}>"

    def layout(self, n_ops: int) -> Layout:
        lay = self._layouts.get(n_ops)
        if lay is None:
            lay = self._layouts[n_ops] = Layout(self.role, self.call, n_ops)
        return lay

    def derived(self, role: str, batch: Batch | None = None, lin=None, need=None) -> Node:
        return self.front.node(role, self.call, batch, lin, need)

    @property
    def n_out(self) -> int:
        return len(self.avals)

    def out_batched(self) -> list[bool] | None:
        """Which outputs of a node batched by the op's vmap rule vary over the batch;
        None where all do (the others are broadcast over the batch). A host rule's
        are its ``out_batched=`` declaration, a traced rule's those it returned when
        the node ran (as JAX reads them while tracing)."""
        if not self.by_vmap_rule:
            return None
        if self.rule.traced:
            return self._out_batched
        return declared_out_batched(self.call, self.batch)

    def host_runner(self):
        """``_primitive._lower``'s host runner: checks, and the batching of the rule."""
        if self._runner is None:
            call, role, rule, lin, need = self.call, self.role, self.rule, self.lin, self.need
            if self.by_vmap_rule:
                mode = rule
            elif self.batch is not None:
                rule, mode = _batching.host_mode(role, rule, call.op)
            else:
                mode = None
            self._runner = _host.make_host_runner(
                call, self.name, lambda lead: make_run(role, call, rule, lin, need, np, lead),
                self.avals, self.names, self.batch, mode,
                inplace=rule.out)
        return self._runner

    def run(self, ops: Sequence[torch.Tensor]) -> list:
        """The node's outputs, computed without autograd (host code or a traced rule)."""
        if self.rule is None:
            raise MissingRuleError(missing_rule_message(self.role, self.call.op))
        if self.rule.traced:
            with torch.no_grad():
                return self.run_traced(ops)
        if self.direct is not None:
            try:
                return self.direct(ops)
            except HostError:
                raise
            except Exception as e:
                raise HostError(f"anybind op '{self.call.op.name}': the {self.name} raised "
                                f"{type(e).__name__}: {e}").with_traceback(
                                    e.__traceback__) from None
        try:
            ins = [_np_view(t) for t in ops]
        except RuntimeError:
            if any(_is_legacy_batched(t) for t in ops):  # gradcheck's check_batched_grad
                from ._ad import legacy_batch  # (imports this module)
                return legacy_batch(self, list(ops))
            raise
        try:
            if self.batch is None:
                outs = self._run_unbatched(ins)
            else:
                outs = [torch.empty(s, dtype=d) for s, d in zip(self.shapes, self.dtypes)]
                self.host_runner()(ins, [_numpy(o) for o in outs])
        except HostError:
            raise
        except Exception as e:
            raise HostError(f"anybind op '{self.call.op.name}': the {self.name} raised "
                            f"{type(e).__name__}: {e}").with_traceback(e.__traceback__) from None
        if ops and not ops[0].is_cpu:
            outs = [o.to(ops[0].device) for o in outs]
        return outs

    def _run_unbatched(self, ins) -> list:
        """The rule's results as tensors: fresh arrays are taken over, others copied.

        An array that nothing but this frame refers to (a temporary the rule just
        made) becomes the tensor's storage without a copy; one the rule keeps, or
        a view of an input, is copied, as XLA's output buffers would be.
        """
        run = self._run
        if run is None:
            call, rule = self.call, self.rule
            run = self._run = make_run(self.role, call, rule, self.lin, self.need, np, ())
            self._expected = [(s, np.dtype(a.dtype)) for s, a in zip(self.shapes, self.avals)]
        res, outs = run(*ins), []
        for j in range(len(res)):
            r = res[j]
            shape, dtype = self._expected[j]
            if not (type(r) is np.ndarray and r.shape == shape and r.dtype == dtype):
                r = _host._as_result(self.call, f"the {self.name}'s {self.names[j]}", r,
                                         self.avals[j], shape, False)
            if r.flags.owndata and r.flags.writeable and sys.getrefcount(r) <= _FRESH:
                outs.append(_from_numpy(r))
            else:
                outs.append(_from_numpy(np.array(r)))
        return outs

    def _run_inplace(self, ins) -> list:
        outs = [torch.empty(s, dtype=d) for s, d in zip(self.shapes, self.dtypes)]
        self.host_runner()(ins, [_numpy(o) for o in outs])
        return outs

    def run_traced(self, ops: Sequence[torch.Tensor]) -> list:
        """A traced function or rule run on torch tensors (differentiable by torch)."""
        call = self.call
        if self.by_vmap_rule:
            flags = []

            def rule(*ops):  # run as traced code: JAX code in it makes the op run by JAX
                leaves, got = call_vmap_rule(call, self.rule.fn, self.batch, list(ops))
                flags.extend(got)
                return leaves
            leaves = traced(call, self.name, rule, ops)
            self._out_batched = [bool(f) for f in flags]
            outs = [l if f else _as_tensor(l).expand(self.shapes[j])
                    for j, (l, f) in enumerate(zip(leaves, flags))]
            check_outputs(call, self.name, outs, self.shapes, self.dtypes, self.names)
            return outs
        run = make_run(self.role, call, self.rule, self.lin, self.need, TXP, ())
        if self.batch is not None:
            run = vmapped(run, self.batch.mask, self.batch.size)
        outs = traced(call, self.name, run, ops)
        check_outputs(call, self.name, outs, self.shapes, self.dtypes, self.names)
        return outs


class NotTorchCode(TypeError):
    """Traced code failed on torch tensors: it is JAX code (``jax.numpy``, ``lax``)."""


def traced(call: Call, name: str, run: Callable, ops) -> list:
    """``run(*ops)`` for a traced rule on torch tensors, with a clear error if it is JAX code."""
    try:
        return list(run(*ops))
    except (HostError, MissingRuleError, TypeError) as e:
        if isinstance(e, TypeError) and "anybind op" not in str(e):
            raise NotTorchCode(_traced_message(call, name, e)) from e
        raise
    except Exception as e:
        if "anybind op" in str(e):
            raise
        raise NotTorchCode(_traced_message(call, name, e)) from e


def _traced_message(call: Call, name: str, e: Exception) -> str:
    return (f"anybind op '{call.op.name}': the traced {name} failed on torch tensors under "
            f"op.torch ({type(e).__name__}: {e}). Traced rules that op.torch runs must use "
            f"plain array arithmetic and bound ops only (not jax.numpy), or be host code "
            f"(traced=False); a traced function written with jax.numpy runs by JAX "
            f"(ab.to_torch)")


def check_outputs(call: Call, name: str, outs, shapes, dtypes, names) -> None:
    """A traced rule's outputs against the expected shapes and dtypes."""
    for o, s, d, n in zip(outs, shapes, dtypes, names):
        if not isinstance(o, torch.Tensor):
            raise NotTorchCode(f"anybind op '{call.op.name}': under op.torch the traced {name} "
                            f"returned {type(o).__name__} for {n}; expected a torch tensor "
                            f"{d}{list(s)} (use plain array arithmetic and bound ops, not "
                            f"jax.numpy)")
        if tuple(o.shape) != tuple(s) or o.dtype != d:
            raise TypeError(f"anybind op '{call.op.name}': the {name} returned "
                            f"{o.dtype}{list(o.shape)} for {n}; expected {d}{list(s)}")


def _as_tensor(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))


# sys.getrefcount of an array held by one local name and the list it came in, only
# (the call's own argument is the third reference)
_FRESH = 3


def _np_view(t: torch.Tensor) -> np.ndarray:
    """A read-only NumPy view of a CPU tensor (a copy only for other devices)."""
    if t.requires_grad:
        t = t.detach()
    try:  # refuses symbolic zeros, other devices, lazy conj/neg and bfloat16: below
        v = t.numpy()
    except (RuntimeError, TypeError):
        v = _np_view_slow(t)
    v.flags.writeable = False
    return v


def _np_view_slow(t: torch.Tensor) -> np.ndarray:
    if _torch.is_zerotensor(t):  # forward AD's symbolic zeros (a tangent nobody set) have no data
        return np.zeros(tuple(t.shape), _TORCH_TO_NP[t.dtype])
    if not t.is_cpu:
        t = t.cpu()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return _numpy(t)


def vmapped(fn: Callable[..., list], mask: Sequence[bool], size: int) -> Callable[..., list]:
    """``fn`` on unbatched operands, lifted to operands in ``Batch`` layout (torch.vmap)."""
    in_dims = tuple(0 if m else None for m in mask)

    def run(*ops):
        squeezed = [o if m else o[0] for o, m in zip(ops, mask)]
        return list(torch.vmap(lambda *a: tuple(fn(*a)), in_dims=in_dims,
                               randomness="same")(*squeezed))
    return run


# --------------------------------------------------------- autograd.Function

def tracking(ops: Sequence[torch.Tensor]) -> bool:
    """Whether any transform or autograd would see this application."""
    if _torch.transforms_active() or _torch.dual_level() >= 0:
        return True
    if torch.is_grad_enabled():
        for t in ops:
            if t.requires_grad:
                return True
    return False


def apply(node: Node, ops: Sequence[torch.Tensor]) -> list:
    """The node's outputs, recorded for autograd and torch.func where they look."""
    if not tracking(ops):
        return run_node(node, ops)
    return list(node.fn.apply(node, *ops))


def _symbolic(ops) -> bool:
    """Whether the tensors are fake ones (torch.compile tracing): no data to compute on."""
    for t in ops:
        if type(t) not in _PLAIN and _torch.is_fake(t):
            return True
    return False


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def run_node(node: Node, ops: Sequence[torch.Tensor]) -> list:
    """The node's outputs without autograd: host code, or ``anybind::run`` when tracing."""
    if _symbolic(ops):
        return list(torch.ops.anybind.run(node.id, list(ops)))
    return node.run(ops)


class _Fn(torch.autograd.Function):
    """Every node under autograd and torch.func; the maths is in ``_ad``."""

    @classmethod
    def apply(cls, *args):
        # torch's apply binds the arguments with inspect.signature on every call (about
        # a third of a small call); without functorch transforms nothing needs that
        if _torch.transforms_active():
            return super().apply(*args)
        for a in args:
            if type(a) is not Node and _is_wrapped(a):  # a dead torch.func wrapper
                return super().apply(*args)
        return _torch.function_apply(cls, *args)

    @staticmethod
    def forward(node: Node, *ops):
        outs = run_node(node, ops)
        return tuple(_fresh(outs, ops) if node.rule.traced else outs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        node, ops = inputs[0], inputs[1:]
        ctx.node = node
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*[o for o, f in zip(output, node.float_out) if not f])
        ctx.save_for_backward(*ops, *output)
        if _torch.transforms_active() or _torch.dual_level() >= 0:
            ctx.save_for_forward(*ops, *output)
        ctx.n_ops = len(ops)

    @staticmethod
    def backward(ctx, *cts):
        node = ctx.node
        saved = ctx.saved_tensors
        ops, outs = saved[:ctx.n_ops], saved[ctx.n_ops:]
        needs = ctx.needs_input_grad[1:]
        if node.role != "primal":  # a derived node of host code: only what the engine runs
            needs = _engine_needs(ctx, needs)
        from ._ad import backward  # (imports this module)
        return (None, *backward(node, list(ops), list(outs), list(cts), needs))

    @staticmethod
    def jvp(ctx, _node, *tangents):
        node = ctx.node
        saved = _unwrapped(ctx.saved_tensors)
        ops, outs = saved[:ctx.n_ops], saved[ctx.n_ops:]
        tangents = _unwrapped(tangents)
        # torch runs jvp staticmethods with forward AD off at every level, so an outer
        # jvp (forward over forward) would silently see zeros; the unwrapped primals
        # carry no tangent of this level, so turning it back on is exact.
        with _torch.set_fwd_grad_enabled(True):
            from ._ad import forward  # (imports this module)
            return tuple(forward(node, list(ops), list(outs), list(tangents)))

    @staticmethod
    def vmap(info, in_dims, node, *ops):
        from ._ad import batch  # (imports this module)
        return batch(node, info.batch_size, in_dims[1:], list(ops))


_is_wrapped = _torch.is_wrapped
_is_legacy_batched = _torch.is_legacy_batched  # gradcheck's batched checks
_is_alias_of = _torch.is_alias_of


def _fresh(outs: list, ops) -> list:
    """A traced rule's outputs, those that share memory with an input or an earlier
    output copied (host code's outputs are fresh already).

    A traced function may return an input as-is or a view of it (x, x[i]); the
    JAX op's output buffers never alias, and torch restricts what an
    ``autograd.Function`` or a custom op returning one may do (it refuses to save
    an input returned as-is; forward AD wants the tangent of a view to be a view
    of the input's tangent; a custom op's outputs may alias nothing).
    """
    res = []
    for o in outs:
        if any(_is_alias_of(o, t) for t in ops) or any(_is_alias_of(o, r) for r in res):
            o = o.clone()
        res.append(o)
    return res


def _engine_needs(ctx, needs) -> list:
    """``needs`` less the inputs whose gradient the running backward pass discards.

    A host rule cannot be differentiated in its primals, which then raises; an
    input that merely requires grad (x under ``autograd.grad(g, ȳ)``) must not.
    Where torch cannot tell (a leaf under ``autograd.grad``) it counts as needed.
    """
    out = list(needs)
    for i, (fn, _) in enumerate(ctx.next_functions):
        if out[i] and fn is not None:
            try:
                out[i] = bool(_torch.will_engine_execute(fn))
            except RuntimeError:
                pass
    return out


def _unwrapped(ts):
    """The tensors without the tangent of the running forward-mode level, if any.

    torch runs a jvp staticmethod on primals that still carry their tangents:
    wrapped at its own level under torch.func.jvp, dual tensors under plain
    forward AD (``forward_ad.dual_level``). Computing on them with forward AD on,
    inside a nested transform (a transposition), or calling an op on them again
    (a traced rule calling its own op) would ask for those tangents again.
    """
    level = _torch.current_level()
    if level is not None:
        if _torch.current_interpreter().key() != _torch.JVP:
            return list(ts)
        return [t if t is None or _torch.level_of(t) != level
                else _torch.unwrap_for_grad(t, level) for t in ts]
    dual = _torch.dual_level()
    if dual < 0:
        return list(ts)
    # (a BatchedTensor of torch._vmap_internals, gradcheck's batched tangent, has no
    # tangent of its own and cannot be unpacked)
    return [t if t is None or _is_legacy_batched(t) else
            _torch.unpack_dual_at(t, level=dual)[0] for t in ts]


# --------------------------------------------------------------- torch.compile

@torch.library.custom_op("anybind::run", mutates_args=())
def _run_op(nid: int, ops: list[torch.Tensor]) -> list[torch.Tensor]:
    node = _NODES[nid]
    outs = node.run(ops)
    return _fresh(outs, ops) if node.rule.traced else outs


@_run_op.register_fake
def _(nid, ops):
    node = _NODES[nid]
    device = ops[0].device if ops else torch.device("cpu")
    return [torch.empty(s, dtype=d, device=device) for s, d in zip(node.shapes, node.dtypes)]


# --------------------------------------------------------------- the front end

class TorchOp:
    """``op.torch``: the op as a PyTorch operation on torch tensors.

    Same function, rules, pytrees, keyword operands and static keywords as
    the JAX op; works under autograd, ``torch.func`` and ``torch.compile``.

    >>> import anybind as ab, numpy as np, torch
    >>> sin = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="sin")
    >>> cos = ab.bind(np.cos, shape=ab.like(0), vmap="vectorized", name="cos")
    >>> _ = sin.def_jvp(lambda p, t: cos(p[0]) * t[0], traced=True)
    >>> _ = cos.def_jvp(lambda p, t: -sin(p[0]) * t[0], traced=True)
    >>> x = torch.tensor([0.5, 1.0], dtype=torch.float64)
    >>> torch.func.hessian(lambda x: sin.torch(x).sum())(x).diagonal()
    tensor([-0.4794, -0.8415], dtype=torch.float64)
    """

    def __init__(self, op):
        self.op = op
        self._cache: dict = {}
        self._nodes: dict = {}  # filled from any thread: single dict writes are atomic
        self._functions: dict = {}  # role -> its _Fn subclass
        self.bridge: TorchOp | None = None  # set once the op's code runs by JAX (see call)

    def __repr__(self) -> str:
        return f"<torch front end of {self.op!r}>"

    def function(self, role: str) -> type:
        """The op's ``_Fn`` for nodes of this role, named after both, so that autograd's
        ``grad_fn`` names the op (``FooBarBackward``, ``FooBar_vjpBackward``)."""
        fn = self._functions.get(role)
        if fn is None:
            name = re.sub(r"\W", "_", self.op.name) + ("" if role in ("primal", "fwd")
                                                        else f"_{role}")
            fn = self._functions.setdefault(role, type(name, (_Fn,), {
                "__module__": _Fn.__module__, "__qualname__": name}))
        return fn

    def node(self, role: str, call: Call, batch=None, lin=None, need=None) -> Node:
        key = (role, call, batch, lin, need)
        node = self._nodes.get(key)
        if node is None:
            node = self._nodes.setdefault(key, Node(self, role, call, batch, lin, need))
        return node

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return _compiled_entry(self.op, *args, **kwargs)
        return self.call(args, kwargs)

    def call(self, args: tuple, kwargs: dict) -> Any:
        """The op on torch tensors: by torch, or by JAX where its code is JAX code.

        A traced op's function runs on the tensors themselves when it is written
        with plain array arithmetic and bound ops, so torch sees every step (and
        ``torch.compile`` can fuse it). JAX code (``jax.numpy``, ``lax``) cannot run
        on tensors: it fails at once, before anything is returned, by raising or by
        returning something other than tensors (``NotTorchCode``). The op then runs
        by JAX from this call on (``_bridges.jax_bridge``: ``jax.jit`` on views of
        the tensors, derivatives by ``jax.vjp``/``jax.jvp``, batching by
        ``jax.vmap``). Falling back is safe because traced code is pure: JAX traces
        it and keeps no effect of running it. ``ab.to_torch`` asks for JAX outright.
        """
        bridge = self.bridge
        if bridge is not None:
            return bridge.call(args, kwargs)
        try:
            return self._call(args, kwargs)
        except NotTorchCode:
            if not self.op.traced:
                raise
            from . import _bridges  # (imports this module)
            self.bridge = _bridges.jax_bridge(self.op)
            return self.bridge.call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        op = self.op
        operands, static = split_kwargs(op, kwargs, _is_tensor, "a tensor") if kwargs \
            else ({}, ())
        xs, args_tree = tree_util.tree_flatten(args)
        ks, kw_tree = tree_util.tree_flatten(operands)
        xs = [_operand(op, x, f"positional input leaf {i}") for i, x in enumerate(xs)]
        ks = [_operand(op, k, f"keyword operand leaf {i}") for i, k in enumerate(ks)]
        ops = xs + ks
        key = (args_tree, kw_tree, static, tuple([(t.shape, t.dtype) for t in ops]),
               tuple(type(v) for _, v in static), op.version)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._prepare(key, xs, ks)
        call, primal, grad_node = entry
        if primal is None:  # a traced function without rules: torch runs it inline
            outs = traced(call, "function", _primal.primal(call, op.fn, TXP), ops)
            check_outputs(call, "function", outs, [a.shape for a in call.out_avals],
                          [torch_dtype(op.name, a.dtype) for a in call.out_avals],
                          [call.out_name(j) for j in range(len(call.out_avals))])
        elif not tracking(ops):
            outs = run_node(primal, ops)
        else:
            outs = list(grad_node.fn.apply(grad_node, *ops))[:len(call.out_avals)]
        return tree_util.tree_unflatten(call.out_tree, outs)

    def _prepare(self, key, xs, ks):
        op = self.op
        if op.device:
            raise NotImplementedError(
                f"anybind op '{op.name}' has device code (device=True), which op.torch does "
                f"not run; call the op from JAX")
        if getattr(op, "multilinear", False):
            raise NotImplementedError(
                f"anybind op '{op.name}' is multilinear=True, which op.torch does not "
                f"support yet (its transposes per argument have no torch counterpart here); "
                f"bind it without multilinear and give it jvp and vjp rules to use it from "
                f"torch")
        args_tree, kw_tree, static, _, static_types, _ = key
        in_avals = tuple(ShapedArray(tuple(t.shape), np_dtype(op.name, t, f"positional input "
                                                              f"leaf {i}"))
                         for i, t in enumerate(xs))
        kw_avals = tuple(ShapedArray(tuple(t.shape), np_dtype(op.name, t, f"keyword operand "
                                                              f"leaf {i}"))
                         for i, t in enumerate(ks))
        import jax
        with jax.enable_x64(True):  # torch's dtypes, whatever JAX's x64 setting
            call = op.call_for(args_tree, kw_tree, static, in_avals, kw_avals, static_types)
        if op.traced and op.jvp_rule is None and op.vjp_rule is None and \
                op.transpose_rule is None and op.fwd_rule is None and op.vmap_rule is None:
            entry = (call, None, None)
        else:
            primal = self.node("primal", call)
            grad_node = self.node("fwd", call) if uses_residuals(call) else primal
            entry = (call, primal, grad_node)
        self._cache[key] = entry
        return entry


def _opaque_call(key: int, args: tuple, kwargs: dict):
    """Under torch.compile: an opaque call to dynamo, traced by AOTAutograd."""
    return front_of(_frontends.LIVE_OPS[key]).call(args, kwargs)


_compiled_call = _opaque_call  # marked opaque to dynamo (nonstrict_trace) once dynamo loads


def _mark_opaque() -> None:
    global _compiled_call
    _compiled_call = _torch.nonstrict_trace(_opaque_call)


def _compiled_entry(op, *args, **kwargs):
    return _compiled_call(id(op), args, kwargs)


_torch.after_import("torch._dynamo", _mark_opaque)


def torch_op(op):
    """``op.torch``: the op's ``TorchOp`` (under torch.compile, its opaque entry)."""
    if torch.compiler.is_compiling():  # dynamo must not build objects it would pass on
        from . import _bridges  # (imports this module)
        native = _bridges.native_code(op)
        if native is not None:  # torch code: dynamo sees it
            return native
        return functools.partial(_compiled_entry, op)
    from . import _bridges
    native = _bridges.native_code(op)
    return native if native is not None else front_of(op)


def front_of(op) -> TorchOp:
    """The op's ``TorchOp`` (kept by the op until a rule changes)."""
    return op.state("torch.front", TorchOp)


def _operand(op, x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (np.ndarray, np.generic)):
        return _from_numpy(np.array(x))
    if isinstance(x, (bool, int, float, complex)):
        return torch.tensor(x)
    raise TypeError(f"anybind op '{op.name}': under op.torch, {what} must be a torch tensor, "
                    f"a NumPy array or a number, got {type(x).__name__}")


def _is_tensor(x) -> bool:
    return isinstance(x, (torch.Tensor, np.ndarray, np.generic))


def _dispatch(op, *args, **kwargs):
    """A bound op called on torch tensors (in a traced rule, say) runs as ``op.torch``."""
    return front_of(op)(*args, **kwargs)


_frontends.FRONT_ENDS[torch.Tensor] = _dispatch
_frontends.MAKERS["torch"] = torch_op
