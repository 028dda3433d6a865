"""Derivatives and batching of torch nodes: ``_derivatives`` and ``_batching`` for torch.

What ``_Fn.backward``, ``_Fn.jvp`` and ``_Fn.vmap`` compute, per node role
(``_front.Node``), in JAX's convention (``backward`` conjugates at its
boundary, see ``_front``):

==========  ===========================================  ==============================
role        backward: ȳ ↦ x̄                               jvp: ẋ ↦ ẏ
==========  ===========================================  ==============================
primal      vjp/bwd rule; else the transpose of a        jvp rule; else the transpose
            traced jvp rule (``torch.func.vjp``); else   of a traced vjp rule; else
            torch's vjp of a traced function             torch's, of a traced function
linear op   transpose rule (or torch's, traced fn)        f(ẋ)
jvp         in ẋ: the vjp node (its transpose)            in ẋ: itself
vjp         in ȳ: the jvp node                            in ȳ: itself
transpose   in ȳ: f                                       in ȳ: itself
==========  ===========================================  ==============================

A host rule's node in its non-linear operands (x) cannot be differentiated:
that raises ``MissingRuleError`` naming the op and the rule. Traced rules run
inline on torch tensors, so torch differentiates them to every order.
Zeros: an absent tangent or cotangent is ``None`` and is left out of the
operands (recorded in ``lin``); a result nobody needs is ``None``.
A batched node's derivatives are ``torch.vmap`` of the unbatched node's.
(A traced function with no derivative rule runs inline, torch differentiating it,
unless it has a vmap rule: then it is a node, whose derivatives are torch's.)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

from ..core._code import higher_order_way, is_compiled
from ..core._errors import MissingRuleError
from ..core._spec import Batch, Call
from ..core.roles import (
    _jvp,
    _primal,
    _transpose as _transposes,
    _vjp,
    missing_rule_message,
    uses_residuals,
)
from . import _torch
from ._run import (
    TXP,
    _symbolic,
    apply,
    check_outputs,
    run_node,
    torch_dtype,
    traced,
    tracking,
)

Node = Any  # a node, ``_front.Node`` (whose module imports this one)

def _conj(t):
    return t.conj().resolve_conj() if t is not None and t.is_complex() else t


def _zeros(aval) -> torch.Tensor:
    return torch.zeros(aval.shape, dtype=torch_dtype("", aval.dtype))


def _keyword_error(call: Call, i: int, action: str) -> TypeError:
    return TypeError(
        f"anybind op '{call.op.name}': {call.kw_name(i)} is a non-differentiable operand, but "
        f"{action} through it under op.torch. Pass it as a positional argument to "
        f"differentiate with respect to it, or .detach() it")


def _higher_order_error(node: Node) -> MissingRuleError:
    op, kind = node.call.op, {"jvp": "jvp", "vjp": "vjp", "transpose": "transpose"}[node.role]
    if node.role == "vjp" and uses_residuals(node.call):
        kind = "bwd"
    rule = {"jvp": op.jvp_rule, "vjp": op.vjp_rule, "bwd": getattr(op, "bwd_rule", None),
            "transpose": op.transpose_rule}.get(kind)
    if rule is not None and is_compiled(rule.fn):
        return MissingRuleError(higher_order_way(rule.fn, op.name, kind, node.name,
                                                 " under op.torch"))
    return MissingRuleError(
        f"anybind op '{op.name}': a higher-order derivative under op.torch differentiates its "
        f"{node.name}, which is host code. Host rules give first derivatives only; for "
        f"higher orders register the rule as traced (op.def_{kind}(rule, traced=True)), "
        f"written with plain array arithmetic and bound ops so that it also runs on torch "
        f"tensors")


def _checked(node: Node, role: str, name: str, run, ops, avals) -> list:
    outs = traced(node.call, name, run, ops)
    check_outputs(node.call, name, outs, [a.shape for a in avals],
                  [torch_dtype(node.call.op.name, a.dtype) for a in avals],
                  [f"{role} output {j}" for j in range(len(avals))])
    return outs


def _vjp_of(f, primals, cts) -> list:
    """∂f(x)ᵀ·ȳ (JAX convention) by torch's vjp, whose cotangents are conjugated."""
    _, pullback = torch.func.vjp(lambda *v: tuple(f(*v)), *primals)
    return [_conj(c) for c in pullback(tuple(_conj(c) for c in cts))]


