"""``python -m anybind demo``: real library functions under every JAX transformation.

Binds functions nobody here wrote — SciPy's ``gammaln`` (with traced rules
through ``digamma`` and ``polygamma``, so derivatives of every order),
NumPy's FFT (linear, with its transpose), a SciPy LU solve ``x = A⁻¹b``
(linear in b), NumPy's sort with its integer index output, ducc0's FFT
when ducc0 is installed, JAXbind's three demos (``_demo_jaxbind``), and a
Numba N-body kernel bound as compiled code (no Python in the call) when Numba
is installed — then runs the transformation matrix on each and compares every
result with an independent pure-JAX reference.

Then the recipes against plain JAX reverse mode (``_demo_recipes``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

TRANSFORMS = ("jit", "vmap", "jvp", "grad", "jacfwd", "jacrev", "hessian", "transpose",
              "ab.check")
RTOL = 1e-9


@dataclasses.dataclass
class Case:
    """One bound function, its pure-JAX reference and its example inputs.

    ``f`` is called on ``x`` (jit, vmap over ``xs``, jvp); ``g`` maps the real
    vector ``xr`` to a real array (grad of Σg², jacfwd, jacrev, hessian);
    ``lin`` is linear in ``lin_x`` for linear_transpose.
    """
    name: str
    op: Any
    check_args: tuple
    f: Callable
    f_ref: Callable
    x: Any
    xs: Any
    g: Callable
    g_ref: Callable
    xr: Any
    hessian: bool = True
    lin: Callable | None = None
    lin_ref: Callable | None = None
    lin_x: Any = None


def _rng():
    return np.random.default_rng(0)


def _elementwise(fn, name, **kw):
    return ab.bind(fn, shape=ab.like(0), vmap="expand_dims", name=name, **kw)


def gammaln_case() -> Case:
    """scipy.special.gammaln; jvp rules are traced and call bound digamma/polygamma."""
    import scipy.special as sc
    polygamma = _elementwise(lambda x, *, n: sc.polygamma(n, x), "polygamma")
    polygamma.def_jvp(lambda p, t, *, n: polygamma(p[0], n=n + 1) * t[0], traced=True)
    digamma = _elementwise(sc.digamma, "digamma")
    digamma.def_jvp(lambda p, t: polygamma(p[0], n=1) * t[0], traced=True)
    gammaln = _elementwise(sc.gammaln, "gammaln")
    gammaln.def_jvp(lambda p, t: digamma(p[0]) * t[0], traced=True)
    x = np.linspace(0.5, 6.0, 7)
    ref = jax.scipy.special.gammaln
    return Case("scipy.special.gammaln", gammaln, ((x,), {}), gammaln, ref, x,
                np.stack([x, x + 0.5, 2 * x]), gammaln, ref, x)


def numpy_fft_case() -> Case:
    """numpy.fft.fft: linear; the DFT matrix is symmetric, so its transpose is itself."""
    fft = ab.bind(lambda z: np.fft.fft(z, axis=-1), shape=ab.like(0), linear=True,
                  vmap="expand_dims", name="numpy_fft",
                  transpose=lambda ct: (np.fft.fft(ct, axis=-1),))
    return _fft_case("numpy.fft.fft", fft)


def ducc0_fft_case() -> Case:
    """ducc0.fft.c2c (forward, unnormalised): linear, its own transpose."""
    import ducc0

    def c2c(z):
        return ducc0.fft.c2c(z, axes=(z.ndim - 1,), forward=True)
    fft = ab.bind(c2c, shape=ab.like(0), linear=True, vmap="expand_dims", name="ducc0_c2c",
                  transpose=lambda ct: (c2c(ct),))
    return _fft_case("ducc0.fft.c2c", fft)


def _fft_case(name: str, fft) -> Case:
    r = _rng()
    z = r.normal(size=8) + 1j * r.normal(size=8)
    ri = lambda op: lambda x: jnp.concatenate(
        [jnp.real(op(x.astype(jnp.complex128))), jnp.imag(op(x.astype(jnp.complex128)))])
    return Case(name, fft, ((z,), {}), fft, jnp.fft.fft, z, np.stack([z, 2 * z, 1j * z]),
                ri(fft), ri(jnp.fft.fft), r.normal(size=8),
                lin=fft, lin_ref=jnp.fft.fft, lin_x=z)


def lu_solve_case() -> Case:
    """scipy.linalg.lu_solve x = A⁻¹b, linear in b; the LU factors are keyword operands."""
    import scipy.linalg as sl
    r = _rng()
    a = r.normal(size=(6, 6)) + 6 * np.eye(6)
    lu, piv = sl.lu_factor(a)
    solve = ab.bind(lambda b, *, lu, piv: sl.lu_solve((lu, piv), b), shape=ab.like(0),
                    linear=True, name="lu_solve",
                    transpose=lambda ct, *, lu, piv: (sl.lu_solve((lu, piv), ct, trans=1),))
    kw = {"lu": lu, "piv": piv.astype(np.int32)}
    f = lambda b: solve(b, **kw)
    ref = lambda b: jnp.linalg.solve(jnp.asarray(a), b)
    b = r.normal(size=6)
    return Case("scipy.linalg.lu_solve", solve, ((b,), kw), f, ref, b,
                np.stack([b, 2 * b, b[::-1]]), f, ref, b, lin=f, lin_ref=ref, lin_x=b)


def sort_case() -> Case:
    """numpy.sort with its int64 argsort output; host jvp and vjp (first order)."""
    def fn(x):
        i = np.argsort(x, axis=-1, kind="stable")
        return np.take_along_axis(x, i, axis=-1), i.astype(np.int64)

    def vjp(p, ct):
        out = np.zeros_like(ct[0])
        np.put_along_axis(out, np.argsort(p[0], axis=-1, kind="stable"), ct[0], axis=-1)
        return (out,)

    sort = ab.bind(fn, shape=lambda x: (x, jax.ShapeDtypeStruct(x.shape, np.int64)),
                   vmap="expand_dims", name="sort", vjp=vjp,
                   jvp=lambda p, t: (np.take_along_axis(
                       t[0], np.argsort(p[0], axis=-1, kind="stable"), axis=-1), None))
    ref = lambda x: (jnp.sort(x), jnp.argsort(x, stable=True).astype(jnp.int64))
    x = _rng().normal(size=7)
    return Case("numpy.sort", sort, ((x,), {}), sort, ref, x, np.stack([x, -x, x**3]),
                lambda x: sort(x)[0], jnp.sort, x, hessian=False)


def nbody_case() -> Case:
    """A Numba direct-summation gravity kernel with compiled jvp and vjp (no Python)."""
    from anybind.contrib.nbody import accelerations, accelerations_ref

    rng = _rng()
    x, m = rng.normal(size=(24, 3)), rng.uniform(0.5, 1.5, size=24)
    return Case("numba N-body (compiled)", accelerations, ((x, m), {}),
                lambda x: accelerations(x, m), lambda x: accelerations_ref(x, m), x,
                rng.normal(size=(4, 24, 3)),
                lambda r: accelerations(r.reshape(8, 3), m[:8]).ravel(),
                lambda r: accelerations_ref(r.reshape(8, 3), m[:8]).ravel(),
                rng.normal(size=24), hessian=False)


def cases() -> tuple[list, list]:
    """The demo's cases, and notes on those left out (missing optional libraries)."""
    out, notes = [numpy_fft_case(), sort_case()], []
    if importlib.util.find_spec("scipy") is not None:
        out[:0] = [gammaln_case()]
        out.append(lu_solve_case())
    else:
        notes.append("scipy not installed: scipy.special.gammaln and lu_solve left out")
    if importlib.util.find_spec("ducc0") is not None:
        out.append(ducc0_fft_case())
    else:
        notes.append("ducc0 not installed: ducc0.fft.c2c left out")
    from . import _demo_jaxbind  # JAXbind's three demos, ported
    if importlib.util.find_spec("scipy") is not None:
        out += _demo_jaxbind.cases(Case, _rng)
    else:
        notes.append("scipy not installed: JAXbind's demos left out")
    if importlib.util.find_spec("numba") is not None:
        out.append(nbody_case())
    else:
        notes.append("numba not installed: the compiled N-body kernel left out")
    return out, notes


