#!/usr/bin/env python
"""The recipes' memory and time against plain JAX, side by side in one run.

    python benchmarks/recipes.py                 # all groups (~5–10 minutes on 2 cores)
    python benchmarks/recipes.py --only loop     # nbody, loop, residuals
    python benchmarks/recipes.py --nbody-n 4096  # smaller direct-summation runs

Groups:

- ``nbody``: gravitational forces by chunked direct summation (a scan over
  chunks of rows, float32 as in the guide), the gradient of Σ|F|² with respect
  to the positions: ``ab.bind(direct_forces, traced=True, symmetric=True)``
  (reverse mode runs the forces' jvp) against plain JAX reverse mode (which
  keeps every chunk's residuals) and JAX's forward mode (one jvp) for scale.
- ``loop``: ``ab.reversible_loop`` against ``lax.fori_loop`` and ``lax.scan``,
  ``jit(grad)`` for 10, 100 and 1000 steps of a 256×256 float64 state.
- ``residuals``: the guide's f(x, y) = sin(x)·cos(x)·y² as host ``def_fwd`` /
  ``def_bwd`` pairs that save (x, y) and recompute sin and cos, or save
  (sin x, cos x, y): ``jit(value_and_grad)`` at n = 2²⁴ float64.

Each route reports the compiled program's temporary memory
(``compiled.memory_analysis().temp_size_in_bytes``) and, in a fresh process
per route, the peak resident set size over the process's size before its
inputs were made (``/proc/self/clear_refs`` resets the peak after compiling),
and the best of a few timed runs (each waits for its result). Results go to
``benchmarks/recipes.json``; ``--update-readme`` writes the tables into
benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import anybind as ab  # noqa: E402
from anybind.cli._demo_recipes import direct_forces, forces  # noqa: E402

HERE = Path(__file__).resolve().parent
PAIRS_PER_CHUNK = 2**22  # chunk rows × N: one chunk's N×chunk×3 float32 array is 48 MiB


# ----------------------------------------------------------------- the routes

def nbody_route(route: str, n: int):
    """(function of x, inputs) for one route of the direct-summation gradient."""
    chunk = min(n, PAIRS_PER_CHUNK // n)
    x = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    if route == "JAX forward mode (one jvp, for scale)":
        return (lambda x: jax.jvp(lambda x: direct_forces(x, chunk=chunk), (x,), (x,))[1]), (x,)
    f = forces if route.startswith("anybind") else direct_forces
    return jax.grad(lambda x: jnp.sum(f(x, chunk=chunk) ** 2)), (x,)


NBODY_ROUTES = ("anybind symmetric=True", "JAX reverse mode",
                "JAX forward mode (one jvp, for scale)")


def _step(i, s):
    q, p = s
    p = p - 0.01 * jnp.sin(q)
    return q + 0.01 * p, p


def _unstep(i, s):
    q, p = s
    q = q - 0.01 * p
    return q, p + 0.01 * jnp.sin(q)


def loop_route(route: str, steps: int):
    q = np.random.default_rng(0).normal(size=(256, 256))
    if route == "ab.reversible_loop":
        loop = lambda s: ab.reversible_loop(_step, _unstep, s, steps)
    elif route == "lax.fori_loop":
        loop = lambda s: lax.fori_loop(0, steps, _step, s)
    else:
        loop = lambda s: lax.scan(lambda c, i: (_step(i, c), None), s, jnp.arange(steps))[0]
    return jax.grad(lambda q: jnp.sum(loop((q, q))[0] ** 2)), (q,)


LOOP_ROUTES = ("ab.reversible_loop", "lax.fori_loop", "lax.scan")


def sincos_ops():
    """The guide's f(x, y) = sin(x)·cos(x)·y², two ways of keeping residuals."""
    def f(x, y):
        return np.sin(x) * np.cos(x) * y**2

    def grads(sx, cx, y, ct):
        return ct * (cx**2 - sx**2) * y**2, ct * 2 * sx * cx * y

    save_x = ab.bind(f, shape=ab.like(0), vmap="vectorized", name="sincos_save_x")
    save_x.def_fwd(lambda x, y: (f(x, y), (x, y)), residuals=lambda x, y: (x, y))
    save_x.def_bwd(lambda r, ct: grads(np.sin(r[0]), np.cos(r[0]), r[1], ct))

    save_sc = ab.bind(f, shape=ab.like(0), vmap="vectorized", name="sincos_save_sc")

    @save_sc.def_fwd(residuals=lambda x, y: (x, x, y))
    def _(x, y):
        sx, cx = np.sin(x), np.cos(x)
        return sx * cx * y**2, (sx, cx, y)
    save_sc.def_bwd(lambda r, ct: grads(*r, ct))
    return {"save x, recompute sin/cos": save_x, "save sin x, cos x": save_sc}


def residual_route(route: str, n: int):
    op = sincos_ops()[route]
    r = np.random.default_rng(0)
    x, y = r.normal(size=n), r.normal(size=n)
    return jax.value_and_grad(lambda x, y: jnp.sum(op(x, y)), argnums=(0, 1)), (x, y)


RESIDUAL_ROUTES = ("save x, recompute sin/cos", "save sin x, cos x")
ROUTES = {"nbody": (nbody_route, NBODY_ROUTES), "loop": (loop_route, LOOP_ROUTES),
          "residuals": (residual_route, RESIDUAL_ROUTES)}


# -------------------------------------------------------------- measurement

def _kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+)", fh.read()).group(1))


