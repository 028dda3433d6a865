"""The shard rule of an op bound with ``shard=RULE``, and how it types the op's outputs.

The rule is part of what an op is: it says which factors of the operands and
outputs each device may hold a slice of, and it types the outputs under
``shard_map`` and Explicit mesh axes. Running per shard is the ``shard``
route's (``routes._shard``). Every primitive of the family (and its batched
form) shards by the same rule, mapped to its operands:

==================  =========================================================
piece               what it does
==================  =========================================================
``ShardRule``       the declared rule: factor names per operand and output,
                    the ``replicated`` ones; parsed once by ``bind``
``factors_of``      the rule fitted to one ``Call`` (ranks, sizes, ``...``
                    expanded): a clear TypeError at the first call if it
                    does not fit; residuals take the factors of a leaf of
                    the same shape
``role_factors``    the rule of a derived primitive: its operands and
                    outputs (``roles.Layout``), a leading batch factor
                    under ``vmap``
``typed``           abstract evaluation: outputs vary over the union of the
                    operands' manual axes (``shard_map``'s vma), and under
                    Explicit mesh axes carry the sharding the rule gives
``vary``            inside ``shard_map``: operands cast (``pvary``) to that
                    union, so transposes sum cotangents of invariant operands
``vary_like``       a tangent from traced code cast to its output's type
==================  =========================================================

Meaning of a rule ``"b n, n -> b n"`` with ``replicated=("n",)``: a factor
that appears in an output and an operand, and is not replicated, may be split
over mesh axes; each device then runs f on its slice, f(x[s], w) = f(x, w)[s].
Other factors (replicated ones, contractions that appear only in operands,
factors absent from every operand) stay whole. An output without a split
factor is the same on every device (f's declared behaviour). For the
cotangent maps (vjp, transpose), an operand broadcast over a split factor
gets the sum of its per-shard cotangents: x̄ = Σ_s ∂f(x[s])ᵀ·ȳ[s] (a psum).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _jax
from ._spec import Batch, Call, fmt_aval

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class ShardRule:
    """A parsed ``shard=`` rule: factor names per operand and output.

    ``ins``/``outs`` hold one tuple of names per value; ``"..."`` may lead a
    value. ``elementwise`` stands for one shape everywhere, every axis split.
    """
    text: str
    ins: tuple | None  # None for "elementwise"
    outs: tuple | None
    replicated: frozenset
    make: Callable | None = None  # a rule computed per call from the inputs' shapes

    @property
    def elementwise(self) -> bool:
        return self.ins is None


def parse_rule(op_name: str, shard, replicated) -> ShardRule | None:
    """The ``shard=`` and ``replicated=`` options of ``bind``, checked for syntax."""
    if isinstance(replicated, str):
        replicated = (replicated,)
    replicated = tuple(replicated or ())
    if shard is None:
        if replicated:
            raise TypeError(f"anybind op '{op_name}': replicated={replicated!r} needs a shard= "
                            f"rule")
        return None
    if callable(shard):
        return ShardRule(getattr(shard, "__name__", repr(shard)), None, None,
                         frozenset(replicated), shard)
    if not isinstance(shard, str):
        raise TypeError(f"anybind op '{op_name}': shard must be a rule string such as "
                        f"'b n, n -> b n' or 'elementwise', or a callable returning one, got "
                        f"{type(shard).__name__}")
    if shard.strip() == "elementwise":
        if replicated:
            raise TypeError(f"anybind op '{op_name}': shard='elementwise' splits every axis; "
                            f"replicated={replicated!r} names factors it does not have")
        return ShardRule("elementwise", None, None, frozenset())

    def bad(why: str) -> TypeError:
        return TypeError(f"anybind op '{op_name}': shard rule {shard!r}: {why}; expected "
                         f"einsum-like notation such as 'b n, n -> b n' or '... n -> ... n'")

    if shard.count("->") != 1:
        raise bad("it needs exactly one '->'")
    lhs, rhs = shard.split("->")

    def values(side: str) -> tuple:
        if not side.strip():
            return ()
        out = []
        for v in side.split(","):
            names = tuple(v.split())
            for k, name in enumerate(names):
                if name == "...":
                    if k:
                        raise bad("'...' may only lead an operand or output")
                elif not _NAME.match(name):
                    raise bad(f"factor {name!r} is not a name (compound factors are not "
                              f"supported)")
            if len(set(names)) != len(names):
                raise bad(f"a factor appears twice in {v.strip()!r}")
            out.append(names)
        return tuple(out)

    ins, outs = values(lhs), values(rhs)
    known = {f for v in ins + outs for f in v if f != "..."}
    unknown = [r for r in replicated if r not in known]
    if unknown:
        raise TypeError(f"anybind op '{op_name}': replicated={replicated!r} names factor(s) "
                        f"{unknown} that the shard rule {shard!r} does not have; its factors "
                        f"are {sorted(known)}")
    return ShardRule(shard, ins, outs, frozenset(replicated))


@dataclasses.dataclass(frozen=True)
class Factors:
    """A rule fitted to one call: factor ids per operand, output and residual."""
    ins: tuple  # positional leaves, then keyword operand leaves
    outs: tuple
    res: tuple
    sizes: dict = dataclasses.field(hash=False, compare=False)
    splittable: frozenset
    n_in: int  # number of positional leaves in ``ins``
    text: str  # the rule
    labels: dict = dataclasses.field(hash=False, compare=False)  # id → how the rule names it


def _operand_name(call: Call, i: int) -> str:
    if i < call.n_in:
        return f"positional input leaf {i} ({fmt_aval(call.in_avals[i])})"
    k = i - call.n_in
    return f"{call.kw_name(k)} ({fmt_aval(call.kw_avals[k])})"


def _rule_for(call: Call) -> ShardRule:
    """The op's rule, or the one its rule callable gives for this call's inputs."""
    rule, op = call.op.shard, call.op
    if rule.make is None:
        return rule
    kwargs = call.kw_tree.unflatten([jax.ShapeDtypeStruct(a.shape, a.dtype)
                                     for a in call.kw_avals])
    kwargs.update(call.static)
    try:
        made = rule.make(*call.input_shapes, **kwargs)
    except Exception as e:
        raise TypeError(f"anybind op '{op.name}': the shard rule {rule.text} failed on inputs "
                        f"{call.input_shapes!r} with keywords {kwargs!r}: "
                        f"{type(e).__name__}: {e}") from e
    text, extra = (made, ()) if isinstance(made, str) else made
    made_rule = parse_rule(op.name, text, tuple(extra) + tuple(rule.replicated))
    if made_rule is None:
        raise TypeError(f"anybind op '{op.name}': the shard rule {rule.text} gave no rule "
                        f"for inputs {call.input_shapes!r}")
    return made_rule


def factors_of(call: Call) -> Factors:
    """The op's rule fitted to this call; a TypeError naming what does not fit."""
    op = call.op
    cache = op.state("shard factors", lambda _: {})
    got = cache.get(call)
    if got is not None:
        return got
    rule = _rule_for(call)
    avals_in = list(call.in_avals) + list(call.kw_avals)
    names_in = [_operand_name(call, i) for i in range(len(avals_in))]
    names_out = [f"{call.out_name(j)} ({fmt_aval(a)})" for j, a in enumerate(call.out_avals)]
    head = f"anybind op '{op.name}': shard rule {rule.text!r}"
    if rule.elementwise:
        shapes = {a.shape for a in avals_in + list(call.out_avals)}
        if len(shapes) > 1:
            where = [f"{n}" for n in names_in + names_out]
            raise TypeError(f"{head} needs every operand and output to have one shape, but "
                            f"they are {', '.join(where)}")
        rank = len(shapes.pop()) if shapes else 0
        ids = tuple(f"e{d}" for d in range(rank))
        ins, outs = (ids,) * len(avals_in), (ids,) * len(call.out_avals)
        user: dict = {}
    else:
        rule_ins, rule_outs = rule.ins or (), rule.outs or ()
        if len(rule_ins) != len(avals_in):
            raise TypeError(
                f"{head} has {len(rule_ins)} operand(s), but the op is called with "
                f"{call.n_in} positional array leaf/leaves and {len(call.kw_avals)} keyword "
                f"array operand(s): {', '.join(names_in) or 'none'}")
        if len(rule_outs) != len(call.out_avals):
            raise TypeError(f"{head} has {len(rule_outs)} output(s), but the op returns "
                            f"{len(call.out_avals)}: {', '.join(names_out)}")
        user = {}

        def fit(spec, aval, what):
            ell = spec[:1] == ("...",)
            named = spec[1:] if ell else spec
            if (aval.ndim < len(named)) if ell else (aval.ndim != len(named)):
                want = ("at least " if ell else "") + str(len(named))
                raise TypeError(f"{head} gives {what} the factors {' '.join(spec)!r}, which "
                                f"need rank {want}, but it has rank {aval.ndim}")
            lead = aval.ndim - len(named)
            ids = [f"e{lead - 1 - d}" for d in range(lead)]
            for name in named:
                user.setdefault(name, f"f{len(user)}")
                ids.append(user[name])
            return tuple(ids)

        ins = tuple(fit(s, a, w) for s, a, w in zip(rule_ins, avals_in, names_in))
        outs = tuple(fit(s, a, w) for s, a, w in zip(rule_outs, call.out_avals, names_out))
    label = {v: k for k, v in user.items()}
    label_of = lambda f: repr(label[f]) if f in label else (
        f"axis {f[1:]} (from the right) of '...'" if not rule.elementwise else f"axis {f[1:]}")
    sizes: dict = {}
    first: dict = {}
    for ids, aval, what in zip(ins + outs, avals_in + list(call.out_avals),
                               names_in + names_out):
        for f, n in zip(ids, aval.shape):
            if f in sizes and sizes[f] != n:
                raise TypeError(f"{head}: factor {label_of(f)} has size {sizes[f]} in "
                                f"{first[f]} but {n} in {what}")
            sizes.setdefault(f, n)
            first.setdefault(f, what)
    in_ids = {f for v in ins for f in v}
    out_ids = {f for v in outs for f in v}
    keep = {user[r] for r in rule.replicated}
    splittable = frozenset((in_ids & out_ids) - keep)
    res = []
    for r, a in enumerate(call.res_avals):
        match = next((ids for ids, b in zip(ins + outs, avals_in + list(call.out_avals))
                      if b.shape == a.shape), None)
        if match is None:
            raise TypeError(
                f"{head}: residual leaf {r} of the fwd rule ({fmt_aval(a)}) has the shape of "
                f"no operand or output, so it cannot be split like one; with shard=, declare "
                f"residuals shaped like an input or output")
        res.append(match)
    labels = {f: label_of(f) for f in sizes}
    got = Factors(ins, outs, tuple(res), sizes, splittable, call.n_in, rule.text, labels)
    cache[call] = got
    return got