# --------------------------------------------------------------------- matrix

def _pairs(c: Case) -> dict:
    """transformation -> (anybind function, reference function, arguments).

    Every transformation except ``jit`` itself is also jitted, once, so a cell
    compiles one program and its time is that of the compiled program.
    """
    sq = lambda g: lambda x: jnp.sum(g(x) ** 2)
    t = _rng().normal(size=np.shape(c.x)).astype(np.asarray(c.x).dtype)
    p = {
        "jit": (c.f, c.f_ref, (c.x,)),
        "vmap": (jax.vmap(c.f), jax.vmap(c.f_ref), (c.xs,)),
        "jvp": (lambda x, t: jax.jvp(c.f, (x,), (t,))[1],
                lambda x, t: jax.jvp(c.f_ref, (x,), (t,))[1], (c.x, t)),
        "grad": (jax.grad(sq(c.g)), jax.grad(sq(c.g_ref)), (c.xr,)),
        "jacfwd": (jax.jacfwd(c.g), jax.jacfwd(c.g_ref), (c.xr,)),
        # the reference Jacobian comes from forward mode: independent of reverse mode
        "jacrev": (jax.jacrev(c.g), jax.jacfwd(c.g_ref), (c.xr,)),
    }
    if c.hessian:
        p["hessian"] = (jax.hessian(sq(c.g)), jax.hessian(sq(c.g_ref)), (c.xr,))
    if c.lin is not None:
        y = c.lin_ref(c.lin_x)
        p["transpose"] = (jax.linear_transpose(c.lin, c.lin_x),
                          jax.linear_transpose(c.lin_ref, c.lin_x), (y,))
    return p


