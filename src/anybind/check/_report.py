"""Numerical verification of an op's rules: ``ab.check``, its report and its error.

``check`` flattens the example inputs once into a ``Context`` that the
individual checks (``_checks.py``) share: random tangents and cotangents
from one seeded generator, finite differences, and tolerances that adapt to
the least precise floating dtype involved. Every comparison either records a
row of the ``Report`` or raises ``RuleError`` naming the op, the check, the
argument or output, and the measured error against the tolerance.

Errors are relative to the larger of the two values compared (∞-norm over
each output leaf): ``|a − b|∞ / max(|a|∞, |b|∞)``, against
``rtol + atol / max(|a|∞, |b|∞)``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from .._api import Op
from ..core._code import is_compiled
from ..core._errors import MissingRuleError
from . import _checks


class RuleError(Exception):
    """A rule of an op computes something other than what it must (raised by ``ab.check``).

    Attributes: ``op`` (the op's name), ``check``, ``where`` (argument/output),
    ``error`` and ``tolerance`` (relative, None when not numerical), and
    ``report``, the checks that ran up to and including this one.

    >>> import anybind as ab, numpy as np
    >>> bad = ab.bind(np.sin, shape=ab.like(0), vmap="expand_dims",
    ...               jvp=lambda p, t: 2 * np.cos(p[0]) * t[0], name="bad_sin")
    >>> try:
    ...     ab.check(bad, np.linspace(0.1, 1.0, 4))
    ... except ab.RuleError as e:
    ...     print(e.check, "|", e.where)
    jvp | argument 0 → output
    """

    def __init__(self, op: str, check: str, where: str, message: str,
                 error: float | None = None, tolerance: float | None = None):
        self.op, self.check, self.where = op, check, where
        self.error, self.tolerance = error, tolerance
        self.report: Report | None = None
        super().__init__(f"ab.check: op '{op}' fails check '{check}' ({where}): {message}")


@dataclasses.dataclass
class Row:
    """One line of a report."""
    check: str
    where: str
    status: str  # "ok", "FAIL" or "skipped"
    error: float | None = None
    tolerance: float | None = None
    note: str = ""


@dataclasses.dataclass
class Report:
    """What ``ab.check`` verified; ``print`` it for a table.

    >>> import anybind as ab, numpy as np
    >>> double = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, name="double",
    ...                  transpose=lambda ct: (2 * ct,))
    >>> r = ab.check(double, np.ones(3))
    >>> r.ok, r.rows[0].check
    (True, 'spec')
    """
    op: str
    description: str
    rows: list = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status != "FAIL" for r in self.rows)

    def to_dict(self) -> dict:
        return {"op": self.op, "description": self.description, "ok": self.ok,
                "rows": [dataclasses.asdict(r) for r in self.rows]}

    def __str__(self) -> str:
        head = ("check", "where", "status", "error", "tolerance")
        body = [(r.check, r.where, r.status, _num(r.error), _num(r.tolerance)) for r in self.rows]
        widths = [max(len(x[i]) for x in [head, *body]) for i in range(5)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        passed = sum(r.status == "ok" for r in self.rows)
        skipped = [r for r in self.rows if r.status == "skipped"]
        lines = [f"op '{self.op}' ({self.description})", line(head),
                 line(["-" * w for w in widths])]
        lines += [line(b) for b in body]
        lines.append(f"{passed} passed, {len(skipped)} skipped"
                     + ("" if self.ok else ", FAILED"))
        lines += [f"  skipped {r.check}: {r.note}" for r in skipped]
        return "\n".join(lines)


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.1e}"


def check(op: Op, *args: Any, rtol: float | None = None, atol: float | None = None,
          seed: int = 0, torch: bool = False, **kwargs: Any) -> Report:
    """Verify every rule of ``op`` numerically on example inputs; raise on the first error.

    Args:
      op: an op made by ``ab.bind``.
      *args: example positional inputs, as the op is called. With neither
        these nor ``**kwargs``, the op's ``examples()`` gives ``(args, kwargs)``.
      rtol: overrides the relative tolerance, which otherwise adapts to the
        least precise floating dtype involved: √eps for finite differences,
        eps^⅔ for identities exact in exact arithmetic (transposes, vmap, jit).
      atol: overrides the absolute tolerance, likewise.
      seed: seed of the random tangents, cotangents and batch perturbations.
      torch: also run the checks through ``op.torch`` (needs ``anybind[torch]``),
        comparing its values and derivatives with the JAX op's.
      **kwargs: example keyword inputs, as the op is called. ``rtol``, ``atol``,
        ``seed`` and ``torch`` are this function's own, not passed to the op.

    Returns:
      A ``Report``; ``print`` it for a table of check, status and error.

    Raises:
      RuleError: on the first failing check, naming the op, the check, the
        argument or output, and the measured error against the tolerance.

    >>> import anybind as ab, numpy as np
    >>> mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="expand_dims",
    ...               jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
    ...               vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct), name="mul")
    >>> ab.check(mul, np.ones(3), np.full(3, 2.0)).ok
    True
    """
    if not args and not kwargs:
        if getattr(op, "examples", None) is None:
            raise TypeError(f"ab.check: op '{getattr(op, 'name', op)}' needs example inputs; "
                            f"pass them as ab.check(op, *args, **kwargs) or bind the op with "
                            f"examples=lambda: (args, kwargs)")
        args, kwargs = examples_of(op)
    ctx = Context(op, tuple(args), dict(kwargs), rtol, atol, seed)
    checks = list(_checks.CHECKS)
    if torch:
        from . import _torch
        checks += _torch.CHECKS
    for name, fn in checks:
        ctx.run_check(name, fn)
    return ctx.report


def examples_of(op) -> tuple:
    """``op.examples()`` as ``(args tuple, kwargs dict)``, validated."""
    ex = op.examples()
    if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and isinstance(ex[1], dict)):
        raise TypeError(f"ab.check: op '{op.name}': examples() must return (args, kwargs), a "
                        f"tuple and a dict; got {ex!r:.80}")
    return tuple(ex[0]), ex[1]


def _is_array(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic, jax.Array))


def inexact(x) -> bool:
    return bool(jnp.issubdtype(x.dtype, jnp.inexact))


class Context:
    """The flattened example inputs of one ``ab.check`` call and the shared machinery."""

    def __init__(self, op, args, kwargs, rtol, atol, seed):
        self.op = op
        self.rng = np.random.default_rng(seed)
        self.args = tree_util.tree_map(jnp.asarray, args)
        operands, self.static = {}, {}
        for k, v in kwargs.items():
            leaves = tree_util.tree_leaves(v)
            if leaves and all(_is_array(l) for l in leaves):
                operands[k] = tree_util.tree_map(jnp.asarray, v)
            else:
                self.static[k] = v
        self.operands = operands
        self.xs, self.xtree = tree_util.tree_flatten(self.args)
        self.ks, self.ktree = tree_util.tree_flatten(operands)
        self.x_group = [i for i, a in enumerate(self.args)
                        for _ in tree_util.tree_leaves(a)]
        self.x_names = [f"argument {i}{tree_util.keystr(p)}" for i, a in enumerate(self.args)
                        for p, _ in tree_util.tree_flatten_with_path(a)[0]]
        self.k_names = [f"keyword {p[0].key!r}{tree_util.keystr(p[1:])}"
                        for p, _ in tree_util.tree_flatten_with_path(operands)[0]]
        self.fx = [i for i, x in enumerate(self.xs) if inexact(x)]
        self.report = Report(op.name, describe(op))
        self.user_rtol, self.user_atol = rtol, atol
        self.out_avals: list = []  # set by the spec check
        self.out_names: list = []
        self.fo: list = []
        self.set_tolerances()
        self.current = ("setup", "inputs")

    # --------------------------------------------------------------- tolerances

    def set_tolerances(self) -> None:
        floats = [self.xs[i].dtype for i in self.fx]
        floats += [a.dtype for a in self.out_avals if jnp.issubdtype(a.dtype, jnp.inexact)]
        eps = max([float(jnp.finfo(d).eps) for d in floats] or [float(jnp.finfo(float).eps)])
        self.eps = eps
        self.h = 0.5 * eps ** 0.2  # five-point stencil: truncation h⁴, rounding eps/h
        self.rtol_fd = self.user_rtol if self.user_rtol is not None else math.sqrt(eps)
        self.rtol_exact = self.user_rtol if self.user_rtol is not None else eps ** (2 / 3)
        self.atol = self.user_atol or 0.0

    # ----------------------------------------------------------------- plumbing

    def apply(self, xs, ks=None) -> list:
        """All output leaves of the op at positional leaves ``xs`` (keyword leaves ``ks``)."""
        ks = self.ks if ks is None else ks
        out = self.op(*self.xtree.unflatten(list(xs)), **self.ktree.unflatten(list(ks)),
                      **self.static)
        return tree_util.tree_leaves(out)

    def f_of(self, idx) -> Callable[..., list]:
        """The float outputs as a function of the positional leaves ``idx``, others fixed."""
        def f(*vs):
            full = list(self.xs)
            for i, v in zip(idx, vs):
                full[i] = v
            outs = self.apply(full)
            return [outs[j] for j in self.fo]
        return f

    def tangent(self, x, imaginary: bool = False):
        """A random direction, each element scaled to that element's magnitude."""
        ax = np.abs(np.asarray(x))
        big = float(ax.max()) if ax.size else 0.0
        s = ax + 1e-3 * big if big > 0 else np.ones(ax.shape)
        t = self.rng.uniform(-1.0, 1.0, ax.shape) * s
        return np.asarray(1j * t if imaginary else t).astype(x.dtype)

    def cotangent(self, like):
        r = self.rng.standard_normal(like.shape)
        if jnp.issubdtype(like.dtype, jnp.complexfloating):
            r = r + 1j * self.rng.standard_normal(like.shape)
        return np.asarray(r).astype(like.dtype)

    def groups(self) -> list:
        """(label, float leaf indices, imaginary direction?) per argument, or per leaf of one."""
        out = []
        for g in range(len(self.args)):
            idx = [i for i in self.fx if self.x_group[i] == g]
            parts = [[i] for i in idx] if len(idx) > 1 else [idx] if idx else []
            for part in parts:
                label = self.x_names[part[0]] if len(idx) > 1 else f"argument {g}"
                out.append((label, part, False))
                if any(jnp.iscomplexobj(self.xs[i]) for i in part):
                    out.append((f"{label}, imaginary direction", part, True))
        if len(self.fx) > 1:
            out.append(("all arguments", list(self.fx), False))
        return out

    def fd(self, f, xs, ts, h: float) -> tuple:
        """Five-point central difference of ``f`` at ``xs`` along ``ts``, and its rounding floor."""
        def at(k):
            stepped = [_checks.combine(1, x, k * h, t) for x, t in zip(xs, ts)]
            return [np.asarray(v) for v in f(*stepped)]
        p1, m1, p2, m2 = at(1), at(-1), at(2), at(-2)
        d = [(8 * (a - b) - (c - e)) / (12 * h) for a, b, c, e in zip(p1, m1, p2, m2)]
        # rounding: of the values (eps·|f|/h) and of the stepped inputs (eps·|D|/h)
        fmax = max([float(np.max(np.abs(v))) for v in (*p1, *p2) if v.size] or [0.0])
        dmax = max([float(np.max(np.abs(v))) for v in d if v.size] or [0.0])
        return d, self.eps * (100 * fmax + 10 * dmax) / h

    def fd_steps(self) -> list:
        """Relative steps tried in turn: a function varying faster than its inputs'
        magnitude (sin at 10³) needs a smaller one than the default."""
        return [self.h, self.h / 10, self.h / 100]

    # -------------------------------------------------------------- comparisons

    def assess(self, got, want, names, fd: bool = False, floor: float = 0.0) -> tuple:
        """(relative error, tolerance, leaf name, message if failing), worst over the leaves.

        Integer leaves must agree exactly, NaNs must sit in the same places.
        """
        worst = (0.0, self.rtol_fd if fd else self.rtol_exact, None, None)
        for g, w, name in zip(got, want, names, strict=True):
            g, w = np.asarray(g), np.asarray(w)
            if g.shape != w.shape:
                return math.inf, 0.0, name, f"shapes differ: {g.shape} vs {w.shape}"
            if not np.issubdtype(w.dtype, np.inexact):
                if not np.array_equal(g, w):
                    return math.inf, 0.0, name, (f"{int(np.sum(g != w))} of {g.size} integer "
                                                 f"elements differ")
                continue
            nan_g, nan_w = np.isnan(g), np.isnan(w)
            if np.any(nan_g != nan_w):
                return math.inf, 0.0, name, (f"{int(np.sum(nan_g != nan_w))} of {g.size} "
                                             f"elements are NaN on one side only")
            g, w = np.where(nan_g, 0, g), np.where(nan_w, 0, w)
            err, tol = self.measure(np.max(np.abs(g - w), initial=0.0),
                                    max(np.max(np.abs(g), initial=0.0),
                                        np.max(np.abs(w), initial=0.0)), fd, floor)
            if not err <= tol:
                return err, tol, name, f"relative error {err:.2e} exceeds tolerance {tol:.2e}"
            if err / tol >= worst[0] / worst[1]:
                worst = (err, tol, name, None)
        return worst

    def assess_scalars(self, lhs: float, rhs: float, bound: float, fd: bool = False,
                       floor: float = 0.0) -> tuple:
        """Like ``assess`` for two sides of an identity; ``bound`` is Σ|terms|."""
        err, tol = self.measure(abs(lhs - rhs), max(abs(lhs), abs(rhs)), fd, floor, bound)
        msg = None if err <= tol else (f"{lhs:.6g} ≠ {rhs:.6g}: relative error {err:.2e} "
                                       f"exceeds tolerance {tol:.2e}")
        return err, tol, None, msg

    def record(self, check: str, where: str, verdicts, hint: str = "") -> None:
        """Record the first passing verdict of an iterable (one per attempt), or fail
        with the closest one."""
        best = None
        for v in verdicts:
            if v[3] is None:
                return self.ok(check, where, v[0], v[1])
            if best is None or v[0] / max(v[1], 1e-300) < best[0] / max(best[1], 1e-300):
                best = v
        err, tol, name, msg = best
        self.fail(check, f"{where} → {name}" if name else where, f"{msg}. {hint}", err, tol)

    def compare(self, check: str, where: str, got, want, names, *, hint: str = "") -> None:
        """``got`` vs ``want``, lists of leaves, to the exact tolerance."""
        self.record(check, where, [self.assess(got, want, names)], hint)

    def compare_fd(self, check: str, where: str, got, f, xs, ts, names, *,
                   hint: str = "") -> None:
        """``got`` vs finite differences of ``f`` at ``xs`` along ``ts``, step by step."""
        def attempts():
            for h in self.fd_steps():
                fd, floor = self.fd(f, xs, ts, h)
                yield self.assess(got, fd, names, True, floor)
        self.record(check, where, attempts(), hint)

    def measure(self, diff: float, ref: float, fd: bool, floor: float,
                bound: float | None = None) -> tuple:
        """(relative error, relative tolerance) of an absolute difference.

        Both are relative to ``ref``; the tolerance is rtol·``bound`` (default
        ``ref``) plus atol plus ``floor`` (the rounding noise of differences).
        """
        rtol = self.rtol_fd if fd else self.rtol_exact
        diff, ref = float(diff), float(ref)
        bound = ref if bound is None else float(bound)
        if ref == 0.0:
            return (0.0 if diff == 0.0 else math.inf), rtol
        return diff / ref, (rtol * bound + self.atol + floor) / ref

    # ----------------------------------------------------------------- outcomes

    def ok(self, check: str, where: str, err=None, tol=None) -> None:
        self.report.rows.append(Row(check, where, "ok", err, tol))

    def skip(self, check: str, note: str) -> None:
        """A check the op has no rule for: keep the first clause of the core's message."""
        note = note.split(";")[0].split(". ")[0]
        note = re.sub(rf"^anybind op '{re.escape(self.op.name)}'(:| )\s*", "", note)
        self.report.rows.append(Row(check, "—", "skipped", note=note))

    def fail(self, check: str, where: str, message: str, err=None, tol=None):
        self.report.rows.append(Row(check, where, "FAIL", err, tol, message))
        e = RuleError(self.op.name, check, where, message.strip(), err, tol)
        e.report = self.report
        raise e

    def run_check(self, name: str, fn: Callable[[Context], None]) -> None:
        self.current = (name, "")
        try:
            fn(self)
        except MissingRuleError as e:
            self.skip(name, str(e))
        except RuleError:
            raise
        except Exception as e:
            where = self.current[1] or "running it"
            self.fail(name, where, f"raised {_short(e)}")


