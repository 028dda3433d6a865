#!/usr/bin/env python
"""Per-call cost of Python host code inside a compiled loop: anybind's routes against raw
``buffer_callback`` (issue 10, "call overhead").

    python benchmarks/host_scan.py [--rounds 5] [--repeats 30] [--sample-ms 20]

One jitted ``lax.scan`` of 1000 steps at n = 1 (float64, shape (1,)) calls
f(x1, x2) = x1·x2² at every step, so the time ÷ 1000 is the cost of one host
call inside a program, with no dispatch. The routes, all on the same NumPy
expression and checked against native ``jax.numpy`` first:

- **buffer_callback**: raw ``jax.experimental.buffer_callback`` (``routes.bc_mul``);
- **anybind, handler**: ``routes.ab_mul`` through anybind's FFI handler
  (``_hostffi``, target ``anybind_python``), its CPU route where the handler is built;
- **anybind, buffer callback**: the same op lowered with the handler switched off
  (``_hostffi.enabled = False``), the route it took before and takes without a C
  compiler;
- **anybind out=True, handler**: the in-place form (``routes.ab_mul_inplace``);
- **handler, bare callable**: the handler calling ``outs[0][...] = ins[0] * ins[1]**2``
  with none of anybind's checks, the floor of the route.

Each round times every route round-robin (``run.measure``); the ratios to
``buffer_callback`` are taken per round, of the minima and of the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (first: it sets the BLAS thread count and x64)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import routes  # noqa: E402
from anybind.routes import _pyffi as _hostffi  # noqa: E402

STEPS = 1000
BASE = "buffer_callback"


def _bare(x1, x2):
    """The handler on a callable of its own: the cost of the route without anybind's runner."""
    sig = _hostffi.signature([routes.sds(x1), routes.sds(x2)], [routes.sds(x1)])
    key = _hostffi.register(_BARE_HOLDER, _bare_host, sig, "the bare callable")
    return jax.ffi.ffi_call(_hostffi.TARGET, routes.sds(x1))(
        x1, x2, **{_hostffi.ATTRIBUTE: np.int64(key)})


def _bare_host(ins, outs):
    outs[0][...] = ins[0] * ins[1]**2


class _Holder:  # stands in for the module context: holds what the handler may call
    def __init__(self):
        self.kept = []

    def add_host_callback(self, cb):
        self.kept.append(cb)


_BARE_HOLDER = _Holder()


def _scan(f, x1, x2, handler: bool = True):
    """jit(scan of f), compiled now with the handler on or off."""
    def body(a, b):
        return jax.lax.scan(lambda c, _: (f(c, b), None), a, None, length=STEPS)[0]
    prev, _hostffi.enabled = _hostffi.enabled, handler
    try:
        return jax.jit(body).lower(x1, x2).compile()
    finally:
        _hostffi.enabled = prev


def cases() -> routes.Cases:
    x1, _ = routes.mul_inputs((1,))
    x2 = jnp.ones_like(x1)  # keeps the carry finite over 1000 steps
    args = (x1, x2)
    out = {"native jnp": (_scan(routes.native_mul, *args), args),
           BASE: (_scan(routes.bc_mul, *args), args)}
    if _hostffi.handler() is not None:
        out["anybind, handler"] = (_scan(routes.ab_mul, *args), args)
    out["anybind, buffer callback"] = (_scan(routes.ab_mul, *args, handler=False), args)
    if _hostffi.handler() is not None:
        if getattr(routes, "ab_mul_inplace", None) is not None:
            out["anybind out=True, handler"] = (_scan(routes.ab_mul_inplace, *args), args)
        out["handler, bare callable"] = (_scan(_bare, *args), args)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--sample-ms", type=float, default=20.0)
    a = p.parse_args(argv)
    cs = cases()
    run.check(cs)
    cs.pop("native jnp")  # 9 ns a step: no host call to compare
    thunks = {name: run._thunk(fn, args) for name, (fn, args) in cs.items()}
    rounds = []
    for r in range(a.rounds):
        load = os.getloadavg()[0]
        res = run.measure(thunks, a.repeats, a.sample_ms / 1e3)
        rounds.append((load, res))
        print(f"round {r + 1}, load {load:.2f}: " + ", ".join(
            f"{k} {v['min_us'] / STEPS:.3f} ({v['median_us'] / STEPS:.3f})"
            for k, v in res.items()), flush=True)
    info = run.machine()
    print(f"\n{info['cpu']}, {info['cores']} cores, jax {info['jax']}, load "
          f"{min(l for l, _ in rounds):.2f}–{max(l for l, _ in rounds):.2f}; "
          f"{a.rounds} rounds × {a.repeats} repeats\n")
    print("| route | µs per step, min (median of medians) | ÷ buffer_callback, min: best "
          "(median) of rounds | ÷ buffer_callback, median: best (median) of rounds |")
    print("|---|---:|---:|---:|")
    summary = {}
    for name in thunks:
        mins = [res[name]["min_us"] / res[BASE]["min_us"] for _, res in rounds]
        meds = [res[name]["median_us"] / res[BASE]["median_us"] for _, res in rounds]
        per = min(res[name]["min_us"] for _, res in rounds) / STEPS
        med = statistics.median(res[name]["median_us"] for _, res in rounds) / STEPS
        summary[name] = {"min_us": per, "median_us": med, "ratio_of_mins": mins,
                         "ratio_of_medians": meds}
        print(f"| {name} | {per:.3f} ({med:.3f}) | {min(mins):.3f} "
              f"({statistics.median(mins):.3f}) | {min(meds):.3f} "
              f"({statistics.median(meds):.3f}) |")
    return summary


if __name__ == "__main__":
    main()
