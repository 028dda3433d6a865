#!/usr/bin/env python
"""What an op costs to make, use once and drop (issue 9).

    python benchmarks/lifetime.py                 # bind + first call, and churn memory
    python benchmarks/lifetime.py --compare SRC   # the same for another checkout's src/

Timing (round-robin, one sample = one fresh op or function, min and median):

- ``bind``: ``ab.bind(np.sin, shape=ab.like(0))`` with a host jvp and vjp rule;
- ``bind + first eager call``: the same, then one eager call (traces, compiles);
- ``bind + first jit call``: the same, then ``jax.jit(lambda v: op(v))(x)``;
- ``bind + first jit(grad) call``: then ``jax.jit(jax.grad(...))(x)``;
- ``fresh jit(jnp.sin) (reference)``: a new jitted pure-JAX function's first call,
  which is what any rebinding must at least pay (one trace and one compile);
- ``same op, next eager call``: the steady state once the op is compiled.

Churn memory (a fresh subprocess each): N ops made, each called eagerly and
under ``jit(grad)``, then dropped; the growth of the resident set size (after
``gc.collect()`` and glibc's ``malloc_trim``) and of JAX's rule tables.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHURN = r"""
import ctypes, gc, json, sys, time
import numpy as np, jax, jax.numpy as jnp, psutil
from jax._src.interpreters import ad, batching, mlir
import anybind as ab

def make(i):
    op = ab.bind(np.sin, shape=ab.like(0), name=f"churn{i}")
    op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
    op.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
    return op

def tables():
    return sum(map(len, (ad.primitive_jvps, ad.primitive_transposes,
                         batching.fancy_primitive_batchers, mlir._lowerings)))

def rss():
    for _ in range(20):
        gc.collect()
        time.sleep(0.01)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return psutil.Process().memory_info().rss

x = jnp.linspace(0.0, 1.0, 3)
for i in range(5):
    op = make(i); op(x); jax.jit(jax.grad(lambda v: op(v).sum()))(x)
del op
r0 = rss(); t0 = tables(); s = time.perf_counter()
for i in range(int(sys.argv[1])):
    op = make(i)
    op(x).block_until_ready()
    jax.jit(jax.grad(lambda v: op(v).sum()))(x).block_until_ready()
del op
el = time.perf_counter() - s
print(json.dumps(dict(rss_growth_mb=(rss() - r0) / 2**20, table_entries_added=tables() - t0,
                      ops_alive=sum(isinstance(o, ab._api._Op) for o in gc.get_objects()),
                      seconds=el)))
"""


def _op():
    import numpy as np
    import anybind as ab
    op = ab.bind(np.sin, shape=ab.like(0), name="rebound")
    op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
    op.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
    return op


def timing(repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    x = jnp.linspace(0.0, 1.0, 3)
    steady = _op()
    steady(x).block_until_ready()

    def bind():
        _op()

    def eager():
        _op()(x).block_until_ready()

    def jit():
        op = _op()
        jax.jit(lambda v: op(v))(x).block_until_ready()

    def jit_grad():
        op = _op()
        jax.jit(jax.grad(lambda v: op(v).sum()))(x).block_until_ready()

    def reference():
        jax.jit(lambda v: jnp.sin(v))(x).block_until_ready()

    def next_call():
        steady(x).block_until_ready()

    cases = {"bind": bind, "bind + first eager call": eager, "bind + first jit call": jit,
             "bind + first jit(grad) call": jit_grad,
             "fresh jit(jnp.sin), first call (reference)": reference,
             "same op, next eager call": next_call}
    for f in cases.values():
        f()
    samples = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            cases[name]()
            samples[name].append((time.perf_counter() - t0) * 1e3)
        gc.collect()
    return {k: {"min_ms": min(s), "median_ms": statistics.median(s)} for k, s in samples.items()}


def churn(n: int, src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHURN, str(n)], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--churn", type=int, default=400, help="ops made and dropped")
    p.add_argument("--compare", type=Path, help="another checkout's src/, measured the same way")
    p.add_argument("--timing-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.timing_child:  # PYTHONPATH picks the checkout
        print(json.dumps(timing(a.repeats)))
        return
    srcs = {"this checkout": ROOT / "src"}
    if a.compare:
        srcs[str(a.compare)] = a.compare
    res = {}
    for label, src in srcs.items():
        env = {**os.environ, "PYTHONPATH": str(src)}
        out = subprocess.run([sys.executable, __file__, "--timing-child", "--repeats",
                              str(a.repeats)], capture_output=True, text=True, env=env,
                             check=True)
        t = json.loads(out.stdout.strip().splitlines()[-1])
        c = churn(a.churn, src)
        res[label] = {"timing_ms": t, "churn": c}
        print(f"{label}: bind + first call, ms per fresh op (min, median of {a.repeats}):")
        for k, v in t.items():
            print(f"  {k:45s} {v['min_ms']:8.3f} {v['median_ms']:8.3f}")
        print(f"  churn of {a.churn} ops: RSS +{c['rss_growth_mb']:.1f} MiB, rule-table "
              f"entries +{c['table_entries_added']}, ops alive {c['ops_alive']}, "
              f"{c['seconds']:.1f} s")
    (HERE / "lifetime.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