def _transpose_of(f, avals, cts) -> list:
    """Aᵀ·ȳ for a linear f (JAX convention), by torch's vjp at zero."""
    return _vjp_of(f, [_zeros(a) for a in avals], cts)


def _jvp_of(f, primals, ts) -> list:
    """∂f(x)·ẋ by torch's forward AD: torch.func.jvp, or under plain forward AD
    (dual tensors), where torch.func.jvp cannot open a level, duals at its level."""
    level = _torch.dual_level()
    if level < 0 or _torch.jvp_nesting() > 0:  # (torch.func.jvp's own count of its levels)
        return list(torch.func.jvp(lambda *v: tuple(f(*v)), tuple(primals), tuple(ts))[1])
    outs = f(*[fwAD.make_dual(p, t, level=level) for p, t in zip(primals, ts)])
    tans = [fwAD.unpack_dual(o, level=level).tangent for o in outs]
    return [torch.zeros_like(o) if t is None else t for o, t in zip(outs, tans)]


def _function_of(node: Node, xs, ks, chosen):
    """The traced function as one of the inputs ``chosen``, the others held at xs;
    its floating outputs (an op with a vmap rule and no derivative rules, which torch
    differentiates itself)."""
    call = node.call
    f = _primal.primal(call, call.op.fn, TXP)
    idx = [i for i, k in enumerate(chosen) if k]

    def g(*v):
        full = list(xs)
        for i, x in zip(idx, v):
            full[i] = x
        outs = traced(call, "function", f, [*full, *ks])
        return [o for o, fl in zip(outs, call.float_out) if fl]
    return g, [xs[i] for i in idx]


# ------------------------------------------------------------------- backward

def backward(node: Node, ops: list, outs: list, cts: list, needs: Sequence[bool]) -> list:
    """torch's gradients (conjugate convention) of the node's operands."""
    res = cotangents(node, ops, outs, [_conj(c) for c in cts], needs)
    return [_conj(r) for r in res]


def cotangents(node: Node, ops: list, outs: list, cts: list, needs) -> list:
    """x̄ = ∂f(x)ᵀ·ȳ for every operand (None where not needed or zero)."""
    if node.batch is not None:
        return _batched_cotangents(node, ops, outs, cts, needs)
    if node.role == "primal":  # the common cases, planned once per pattern of zeros
        key = (tuple([c is not None for c in cts]), tuple(needs))
        plan = node.plans.get(key, False)
        if plan is False:
            plan = node.plans[key] = _vjp_plan(node, *key)
        if plan is not None:
            tensors_only, run = plan
            if not (tensors_only and _not_plain([*ops, *[c for c in cts if c is not None]])):
                return run(ops, cts)
    call, role, op = node.call, node.role, node.call.op
    lay = node.layout(len(ops))
    for k, i in enumerate(lay.ks):
        if needs[i]:
            raise _keyword_error(call, k, "a gradient was asked")
    res = [None] * len(ops)
    if role in ("primal", "fwd"):
        n_out = len(call.out_avals)
        cts = cts[:n_out]
        ct_lin = tuple(c is not None and f for c, f in zip(cts, call.float_out))
        need = tuple(bool(needs[i]) and call.float_in[i] for i in range(call.n_in))
        if not any(need) or not any(ct_lin):
            return res
        present = [c for c, p in zip(cts, ct_lin) if p]
        xs, ks = ops[:call.n_in], ops[call.n_in:]
        if op.linear:
            xbar = _transpose(node, xs, ks, present, ct_lin, need)
        else:
            xbar = _primal_vjp(node, xs, ks, outs[n_out:], present, ct_lin, need)
        for i, c in zip([i for i, k in enumerate(need) if k], xbar):
            res[i] = c
        return res
    if any(needs[i] for i in lay.nonlin):
        raise _higher_order_error(node)
    und = [bool(needs[i]) for i in lay.lin]
    present = tuple(c is not None for c in cts)
    if not any(und) or not any(present):
        return res
    pcts = [c for c in cts if c is not None]
    nonlin = [ops[i] for i in lay.nonlin]
    out = _LINEAR_TRANSPOSES[role](node, nonlin, pcts, und, present)
    for i, c in zip([i for i, u in zip(lay.lin, und) if u], out):
        res[i] = c
    return res


