#!/usr/bin/env python
"""anybind's benchmark suite (issue 4): every route side by side, in one run.

    python benchmarks/run.py            # the full run (a few minutes on 2 cores)
    python benchmarks/run.py --quick    # fewer repeats, smaller memory test

Each group of routes is timed round-robin: every repeat times each route once,
in an order rotated from one repeat to the next, so that a noisy neighbour
slows all routes alike. A sample is the mean per-call time of a burst of calls
long enough (~``--sample-ms``) to swamp the timer; each call waits on its result
(``block_until_ready``). After warm-up the garbage collector is off while a
group runs. The minimum over samples is the headline figure (the machine is
shared, and noise only ever adds time); the median is reported beside it.

Peak memory is measured in a fresh subprocess per route: the program is
compiled first, the peak resident set size is then reset (``/proc/self/clear_refs``),
the inputs are created and the program runs once; the peak over that span is
compared with the size of the inputs plus the outputs.

Results are printed as tables, written to ``benchmarks/results.json`` and
``benchmarks/results.md``, and with ``--update-readme`` into benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The host routes all run the same NumPy/SciPy code; with BLAS threads of its own
# that code fights XLA's threads for the 2 cores and turns a 0.2 ms matmul into a
# 3 ms one at random. The suite measures the bridge, so BLAS runs on one thread
# unless the environment says otherwise. (Only effective before NumPy is imported.)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import contrib_routes  # noqa: E402
import routes  # noqa: E402
import ffi_routes  # noqa: E402

SIZES = (1, 1_000, 1_000_000)
GRAD1_N = 1_000_000
MEM_N = 50_000_000


# --------------------------------------------------------------------- timing

def _thunk(fn: Callable, args: tuple) -> Callable[[], None]:
    """One call that waits for its result; a bare array skips the pytree walk."""
    if isinstance(fn(*args), jax.Array):
        return lambda: fn(*args).block_until_ready()

    def call():
        for leaf in jax.tree_util.tree_leaves(fn(*args)):
            leaf.block_until_ready()
    return call


def check(cases: routes.Cases, rtol: float = 1e-9) -> None:
    """Every route must agree with the first (native) one before it is timed."""
    names = list(cases)
    ref = jax.tree_util.tree_leaves(cases[names[0]][0](*cases[names[0]][1]))
    for name in names[1:]:
        fn, args = cases[name]
        got = jax.tree_util.tree_leaves(fn(*args))
        for r, g in zip(ref, got, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=rtol, atol=1e-12,
                                       err_msg=f"route {name!r} disagrees with {names[0]!r}")


def measure(thunks: dict[str, Callable[[], None]], repeats: int, sample_s: float,
            warmup_s: float = 0.02) -> dict[str, dict]:
    """Round-robin timing; µs per call for each route: min, median and the samples."""
    inner = {}
    for name, t in thunks.items():
        t()                                   # compile, first-run costs
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < warmup_s or n < 3:
            t()
            n += 1
        per_call = (time.perf_counter() - t0) / n
        inner[name] = max(1, min(10_000, round(sample_s / per_call)))
    samples: dict[str, list[float]] = {name: [] for name in thunks}
    names = list(thunks)
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t, m = thunks[name], inner[name]
                t0 = time.perf_counter_ns()
                for _ in range(m):
                    t()
                samples[name].append((time.perf_counter_ns() - t0) / m / 1e3)
    finally:
        gc.enable()
    return {name: {"min_us": min(s), "median_us": statistics.median(s),
                   "repeats": repeats, "calls_per_sample": inner[name], "samples_us": s}
            for name, s in samples.items()}


def run_group(cases: routes.Cases, repeats: int, sample_s: float,
              extra: dict[str, Callable[[], None]] | None = None) -> dict[str, dict]:
    check(cases)
    thunks = {name: _thunk(fn, args) for name, (fn, args) in cases.items()}
    thunks.update(extra or {})
    return measure(thunks, repeats, sample_s)


# --------------------------------------------------------------------- memory

def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1))


MEM_FORWARD = {
    "NumPy alone (x1*x2**2)": None,
    "native jnp": "native_mul",
    "pure_callback": "pc_mul",
    "buffer_callback": "bc_mul",
    "buffer_callback, np.multiply(out=)": "bc_mul_nt",
    "JAXbind": "jb_mul",
    "anybind": "ab_mul",
    "anybind out=True": "ab_mul_inplace",
    "anybind out=True, np.multiply(out=)": "ab_mul_inplace_nt",
}
MEM_GRAD = {
    "native jnp": "native_mul",
    "custom_vjp+pure_callback": "pc_mul_vjp",
    "custom_vjp+buffer_callback": "bc_mul_vjp",
    "custom_vjp+buffer_callback, np.multiply(out=)": "bc_mul_vjp_nt",
    "JAXbind": "jb_mul",
    "anybind": "ab_mul",
    "anybind def_vjp(out=True)": "ab_mul_vjp_inplace",
    "anybind def_vjp(out=True), np.multiply(out=)": "ab_mul_vjp_inplace_nt",
}


def memory_child(kind: str, attr: str, n: int) -> dict:
    """Runs in a fresh process: peak RSS over creating the inputs and one call."""
    import jax.numpy as jnp
    spec = jax.ShapeDtypeStruct((n,), np.float64)
    make = jax.jit(lambda: routes.mul_inputs((n,))).lower().compile()
    if attr == "None":                        # NumPy by itself, no JAX call
        fn = None
    else:
        f = getattr(routes, attr)
        g = f if kind == "forward" else jax.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1))
        fn = jax.jit(g).lower(spec, spec).compile()
    del jnp
    gc.collect()
    base = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                         # reset the peak (VmHWM) to the current RSS
    if _rss_kib("VmHWM") > base * 1.05:
        raise RuntimeError("could not reset the peak RSS through /proc/self/clear_refs")
    x1, x2 = make()
    if fn is None:
        x1, x2 = np.asarray(x1), np.asarray(x2)
        out = (routes.np_mul(x1, x2),)
    else:
        out = jax.tree_util.tree_leaves(fn(x1, x2))
        for o in out:
            o.block_until_ready()
    peak = _rss_kib("VmHWM")
    arrays = (2 + len(out)) * n * 8
    return {"kind": kind, "n": n, "peak_over_base_bytes": (peak - base) * 1024,
            "inputs_outputs_bytes": arrays, "ratio": (peak - base) * 1024 / arrays}


def memory(n: int, only: set[str] | None = None) -> dict[str, dict]:
    res: dict[str, dict] = {}
    for kind, table in (("forward", MEM_FORWARD), ("grad", MEM_GRAD)):
        for name, attr in table.items():
            if attr and not hasattr(routes, attr):
                continue
            if only is not None and name not in only:
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child",
                   kind, str(attr), str(n)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                res[f"{kind}: {name}"] = {"error": p.stderr.strip().splitlines()[-1:]}
                continue
            res[f"{kind}: {name}"] = json.loads(p.stdout.strip().splitlines()[-1])
    return res


# --------------------------------------------------------------------- tables

def machine() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = re.search(r"model name\s*:\s*(.*)", f.read()).group(1).strip()
    except (OSError, AttributeError):
        pass
    import jaxlib
    import scipy

    import anybind
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "numpy": np.__version__, "scipy": scipy.__version__,
            "anybind": getattr(anybind, "__version__", "?"),
            "jaxbind": getattr(routes.jaxbind, "__version__", None) if routes.jaxbind else None,
            "ducc0": getattr(contrib_routes.ducc0, "__version__", None),
            "jax_backend": jax.default_backend(),
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "cpu_async_dispatch": jax.config.values["jax_cpu_enable_async_dispatch"]}
    try:
        git = ["git", "-C", str(HERE.parent)]
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        info["anybind_commit"] = head + (" + uncommitted changes in src/" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import psutil
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["load_avg"] = os.getloadavg()
    except ImportError:
        pass
    return info


def _fmt(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def sized_tables(title: str, results: dict[int, dict], raw: str) -> str:
    """Routes × sizes: µs (min, median) and min ratios to native and to ``raw``."""
    sizes = list(results)
    names = list(dict.fromkeys(k for r in results.values() for k in r))
    cols = [f"n={n:,}" for n in sizes]

    def val(name, n, key):
        return results[n].get(name, {}).get(key)

    def ratio(name, n, base):
        v, b = val(name, n, "min_us"), val(base, n, "min_us")
        return None if v is None or b is None else v / b
    out = [f"### {title}", "",
           "µs per call, min (median):", "",
           _md(["route"] + cols,
               [[name] + [f"{_fmt(val(name, n, 'min_us'))} ({_fmt(val(name, n, 'median_us'))})"
                          for n in sizes] for name in names]), "",
           f"ratio of mins to native jnp / to {raw}:", "",
           _md(["route"] + cols,
               [[name] + [f"{_fmt(ratio(name, n, 'native jnp'))} / {_fmt(ratio(name, n, raw))}"
                          for n in sizes] for name in names])]
    return "\n".join(out)


def single_table(title: str, res: dict[str, dict], raw: str | None, note: str = "") -> str:
    base = res["native jnp"]["min_us"]
    rawv = res[raw]["min_us"] if raw else None
    hdr = ["route", "min µs", "median µs", "÷ native"] + ([f"÷ {raw}"] if raw else [])
    rows = []
    for name, r in res.items():
        row = [name, _fmt(r["min_us"]), _fmt(r["median_us"]), _fmt(r["min_us"] / base)]
        if raw:
            row.append(_fmt(r["min_us"] / rawv))
        rows.append(row)
    return "\n".join([f"### {title}", ""] + ([note, ""] if note else []) + [_md(hdr, rows)])


def contrib(repeats: int, sample_s: float) -> dict[str, dict]:
    """Each contrib case, forward and jit(grad), anybind and JAXbind round-robin."""
    out: dict[str, dict] = {}
    for label, build in contrib_routes.cases().items():
        out[label] = {kind: run_group(build(grad), repeats, sample_s)
                      for kind, grad in (("forward", False), ("jit(grad)", True))}
    return out


def contrib_table(res: dict[str, dict]) -> str:
    """anybind and JAXbind side by side, µs min (median), and the ratio of the minima."""
    rows = []
    for label, kinds in res.items():
        row = [label]
        for kind in ("forward", "jit(grad)"):
            r = kinds[kind]
            a, j = r["anybind"], r.get("JAXbind")
            row += [f"{_fmt(a['min_us'])} ({_fmt(a['median_us'])})",
                    "–" if j is None else f"{_fmt(j['min_us'])} ({_fmt(j['median_us'])})",
                    "–" if j is None else f"{a['min_us'] / j['min_us']:.2f}"]
        rows.append(row)
    return "\n".join([
        "### anybind.contrib.ducc0 against JAXbind's jaxducc0", "",
        "µs per call, min (median); ratio of minima, anybind ÷ JAXbind (≤ 1: anybind as fast "
        "or faster). jit(grad) is of ‖f(x)‖², so it runs the op and its transpose.", "",
        _md(["op", "forward anybind", "forward JAXbind", "ratio", "jit(grad) anybind",
             "jit(grad) JAXbind", "ratio"], rows)])


def memory_table(res: dict[str, dict], n: int) -> str:
    rows = []
    for name, r in res.items():
        if "error" in r:
            rows.append([name, "error", " ".join(r["error"]), ""])
            continue
        rows.append([name, f"{r['peak_over_base_bytes'] / 2**20:,.0f}",
                     f"{r['inputs_outputs_bytes'] / 2**20:,.0f}", f"{r['ratio']:.2f}"])
    return "\n".join([
        f"### Peak memory, n = {n:,} float64 ({n * 8 / 2**20:,.0f} MiB per array)", "",
        "Peak RSS over creating the inputs and one call, against the inputs' and "
        "outputs' own size (forward: 2 in + 1 out; grad: 2 in + 2 out).", "",
        _md(["route", "peak MiB", "arrays MiB", "peak ÷ arrays"], rows)])


# ----------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few repeats, small memory test")
    p.add_argument("--repeats", type=int, help="samples per route (default 150, quick 20)")
    p.add_argument("--sample-ms", type=float, help="length of one sample in ms (default 1)")
    p.add_argument("--mem-n", type=int, help=f"memory test size (default {MEM_N:,})")
    p.add_argument("--only", help="comma-separated groups: "
                   "calls,grads,grad1,vmap,vmapfft,jacrev,solve,contrib,ffi,devices,memory")
    p.add_argument("--out", default=str(HERE / "results.json"))
    p.add_argument("--update-readme", action="store_true",
                   help="write the tables into benchmarks/README.md")
    p.add_argument("--memory-child", nargs=3, metavar=("KIND", "ROUTE", "N"),
                   help=argparse.SUPPRESS)
    p.add_argument("--async-dispatch", action="store_true",
                   help="keep JAX's asynchronous CPU dispatch (off by default, see README)")
    a = p.parse_args(argv)
    # Every call here waits for its result, so asynchronous dispatch can only add a
    # hand-off to XLA's worker thread, which native programs pay and programs with
    # host callbacks (run synchronously) do not; on a loaded machine that hand-off
    # alone cost native jnp 40-70 µs per call at n = 1000.
    jax.config.update("jax_cpu_enable_async_dispatch", a.async_dispatch)
    if a.memory_child:
        kind, attr, n = a.memory_child
        print(json.dumps(memory_child(kind, attr, int(n))))
        return {}

    repeats = a.repeats or (20 if a.quick else 150)
    sample_s = (a.sample_ms or 1.0) / 1e3
    mem_n = a.mem_n or (5_000_000 if a.quick else MEM_N)
    groups = set(a.only.split(",")) if a.only else {"calls", "grads", "grad1", "vmap",
                                                     "vmapfft", "jacrev", "solve", "contrib",
                                                     "ffi", "devices", "memory"}
    info = machine()
    print("machine:", json.dumps(info))
    print(f"repeats={repeats}, sample≈{sample_s * 1e3:g} ms; min is the headline "
          f"(shared, noisy machine), median beside it\n")
    t_start = time.perf_counter()
    results: dict[str, Any] = {"machine": info, "repeats": repeats, "sample_s": sample_s,
                               "features": {"out=True": routes.HAVE_INPLACE,
                                            "def_fwd/def_bwd": routes.HAVE_FWD_BWD}}
    md: list[str] = []

    def emit(text: str) -> None:
        print(text + "\n", flush=True)
        md.append(text)

    if "calls" in groups:
        res = {n: run_group(routes.calls(n), repeats, sample_s) for n in SIZES}
        results["calls"] = {str(n): r for n, r in res.items()}
        emit(sized_tables("Call overhead under jit: f(x1, x2) = x1·x2², float64", res,
                          "buffer_callback"))
    if "grads" in groups:
        res = {n: run_group(routes.grads(n), repeats, sample_s) for n in SIZES}
        results["grads"] = {str(n): r for n, r in res.items()}
        emit(sized_tables("jit(grad) of sum(f) with respect to x1 and x2", res,
                          "custom_vjp+buffer_callback"))
    if "grad1" in groups:
        res = run_group(routes.grads_first_arg(GRAD1_N), repeats, sample_s)
        results["grad_x1_only"] = res
        emit(single_table(f"jit(grad) of sum(f) with respect to x1 only, n={GRAD1_N:,}", res,
                          "custom_vjp+buffer_callback"))
    if "vmap" in groups:
        loop = routes.numpy_row_loop()
        x1, x2 = (np.asarray(v) for v in routes.mul_inputs((1000, 100)))
        res = run_group(routes.vmaps(), repeats, sample_s,
                        extra={"NumPy row loop, no JAX (reference)": loop,
                               "NumPy whole array, no JAX (reference)":
                                   lambda: routes.np_mul(x1, x2)})
        results["vmap"] = res
        seq = res["anybind sequential"]["min_us"]
        per_row = (seq - res["NumPy row loop, no JAX (reference)"]["min_us"]) / 1000
        results["vmap_sequential_overhead_us_per_row"] = per_row
        note = (f"anybind sequential costs {per_row:.2f} µs per row over the NumPy row loop "
                f"by itself.")
        if "JAXbind (default batching)" in res:
            jb = res["JAXbind (default batching)"]["min_us"]
            results["vmap_jaxbind_us_per_row"] = jb / 1000
            note += f" JAXbind's default batching: {jb / 1000:.2f} µs per row all told."
        emit(single_table("jit(vmap(f)) over 1000×100", res, "buffer_callback broadcast_all",
                          note))
        res = run_group(routes.vmap_grads(), repeats, sample_s)
        results["vmap_grad"] = res
        emit(single_table("jit(vmap(grad(sum f))) over 1000×100", res,
                          "custom_vjp+buffer_callback"))
    if "vmapfft" in groups:
        shape = "×".join(map(str, routes.FFT_SHAPE))
        for loss, title in (("sum", "Σ Re fft2(x) (the transpose alone)"),
                            ("abs2", "Σ |fft2(x)|² (forward and transpose)")):
            res = run_group(routes.vmap_fft_grads(loss), repeats, sample_s)
            results[f"vmap_fft_grad_{loss}"] = res
            emit(single_table(f"jit(grad({title})) under vmap over {routes.FFT_BATCH} "
                              f"arrays of {shape}, complex128", res,
                              "JAXbind func_can_batch=True"
                              if "JAXbind func_can_batch=True" in res else None))
    if "jacrev" in groups:
        res = run_group(routes.jacrevs(), repeats, sample_s)
        results["jacrev"] = res
        emit(single_table("jit(jacrev(tanh(A·x))), 100 → 100 (100 batched VJPs)", res, None))
    if "solve" in groups:
        cases = routes.solves()
        factorisations = {}
        for name, (fn, args) in cases.items():
            routes.LU_COUNT[0] = 0
            jax.block_until_ready(fn(*args))
            factorisations[name] = routes.LU_COUNT[0]
        res = run_group(cases, repeats, sample_s)
        for name, k in factorisations.items():
            res[name]["lu_factor_calls"] = k
        results["solve_value_and_grad"] = res
        note = ("SciPy LU factorisations per call: " + ", ".join(
            f"{name}: {k}" for name, k in factorisations.items() if name != "native jnp")
            + " (native jnp: XLA's LU, once).")
        if not routes.HAVE_FWD_BWD:
            note += " anybind has no def_fwd/def_bwd in this checkout."
        emit(single_table(f"jit(value_and_grad(sum(solve(A, b)))), A {routes.N_LU}×"
                          f"{routes.N_LU}: reusing the LU factorisation", res, None, note))
    if "contrib" in groups and contrib_routes.AVAILABLE:
        res = contrib(repeats, sample_s)
        results["contrib"] = res
        emit(contrib_table(res))
    if "ffi" in groups:
        res = {n: run_group(ffi_routes.calls(n), repeats, sample_s) for n in SIZES}
        scan = run_group(ffi_routes.scans(), repeats, sample_s)
        results["ffi"] = {**{str(n): r for n, r in res.items()}, "scan": scan}
        emit(ffi_routes.table(res, scan))
    if "devices" in groups:  # 8 simulated devices need a process of their own
        proc = subprocess.run([sys.executable, str(HERE / "many_devices.py"), "--json",
                               "--repeats", str(max(3, repeats // 15))],
                              capture_output=True, text=True, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results["devices"] = res
        for title, r in res.items():
            if isinstance(r, dict) and "routes" in r:
                emit(single_table(f"8 devices: {title}", r["routes"], "gathered",
                                  f"one host call on a shard takes "
                                  f"{r['host_call_s']['shard'] / r['host_call_s']['whole']:.2f}"
                                  f"× the time of one on the whole array (1/8 = 0.125)"))
    if "memory" in groups:
        res = memory(mem_n)
        results["memory"] = res
        emit(memory_table(res, mem_n))

    elapsed = time.perf_counter() - t_start
    results["elapsed_s"] = elapsed
    print(f"total {elapsed:.0f} s")
    if not a.quick or a.out != str(HERE / "results.json"):
        Path(a.out).write_text(json.dumps(results, indent=1))
        Path(a.out).with_suffix(".md").write_text(
            _machine_md(info, repeats, sample_s) + "\n\n" + "\n\n".join(md) + "\n")
    if a.update_readme:
        update_readme(_machine_md(info, repeats, sample_s) + "\n\n" + "\n\n".join(md))
    return results


def _machine_md(info: dict, repeats: int, sample_s: float) -> str:
    return (f"Machine: {info['cpu']}, {info['cores']} cores"
            f"{', %s GiB' % info['memory_gib'] if 'memory_gib' in info else ''}; "
            f"Python {info['python']}, jax {info['jax']}, jaxlib {info['jaxlib']}, "
            f"NumPy {info['numpy']}, SciPy {info['scipy']}, JAXbind {info['jaxbind']}, "
            f"ducc0 {info.get('ducc0')}, "
            f"anybind {info['anybind']} (commit {info.get('anybind_commit', '?')}); backend {info['jax_backend']}. "
            f"{repeats} samples of ≈{sample_s * 1e3:g} ms per route, round-robin; BLAS threads "
            f"{info.get('blas_threads')}, CPU async dispatch {info.get('cpu_async_dispatch')}; "
            f"load average at start {tuple(round(x, 1) for x in info.get('load_avg', ()))}.")


def update_readme(text: str, section: str = "results") -> None:
    """Replace what stands between ``<!-- section:start -->`` and ``<!-- section:end -->``."""
    path = HERE / "README.md"
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    doc = path.read_text()
    i, j = doc.index(start) + len(start), doc.index(end)
    path.write_text(doc[:i] + "\n" + text + "\n" + doc[j:])


if __name__ == "__main__":
    main()