def _short(e: Exception) -> str:
    """The exception's message, without the traceback XLA wraps around host errors."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    ours = [l for l in lines if "anybind op" in l]
    return ours[-1] if ours else f"{type(e).__name__}: {lines[0] if lines else ''}"


def describe(op) -> str:
    """One line on what kind of op this is and which rules it has."""
    rules = [f"{k}{' (traced)' if r.traced and not op.traced else ''}"
             for k in ("jvp", "vjp", "transpose", "fwd", "bwd")
             if (r := getattr(op, f"{k}_rule", None)) is not None]
    rules += [f"transpose in {i}{' (traced)' if r.traced and not op.traced else ''}"
              for i, r in sorted(getattr(op, "transpose_rules", {}).items())]
    argnums = tuple(getattr(op, "linear_argnums", ()))
    code = "traced" if op.traced else "compiled" if is_compiled(op.fn) \
        else "device (checked through its host fallback)" if op.device else "host"
    kinds = [code] + (["symmetric"] if getattr(op, "symmetric", False) else []) + (
        ["linear"] if op.linear else [
        f"linear in {', '.join(map(str, argnums))}"] if argnums else [
        "multilinear"] if getattr(op, "multilinear", False) else [])
    vmap = "rule" if getattr(op, "vmap_rule", None) is not None else op.vmap
    return f"{' '.join(kinds)}; vmap: {vmap}; rules: {', '.join(rules) or 'none'}"