def _not_plain(ts) -> bool:
    """Whether autograd, a transform or torch.compile's tracing sees these tensors."""
    return tracking(ts) or _symbolic(ts)


def _vjp_plan(node: Node, present, needs):
    """``(tensors_only, run(ops, cts) -> x̄)`` when the op's vjp rule alone answers this
    pattern of zeros: a host rule's node, or a rule with a way of its own to run on plain
    tensors (``tensor_vjp``: a bridge's, which nothing may differentiate or trace); None
    when the general path must decide."""
    call, op = node.call, node.call.op
    vr = op.vjp_rule
    if op.linear or uses_residuals(call) or vr is None or any(needs[call.n_in:]):
        return None
    ct_lin = tuple(p and f for p, f in zip(present, call.float_out))
    need = tuple(bool(needs[i]) and call.float_in[i] for i in range(call.n_in))
    if not any(need) or not any(ct_lin):
        return None
    given = [j for j, p in enumerate(ct_lin) if p]
    wanted = [i for i, k in enumerate(need) if k]
    n_ops, n_in = len(needs), call.n_in

    def spread(got) -> list:
        res = [None] * n_ops
        for i, c in zip(wanted, got):
            res[i] = c
        return res
    if not vr.traced:
        vjp_node = node.derived("vjp", None, ct_lin, need)
        return False, lambda ops, cts: spread(apply(vjp_node, [*ops, *[cts[j] for j in given]]))
    make = getattr(vr.fn, "tensor_vjp", None)
    direct = None if make is None else make(call, ct_lin, need)
    if direct is None:
        return None
    return True, lambda ops, cts: spread(direct(ops[:n_in], ops[n_in:], [cts[j] for j in given]))


def _primal_vjp(node: Node, xs, ks, rs, cts, ct_lin, need) -> list:
    call, op = node.call, node.call.op
    vr, jr = op.vjp_rule, op.jvp_rule
    if uses_residuals(call):
        return apply(node.derived("vjp", None, ct_lin, need), [*xs, *ks, *rs, *cts])
    if vr is not None and not vr.traced:
        return apply(node.derived("vjp", None, ct_lin, need), [*xs, *ks, *cts])
    avals = [a for a, k in zip(call.in_avals, need) if k]
    if vr is not None:
        key = ("traced vjp", ct_lin, need)
        run = node.plans.get(key)
        if run is None:  # made once per pattern of zeros
            run = node.plans[key] = _vjp.vjp(call, vr.fn, ct_lin, need, TXP, (), vr.symbolic_zeros)
        return _checked(node, "vjp", "vjp rule", run, [*xs, *ks, *cts], avals)
    if jr is not None and jr.traced:  # the vjp is the transpose of the traced jvp
        run = _jvp.jvp(call, jr.fn, need, TXP, (), jr.symbolic_zeros)
        it = iter(cts)
        full = [next(it) if p else _zeros(a) for p, a, f in
                zip(ct_lin, call.out_avals, call.float_out) if f]
        return _transpose_of(lambda *ts: run(*xs, *ks, *ts), avals, full)
    if op.traced:  # no derivative rule: torch's vjp of the function
        g, primals = _function_of(node, xs, ks, need)
        it = iter(cts)
        full = [next(it) if p else _zeros(a) for p, a, f in
                zip(ct_lin, call.out_avals, call.float_out) if f]
        return _vjp_of(g, primals, full)
    raise MissingRuleError(missing_rule_message("vjp", op))


