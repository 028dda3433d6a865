"""Multilinear ops: linear in each positional argument separately, the others fixed.

For f(x₀, …, xₙ₋₁) multilinear, the form φ(z₀, …, zₙ) = ⟨zₙ, f(z₀, …, zₙ₋₁)⟩
(zₙ = ȳ, ⟨a, b⟩ = Σ a·b without conjugation) is linear in each zⱼ, and so is
each of its partial gradients Gₖ = ∂φ/∂zₖ, a map of the other n arguments:

=========================  =====================  ==================================
Gₖ                         primitive              operands
=========================  =====================  ==================================
Gₙ = f                     ``f``                  (xs, ks)
Gᵢ = (∂f/∂xᵢ)ᵀ·ȳ, i < n    ``f_transpose``,       (xs without xᵢ, ks, ȳ); ``need``
                           the user's rule i      marks the leaves of xᵢ
=========================  =====================  ==================================

The family is closed under differentiation, so no other rule is ever needed:

- jvp:       ∂Gₖ·ż = Σⱼ≠ₖ Gₖ(…, żⱼ, …)                      (linear in each zⱼ)
- transpose: in zⱼ, with cotangent w of zₖ: Gⱼ(… zₖ := w …)  (both sides are φ(…))

so f's jvp is Σᵢ f(…, ẋᵢ, …), its vjp is (G₀(x, ȳ), …, Gₙ₋₁(x, ȳ)), and every
higher order follows from host rules alone. Transposing in two arguments at
once is not linear, and is an error. Every positional leaf and every output
leaf must be floating or complex (checked with the output spec).

The user's transpose rules run in ``roles._transpose``.

Zeros: an argument whose tangent leaves are all ``Zero`` adds no term;
partly zero arguments and cotangents are filled with zeros here.
"""
from __future__ import annotations

import jax
import numpy as np

from . import _jax
from ._batching import sum_unbatched, vmapped
from ._spec import Call

_KW = -1  # the owner of keyword operands


def _sizes(call: Call) -> list:
    """Leaves per group: each positional argument, then the output cotangent ȳ."""
    return [t.num_leaves for t in call.arg_trees] + [len(call.out_avals)]


def owners(call: Call, k: int) -> list:
    """For each operand of Gₖ: the group j it belongs to, or _KW for keyword operands."""
    n, sizes = call.n_args, _sizes(call)
    out = [j for j in range(n) if j != k for _ in range(sizes[j])]
    out += [_KW] * len(call.kw_avals)
    return out + ([n] * sizes[n] if k != n else [])


def need_of(call: Call, j: int) -> tuple:
    """``need`` of the transpose in argument j: its positional leaves."""
    leaves = call.leaves_of((j,))
    return tuple(i in leaves for i in range(call.n_in))


def index_of(role: str, call: Call, need) -> int:
    """k of the primitive: n for f, the argument whose leaves ``need`` marks for f_transpose."""
    if role == "primal":
        return call.n_args
    first = need.index(True)
    starts = np.cumsum([t.num_leaves for t in call.arg_trees])
    return int(np.searchsorted(starts, first, side="right"))


def bind(call: Call, k: int, z: list, ks: list, batch=None) -> list:
    """Gₖ at the groups ``z`` (entry k ignored) and keyword operands ``ks``."""
    fam, n = call.op._family, call.n_args
    ops = [leaf for j in range(n) if j != k for leaf in z[j]] + list(ks)
    if k == n:
        return fam["primal"].bind(*ops, call=call, batch=batch)
    return fam["transpose"].bind(*ops, *z[n], call=call, batch=batch,
                                 lin=(True,) * len(call.out_avals), need=need_of(call, k))


def split(owner: list, ops) -> tuple:
    """Operands into groups (a dict j → leaves) and keyword operands."""
    z: dict = {}
    ks: list = []
    for o, x in zip(owner, ops):
        (ks if o == _KW else z.setdefault(o, [])).append(x)
    return z, ks


def _groups(z: dict, n: int) -> list:
    return [z.get(j) for j in range(n + 1)]


