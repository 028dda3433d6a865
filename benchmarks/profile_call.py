#!/usr/bin/env python
"""Where a host call's microseconds go at n = 1: anybind against raw buffer_callback.

    python benchmarks/profile_call.py [--calls 10000]

1. End-to-end µs per jitted call (round-robin, min and median, as in run.py).
2. The Python time spent inside each route's host callback, timed with
   ``perf_counter_ns`` around the callback XLA invokes (raw ``buffer_callback``
   registers it with ``ModuleContext.add_host_callback``, anybind with its FFI
   handler, ``_hostffi.register``; the wrapper is installed at lowering time).
   End-to-end minus this is XLA's dispatch, the custom call and the C or C++
   side of the handler (GIL, arrays or Buffer objects).
3. ``cProfile`` of anybind's callback alone (enabled on entry, disabled on exit),
   top functions by own time, per host call. cProfile inflates every Python
   call by a similar amount, so read it for where, not for how much.
4. The cost of the elementary steps a host callback performs, timed inside a
   live callback on XLA's real buffers.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (first: it sets the BLAS thread count and x64)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402
from jax.experimental.buffer_callback import buffer_callback  # noqa: E402

import routes  # noqa: E402
from anybind.routes import _pyffi as _hostffi  # noqa: E402

_original_add = _mlir.ModuleContext.add_host_callback
_current: dict = {"route": None, "profile": None}
ACC: dict[str, list[int]] = {}
RAW: dict[str, list] = {}  # route -> the callbacks it registered, unwrapped


def _timed(cb):
    """``cb`` wrapped to time (or profile) its calls for the route being compiled."""
    route = _current["route"]
    if route is None:
        return cb
    acc = ACC.setdefault(route, [0, 0])
    RAW.setdefault(route, []).append(cb)
    prof = _current["profile"]

    if prof is None:
        def timed(*a):
            t0 = time.perf_counter_ns()
            try:
                return cb(*a)
            finally:
                acc[0] += 1
                acc[1] += time.perf_counter_ns() - t0
    else:
        def timed(*a):
            prof.enable()
            try:
                return cb(*a)
            finally:
                prof.disable()
    return timed


def _add_host_callback(self, cb):
    if isinstance(cb, _hostffi._Held):  # anybind's handler route: timed at _register
        return _original_add(self, cb)
    return _original_add(self, _timed(cb))


def _register(module_context, cb, *args):
    """anybind's FFI handler route: its callable is ``guarded(ins, outs)``."""
    return _original_register(module_context, _timed(cb), *args)


_mlir.ModuleContext.add_host_callback = _add_host_callback
_original_register = _hostffi.register
_hostffi.register = _register


def _compile(name: str, f, args, profile=None):
    """jit(f), lowered with the timing (or profiling) wrapper around its callbacks."""
    _current.update(route=name, profile=profile)
    try:
        g = jax.jit(lambda *a: f(*a))  # a fresh function: no cached lowering is reused
        jax.block_until_ready(g(*args))
    finally:
        _current.update(route=None, profile=None)
    ACC.setdefault(name, [0, 0])[:] = [0, 0]  # forget the first call
    return g