def child(group: str, route: str, size: int, repeats: int) -> dict:
    """In a fresh process: compile, reset the peak RSS, make inputs, run; then time."""
    make, _ = ROUTES[group]
    fn, args = make(route, size)
    compiled = jax.jit(fn).lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    base = _kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    dev = [jax.device_put(a) for a in args]
    jax.block_until_ready(compiled(*dev))
    peak = (_kib("VmHWM") - base) * 1024
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*dev))
        times.append(time.perf_counter() - t0)
    return {"temp_bytes": temp, "peak_rss_bytes": peak, "time_s": min(times),
            "times_s": times}


def measure(group: str, sizes, repeats: int) -> dict:
    out = {}
    for size in sizes:
        for route in ROUTES[group][1]:
            cmd = [sys.executable, __file__, "--child", group, route, str(size), str(repeats)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            key = f"{route} @ {size}"
            if p.returncode != 0:
                out[key] = {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
            else:
                out[key] = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"  {group}: {key}: {out[key]}", file=sys.stderr, flush=True)
    return out


def check_gradients(n: int = 1024) -> dict:
    """Each recipe's gradient against plain JAX's, at a size that runs in seconds."""
    errs = {}
    for group, size, routes in (("nbody", n, NBODY_ROUTES[:2]), ("loop", 20, LOOP_ROUTES[:2]),
                                ("residuals", 1000, RESIDUAL_ROUTES)):
        make = ROUTES[group][0]
        vals = [jax.jit(make(r, size)[0])(*make(r, size)[1]) for r in routes]
        a, b = (np.concatenate([np.ravel(l) for l in jax.tree_util.tree_leaves(v)])
                for v in vals)
        errs[group] = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    return errs


# ------------------------------------------------------------------ reports

def _mib(b) -> str:
    return f"{b / 2**20:,.1f} MiB" if b >= 2**20 else f"{b / 2**10:,.1f} KiB"


def table(group: str, res: dict, sizes, size_name: str) -> str:
    routes = ROUTES[group][1]
    lines = [f"| {size_name} | route | compiled temp | peak RSS over base | time (best) |",
             "|---:|---|---:|---:|---:|"]
    for size in sizes:
        for route in routes:
            r = res.get(f"{route} @ {size}", {})
            if "error" in r or not r:
                lines.append(f"| {size:,} | {route} | failed: {r.get('error', '?')} | | |")
                continue
            lines.append(f"| {size:,} | {route} | {_mib(r['temp_bytes'])} | "
                         f"{_mib(r['peak_rss_bytes'])} | {r['time_s'] * 1e3:,.1f} ms |")
    return "\n".join(lines)


def ratios(group: str, res: dict, sizes, mine: str, ref: str) -> list[str]:
    out = []
    for size in sizes:
        a, b = res.get(f"{mine} @ {size}", {}), res.get(f"{ref} @ {size}", {})
        if "temp_bytes" in a and "temp_bytes" in b:
            out.append(f"{size:,}: {ref} / {mine}: compiled temp "
                       f"{b['temp_bytes'] / max(a['temp_bytes'], 1):,.1f}×, peak RSS "
                       f"{b['peak_rss_bytes'] / max(a['peak_rss_bytes'], 1):,.1f}×, time "
                       f"{b['time_s'] / a['time_s']:.2f}×")
    return out


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = re.search(r"model name\s*:\s*(.*)", fh.read()).group(1).strip()
    except (OSError, AttributeError):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB; jax {jax.__version__}, "
            f"NumPy {np.__version__}; load average at start "
            f"{', '.join(f'{l:.1f}' for l in os.getloadavg())}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="nbody,loop,residuals")
    p.add_argument("--nbody-n", default="4096,8192")
    p.add_argument("--steps", default="10,100,1000")
    p.add_argument("--residual-n", type=int, default=2**24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--update-readme", action="store_true")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        group, route, size, repeats = a.child
        print(json.dumps(child(group, route, int(size), int(repeats))))
        return 0
    only = set(a.only.split(","))
    sizes = {"nbody": [int(s) for s in a.nbody_n.split(",")],
             "loop": [int(s) for s in a.steps.split(",")], "residuals": [a.residual_n]}
    res = {"machine": machine(), "gradient_errors": check_gradients()}
    print("gradients vs plain JAX (max relative error):", res["gradient_errors"])
    md = [f"Machine: {res['machine']}.", "",
          "Gradients agree with plain JAX's (max relative error, small sizes): "
          + ", ".join(f"{k} {v:.1e}" for k, v in res["gradient_errors"].items()) + "."]
    spec = {"nbody": ("N", "anybind symmetric=True", "JAX reverse mode",
                      "Direct-summation forces, grad of Σ|F|² (float32)"),
            "loop": ("steps", "ab.reversible_loop", "lax.fori_loop",
                     "Reversible loop, jit(grad), 256×256 float64 state"),
            "residuals": ("n", "save x, recompute sin/cos", "save sin x, cos x",
                          "def_fwd/def_bwd residual choices, jit(value_and_grad) (float64)")}
    for group in ("nbody", "loop", "residuals"):
        if group not in only:
            continue
        res[group] = measure(group, sizes[group], a.repeats)
        size_name, mine, ref, title = spec[group]
        md += ["", f"### {title}", "", table(group, res[group], sizes[group], size_name), ""]
        md += [f"- {r}" for r in ratios(group, res[group], sizes[group], mine, ref)]
    text = "\n".join(md)
    print(text)
    (HERE / "recipes.json").write_text(json.dumps(res, indent=1))
    if a.update_readme:
        readme = HERE / "README.md"
        body = readme.read_text()
        start, end = "<!-- recipes:start -->", "<!-- recipes:end -->"
        new = f"{start}\n{text}\n{end}"
        body = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda m: new, body,
                      flags=re.S) if start in body else body.rstrip() + "\n\n" + new + "\n"
        readme.write_text(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
