#!/usr/bin/env python
"""Many devices: an op per shard (``shard=``) vs today's gathered call vs native jnp.

    python benchmarks/many_devices.py [--repeats N] [--rows K]

Runs on 8 simulated CPU devices (``--xla_force_host_platform_device_count=8``,
set here before JAX starts; ``run.py --only devices`` starts this script).
Inputs are sharded by rows over the 8 devices. Each pair of routes runs the
same host code and rules, bound with and without ``shard=``: with it each
device runs the host code on its shard; without it the input is gathered and
every device runs the whole array. Besides wall time per call, the host code
times itself: the per-call time of one shard should be 1/8 of a whole call.
Timing is round-robin (``run.measure``), one interleaved run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import run  # noqa: E402  (sets x64, imports jax)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import anybind as ab  # noqa: E402


class Clock:
    """Start and end of each host call, per route."""

    def __init__(self):
        self.lock, self.spans = threading.Lock(), {}

    def timed(self, name, fn):
        def f(*args, **kw):
            t0 = time.perf_counter()
            out = fn(*args, **kw)
            with self.lock:
                self.spans.setdefault(name, []).append((t0, time.perf_counter()))
            return out
        f.__wrapped__ = fn
        return f

    def median(self, name) -> float:
        return float(np.median([b - a for a, b in self.spans.get(name, [(0, np.nan)])]))

    def overlap(self, name) -> float:
        """Mean number of calls in flight while any is: 1 if they ran one at a time."""
        spans = sorted(self.spans.get(name, []))
        busy, end = 0.0, -np.inf
        for a, b in spans:  # length of the union of the spans
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        return sum(b - a for a, b in spans) / busy if busy else float("nan")


CLOCK = Clock()


def fft_ops():
    import ducc0

    def make(shard: bool):
        tag = "shard" if shard else "whole"
        fn = CLOCK.timed(f"c2c {tag}", lambda x: ducc0.fft.c2c(x, axes=(x.ndim - 1,)))
        opts = dict(shard="b n -> b n", replicated=("n",)) if shard else {}
        return ab.bind(fn, shape=ab.like(0), linear=True, vmap="vectorized",
                       transpose=lambda ct: (fn(ct),), name=f"c2c_{tag}", **opts)
    return make(True), make(False)


def gammaln_ops():
    from scipy import special

    def make(shard: bool):
        tag = "shard" if shard else "whole"
        fn = CLOCK.timed(f"gammaln {tag}", special.gammaln)
        d = CLOCK.timed(f"gammaln vjp {tag}", lambda p, ct: (special.digamma(p[0]) * ct,))
        return ab.bind(fn, shape=ab.like(0), vmap="vectorized", vjp=d,
                       jvp=lambda p, t: special.digamma(p[0]) * t[0],
                       shard="elementwise" if shard else None, name=f"gammaln_{tag}")
    return make(True), make(False)


def loop(fn, x):
    """The reference for concurrency: the 8 shards' host calls one after another, no JAX."""
    shards = [np.asarray(s.data) for s in x.addressable_shards]
    return lambda: [fn(s) for s in shards]


def cases(rows: int, elements: int):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))
    r = np.random.default_rng(0)
    z = put(r.normal(size=(8 * rows, 1024)) + 1j * r.normal(size=(8 * rows, 1024)))
    x = put(r.uniform(0.5, 5.0, size=(elements,)))
    c_shard, c_whole = fft_ops()
    g_shard, g_whole = gammaln_ops()
    power = lambda f: (lambda a: jnp.sum(jnp.abs(f(a)) ** 2))
    total = lambda f: (lambda a: jnp.sum(f(a)))
    fft_jnp = lambda a: jnp.fft.fft(a, axis=-1)
    return [
        (f"ducc0 c2c over rows, ({8 * rows}, 1024) complex128", {
            "per shard": (jax.jit(c_shard), (z,)), "gathered": (jax.jit(c_whole), (z,)),
            "native jnp": (jax.jit(fft_jnp), (z,))}, "c2c",
         loop(c_shard.fn.__wrapped__, z)),
        ("jit(grad) of sum |c2c|²", {
            "per shard": (jax.jit(jax.grad(power(c_shard))), (z,)),
            "gathered": (jax.jit(jax.grad(power(c_whole))), (z,)),
            "native jnp": (jax.jit(jax.grad(power(fft_jnp))), (z,))}, "c2c", None),
        (f"scipy.special.gammaln, {elements:.0e} float64", {
            "per shard": (jax.jit(g_shard), (x,)), "gathered": (jax.jit(g_whole), (x,)),
            "native jnp": (jax.jit(jax.scipy.special.gammaln), (x,))}, "gammaln",
         loop(g_shard.fn.__wrapped__, x)),
        ("jit(grad) of sum gammaln", {
            "per shard": (jax.jit(jax.grad(total(g_shard))), (x,)),
            "gathered": (jax.jit(jax.grad(total(g_whole))), (x,)),
            "native jnp": (jax.jit(jax.grad(total(jax.scipy.special.gammaln))), (x,))},
         "gammaln vjp", None)]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rows", type=int, default=512, help="rows per device of the FFT input")
    p.add_argument("--elements", type=int, default=10_000_000, help="gammaln's input size")
    p.add_argument("--json", action="store_true", help="print the results as JSON only")
    a = p.parse_args(argv)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    out, md = {"devices": jax.device_count(), "machine": run.machine()}, []
    for title, group, key, reference in cases(a.rows, a.elements):
        run.check({k: group[k] for k in ("native jnp", "per shard", "gathered")}, rtol=1e-6)
        thunks = {k: run._thunk(*v) for k, v in group.items()}
        if reference is not None:
            thunks["8 shards one after another, no JAX (reference)"] = reference
        CLOCK.spans.clear()
        res = run.measure(thunks, a.repeats, 0.0)
        host = {tag: CLOCK.median(f"{key} {tag}") for tag in ("shard", "whole")}
        speed = res["gathered"]["min_us"] / res["per shard"]["min_us"]
        overlap = CLOCK.overlap(f"{key} shard")
        note = (f"per shard {speed:.1f}× faster than gathered; one host call on a shard "
                f"takes {host['shard'] * 1e3:.1f} ms, on the whole array "
                f"{host['whole'] * 1e3:.1f} ms ({host['shard'] / host['whole']:.2f}×, 1/8 = "
                f"0.125); {overlap:.1f} per-shard calls in flight on average")
        out[title] = {"routes": {k: {m: v[m] for m in ("min_us", "median_us")}
                                 for k, v in res.items()},
                      "host_call_s": host, "speedup_vs_gathered": speed,
                      "calls_in_flight": overlap}
        md.append(run.single_table(title, res, None, note))
    if a.json:
        print(json.dumps(out))
    else:
        print("\n\n".join(md))
    return out


if __name__ == "__main__":
    sys.exit(main() and 0)