def role_factors(role: str, call: Call, batch: Batch | None, lin, need) -> tuple:
    """(operand factor ids, output factor ids) of one primitive of the family.

    Operands and outputs follow ``roles.Layout`` (and ``_multilinear``'s transposes in
    one argument): tangents take their input's
    factors, cotangents of outputs their output's, cotangents of inputs their
    input's. Under vmap every value leads with the batch factor ``b``
    (splittable); operands broadcast over the batch lead with a factor of
    size 1 of their own.
    """
    fs = factors_of(call)
    xs, ks, outs = fs.ins[:fs.n_in], fs.ins[fs.n_in:], fs.outs
    if role == "primal":
        ops, res = fs.ins, outs
    elif role == "fwd":
        ops, res = fs.ins, outs + fs.res
    elif role == "jvp":
        ops = fs.ins + fs.res + tuple(x for x, m in zip(xs, lin) if m)
        res = tuple(o for o, f in zip(outs, call.float_out) if f)
    elif role == "vjp":
        ops = fs.ins + fs.res + tuple(o for o, m in zip(outs, lin) if m)
        res = tuple(x for x, m in zip(xs, need) if m)
    else:  # transpose; of a multilinear op: in one argument, the others are operands
        others = tuple(x for x, m in zip(xs, need) if not m) if call.op.multilinear else ()
        ops = others + ks + tuple(o for o, m in zip(outs, lin) if m)
        res = tuple(x for x, m in zip(xs, need) if m)
    if batch is not None:
        ops = tuple((("b",) if m else (f"u{i}",)) + o for i, (o, m) in
                    enumerate(zip(ops, batch.mask)))
        res = tuple(("b",) + r for r in res)
    return ops, res


