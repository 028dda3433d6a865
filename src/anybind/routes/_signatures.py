"""Which calls a compiled function takes: what the shim checks before it runs one.

A program names the function it calls by a key, and a deserialised program can
name any key with any operands. So the shim (``_shim.c``) runs a function only
on calls its binding allows: those lowered in this process (``words`` of each
call, added as it is lowered), and, for a program linked by the op's stable
name (``jax.export``), those that ``check`` finds the op itself gives for the
operands the program passes.

=================  ===============================================================
piece              what it does
=================  ===============================================================
``operands``       ``(ins, outs)`` avals of a role of a ``Call`` in anybind's C
                   calling convention (the table in ``_compiled``)
``words``          one call (batch rows, operands, outputs) as the shim stores it
``tree_text``      how a call's operands group into the op's arguments, as a short
                   text the program carries (built-in containers only)
``check``          a call not seen before, against the op: rebuild its ``Call``
                   from the operands and that text with the op's shape rule, and
                   compare every operand and output; ``None`` if it is the op's
=================  ===============================================================
"""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from jax import tree_util

from ..core._jax import ShapedArray

_LEAF = object()
_MAX_TREE = 1 << 16  # characters of tree text a program may carry
_BATCHED_KINDS = ("vmap",)  # a compiled vmap rule: every call batched, vectorized


def operands(call, kind: str, lead_in: tuple = (), lead_out: tuple = ()) -> tuple[list, list]:
    """``(ins, outs)`` of the compiled ``kind`` ("function", "jvp", "bwd", ...) for ``call``.

    ``lead_in``/``lead_out``: a batch axis before every operand and output.
    Tangents and cotangents exist for floating leaves only.
    """
    base = kind.removesuffix(".vmap")
    xs, ks = list(call.in_avals), list(call.kw_avals)
    fl_in = [a for a, f in zip(call.in_avals, call.float_in) if f]
    fl_out = [a for a, f in zip(call.out_avals, call.float_out) if f]
    ins, outs = {
        "function": (xs + ks, list(call.out_avals)),
        "vmap": (xs + ks, list(call.out_avals)),
        "fwd": (xs + ks, list(call.out_avals) + list(call.res_avals)),
        "jvp": (xs + ks + fl_in, fl_out),
        "vjp": (xs + ks + fl_out, fl_in),
        "bwd": (ks + list(call.res_avals) + fl_out, fl_in),
        "transpose": (ks + fl_out, fl_in),
    }[base]
    return ([ShapedArray(lead_in + a.shape, a.dtype) for a in ins],
            [ShapedArray(lead_out + a.shape, a.dtype) for a in outs])


def words(rows: int, ins: Sequence, outs: Sequence, codes: dict) -> list[int] | None:
    """Per operand its dtype code, rank and dims; None where a dim is symbolic."""
    out: list[int] = []
    for a in (*ins, *outs):
        if not all(isinstance(d, (int, np.integer)) for d in a.shape):
            return None
        out += [codes[np.dtype(a.dtype).name], len(a.shape), *map(int, a.shape)]
    return out


# -------------------------------------------------------------------- structure

def _enc(x):
    if x is _LEAF:
        return 0
    if x is None:
        return None
    if type(x) is tuple:
        return {"t": [_enc(v) for v in x]}
    if type(x) is list:
        return {"l": [_enc(v) for v in x]}
    if type(x) is dict and all(type(k) is str for k in x):
        return {"d": {k: _enc(v) for k, v in x.items()}}
    raise ValueError("not a built-in container")


def _dec(x):
    if x == 0 and type(x) is int:
        return 0
    if x is None:
        return None
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "t" and type(v) is list:
            return tuple(_dec(u) for u in v)
        if tag == "l" and type(v) is list:
            return [_dec(u) for u in v]
        if tag == "d" and type(v) is dict:
            return {k: _dec(u) for k, u in v.items()}
    raise ValueError(f"not a structure: {str(x)[:40]}")


def tree_text(args_tree, kw_tree) -> str | None:
    """The call's argument structure as text, or None where it has other pytree nodes."""
    try:
        trees = [_enc(t.unflatten([_LEAF] * t.num_leaves)) for t in (args_tree, kw_tree)]
    except ValueError:
        return None
    return json.dumps(trees, separators=(",", ":"))


