"""The individual checks of ``ab.check``, in the order they run.

Each check takes the shared ``Context`` (``check._checks``) and records rows or
raises ``RuleError`` through it. A check that needs a rule the op lacks
raises ``MissingRuleError`` from JAX's transformation and is reported as
skipped; a check that does not apply to the op (linearity of a nonlinear
op) records nothing. Earlier checks vouch for later ones: the jvp is tested
against finite differences before the vjp is tested against the jvp, so a
failing vjp check points at the vjp rule.

Notation: f maps the floating positional leaves x to the floating output
leaves; ẋ are tangents, ȳ cotangents, and ⟨a, b⟩ = Re Σ a·b.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from ..core import roles
from ..core._code import is_compiled
from ..core._sharding import slicings

_B = 3  # batch size of the vmap checks


def pair(a, b) -> float:
    """⟨a, b⟩ = Re Σ a·b: how JAX pairs cotangents with tangents (no conjugation)."""
    return float(np.real(np.sum(np.asarray(a) * np.asarray(b))))


def abs_pair(a, b) -> float:
    return float(np.sum(np.abs(np.asarray(a)) * np.abs(np.asarray(b))))


def combine(a: float, x, b: float, y) -> np.ndarray:
    """a·x + b·y in x's dtype, in NumPy: the checks' own arithmetic compiles no XLA
    programs (eager ``jax.numpy`` would compile one per operation, shape and dtype)."""
    return (a * np.asarray(x) + b * np.asarray(y)).astype(x.dtype)


def _tangents(ctx, idx, imaginary=False) -> list:
    return [ctx.tangent(ctx.xs[i], imaginary) for i in idx]


def _float_names(ctx) -> list:
    return [ctx.out_names[j] for j in ctx.fo]


def _no_derivatives(ctx, name: str) -> bool:
    if not ctx.fx or not ctx.fo:
        ctx.skip(name, "no floating-point inputs or outputs to differentiate")
        return True
    return False


def _no_second_order(ctx, name: str) -> bool:
    """Linear ops have no second-order terms; host and compiled rules give first derivatives
    only (unless bound as ops with rules of their own)."""
    op = ctx.op
    if op.linear or _no_derivatives(ctx, name):
        return True
    rules = [r for r in (op.jvp_rule, op.vjp_rule, getattr(op, "bwd_rule", None)) if r]
    multilinear = getattr(op, "multilinear", False)  # all orders from host transposes
    if not op.traced and not multilinear and not any(r.traced for r in rules):
        if any(is_compiled(r.fn) for r in rules):
            ctx.skip(name, "compiled rules give first derivatives only; a rule bound as an op "
                           "with rules of its own (op.def_vjp(vjp_op)), or a traced rule, "
                           "gives higher orders")
        else:
            ctx.skip(name, "host rules give first derivatives only; traced rules give all orders")
        return True
    return False


# ------------------------------------------------------------------- values

def spec(ctx) -> None:
    """Declared output structure, shapes and dtypes vs what the function returns."""
    op = ctx.op
    ctx.current = ("spec", "evaluating the declared output spec")
    declared = jax.eval_shape(
        lambda *xs: op(*ctx.xtree.unflatten(list(xs)), **ctx.operands, **ctx.static), *ctx.xs)
    with_path, tree = tree_util.tree_flatten_with_path(declared)
    ctx.out_avals = [leaf for _, leaf in with_path]
    ctx.out_names = [f"output{tree_util.keystr(p)}" for p, _ in with_path]
    ctx.fo = [j for j, a in enumerate(ctx.out_avals) if jnp.issubdtype(a.dtype, jnp.inexact)]
    ctx.set_tolerances()
    if op.traced and op.shape is None:
        ctx.direct = None
        ctx.ok("spec", "inferred from the traced function")
        return
    if is_compiled(op.fn):  # runs on XLA's buffers of the declared spec only
        ctx.direct = None
        ctx.ok("spec", "compiled function: writes the declared outputs")
        return
    if op.device and op.host is None:  # runs on device buffers only
        ctx.direct = None
        ctx.ok("spec", "device function without a host fallback: not called directly")
        return
    ctx.current = ("spec", "calling the function directly")
    if op.traced:
        got = jax.eval_shape(lambda *xs: op.fn(*ctx.xtree.unflatten(list(xs)), **ctx.operands,
                                               **ctx.static), *ctx.xs)
        ctx.direct = None
    else:
        got = _call_host(ctx, declared)
        ctx.direct = tree_util.tree_leaves(got)
    if tree_util.tree_structure(got) != tree:
        ctx.fail("spec", "output structure", f"the output spec declares {tree} but the "
                 f"function returned {tree_util.tree_structure(got)}")
    for name, a, r in zip(ctx.out_names, ctx.out_avals, tree_util.tree_leaves(got)):
        shape = tuple(np.shape(r))
        dtype = None if isinstance(r, (int, float, complex, bool)) else np.dtype(r.dtype)
        if shape != tuple(a.shape) or (dtype is not None and dtype != np.dtype(a.dtype)):
            ctx.fail("spec", name, f"declared {np.dtype(a.dtype).name}{list(a.shape)} but the "
                     f"function returned {dtype or type(r).__name__}{list(shape)}; fix the "
                     f"shape= given to ab.bind (or the function)")
    ctx.ok("spec", f"{len(ctx.out_avals)} output(s) match")


def _call_host(ctx, declared):
    """The host function (a device function's host fallback) on NumPy copies of the
    inputs; an in-place one (``out=True``) is run twice on outputs prefilled with 0 and
    with 1, and must overwrite both."""
    to_np = lambda t: tree_util.tree_map(np.asarray, t)
    args, kw = to_np(ctx.args), {**to_np(ctx.operands), **ctx.static}
    fn = ctx.op.host if ctx.op.device else ctx.op.fn
    if not getattr(ctx.op, "inplace", False):
        return fn(*args, **kw)
    outs = []
    for fill in (0, 1):
        out = tree_util.tree_map(lambda a, fill=fill: np.full(a.shape, fill, a.dtype), declared)
        fn(*args, out=out, **kw)
        outs.append(out)
    for name, a, b in zip(ctx.out_names, *map(tree_util.tree_leaves, outs)):
        unwritten = (a == 0) & (b == 1)
        if np.any(unwritten):
            ctx.fail("spec", name, f"the function (out=True) left {int(np.sum(unwritten))} of "
                     f"{a.size} output elements unwritten; it must write every element")
    return outs[0]


def inplace_rules(ctx) -> None:
    """In-place rules (``out=True``) write every element: each runs on NumPy inputs twice,
    into outputs prefilled with 0 and with 1, and must overwrite both."""
    op = ctx.op
    kinds = [k for k in ("jvp", "vjp", "transpose", "bwd")
             if getattr(getattr(op, f"{k}_rule", None), "out", False)]
    if not kinds:
        return
    ctx.current = ("in-place rules", "tracing the op")
    prim = op.primitive("primal")
    call = next(e.params["call"] for e in jax.make_jaxpr(ctx.apply)(ctx.xs, ctx.ks).eqns
                if e.primitive is prim)
    xs = [np.asarray(x) for x in ctx.xs]
    ks = [np.asarray(k) for k in ctx.ks]
    ts = [np.asarray(ctx.tangent(x)) for x, f in zip(ctx.xs, call.float_in) if f]
    cts = [np.asarray(ctx.cotangent(a)) for a, f in zip(call.out_avals, call.float_out) if f]
    rs = []
    if call.res_tree is not None:
        ctx.current = ("in-place rules", "the fwd rule's residuals")
        rs = roles.make_run("fwd", call, op.fwd_rule, None, None, np, ())(*xs, *ks)
        rs = [np.asarray(r, a.dtype) for r, a in zip(rs[len(call.out_avals):], call.res_avals)]
    for kind in kinds:
        if kind == "bwd" and call.res_tree is None or kind == "vjp" and call.res_tree is not None:
            continue  # not the rule reverse mode runs (the vjp and the bwd rule are exclusive)
        role = "vjp" if kind == "bwd" else kind
        lin, need = (call.float_in, None) if role == "jvp" else (call.float_out, call.float_in)
        ins = {"jvp": [*xs, *ks, *rs, *ts], "vjp": [*xs, *ks, *rs, *cts],
               "transpose": [*ks, *cts]}[role]
        avals = roles.out_avals(role, call, lin, need)
        names = roles.out_names(role, call, need)
        run = roles.make_run(role, call, roles.rule_of(role, call), lin, need, np, ())
        where = f"{kind} rule"
        ctx.current = ("in-place rules", where)
        outs = []
        for fill in (0, 1):
            outs.append([np.full(a.shape, fill, a.dtype) for a in avals])
            run(ins, outs[-1])
        for name, a, b in zip(names, *outs):
            unwritten = (a == 0) & (b == 1)
            if np.any(unwritten):
                ctx.fail("in-place rules", f"{where} → {name}",
                         f"the {kind} rule (out=True) left {int(np.sum(unwritten))} of {a.size} "
                         f"elements unwritten; it must write every element (zeros for a zero "
                         f"{'tangent' if role == 'jvp' else 'cotangent'})")
        ctx.ok("in-place rules", f"{where}: every element written")


def eager(ctx) -> None:
    """op(x) through the host call vs the function called directly."""
    ctx.current = ("eager", "outputs")
    ctx.eager_out = ctx.apply(ctx.xs)
    if ctx.direct is None:
        if ctx.op.traced:
            want = tree_util.tree_leaves(ctx.op.fn(*ctx.args, **ctx.operands, **ctx.static))
            ctx.compare("eager", "op vs function", ctx.eager_out, want, ctx.out_names)
        return
    ctx.compare("eager", "op vs function", ctx.eager_out, ctx.direct, ctx.out_names,
                hint="The op's result differs from calling its function on NumPy arrays.")


def shard(ctx) -> None:
    """f on two slices along each splittable factor of the ``shard=`` rule, concatenated,
    vs f on the whole: f(x[s]) = f(x)[s]; an output without the factor is f(x) on each."""
    op = ctx.op
    if getattr(op, "shard", None) is None:
        return
    call = op.call_of(*ctx.args, **ctx.operands, **ctx.static)
    n, hint = len(ctx.xs), ("Running the op per shard along this factor gives other values "
                            "than running it whole: keep the factor whole (replicated=) or "
                            "fix the rule.")
    cases = [c for c in slicings(call) if c[1] >= 2]
    for label, size, in_axes, out_axes in cases:
        ctx.current = ("shard", f"factor {label}")
        halves = []
        for lo, hi in ((0, size // 2), (size // 2, size)):
            leaves = [x if d is None else np.asarray(x)[(slice(None),) * d + (slice(lo, hi),)]
                      for x, d in zip(ctx.xs + ctx.ks, in_axes)]
            halves.append(ctx.apply(leaves[:n], leaves[n:]))
        got = [a if d is None else np.concatenate([a, b], axis=d)
               for a, b, d in zip(*halves, out_axes)]
        whole = [o for o, d in zip(halves[1], out_axes) if d is None]
        ctx.compare("shard", f"factor {label}", got + whole,
                    ctx.eager_out + [o for o, d in zip(ctx.eager_out, out_axes) if d is None],
                    ctx.out_names + [n_ for n_, d in zip(ctx.out_names, out_axes) if d is None],
                    hint=hint)
    if not cases:
        ctx.skip("shard", "no factor of the rule splits these examples (size 2 or more)"
                 if slicings(call) else "the rule splits no factor: the op runs whole")


def jit(ctx) -> None:
    """jit of the op, its jvp and its vjp vs eager evaluation."""
    ctx.current = ("jit", "outputs")
    got = jax.jit(ctx.apply)(ctx.xs, ctx.ks)
    ctx.compare("jit", "outputs", got, ctx.eager_out, ctx.out_names)
    if not ctx.fx or not ctx.fo:
        return
    f, xs = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx]
    ts = _tangents(ctx, ctx.fx)
    ys = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    cases = (("jvp", lambda xs, ts: jax.jvp(f, xs, ts)[1], ts, _float_names(ctx)),
             ("vjp", lambda xs, ys: jax.vjp(f, *xs)[1](ys), ys,
              [ctx.x_names[i] for i in ctx.fx]))
    for label, g, lin, names in cases:
        ctx.current = ("jit", label)
        try:
            want = g(xs, lin)
        except NotImplementedError:  # the rule is missing; the jvp and vjp rows say so
            continue
        ctx.compare("jit", label, jax.jit(g)(xs, lin), want, names)


# -------------------------------------------------------------- first order

def jvp(ctx) -> None:
    """∂f(x)·ẋ vs five-point central differences, per positional argument."""
    ctx.jvp_cache = {}
    if _no_derivatives(ctx, "jvp"):
        return
    op = ctx.op
    source = ("the op is linear=True, so its jvp is the function itself" if op.linear
              else "the op is multilinear=True, so its jvp is Σᵢ f(…, ẋᵢ, …): check that "
                   "the function is linear in each argument"
              if getattr(op, "multilinear", False)
              else "check the jvp rule" if op.jvp_rule is not None
              else "the jvp is derived from the traced vjp rule" if op.vjp_rule is not None
              else "the jvp is JAX's derivative of the traced function")
    hint = f"The tangent disagrees with finite differences of the function; {source}."
    for label, idx, imag in ctx.groups():
        ctx.current = ("jvp", label)
        f, xs, ts = ctx.f_of(idx), [ctx.xs[i] for i in idx], _tangents(ctx, idx, imag)
        _, jt = jax.jvp(f, xs, ts)
        ctx.jvp_cache[label] = (ts, jt)
        ctx.compare_fd("jvp", label, jt, f, xs, ts, _float_names(ctx), hint=hint)


def vjp(ctx) -> None:
    """⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩ with J·ẋ from the checked jvp, or from differences without one."""
    if _no_derivatives(ctx, "vjp"):
        return
    ctx.current = ("vjp", "all arguments")
    xs = [ctx.xs[i] for i in ctx.fx]
    ybar = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    cts = jax.vjp(ctx.f_of(ctx.fx), *xs)[1](ybar)
    op = ctx.op
    rule = ("the fwd/bwd rules" if getattr(op, "bwd_rule", None) is not None
            else "the transpose rule (linear=True)" if op.linear and op.vjp_rule is None
            else "the transpose rule for this argument (multilinear=True)"
            if getattr(op, "multilinear", False)
            else "the jvp rule (symmetric=True)" if getattr(op, "symmetric", False)
            else "the vjp rule" if op.vjp_rule is not None
            else "the vjp derived from the traced jvp rule" if op.jvp_rule is not None
            else "JAX's vjp of the traced function")
    for label, idx, imag in ctx.groups():
        ctx.current = ("vjp", label)
        c = [cts[ctx.fx.index(i)] for i in idx]
        if label in ctx.jvp_cache:
            ts, jt = ctx.jvp_cache[label]
            verdicts, source = [ctx.assess_scalars(*_identity(ybar, jt, c, ts))], "the jvp"
        else:
            ts = _tangents(ctx, idx, imag)
            verdicts, source = _fd_identity(ctx, idx, ts, ybar, c), "finite differences"
        ctx.record("vjp", label, verdicts,
                   hint=f"⟨ȳ, J·ẋ⟩ from {source} differs from ⟨Jᵀ·ȳ, ẋ⟩ from {rule}, which "
                        f"is wrong for this argument.")


def symmetry(ctx) -> None:
    """⟨u, J·v⟩ = ⟨J·u, v⟩ for a ``symmetric=True`` op, both products by its jvp.

    The vjp of such an op is its jvp, so this is what makes reverse mode right.
    Complex leaves get directions with real and imaginary parts.
    """
    if not getattr(ctx.op, "symmetric", False) or _no_derivatives(ctx, "symmetry"):
        return
    ctx.current = ("symmetry", "argument 0")
    f, xs = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx]

    def direction():
        return [ctx.tangent(x) + (ctx.tangent(x, True) if jnp.iscomplexobj(x) else 0)
                for x in xs]
    u, v = direction(), direction()
    ju, jv = (jax.jvp(f, xs, t)[1] for t in (u, v))
    ctx.record("symmetry", "argument 0", [ctx.assess_scalars(*_identity(u, jv, ju, v))],
               hint="The op is declared symmetric=True but its Jacobian (from the jvp) is not "
                    "symmetric, so the vjp it derives from the jvp is wrong. For complex "
                    "values symmetric means J = Jᵀ, not Hermitian.")


def _identity(ybar, jt, cts, ts) -> tuple:
    """(⟨ȳ, J·ẋ⟩, ⟨Jᵀ·ȳ, ẋ⟩, Σ|terms|)."""
    lhs = sum(pair(y, t) for y, t in zip(ybar, jt))
    rhs = sum(pair(c, t) for c, t in zip(cts, ts))
    bound = sum(abs_pair(y, t) for y, t in zip(ybar, jt)) + \
        sum(abs_pair(c, t) for c, t in zip(cts, ts))
    return lhs, rhs, bound


def _fd_identity(ctx, idx, ts, ybar, cts):
    """Verdicts of the transpose identity with J·ẋ from differences, one per step."""
    f, xs = ctx.f_of(idx), [ctx.xs[i] for i in idx]
    ynorm = sum(float(np.sum(np.abs(y))) for y in ybar)
    for h in ctx.fd_steps():
        jt, floor = ctx.fd(f, xs, ts, h)
        yield ctx.assess_scalars(*_identity(ybar, jt, cts, ts), fd=True, floor=floor * ynorm)


def _linear_parts(ctx) -> list:
    """[(label, float leaves)] the op is declared linear in: all arguments jointly with
    ``linear=True``, those of ``linear=(i, ...)``'s arguments jointly, each argument
    by itself with ``multilinear=True``, or none."""
    if ctx.op.linear:
        return [("all arguments", list(ctx.fx))]
    if getattr(ctx.op, "multilinear", False):
        parts = [(f"argument {g}", [i for i in ctx.fx if ctx.x_group[i] == g])
                 for g in range(len(ctx.args))]
        return [(label, idx) for label, idx in parts if idx]
    argnums = tuple(getattr(ctx.op, "linear_argnums", ()))
    idx = [i for i in ctx.fx if ctx.x_group[i] in argnums]
    return [(f"argument{'s' * (len(argnums) > 1)} {', '.join(map(str, argnums))}", idx)] \
        if idx else []


def _is_linear_in(ctx, idx, ys=None) -> tuple:
    """(f(a·x + b·y), a·f(x) + b·f(y)) in the leaves ``idx``, the others fixed."""
    f, xs = ctx.f_of(idx), [ctx.xs[i] for i in idx]
    ys = _tangents(ctx, idx) if ys is None else ys
    a, b = 0.75, -1.25
    lhs = f(*[combine(a, x, b, y) for x, y in zip(xs, ys)])
    return lhs, [combine(a, u, b, v) for u, v in zip(f(*xs), f(*ys))]


def _separately_linear(ctx) -> bool:
    """Whether f is linear in each argument by itself (though not jointly)."""
    groups = sorted({ctx.x_group[i] for i in ctx.fx})
    if len(groups) < 2:
        return False
    for g in groups:
        lhs, rhs = _is_linear_in(ctx, [i for i in ctx.fx if ctx.x_group[i] == g])
        if ctx.assess(lhs, rhs, _float_names(ctx))[3] is not None:
            return False
    return True


def linearity(ctx) -> None:
    """f(a·x + b·y) = a·f(x) + b·f(y) in the arguments the op is declared linear in."""
    for label, idx in _linear_parts(ctx):
        ctx.current = ("linearity", label)
        lhs, rhs = _is_linear_in(ctx, idx)
        verdict = ctx.assess(lhs, rhs, _float_names(ctx))
        hint = f"The op is declared linear in {label} but its function is not."
        if verdict[3] is not None and len({ctx.x_group[i] for i in idx}) > 1 \
                and _separately_linear(ctx):
            hint += (" It is linear in each argument by itself, the others fixed (like a "
                     "product x·y): bind it with multilinear=True and give "
                     "op.def_transpose(rule, argnum=i) for each argument instead.")
        ctx.record("linearity", label, [verdict], hint)


def transpose(ctx) -> None:
    """⟨ȳ, A·ẋ⟩ = ⟨Aᵀ·ȳ, ẋ⟩ in the linear arguments, Aᵀ by jax.linear_transpose."""
    for label, idx in _linear_parts(ctx):
        _transpose_in(ctx, label, idx)


def _multilinear_rule(op, label: str) -> str:
    given = int(label.split()[-1]) in op.transpose_rules
    return f"the transpose rule for {label}" if given else f"JAX's transpose in {label}"


def _transpose_in(ctx, label, idx) -> None:
    if not ctx.fo:
        return
    ctx.current = ("transpose", label)
    f, xs = ctx.f_of(idx), [ctx.xs[i] for i in idx]
    ybar = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    cts = jax.linear_transpose(f, *xs)(ybar)
    rule = ("the transpose rule" if ctx.op.linear else
            _multilinear_rule(ctx.op, label) if getattr(ctx.op, "multilinear", False)
            else "the vjp rule (linear_transpose)")
    for where, part, imag in ctx.groups():
        if not set(part) <= set(idx):
            continue
        ctx.current = ("transpose", where)
        ts = _tangents(ctx, part, imag)
        full = [np.zeros(x.shape, x.dtype) for x in xs]
        for i, t in zip(part, ts):
            full[idx.index(i)] = t
        c = [cts[idx.index(i)] for i in part]
        ax = f(*full)
        verdict = ctx.assess_scalars(*_identity(ybar, ax, c, ts))
        hint = f"⟨ȳ, A·ẋ⟩ from the function differs from ⟨Aᵀ·ȳ, ẋ⟩ from {rule}."
        if verdict[3] is not None and _is_adjoint(ctx, ybar, ax, c, ts):
            hint += (" It computes the adjoint A^H·ȳ (the conjugate transpose). JAX "
                     "transposes complex-linear maps without conjugation, pairing ⟨a, b⟩ = "
                     "Re Σ a·b: return Aᵀ·ȳ = conj(A^H·conj(ȳ)) instead (a symmetric map, "
                     "such as the DFT, is its own transpose).")
        ctx.record("transpose", where, [verdict], hint=hint)


def _is_adjoint(ctx, ybar, ax, cts, ts) -> bool:
    """Whether the cotangents satisfy the adjoint's identity Re⟨ȳ, A·ẋ⟩_H = Re⟨c, ẋ⟩_H
    (with conjugation) instead of the transpose's, for a complex map."""
    if not any(np.iscomplexobj(np.asarray(v)) for v in (*ybar, *ts)):
        return False
    conj = lambda vs: [np.conj(np.asarray(v)) for v in vs]
    return ctx.assess_scalars(*_identity(conj(ybar), ax, conj(cts), ts))[3] is None


# -------------------------------------------------------------------- vmap

def _perturbed(ctx, x):
    """_B copies of x along a new leading axis: x itself, then multiplicative perturbations."""
    x = np.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return np.stack([x] * _B)
    u = ctx.rng.uniform(-1.0, 1.0, (_B - 1,) + x.shape)
    return np.concatenate([x[None], (x[None] * (1 + 0.05 * u)).astype(x.dtype)])


def _vmap_vs_loop(ctx, check: str, where: str, fn, leaves, mask, names, hint="",
                  row=None) -> None:
    """vmap of ``fn`` vs a loop of ``row`` (default ``fn``) over the batch; with a
    ``row`` given (a jitted ``fn``), the batched function is jitted too."""
    ctx.current = (check, where)
    ins = [_perturbed(ctx, x) if m else x for x, m in zip(leaves, mask)]
    batched = jax.vmap(lambda *a: list(fn(*a)), in_axes=[0 if m else None for m in mask])
    got = (batched if row is None else jax.jit(batched))(*ins)
    row = fn if row is None else row
    rows = [row(*[x[b] if m else x for x, m in zip(ins, mask)]) for b in range(_B)]
    want = [np.stack([np.asarray(r[j]) for r in rows]) for j in range(len(got))]
    ctx.compare(check, where, got, want, names, hint=hint)


def vmap(ctx) -> None:
    """vmap of the op (its mode or rule) vs a loop, all and each argument batched."""
    op, nx = ctx.op, len(ctx.xs)
    fn = lambda *leaves: ctx.apply(leaves[:nx], leaves[nx:])
    leaves = [*ctx.xs, *ctx.ks]
    groups = [f"argument {g}" for g in ctx.x_group] + ctx.k_names
    patterns = [("all batched", [True] * len(leaves))]
    if len(set(groups)) > 1:
        patterns += [(f"only {g} batched", [h == g for h in groups])
                     for g in dict.fromkeys(groups)]
    if getattr(op, "vmap_rule", None) is not None:
        hint = "The vmap rule computes something other than the op row by row."
    elif op.vmap in ("expand_dims", "broadcast_all"):
        hint = (f"With vmap={op.vmap!r} the function gets arrays with a leading batch axis "
                f"({'broadcast' if op.vmap == 'broadcast_all' else 'length 1'} for unbatched "
                f"arguments) and must treat each row independently.")
    else:
        hint = ""
    for where, mask in patterns:
        _vmap_vs_loop(ctx, "vmap", where, fn, leaves, mask, ctx.out_names, hint)


def vmap_derivatives(ctx) -> None:
    """The jvp, vjp (and transpose) primitives batched vs a loop."""
    if not ctx.fx or not ctx.fo:
        return
    f, xs, n = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx], len(ctx.fx)
    ts = _tangents(ctx, ctx.fx)
    ys = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    in_names = [ctx.x_names[i] for i in ctx.fx]
    hint = (f"Under vmap={ctx.op.vmap!r} every rule also gets a leading batch axis."
            if ctx.op.vmap in ("expand_dims", "broadcast_all") else "")
    cases = [("vmap of jvp", "tangents", lambda *a: jax.jvp(f, a[:n], a[n:])[1], ts,
              _float_names(ctx)),
             ("vmap of vjp", "cotangents", lambda *a: jax.vjp(f, *a[:n])[1](list(a[n:])), ys,
              in_names)]
    if ctx.op.linear:
        cases.append(("vmap of transpose", "cotangents",
                      lambda *a: jax.linear_transpose(f, *xs)(list(a[n:])), ys, in_names))
    for check, what, g, lin, names in cases:
        patterns = (("all batched", [True] * (n + len(lin))),
                    (f"only {what} batched", [False] * n + [True] * len(lin)))
        row = jax.jit(g)  # one compilation for the loops of both patterns
        try:
            for where, mask in patterns:
                _vmap_vs_loop(ctx, check, where, g, [*xs, *lin], mask, names, hint, row)
        except NotImplementedError as e:  # the rule is missing: the jvp/vjp rows say which
            ctx.skip(check, str(e))