def slicings(call: Call) -> list:
    """(label, size, axis in each operand or None, axis in each output or None) for each
    splittable factor: what ``ab.check`` slices to check the rule."""
    fs = factors_of(call)
    where = lambda f, values: [v.index(f) if f in v else None for v in values]
    return [(fs.labels[f], fs.sizes[f], where(f, fs.ins), where(f, fs.outs))
            for f in fs.sizes if f in fs.splittable]


def splittable_factors(call: Call, batch: Batch | None) -> frozenset:
    s = factors_of(call).splittable
    return s | {"b"} if batch is not None else s


# --------------------------------------------------------------- abstract eval

def _mesh_of(avals):
    for a in avals:
        s = getattr(a, "sharding", None)
        if s is not None and not s.mesh.empty:
            return s.mesh
    return _jax.get_abstract_mesh()


def typed(role: str, avals, outs: list, call: Call, batch, lin, need) -> list:
    """The outputs' types: vma the union of the operands', sharding from the rule."""
    mesh = _mesh_of(avals)
    if mesh.empty:
        return outs
    vma = frozenset().union(*(_jax.varying_axes(a) for a in avals))
    specs = [P()] * len(outs)
    explicit = {n for n, t in zip(mesh.axis_names, mesh.axis_types)
                if t == jax.sharding.AxisType.Explicit}
    if explicit and call.op.shard is not None:
        ops_f, res_f = role_factors(role, call, batch, lin, need)
        plan = plan_factors([getattr(a.sharding, "spec", P()) for a in avals], ops_f, mesh,
                     splittable_factors(call, batch), explicit, strict=call)
        specs = [P(*[plan.get(f) for f in r]) for r in res_f]
    return [_jax.typed_aval(o.shape, o.dtype, NamedSharding(mesh, s), vma)
            for o, s in zip(outs, specs)]


