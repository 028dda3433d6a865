#!/usr/bin/env python
"""The NUFFT (issue 29): anybind.contrib.finufft against jax-finufft, in one run.

    python benchmarks/nufft.py                   # a few minutes on 2 cores
    python benchmarks/nufft.py --quick           # fewer samples, smaller problem
    python benchmarks/nufft.py --update-readme   # the tables into benchmarks/README.md
    python benchmarks/nufft.py --only CG --repeats 20   # some rows, more samples

jax-finufft (``pip install jax-finufft``) is not a dependency; without it the
anybind columns are measured alone. The same calls run through both libraries
(only the import differs), on one problem: 2-D, 128² modes, 10⁵ points in
[−π, π)², eps 1e-6, complex128; type 3 maps the 10⁵ points to 2¹⁴ targets in
[−64, 64)². Per call, ``jax.jit`` of:

- types 1, 2 and 3;
- the gradient of ‖f‖² with respect to the values, and with respect to the points;
- 20 iterations of CG on the normal operator AᴴA (A = type 2 on the points),
  unplanned in both libraries, and with ``anybind.contrib.finufft.Plan``;
- single precision: complex64 at eps 1e-6 (ducc0 runs it in single) and at
  1e-7, below ducc0's single-precision limit (computed in double and rounded),
  beside complex128 at 1e-7.

Each on one thread (``Opts(nthreads=1)``) and on all cores (``Opts()``,
jax-finufft's default). Timing is ``run.measure``'s: round-robin over the
routes, the minimum over samples as the headline, the median beside it; the
routes are checked against each other first. Results of a full run:
``benchmarks/nufft.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

# jax-finufft's threads are OpenMP's: leave them every core (run.py limits BLAS to one)
os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import run  # noqa: E402  (x64 on)

from anybind.contrib import finufft as ab_finufft  # noqa: E402

try:
    import jax_finufft
    from jax_finufft.options import Opts as JfOpts
except ImportError as e:  # recorded, not fatal
    jax_finufft, JfOpts, JF_ERROR = None, None, repr(e)
else:
    JF_ERROR = None

LIBS = {"anybind": (ab_finufft, ab_finufft.Opts)}
if jax_finufft is not None:
    LIBS["jax-finufft"] = (jax_finufft, JfOpts)


def problem(n_modes: int, m: int, n_targets: int, seed: int = 0) -> dict:
    r = np.random.default_rng(seed)
    return dict(
        shape=(n_modes, n_modes),
        x=jnp.asarray(r.uniform(-np.pi, np.pi, m)), y=jnp.asarray(r.uniform(-np.pi, np.pi, m)),
        s=jnp.asarray(r.uniform(-n_modes / 2, n_modes / 2, n_targets)),
        t=jnp.asarray(r.uniform(-n_modes / 2, n_modes / 2, n_targets)),
        c=jnp.asarray(r.normal(size=m) + 1j * r.normal(size=m)),
        f=jnp.asarray(r.normal(size=(n_modes, n_modes)) + 1j * r.normal(size=(n_modes, n_modes))))


def cg(apply: Callable, b, iters: int):
    """Conjugate gradients on a Hermitian positive semidefinite operator (fixed count)."""
    def body(_, state):
        x, r, p, rr = state
        ap = apply(p)
        alpha = rr / jnp.vdot(p, ap).real
        x, r = x + alpha * p, r - alpha * ap
        rr_new = jnp.vdot(r, r).real
        return x, r, r + (rr_new / rr) * p, rr_new
    return jax.lax.fori_loop(0, iters, body, (jnp.zeros_like(b), b, b, jnp.vdot(b, b).real))[0]


def cases(p: dict, nthreads: int, cg_iters: int) -> dict[str, dict[str, tuple]]:
    """{case: {route: (jitted function, args)}}."""
    shape, x, y, s, t, c, f = (p[k] for k in ("shape", "x", "y", "s", "t", "c", "f"))
    eps = 1e-6
    out: dict[str, dict[str, tuple]] = {}

    def add(case, route, fn, *args):
        out.setdefault(case, {})[route] = (jax.jit(fn), args)

    for lib, (mod, Opts) in LIBS.items():
        o = Opts(nthreads=nthreads)
        t1 = lambda c, x, y, mod=mod, o=o: mod.nufft1(shape, c, x, y, eps=eps, opts=o)
        t2 = lambda f, x, y, mod=mod, o=o: mod.nufft2(f, x, y, eps=eps, opts=o)
        t3 = lambda c, x, y, s, t, mod=mod, o=o: mod.nufft3(c, x, y, s, t, eps=eps, opts=o)
        add("type 1", lib, t1, c, x, y)
        add("type 2", lib, t2, f, x, y)
        add("type 3", lib, t3, c, x, y, s, t)
        sq = lambda fn: lambda *a: jnp.sum(jnp.abs(fn(*a)) ** 2)   # noqa: E731
        add("type 1, grad in values", lib, jax.grad(sq(t1), 0), c, x, y)
        add("type 1, grad in points", lib, jax.grad(sq(t1), (1, 2)), c, x, y)
        add("type 2, grad in values", lib, jax.grad(sq(t2), 0), f, x, y)
        add("type 2, grad in points", lib, jax.grad(sq(t2), (1, 2)), f, x, y)
        add("type 3, grad in points", lib, jax.grad(sq(t3), (1, 2, 3, 4)), c, x, y, s, t)
        normal = lambda g, x, y, mod=mod, o=o: mod.nufft1(  # noqa: E731
            shape, mod.nufft2(g, x, y, eps=eps, opts=o, iflag=-1), x, y, eps=eps, opts=o)
        add(f"CG, {cg_iters} iterations", lib,
            lambda b, x, y, normal=normal: cg(lambda g: normal(g, x, y), b, cg_iters), f, x, y)
        for dt, e in (("complex64", 1e-6), ("complex64", 1e-7), ("complex128", 1e-7)):
            real = np.float32 if dt == "complex64" else np.float64
            args = (c.astype(dt), x.astype(real), y.astype(real))
            add(f"type 1, {dt}, eps {e:g}", lib,
                lambda c, x, y, mod=mod, o=o, e=e: mod.nufft1(shape, c, x, y, eps=e, opts=o),
                *args)
    plan = ab_finufft.Plan(shape, np.asarray(x), np.asarray(y), eps=eps,
                           opts=ab_finufft.Opts(nthreads=nthreads))
    add(f"CG, {cg_iters} iterations", "anybind, Plan",
        lambda b: cg(lambda g: plan.nufft1(plan.nufft2(g)), b, cg_iters), f)
    return out


def check(group: dict[str, tuple], case: str) -> None:
    """The routes agree (to eps, relative to the largest entry) before they are timed."""
    names = list(group)
    ref = jax.tree.leaves(group[names[0]][0](*group[names[0]][1]))
    tol = 2e-3 if "CG" in case or "grad" in case or "complex64" in case else 1e-4
    for name in names[1:]:
        got = jax.tree.leaves(group[name][0](*group[name][1]))
        for a, b in zip(got, ref, strict=True):
            a, b = np.asarray(a, np.complex128), np.asarray(b, np.complex128)
            err = np.abs(a - b).max() / np.abs(b).max()
            if err > tol:
                raise AssertionError(f"{case}: {name} differs from {names[0]} by {err:.1e}")


def table(results: dict, threads: str) -> str:
    routes = ["anybind", "jax-finufft", "anybind, Plan"]
    rows = [f"{threads}: ms per call, min (median); ratio of minima anybind ÷ jax-finufft "
            f"(< 1: anybind faster).", "",
            "| case | anybind | jax-finufft | ratio | anybind, Plan |",
            "|---|---:|---:|---:|---:|"]
    for case, r in results.items():
        cell = {k: f"{r[k]['min_us'] / 1e3:,.1f} ({r[k]['median_us'] / 1e3:,.1f})"
                if k in r else "—" for k in routes}
        ratio = (f"{r['anybind']['min_us'] / r['jax-finufft']['min_us']:.2f}"
                 if "jax-finufft" in r else "—")
        rows.append(f"| {case} | {cell['anybind']} | {cell['jax-finufft']} | {ratio} | "
                    f"{cell['anybind, Plan']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--update-readme", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated parts of case names to run")
    args = ap.parse_args()
    n_modes, m, n_targets, repeats, iters = (
        (64, 20_000, 4096, 3, 10) if args.quick else (128, 100_000, 16_384, 7, 20))
    repeats = args.repeats or repeats
    p = problem(n_modes, m, n_targets)
    results, texts = {}, []
    for threads, nthreads in (("one thread", 1), (f"all {os.cpu_count()} cores", 0)):
        results[threads] = {}
        for case, group in cases(p, nthreads, iters).items():
            if args.only and not any(part in case for part in args.only.split(",")):
                continue
            check(group, case)
            thunks = {name: run._thunk(fn, a) for name, (fn, a) in group.items()}
            results[threads][case] = run.measure(thunks, repeats, sample_s=0.05)
            print(f"{threads:>12} | {case:<34}", "  ".join(
                f"{k} {v['min_us'] / 1e3:8.1f} ms" for k, v in results[threads][case].items()),
                flush=True)
        texts.append(table(results[threads], threads))
    versions = {"anybind": "this checkout", "ducc0": __import__("ducc0").__version__,
                "jax": jax.__version__,
                "jax-finufft": getattr(jax_finufft, "__version__", JF_ERROR)}
    header = (f"2-D, {n_modes}² modes, {m:,} points, type 3 to {n_targets:,} targets, eps 1e-6 "
              f"unless a row says otherwise, complex128; {platform.machine()}, "
              f"{os.cpu_count()} cores; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    text = header + "\n\n" + "\n\n".join(texts)
    print("\n" + text)
    if args.quick or args.only:  # a partial run leaves the full run's results alone
        return
    (HERE / "nufft.json").write_text(json.dumps(
        {"header": header, "results": {t: {c: {k: {kk: vv for kk, vv in v.items()
                                                   if kk != "samples_us"}
                                               for k, v in r.items()}
                                           for c, r in rs.items()}
                                       for t, rs in results.items()}}, indent=1))
    if args.update_readme:
        run.update_readme(text, "nufft")


if __name__ == "__main__":
    main()