def _transpose(node: Node, xs, ks, cts, ct_lin, need) -> list:
    """A linear op's x̄ = Aᵀ·ȳ."""
    call, op = node.call, node.call.op
    tr = op.transpose_rule
    avals = [a for a, k in zip(call.in_avals, need) if k]
    if tr is not None and not tr.traced:
        return apply(node.derived("transpose", None, ct_lin, need), [*ks, *cts])
    if tr is not None:
        run = _transposes.transpose(call, tr.fn, ct_lin, need, TXP, (), tr.symbolic_zeros,
                               tr.input_shapes)
        return _checked(node, "transpose", "transpose rule", run, [*ks, *cts], avals)
    if op.traced:  # torch transposes the traced function itself
        f = _primal.primal(call, op.fn, TXP)
        idx = [i for i, k in enumerate(need) if k]

        def g(*v):
            full = list(xs)
            for i, x in zip(idx, v):
                full[i] = x
            return [o for o, fl in zip(f(*full, *ks), call.float_out) if fl]
        it = iter(cts)
        full = [next(it) if p else _zeros(a) for p, a, f in
                zip(ct_lin, call.out_avals, call.float_out) if f]
        return _transpose_of(g, avals, full)
    raise MissingRuleError(missing_rule_message("transpose", op))


def _t_jvp(node: Node, nonlin, cts, und, present) -> list:
    """f_jvp in ẋ: ȳ ↦ f_vjp(x, ȳ) for the wanted ẋ."""
    call = node.call
    positions = [p for p, b in enumerate(node.lin) if b]
    wanted = {p for p, u in zip(positions, und) if u}
    need_x = tuple(p in wanted for p in range(len(node.lin)))
    it = iter(present)
    ct_lin = tuple(next(it) if f else False for f in call.float_out)
    return apply(node.derived("vjp", None, ct_lin, need_x), [*nonlin, *cts])


def _t_vjp(node: Node, nonlin, cts, und, present) -> list:
    """f_vjp in ȳ: x̄ ↦ f_jvp(x, x̄) for the wanted ȳ."""
    call = node.call
    positions = [p for p, b in enumerate(node.lin) if b]
    got = [i for i, k in enumerate(node.need) if k]
    given = {i for i, p in zip(got, present) if p}
    ct_lin = tuple(i in given for i in range(call.n_in))
    float_pos = [j for j, f in enumerate(call.float_out) if f]
    wanted = [float_pos.index(p) for p, u in zip(positions, und) if u]
    outs = apply(node.derived("jvp", None, ct_lin, None), [*nonlin, *cts])
    return [outs[k] for k in wanted]


def _t_transpose(node: Node, nonlin, cts, und, present) -> list:
    """f_transpose in ȳ: x̄ ↦ f(x̄) at the wanted ȳ."""
    call = node.call
    positions = [p for p, b in enumerate(node.lin) if b]
    wanted = [p for p, u in zip(positions, und) if u]
    got = [i for i, k in enumerate(node.need) if k]
    given = {i for i, p in zip(got, present) if p}
    it = iter(cts)
    xs = [next(it) if i in given else _zeros(a) for i, a in enumerate(call.in_avals)]
    outs = apply(node.derived("primal"), [*xs, *nonlin])
    return [outs[p] for p in wanted]


_LINEAR_TRANSPOSES = {"jvp": _t_jvp, "vjp": _t_vjp, "transpose": _t_transpose}


# ---------------------------------------------------------------- forward mode

def forward(node: Node, ops: list, outs: list, ts: list) -> list:
    """ẏ = ∂f(x)·ẋ for every output of the node (None for integer outputs)."""
    if node.batch is not None:
        return _batched_tangents(node, ops, outs, ts)
    call, role, op = node.call, node.role, node.call.op
    lay = node.layout(len(ops))
    for k, i in enumerate(lay.ks):
        if ts[i] is not None:
            raise _keyword_error(call, k, "a tangent flows")
    res = [None] * node.n_out
    if role in ("primal", "fwd"):
        n = call.n_in
        present = tuple(ts[i] is not None and call.float_in[i] for i in range(n))
        if not any(present):
            return [None if not f else torch.zeros_like(o)
                    for o, f in zip(outs, node.float_out)]
        xs, ks = ops[:n], ops[n:]
        pts = [t for t, p in zip(ts, present) if p]
        if op.linear:
            it = iter(pts)
            full = [next(it) if p else _zeros(a) for p, a in zip(present, call.in_avals)]
            tan = apply(node.derived("primal"), [*full, *ks])
        else:
            tan = _primal_jvp(node, xs, ks, outs[len(call.out_avals):], pts, present)
        it = iter(tan)
        for j, f in enumerate(call.float_out):
            if f:
                res[j] = next(it)
        return res
    if any(ts[i] is not None for i in lay.nonlin):
        raise _higher_order_error(node)
    sel = [i for i in lay.lin if ts[i] is not None]
    if not sel:
        return [torch.zeros_like(o) for o in outs]
    positions = [p for p, b in enumerate(node.lin) if b]
    chosen = {positions[i - lay.lin.start] for i in sel}
    new_lin = tuple(p in chosen for p in range(len(node.lin)))
    nonlin = [ops[i] for i in lay.nonlin]
    return apply(node.derived(role, None, new_lin, node.need), [*nonlin, *[ts[i] for i in sel]])