# ------------------------------------------------------------- second order

def second_order(ctx) -> None:
    """The jvp of the jvp vs central differences of the jvp."""
    if _no_second_order(ctx, "2nd-order jvp"):
        return
    ctx.current = ("2nd-order jvp", "all arguments")
    f, xs = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx]
    t1, t2 = _tangents(ctx, ctx.fx), _tangents(ctx, ctx.fx)
    q = jax.jit(lambda *x: jax.jvp(f, list(x), t1)[1])  # compiled once, run at every step
    _, got = jax.jvp(q, xs, t2)
    ctx.compare_fd("2nd-order jvp", "all arguments", got, q, xs, t2, _float_names(ctx),
                   hint="The derivative of the jvp disagrees with finite differences of the "
                        "jvp: check the traced rules (and the ops they call).")


def hessian(ctx) -> None:
    """⟨ẋ₂, H·ẋ₁⟩ = ⟨ẋ₁, H·ẋ₂⟩ (forward over reverse) = ∂²s[ẋ₁, ẋ₂] (forward over forward)."""
    if _no_second_order(ctx, "hessian symmetry"):
        return
    ctx.current = ("hessian symmetry", "all arguments")
    f, xs, n = ctx.f_of(ctx.fx), [ctx.xs[i] for i in ctx.fx], len(ctx.fx)
    ybar = [ctx.cotangent(ctx.out_avals[j]) for j in ctx.fo]
    t1, t2 = _tangents(ctx, ctx.fx), _tangents(ctx, ctx.fx)
    s = lambda *x: sum(jnp.real(jnp.sum(y * o)) for y, o in zip(ybar, f(*x)))
    grad = jax.grad(s, argnums=tuple(range(n)))
    hvp = jax.jit(lambda x, t: jax.jvp(grad, x, t)[1])  # compiled once: one program
    hv1, hv2 = hvp(xs, t1), hvp(xs, t2)
    h12, h21, bound = _identity(t2, hv1, t1, hv2)
    # two levels of differentiation round more than one: the finite-difference tolerance
    ctx.record("hessian symmetry", "forward over reverse",
               [ctx.assess_scalars(h12, h21, bound, fd=True)],
               hint="The Hessian of ⟨ȳ, f(x)⟩ from the rules is not symmetric.")
    ctx.current = ("hessian symmetry", "forward over forward")
    hff = float(jax.jit(lambda x: jax.jvp(lambda *y: jax.jvp(s, list(y), t1)[1], x, t2)[1])(xs))
    ctx.record("hessian symmetry", "forward over forward",
               [ctx.assess_scalars(hff, h12, bound, fd=True)],
               hint="Forward-over-forward and forward-over-reverse second derivatives "
                    "disagree: the jvp and vjp rules' derivatives differ.")


CHECKS: list = [("spec", spec), ("in-place rules", inplace_rules), ("eager", eager),
                ("shard", shard), ("linearity", linearity), ("jvp", jvp),
                ("symmetry", symmetry),
                ("transpose", transpose), ("vjp", vjp), ("vmap", vmap),
                ("vmap of derivatives", vmap_derivatives), ("jit", jit),
                ("2nd-order jvp", second_order),
                ("hessian symmetry", hessian)]