def step_costs(batches: int = 30, reps: int = 1000) -> dict[str, float]:
    """ns per elementary step, timed inside one live callback on XLA's buffers.

    Each step runs in ``batches`` bursts of ``reps``; the fastest burst counts,
    less the cost of the empty loop.
    """
    out: dict[str, float] = {}
    x = routes.mul_inputs((1,))

    def host(ctx, o, x1, x2):
        def t(label, fn):
            best = float("inf")
            for _ in range(batches):
                t0 = time.perf_counter_ns()
                for _ in range(reps):
                    fn()
                best = min(best, (time.perf_counter_ns() - t0) / reps)
            out[label] = best

        a1, a2, ao = np.asarray(x1), np.asarray(x2), np.asarray(o)
        r = a1 * a2**2
        flat = jax.tree_util.tree_flatten(((1, 2), {}))[1]
        aval = jax.core.ShapedArray((1,), np.float64)

        def seta():
            v = np.asarray(x1)
            v.setflags(write=False)

        t("empty", lambda: None)
        t("np.asarray(Buffer)", lambda: np.asarray(x1))
        t("np.asarray(Buffer) + setflags(write=False)", seta)

        def setb():
            v = x1.__array__()
            v.setflags(write=False)

        t("Buffer.__array__() (what anybind calls)", lambda: x1.__array__())
        t("Buffer.__array__() + setflags(write=False)", setb)
        t("np.asarray(ndarray)", lambda: np.asarray(a1))
        t("the user's NumPy: x1 * x2**2 (n=1)", lambda: a1 * a2**2)
        t("out[...] = r (n=1)", lambda: ao.__setitem__(Ellipsis, r))
        t("r.shape == s and r.dtype == aval.dtype",
          lambda: r.shape == (1,) and r.dtype == aval.dtype)
        t("isinstance(r, (int, float, complex, bool))",
          lambda: isinstance(r, (int, float, complex, bool)))
        t("treedef.unflatten of ((x1, x2), {})", lambda: flat.unflatten([a1, a2]))
        t("a Python call with *args, returning a list", lambda: (lambda *a: [a])(a1, a2))
        base = out.pop("empty")
        for k in out:
            out[k] = max(0.0, out[k] - base)

    jax.jit(lambda a, b: buffer_callback(host, routes.sds(a))(a, b))(*x).block_until_ready()
    return out


def _cell(fn, name):
    """A variable captured by a closure (for peeling the layers of a host callback)."""
    return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents


def _best_ns(fn, batches: int = 200, reps: int = 100) -> float:
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / reps)
    return best