def _primal_jvp(node: Node, xs, ks, rs, ts, present) -> list:
    call, op = node.call, node.call.op
    jr, vr = op.jvp_rule, op.vjp_rule
    avals = [a for a, f in zip(call.out_avals, call.float_out) if f]
    if jr is not None and not jr.traced:
        return apply(node.derived("jvp", None, present, None), [*xs, *ks, *rs, *ts])
    if jr is not None:
        key = ("traced jvp", present)
        run = node.plans.get(key)
        if run is None:  # made once per pattern of zeros
            run = node.plans[key] = _jvp.jvp(call, jr.fn, present, TXP, (), jr.symbolic_zeros)
        return _checked(node, "jvp", "jvp rule", run, [*xs, *ks, *rs, *ts], avals)
    if vr is not None and vr.traced and not uses_residuals(call):
        run = _vjp.vjp(call, vr.fn, call.float_out, present, TXP, (), vr.symbolic_zeros)
        return _transpose_of(lambda *cts: run(*xs, *ks, *cts), avals, ts)
    if op.traced:  # no derivative rule: torch's jvp of the function
        g, primals = _function_of(node, xs, ks, present)
        return _jvp_of(g, primals, ts)
    raise MissingRuleError(missing_rule_message("jvp", op))


# -------------------------------------------------------------------- batching

def _squeezed(ops, mask):
    return [o if m else o[0] for o, m in zip(ops, mask)]


def _batched_cotangents(node: Node, ops, outs, cts, needs) -> list:
    """vmap of the unbatched node's cotangents; unbatched operands' ones summed."""
    mask = node.batch.mask
    unb = node.derived(node.role, None, node.lin, node.need)
    wanted = [i for i, k in enumerate(needs) if k]
    given = [j for j, c in enumerate(cts) if c is not None]
    n_ops, n_outs = len(ops), len(outs)

    def f(*a):
        o, s, c = a[:n_ops], a[n_ops:n_ops + n_outs], a[n_ops + n_outs:]
        full = [None] * len(cts)
        for j, v in zip(given, c):
            full[j] = v
        r = cotangents(unb, list(o), list(s), full, needs)
        return tuple(torch.zeros_like(o[i]) if r[i] is None else r[i] for i in wanted)

    in_dims = tuple(0 if m else None for m in mask) + (0,) * (n_outs + len(given))
    got = torch.vmap(f, in_dims=in_dims, randomness="same")(
        *_squeezed(ops, mask), *outs, *[cts[j] for j in given])
    res = [None] * n_ops
    for i, c in zip(wanted, got):
        res[i] = c if mask[i] else c.sum(0, keepdim=True)
    return res


def _batched_tangents(node: Node, ops, outs, ts) -> list:
    mask = node.batch.mask
    unb = node.derived(node.role, None, node.lin, node.need)
    given = [i for i, t in enumerate(ts) if t is not None]
    n_ops, n_outs = len(ops), len(outs)
    floats = [j for j, f in enumerate(node.float_out) if f]

    def f(*a):
        o, s, t = a[:n_ops], a[n_ops:n_ops + n_outs], a[n_ops + n_outs:]
        full = [None] * n_ops
        for i, v in zip(given, t):
            full[i] = v
        r = forward(unb, list(o), list(s), full)
        return tuple(torch.zeros_like(s[j]) if r[j] is None else r[j] for j in floats)

    tmask = [mask[i] for i in given]
    in_dims = tuple(0 if m else None for m in mask) + (0,) * n_outs + \
        tuple(0 if m else None for m in tmask)
    got = torch.vmap(f, in_dims=in_dims, randomness="same")(
        *_squeezed(ops, mask), *outs, *_squeezed([ts[i] for i in given], tmask))
    res = [None] * node.n_out
    for j, t in zip(floats, got):
        res[j] = t
    return res