def _name(call: Call, k: int) -> str:
    return "function" if k == call.n_args else f"transpose rule for argument {k}"


def _keyword_error(call: Call, k: int, action: str) -> TypeError:
    return TypeError(
        f"anybind op '{call.op.name}': a keyword argument is a non-differentiable operand, "
        f"but {action} through the {_name(call, k)}. Pass it as a positional argument to "
        f"differentiate with respect to it, or wrap it in jax.lax.stop_gradient")


# --------------------------------------------------------------------------- JVP

def jvp_rule(role, primals, tangents, *, call: Call, batch, lin=None, need=None):
    """(z, ż) ↦ (Gₖ(z), Σⱼ Gₖ(…, żⱼ, …)) over the groups j with a nonzero tangent."""
    k, n = index_of(role, call, need), call.n_args
    params = dict(call=call, batch=batch)
    if role != "primal":
        params.update(lin=lin, need=need)
    outs = call.op._family[role].bind(*primals, **params)
    owner = owners(call, k)
    nonzero = [type(t) is not _jax.Zero for t in tangents]
    if any(nz and o == _KW for nz, o in zip(nonzero, owner)):
        raise _keyword_error(call, k, "a tangent flows into it")
    sel = sorted({o for nz, o in zip(nonzero, owner) if nz})
    if not sel:
        return outs, [_jax.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    pos = [i for j in sel for i, o in enumerate(owner) if o == j]
    ts = [_jax.instantiate_zeros(tangents[i]) for i in pos]

    def core(*ops):
        z, ks = split(owner, ops[:len(owner)])
        it, total = iter(ops[len(owner):]), None
        for j in sel:
            zz = _groups(z, n)
            zz[j] = [next(it) for _ in z[j]]
            term = bind(call, k, zz, ks)
            total = term if total is None else [a + b for a, b in zip(total, term)]
        return total

    if batch is not None:
        core = vmapped(core, batch.mask + tuple(batch.mask[i] for i in pos), batch.size,
                       batch.axes)
    return outs, list(core(*primals, *ts))


# --------------------------------------------------------------------- transpose

def transpose_rule(role, cts, *operands, call: Call, batch, lin=None, need=None):
    """w ↦ Gⱼ(… zₖ := w …) for the one group j whose operands are undefined."""
    k, n = index_of(role, call, need), call.n_args
    owner = owners(call, k)
    undefined = [isinstance(o, _jax.UndefinedPrimal) for o in operands]
    groups = sorted({o for u, o in zip(undefined, owner) if u})
    if _KW in groups:
        raise _keyword_error(call, k, "a transpose was asked")
    if len(groups) > 1:
        names = ", ".join("the cotangent ȳ" if j == n else f"argument {j}" for j in groups)
        raise TypeError(
            f"anybind op '{call.op.name}' is multilinear: its {_name(call, k)} is linear in "
            f"each argument separately, not in several jointly, but a transpose was asked "
            f"in {names} at once. Transpose in one argument at a time (jax.linear_transpose "
            f"of a function of that argument alone)")
    res = [None] * len(operands)
    if not groups or all(type(c) is _jax.Zero for c in cts):
        return res
    (j,) = groups
    w = [_jax.instantiate_zeros(c) for c in cts]
    keep = [i for i, o in enumerate(owner) if o != j]
    own = [i for i, o in enumerate(owner) if o == j]

    def core(*ops):
        z, ks = split([owner[i] for i in keep], ops[:len(keep)])
        z = _groups(z, n)
        z[k] = list(ops[len(keep):])
        return bind(call, j, z, ks)

    if batch is None:
        out = core(*[operands[i] for i in keep], *w)
    else:
        out = vmapped(core, tuple(batch.mask[i] for i in keep) + (True,) * len(w),
                      batch.size, batch.axes)(*[operands[i] for i in keep], *w)
        out = [sum_unbatched(c, batch.mask[i]) for c, i in zip(out, own)]
    for i, c in zip(own, out):
        if undefined[i]:
            res[i] = c
    return res