def layers(x) -> list[str]:
    """ns per call of each layer of the forward and the VJP host calls at n = 1.

    The layers are peeled from the callbacks the routes registered at lowering
    (closure variables ``runner`` and ``run``), so the names follow
    ``src/anybind/_hostcall.py`` and ``_impls.py``; if they change, the row says so.
    """
    x1, x2 = (np.asarray(v) for v in x)
    ct = np.ones_like(x1)
    lines = []
    empty = _best_ns(lambda: None)
    for label, route, ins, n_out, user in (
            ("forward", "anybind", (x1, x2), 1, lambda: routes.np_mul(x1, x2)),
            ("vjp", "grad: anybind", (x1, x2, ct), 2, lambda: routes.np_mul_vjp(x1, x2, ct))):
        outs = [np.empty_like(x1) for _ in range(n_out)]
        ins = tuple(a.copy() for a in ins)
        raw = {"buffer_callback" if label == "forward" else "grad: custom_vjp+buffer_callback":
               None, route: None}
        for k in raw:
            cbs = RAW.get(k, [])
            raw[k] = cbs[-1] if cbs else None
        rows = [("the user's NumPy alone", user)]
        bc = raw["buffer_callback" if label == "forward" else "grad: custom_vjp+buffer_callback"]
        if bc is not None:
            rows.append(("raw buffer_callback: its whole callback",
                         lambda bc=bc: bc(None, *ins, *outs)))
        cb = raw[route]
        try:
            # anybind's FFI handler calls guarded(ins, outs); XLA's buffer callback (the
            # fallback) a callback(exec_ctx, *buffers) around it
            guarded = cb if "runner" in cb.__code__.co_freevars else _cell(cb, "guarded")
            runner = _cell(guarded, "runner")
            run_ = _cell(runner, "run")
            rows += [(f"anybind {label}: role adapter run(*ins) (_impls)",
                      lambda: run_(*ins)),
                     (f"anybind {label}: + checks and copy, runner(ins, outs) (_hostcall)",
                      lambda: runner(list(ins), outs)),
                     (f"anybind {label}: + error guard, guarded(ins, outs) (_hostcall)",
                      lambda: guarded(list(ins), outs))]
            if guarded is not cb:
                rows.append((f"anybind {label}: + views, buffer callback (_hostcall)",
                             lambda: cb(None, *ins, *outs)))
        except (TypeError, ValueError, AttributeError) as e:
            rows.append((f"anybind {label}: layers not found ({e})", lambda: None))
        for name, fn in rows:
            lines.append(f"{label:8s} {name:62s} {max(0.0, _best_ns(fn) - empty):7.0f}")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=30)
    a = p.parse_args(argv)
    x = routes.mul_inputs((1,))
    grad = routes._grad_sum
    candidates = {"native jnp": routes.native_mul,
                  "buffer_callback": routes.bc_mul,
                  "JAXbind": getattr(routes, "jb_mul", None),
                  "anybind": routes.ab_mul,
                  "anybind out=True": getattr(routes, "ab_mul_inplace", None),
                  "grad: native jnp": grad(routes.native_mul),
                  "grad: custom_vjp+buffer_callback": grad(routes.bc_mul_vjp),
                  "grad: JAXbind": grad(routes.jb_mul) if routes.jaxbind else None,
                  "grad: anybind": grad(routes.ab_mul)}
    candidates = {k: v for k, v in candidates.items() if v is not None}

    # 1. End to end, plain compilations (no wrapper).
    thunks = {k: run._thunk(jax.jit(f), x) for k, f in candidates.items()}
    e2e = run.measure(thunks, a.repeats, 0.004)
    print("1. µs per jitted call at n=1, min (median):")
    for k, r in e2e.items():
        print(f"   {k:34s} {r['min_us']:7.2f} ({r['median_us']:.2f})")

    # 2. Python time inside each route's callback. JAXbind's C++ handler calls
    #    the user's function without a Python host callback, so it has no row.
    timed = {k: _compile(k, f, x) for k, f in candidates.items()
             if "JAXbind" not in k and "native" not in k}
    inside: dict[str, list[float]] = {k: [] for k in timed}
    per_sample = 50
    for r in range(a.calls // per_sample):
        for k, g in timed.items():
            ACC[k][:] = [0, 0]
            for _ in range(per_sample):
                jax.block_until_ready(g(*x))
            n, ns = ACC[k]
            inside[k].append(ns / n / 1e3)
    print("\n2. Python time inside the host callback(s), µs per jitted call, min (median):")
    for k, s in inside.items():
        tot = e2e[k]["min_us"]
        print(f"   {k:34s} {min(s):6.2f} ({statistics.median(s):.2f});  end-to-end min "
              f"{tot:.2f} → outside ≈ {tot - min(s):.2f}")

    # 3. cProfile of anybind's callbacks, forward and grad.
    for label, f in (("forward", routes.ab_mul), ("grad", grad(routes.ab_mul))):
        prof = cProfile.Profile()
        g = _compile(f"anybind {label} (profiled)", f, x, profile=prof)
        for _ in range(a.calls):
            jax.block_until_ready(g(*x))
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        print(f"\n3. cProfile of anybind's {label} host callback over {a.calls} calls "
              f"({st.total_calls / a.calls:.0f} Python-level calls per host call, "
              f"{st.total_tt / a.calls * 1e6:.2f} µs per host call under the profiler):")
        st.sort_stats("tottime").print_stats(16)
        lines = s.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if "ncalls" in line)
        for line in lines[start:]:
            if line.strip():
                print("   " + line.replace(str(HERE.parent) + "/", ""))

    # 4. Layer by layer, outside XLA.
    print("\n4. Layer by layer, outside XLA: each route's registered callback called "
          "directly on NumPy arrays standing in for XLA's buffers, ns per call (fastest of "
          "200 bursts of 100):")
    for line in layers(x):
        print("   " + line)

    # 5. Elementary steps.
    print("\n5. ns per elementary step, inside a live callback:")
    for k, v in step_costs().items():
        print(f"   {k:44s} {v:7.0f}")


if __name__ == "__main__":
    main()
