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
``_ad._Fn``      the ``torch.autograd.Function`` of every node: ``forward``,
                 ``setup_context``, ``backward``, ``jvp``, ``vmap``; one subclass
                 per op and role, named after them (``grad_fn``: ``FooBarBackward``),
                 and what they compute (the JVP and transpose rules of
                 ``_derivatives``, on torch tensors)
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

import pickle
import re
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jax import tree_util

from .._api import remade
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
from ._ad import _Fn, _fresh, legacy_batch
from ._run import (  # noqa: F401
    _FRESH,
    _NP_TO_TORCH,
    _TORCH_TO_NP,
    TXP,
    NotTorchCode,
    _as_tensor,
    _from_numpy,
    _np_view,
    _numpy,
    apply,
    check_outputs,
    np_dtype,
    run_node,
    torch_dtype,
    traced,
    tracking,
    vmapped,
)

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
            if any(_torch.is_legacy_batched(t) for t in ops):  # gradcheck's check_batched_grad
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
    >>> sin = ab.bind(np.sin, shape=ab.like(0), vmap="expand_dims", name="sin")
    >>> cos = ab.bind(np.cos, shape=ab.like(0), vmap="expand_dims", name="cos")
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

    pickled: tuple | None = None  # (make, args, kwargs) it pickles as, if it has a maker

    def __reduce__(self) -> tuple:
        if self.pickled is None:
            raise pickle.PicklingError(
                f"anybind op '{self.op.name}': its op.torch pickles with the op: pickle the "
                f"op (ab.Op) and take .torch of what loads")
        return remade(*self.pickled, self.op.name)

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
            self.bridge = self.op.state("torch.jax_bridge", _frontends.MAKERS["torch.jax"])
            return self.bridge.call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        op = self.op
        xs, args_tree = tree_util.tree_flatten(args)
        if kwargs:
            operands, static = split_kwargs(op, kwargs, _is_tensor, "a tensor")
            ks, kw_tree = tree_util.tree_flatten(operands)
        else:
            static, ks, kw_tree = (), [], _NO_KWARGS
        for leaves, what in ((xs, "positional input"), (ks, "keyword operand")):
            for i, x in enumerate(leaves):
                if type(x) is not torch.Tensor:
                    leaves[i] = _operand(op, x, f"{what} leaf {i}")
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


def front_of(op) -> TorchOp:
    """The op's ``TorchOp`` (kept by the op until a rule changes)."""
    return op.state("torch.front", TorchOp)


_NO_KWARGS = tree_util.tree_structure({})


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


_frontends.FRONT_ENDS[torch.Tensor] = _dispatch  # (op.torch's maker: ``_bridges``)