def _merge(x, dim, before: bool, size: int, old: int | None):
    """``_batching._merge`` for torch: one leading axis of size·old, or 1."""
    if old is None:
        return (x.movedim(dim, 0), True) if dim is not None else (x.unsqueeze(0), False)
    if dim is None:
        if not before:
            return x, False
        x = x.expand(size, *x.shape)
    else:
        x = x.movedim(dim, 0)
        if not before:
            x = x.expand(size, old, *x.shape[2:])
    return x.reshape(size * old, *x.shape[2:]), True


def batch(node: Node, size: int, in_dims, ops: list):
    """``_Fn.vmap``: the batched node on the merged operands; outputs batched at 0,
    but those the vmap rule leaves unbatched (out_batched), which leave unbatched."""
    old = None if node.batch is None else node.batch.size
    before = (False,) * len(ops) if node.batch is None else node.batch.mask
    merged = [_merge(o, d, b, size, old) for o, d, b in zip(ops, in_dims, before)]
    new = node.derived(node.role, Batch(size if old is None else size * old,
                                        tuple(m for _, m in merged)), node.lin, node.need)
    outs = apply(new, [o for o, _ in merged])
    if old is not None:
        outs = [o.reshape(size, old, *o.shape[1:]) for o in outs]
    flags = new.out_batched()
    if flags is None:
        return tuple(outs), (0,) * len(outs)
    return (tuple(o if f else o[0] for o, f in zip(outs, flags)),
            tuple(0 if f else None for f in flags))


def legacy_batch(node: Node, ops: list) -> list:
    """The node on BatchedTensors of torch's older vmap (``torch._vmap_internals``, which
    gradcheck's ``check_batched_grad`` and ``check_batched_forward_grad`` use): ``batch``
    on the physical tensors of the innermost level that batches an operand, as
    ``_Fn.vmap`` does under torch.vmap, so that host code never sees a BatchedTensor."""
    top = _torch.vmapmode_increment() - 1  # the current nesting
    _torch.vmapmode_decrement()
    for level in range(top, 0, -1):
        # remove_batch_dim moves a batched operand's axis to 0, and expands
        # another to the batch size it is given: 0 tells them apart
        phys = [_torch.remove_batch_dim(t, level, 0, 0) if _torch.is_legacy_batched(t)
                else t.unsqueeze(0)[:0] for t in ops]
        in_dims = [0 if p.shape[0] else None for p in phys]
        if any(d is not None for d in in_dims):
            break
    else:
        raise RuntimeError(f"anybind op '{node.call.op.name}': an operand of its {node.name} "
                           f"is batched by torch._vmap_internals at no level that is active")
    size = next(p.shape[0] for p, d in zip(phys, in_dims) if d is not None)
    outs, out_dims = batch(node, size, in_dims,
                           [p if d is not None else t for p, d, t in zip(phys, in_dims, ops)])
    return [o if d is None else _torch.add_batch_dim(o, d, level)
            for o, d in zip(outs, out_dims)]


# --------------------------------------------------------- autograd.Function

class _Fn(torch.autograd.Function):
    """Every node under autograd and torch.func; the maths is in ``_ad``."""

    @classmethod
    def apply(cls, *args):
        # torch's apply binds the arguments with inspect.signature on every call (about
        # a third of a small call); without functorch transforms nothing needs that
        if _torch.transforms_active():
            return super().apply(*args)
        for a in args:
            if isinstance(a, torch.Tensor) and _is_wrapped(a):  # a dead torch.func wrapper
                return super().apply(*args)
        return _torch.function_apply(cls, *args)

    @staticmethod
    def forward(node, *ops):
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
            return tuple(forward(node, list(ops), list(outs), list(tangents)))

    @staticmethod
    def vmap(info, in_dims, node, *ops):
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