def mesh_axes(entry) -> tuple:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def plan_factors(specs, ops_f, mesh, splittable, allowed, strict: Call | None = None,
          sizes: dict | None = None) -> dict:
    """factor → mesh axes, read off the operands' partition specs.

    A factor takes the axes of the first operand that splits it over mesh
    axes in ``allowed`` and not yet used; factors that must stay whole, and
    splits that do not divide the factor's size, are dropped (the partitioner
    then gathers that operand). With ``strict`` (Explicit axes: the sharding
    is the type) two operands that split one factor differently are an error.
    """
    plan: dict = {}
    used: set = set()
    for k, (spec, fl) in enumerate(zip(specs, ops_f)):
        for d, f in enumerate(fl):
            axes = tuple(a for a in mesh_axes(spec[d] if d < len(spec) else None) if a in allowed)
            if not axes or f not in splittable:
                continue
            if f in plan:
                if strict is not None and plan[f] != axes:
                    raise TypeError(
                        f"anybind op '{strict.op.name}': operands split one factor of the shard "
                        f"rule {factors_of(strict).text!r} differently: {plan[f]} and {axes} (at "
                        f"operand {k}, axis {d}); reshard them alike (jax.sharding.reshard)")
                continue
            if used & set(axes):
                continue
            if sizes is not None and sizes[f] % math.prod(mesh.shape[a] for a in axes):
                continue
            plan[f] = axes
            used |= set(axes)
    return {f: a[0] if len(a) == 1 else a for f, a in plan.items()}


def vary_like(value, aval):
    """``value`` marked varying over the manual axes ``aval`` varies over and it does not.

    Inside ``shard_map`` an op's outputs vary over the union of its operands' axes
    (``typed``) while traced code can give a tangent that varies over fewer (a
    ``psum`` in a traced jvp rule); the tangent takes its output's type.
    """
    missing = _jax.varying_axes(aval) - _jax.varying_axes(jax.typeof(value))
    if not missing or not _jax.check_vma.value:
        return value
    return _jax.pvary(value, _mesh_order(missing))


def vary(args: Sequence) -> Sequence:
    """Inside ``shard_map`` with vma checks: every operand varies over the union of axes."""
    if not _jax.check_vma.value:
        return args
    vmas = [_jax.varying_axes(jax.typeof(a)) for a in args]
    union = frozenset().union(*vmas)
    if not union:
        return args
    pvary = _jax.pvary
    return [a if v == union else pvary(a, _mesh_order(union - v))  # type: ignore[misc]
            for a, v in zip(args, vmas)]


def _mesh_order(axes) -> tuple:
    mesh = _jax.get_abstract_mesh()
    return tuple(n for n in mesh.axis_names if n in axes) if not mesh.empty else tuple(sorted(axes))