def _error(got, want) -> float:
    err = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if b.dtype == jax.dtypes.float0:  # the tangent of an integer output
            continue
        if a.shape != b.shape:
            return float("inf")
        scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
        err = max(err, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    return err


def _timed(fn: Callable, args: tuple) -> tuple:
    """The result of jit(fn)(*args) and the best of three compiled runs."""
    fn = jax.jit(fn)
    out = jax.block_until_ready(fn(*args))  # compiles
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return out, best


def run_case(c: Case) -> list:
    """One result dict per transformation of ``TRANSFORMS``."""
    rows, pairs = [], _pairs(c)
    for name in TRANSFORMS:
        row = {"op": c.name, "transformation": name, "status": "n/a", "error": None,
               "tolerance": RTOL, "time_s": None, "note": ""}
        try:
            if name == "ab.check":
                t0 = time.perf_counter()
                report = ab.check(c.op, *c.check_args[0], **c.check_args[1])
                row["time_s"] = time.perf_counter() - t0
                errs = [r.error / r.tolerance for r in report.rows
                        if r.status == "ok" and r.error is not None and r.tolerance]
                row.update(status="ok", error=max(errs, default=0.0), tolerance=1.0,
                           note=f"{sum(r.status == 'ok' for r in report.rows)} checks; "
                                f"error/tolerance")
            elif name in pairs:
                mine, ref, args = pairs[name]
                got, row["time_s"] = _timed(mine, args)
                row["error"] = _error(got, jax.jit(ref)(*args))
                row["status"] = "ok" if row["error"] <= RTOL else "FAIL"
            else:
                row["note"] = ("host rules give first derivatives" if name == "hessian"
                               else "not a linear op")
        except Exception as e:  # a demo reports every failure and carries on
            row.update(status="FAIL", note=f"{type(e).__name__}: {str(e).splitlines()[0]}")
        rows.append(row)
    return rows


def run(show: Callable[[str], None] | None = print) -> dict:
    """Run the demo; returns the results (as ``--json`` prints them).

    >>> results = run(show=None)  # doctest: +SKIP
    >>> results["ok"]  # doctest: +SKIP
    True
    """
    jax.config.update("jax_enable_x64", True)
    t0 = time.perf_counter()
    cs, notes = cases()
    results = []
    for c in cs:
        results += run_case(c)
    from . import _demo_recipes
    recipes = _demo_recipes.results(_rng, _error)
    ok = all(r["status"] != "FAIL" for r in results + recipes)
    out = {"ok": ok, "elapsed_s": time.perf_counter() - t0, "versions": _versions(),
           "notes": notes, "results": results, "recipes": recipes}
    if show is not None:
        show(format_table(out))
    return out


def _versions() -> dict:
    v = {"jax": jax.__version__, "numpy": np.__version__}
    for mod in ("scipy", "ducc0", "numba"):
        if importlib.util.find_spec(mod) is not None:
            v[mod] = __import__(mod).__version__
    return v


_MARK = {"ok": "✓", "FAIL": "✗", "n/a": "—"}


def format_table(out: dict) -> str:
    """The matrix op × transformation, then one line per result with error and time."""
    res = out["results"]
    ops = list(dict.fromkeys(r["op"] for r in res))
    w = max(len(o) for o in ops)
    lines = ["anybind demo — " + ", ".join(f"{k} {v}" for k, v in out["versions"].items()),
             "", " " * w + "  " + "  ".join(TRANSFORMS)]
    for o in ops:
        marks = {r["transformation"]: _MARK[r["status"]] for r in res if r["op"] == o}
        lines.append(o.ljust(w) + "  " + "  ".join(marks[t].center(len(t)) for t in TRANSFORMS))
    lines += ["", f"{'op'.ljust(w)}  {'transformation':<14}  {'':1}  {'max error':>9}  "
                  f"{'time':>9}  note"]
    for r in res:
        if r["status"] == "n/a":
            continue
        err = "—" if r["error"] is None else f"{r['error']:.1e}"
        tm = "—" if r["time_s"] is None else _ms(r["time_s"])
        lines.append(f"{r['op'].ljust(w)}  {r['transformation']:<14}  {_MARK[r['status']]}  "
                     f"{err:>9}  {tm:>9}  {r['note']}")
    lines += ["", "recipes vs plain JAX reverse mode (temporary memory of the compiled "
                  "programs, XLA's count; peak RSS in benchmarks/README.md):"]
    for r in out.get("recipes", []):
        lines.append(f"  {_MARK[r['status']]} {r['recipe']}: error {r['error']:.1e}, "
                     f"{_mib(r['temp_bytes'])} vs {_mib(r['jax_temp_bytes'])}")
    res = res + out.get("recipes", [])
    n_ok = sum(r["status"] == "ok" for r in res)
    n_bad = sum(r["status"] == "FAIL" for r in res)
    lines += [""] + [f"note: {n}" for n in out["notes"]]
    lines.append(f"{n_ok} results agree with their pure-JAX references (relative error ≤ "
                 f"{RTOL:.0e})" + (f", {n_bad} FAILED" if n_bad else "")
                 + f"; {out['elapsed_s']:.1f} s")
    return "\n".join(lines)


def _mib(b: int) -> str:
    return f"{b / 2**20:.1f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"
