"""``ab.check(op, ..., torch=True)``: the same checks, run through ``op.torch``.

Each check compares the torch side with the JAX side on the same inputs,
tangents and cotangents, after the JAX checks have verified the rules
themselves (against finite differences and the transpose identity):

==================  ====================================================================
check               compares
==================  ====================================================================
torch eager         op.torch(x) with the JAX op's outputs
torch jvp           torch.func.jvp with jax.jvp, per argument group
torch vjp           torch.func.vjp with jax.vjp: x̄ = conj(Jᵀ·conj(ȳ)) (torch's convention)
torch vmap          torch.vmap of op.torch with a loop over the batch
torch 2nd order     torch.func's Hessian-vector product with JAX's (traced rules, real x)
==================  ====================================================================
"""
from __future__ import annotations

import jax
import numpy as np
import torch

from . import _checks


def _t(x) -> torch.Tensor:
    return torch.from_numpy(np.array(x))


def _np(t) -> np.ndarray:
    return t.detach().resolve_conj().resolve_neg().numpy()


def _conj(t):
    return t.conj() if t.is_complex() else t


def _torch_f(ctx, idx):
    """The float outputs of op.torch as a function of the positional leaves ``idx``."""
    ks = [_t(k) for k in ctx.ks]
    xs = [_t(x) for x in ctx.xs]

    def f(*vs):
        full = list(xs)
        for i, v in zip(idx, vs):
            full[i] = v
        out = ctx.op.torch(*ctx.xtree.unflatten(full), **ctx.ktree.unflatten(ks), **ctx.static)
        leaves = jax.tree_util.tree_leaves(out)
        return tuple(leaves[j] for j in ctx.fo)
    return f


def eager(ctx) -> None:
    ctx.current = ("torch eager", "outputs")
    got = ctx.op.torch(*ctx.xtree.unflatten([_t(x) for x in ctx.xs]),
                       **ctx.ktree.unflatten([_t(k) for k in ctx.ks]), **ctx.static)
    ctx.compare("torch eager", "op.torch vs op", [_np(g) for g in jax.tree_util.tree_leaves(got)],
                ctx.eager_out, ctx.out_names,
                hint="op.torch computes something other than the JAX op on the same inputs.")


def jvp(ctx) -> None:
    if _checks._no_derivatives(ctx, "torch jvp"):
        return
    for label, idx, _ in ctx.groups():
        if label not in getattr(ctx, "jvp_cache", {}):
            continue
        ctx.current = ("torch jvp", label)
        ts, jt = ctx.jvp_cache[label]
        _, got = torch.func.jvp(_torch_f(ctx, idx), tuple(_t(ctx.xs[i]) for i in idx),
                                tuple(_t(t) for t in ts))
        ctx.compare("torch jvp", label, [_np(g) for g in got], jt,
                    [ctx.out_names[j] for j in ctx.fo],
                    hint="torch.func.jvp of op.torch differs from jax.jvp of the op: a traced "
                         "rule behaves differently on torch tensors.")


def vjp(ctx) -> None:
    if _checks._no_derivatives(ctx, "torch vjp"):
        return
    ctx.current = ("torch vjp", "all arguments")
    xs = [ctx.xs[i] for i in ctx.fx]
    ybar = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    want = jax.vjp(ctx.f_of(ctx.fx), *xs)[1](ybar)
    _, pullback = torch.func.vjp(_torch_f(ctx, ctx.fx), *[_t(x) for x in xs])
    got = pullback(tuple(_conj(_t(y)) for y in ybar))
    ctx.compare("torch vjp", "all arguments", [_np(_conj(g)) for g in got], want,
                [ctx.x_names[i] for i in ctx.fx],
                hint="torch.func.vjp of op.torch (conjugated back) differs from jax.vjp of the "
                     "op: a traced rule behaves differently on torch tensors.")


def vmap(ctx) -> None:
    ctx.current = ("torch vmap", "all batched")
    n = len(ctx.xs)
    ins = [_t(_checks._perturbed(ctx, x)) for x in [*ctx.xs, *ctx.ks]]

    def g(*leaves):
        out = ctx.op.torch(*ctx.xtree.unflatten(list(leaves[:n])),
                           **ctx.ktree.unflatten(list(leaves[n:])), **ctx.static)
        return tuple(jax.tree_util.tree_leaves(out))
    got = torch.vmap(g)(*ins)
    rows = [g(*[x[b] for x in ins]) for b in range(_checks._B)]
    want = [np.stack([_np(r[j]) for r in rows]) for j in range(len(got))]
    ctx.compare("torch vmap", "all batched", [_np(o) for o in got], want, ctx.out_names,
                hint="torch.vmap of op.torch differs from a loop over the batch.")


def second_order(ctx) -> None:
    if _checks._no_second_order(ctx, "torch 2nd order"):
        return
    if any(np.iscomplexobj(ctx.xs[i]) for i in ctx.fx):
        ctx.skip("torch 2nd order", "complex inputs: torch.func.grad needs real ones")
        return
    ctx.current = ("torch 2nd order", "all arguments")
    f, xs, n = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx], len(ctx.fx)
    ybar = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    t1 = _checks._tangents(ctx, ctx.fx)
    s = lambda *x: sum(jax.numpy.real(jax.numpy.sum(y * o)) for y, o in zip(ybar, f(*x)))
    want = jax.jvp(jax.grad(s, argnums=tuple(range(n))), xs, t1)[1]
    tf = _torch_f(ctx, ctx.fx)
    ts = lambda *x: sum((_t(y) * o).real.sum() for y, o in zip(ybar, tf(*x)))
    got = torch.func.jvp(torch.func.grad(ts, argnums=tuple(range(n))),
                         tuple(_t(x) for x in xs), tuple(_t(t) for t in t1))[1]
    ctx.compare("torch 2nd order", "forward over reverse", [_np(g) for g in got], want,
                [ctx.x_names[i] for i in ctx.fx],
                hint="torch's Hessian-vector product through op.torch differs from JAX's.")


CHECKS: list = [("torch eager", eager), ("torch jvp", jvp), ("torch vjp", vjp),
                ("torch vmap", vmap), ("torch 2nd order", second_order)]
