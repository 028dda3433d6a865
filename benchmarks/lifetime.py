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

Churn memory (a fresh subprocess per kind: host, traced, compiled under N names
or one name, torch): N ops
made, each used (eagerly, under ``jit(grad)`` and ``vmap``; a torch op forward,
backward and under ``torch.func.vmap``), then dropped; the growth of the resident
set size (after ``gc.collect()`` and glibc's ``malloc_trim``), of Python's heap
per op (tracemalloc), and of JAX's rule tables.
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
import ctypes, gc, json, os, sys, time, tracemalloc
import numpy as np, jax, jax.numpy as jnp, psutil
import anybind as ab
from anybind.core import _lifetime

kind, n = sys.argv[1], int(sys.argv[2])
jax.config.update("jax_enable_x64", True)
x = jnp.linspace(0.0, 1.0, 3)

if kind.startswith("compiled"):  # x1·x2² in C, host derivative rules
    sys.path.insert(0, os.environ["ANYBIND_BENCH_DIR"])
    import ffi_routes
    lib = ctypes.CDLL(str(ffi_routes._build(ffi_routes.C_SOURCE, ".c", os.environ.get("CC", "cc"), [])))
    lib.mul.restype, lib.mul.argtypes = ab.ctypes_signature()

def make(i):
    if kind == "traced":
        return ab.bind(jnp.sin, traced=True, name=f"churn{i}")
    if kind.startswith("compiled"):  # "compiled-one-name": every op bound as "churn"
        op = ab.bind(lib.mul, shape=ab.like(0), name="churn" if kind.endswith("name") else f"churn{i}")
        op.def_jvp(lambda p, t: t[0] * p[1] ** 2 + 2 * p[0] * p[1] * t[1])
        op.def_vjp(lambda p, ct: (ct * p[1] ** 2, 2 * ct * p[0] * p[1]))
        return lambda v: op(v, v)
    op = ab.bind(np.sin, shape=ab.like(0), name=f"churn{i}")
    op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
    op.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
    return op

def use(op):
    if kind == "torch":
        import torch
        t = torch.linspace(0.0, 1.0, 3, dtype=torch.float64, requires_grad=True)
        op.torch(t).sum().backward()
        torch.func.vmap(op.torch)(torch.ones(2, 3, dtype=torch.float64))
        return
    op(x).block_until_ready()
    jax.jit(jax.grad(lambda v: op(v).sum()))(x).block_until_ready()
    jax.vmap(op)(jnp.stack([x, x])).block_until_ready()

def settle():  # collect, and hand freed pages back (glibc)
    for _ in range(20):
        gc.collect()
        time.sleep(0.01)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

for i in range(20):  # JAX's (and torch's) own first-use allocations
    use(make(-1 - i))
settle()
ops_before = sum(isinstance(o, ab.Op) for o in gc.get_objects())  # other modules' own ops
tracemalloc.start(1)
r0, h0, t0 = psutil.Process().memory_info().rss, tracemalloc.get_traced_memory()[0], \
    _lifetime.table_sizes()
s = time.perf_counter()
for i in range(n):
    use(make(i))
el = time.perf_counter() - s
settle()
grown = {k: v - t0[k] for k, v in _lifetime.table_sizes().items()}
print(json.dumps(dict(kind=kind, ops=n, seconds=el,
                      rss_growth_mb=(psutil.Process().memory_info().rss - r0) / 2**20,
                      heap_per_op_bytes=(tracemalloc.get_traced_memory()[0] - h0) / n,
                      table_entries_added=sum(grown.values()),
                      ops_alive=sum(isinstance(o, ab.Op) for o in gc.get_objects()) - ops_before)))
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


KINDS = ("host", "traced", "compiled", "compiled-one-name", "torch")


def churn(kind: str, n: int, src: Path) -> dict:
    """``n`` ops of one kind made, used (eager, ``jit(grad)``, ``vmap``; for ``torch``,
    ``op.torch`` forward, backward and ``torch.func.vmap``) and dropped, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(src), "ANYBIND_BENCH_DIR": str(HERE)}
    out = subprocess.run([sys.executable, "-c", CHURN, kind, str(n)], capture_output=True,
                         text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"churn of {kind} ops failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--churn", type=int, default=2000, help="ops of each kind made and dropped")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
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
        res[label] = {"timing_ms": t, "churn": {}}
        print(f"{label}: bind + first call, ms per fresh op (min, median of {a.repeats}):")
        for k, v in t.items():
            print(f"  {k:45s} {v['min_ms']:8.3f} {v['median_ms']:8.3f}")
        for kind in a.kinds:
            c = res[label]["churn"][kind] = churn(kind, a.churn, src)
            print(f"  churn of {a.churn} {kind} ops: RSS {c['rss_growth_mb']:+.1f} MiB, Python "
                  f"heap {c['heap_per_op_bytes']:+.0f} B per op, rule-table entries "
                  f"+{c['table_entries_added']}, ops alive {c['ops_alive']}, {c['seconds']:.1f} s")
    (HERE / "lifetime.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