def _trees(text: str):
    if not text or len(text) > _MAX_TREE:
        raise ValueError("the program does not say how its operands group into the op's "
                         "arguments (pytrees of other than tuples, lists and dicts)")
    args, kw = json.loads(text)
    args, kw = _dec(args), _dec(kw)
    if type(args) is not tuple or type(kw) is not dict:
        raise ValueError("its argument structure is not (positional tuple, keyword dict)")
    return tree_util.tree_structure(args), tree_util.tree_structure(kw)


# ---------------------------------------------------------------------------- check

def _shown(avals) -> str:
    return ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals) or "nothing"


def check(op, kind: str, text: str, rows: int, ins: list, outs: list) -> str | None:
    """``None`` if ``op``'s own ``kind`` takes these operands and outputs; else why not.

    ``ins``/``outs``: the program's avals, with the leading axis of ``rows`` if
    it calls by rows. A vectorized batch (a leading axis on everything, of 1
    where unbatched; the last axis in order ``"F"``) is tried where the op
    batches so.
    """
    try:
        args_tree, kw_tree = _trees(text)
    except (ValueError, TypeError, RecursionError) as e:
        return f"{e}" if isinstance(e, ValueError) else "its argument structure is malformed"
    # order="F": a whole batch comes with its axis last (Fortran's slowest)
    last = getattr(op, "order", None) == "F"
    batched = (kind in _BATCHED_KINDS or kind.endswith(".vmap")
               or op.vmap in ("expand_dims", "broadcast_all"))
    tries = []
    if rows:
        tries.append(rows)
    else:
        if kind not in _BATCHED_KINDS and not kind.endswith(".vmap"):
            tries.append(0)
        if batched and outs and outs[0].shape:
            tries.append(outs[0].shape[-1 if last else 0])
    why = "it is not a call the op makes"
    for size in tries:
        why = _check_one(op, kind, args_tree, kw_tree, size, ins, outs,
                         last=last and size != rows)
        if why is None:
            return None
    return why


def _strip(avals, size: int, ones: bool, last: bool = False):
    """The avals without their leading (``last``: trailing) batch axis of ``size`` (or 1,
    with ``ones``)."""
    out = []
    at = -1 if last else 0
    for a in avals:
        if not a.shape or not (a.shape[at] == size or (ones and a.shape[at] == 1)):
            raise ValueError(f"an operand of shape {list(a.shape)} has no batch axis of "
                             f"{size}")
        out.append(ShapedArray(a.shape[:-1] if last else a.shape[1:], a.dtype))
    return out


def _check_one(op, kind, args_tree, kw_tree, size: int, ins, outs,
               last: bool = False) -> str | None:
    lead = () if not size else (size,)
    try:
        if size:
            ins, outs = _strip(ins, size, True, last), _strip(outs, size, False, last)
        n, m = args_tree.num_leaves, kw_tree.num_leaves
        base = kind.removesuffix(".vmap")
        if base in ("bwd", "transpose"):  # the positional avals are those of the outputs
            xs, ks = outs, ins[:m]
            if len(xs) != n:
                return (f"its {n} positional leaves are not all floating, so their shapes "
                        f"cannot be read from the outputs of its {base} rule")
        else:
            xs, ks = ins[:n], ins[n:n + m]
        if len(xs) != n or len(ks) != m:
            return f"it takes {n} positional and {m} keyword leaves"
        call = op.call_for(args_tree, kw_tree, (), tuple(xs), tuple(ks), ())
        want_in, want_out = operands(call, kind)
    except Exception as e:  # noqa: BLE001  (the op's own shape rule may raise anything)
        return f"the op's shape rule refuses them ({type(e).__name__}: {e})"
    got = [(tuple(a.shape), np.dtype(a.dtype)) for a in (*ins, *outs)]
    want = [(tuple(a.shape), np.dtype(a.dtype)) for a in (*want_in, *want_out)]
    if got != want or len(ins) != len(want_in):
        return (f"for these inputs the op's shape rule gives {_shown(want_in)} -> "
                f"{_shown(want_out)}{' per batch row' if lead else ''}")
    return None
