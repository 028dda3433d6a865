#!/usr/bin/env python
"""What "no user code can change a JAX array" costs host code per call.

Input views of XLA's buffers are read-only in a way no flag undoes: on
anybind's FFI handler their base is a read-only lease over an empty bytes
object (the same work per call as before); on XLA's buffer callback each input
view is made over a read-only window on the buffer's address instead of
jaxlib's ``Buffer`` (which gives anyone a writable array). This times a jitted
host op ``y = x`` (one input, one output, float64) at n = 1 and n = 10⁶ on
both routes, with the buffer callback's former views (``Buffer.__array__()``,
then ``setflags(write=False)``, which host code could undo) beside it.

    python benchmarks/readonly_views.py [--repeats 15]

Round-robin over the cases, each sample the mean of a burst of calls of about
20 ms, the minimum over samples reported (noise only adds time), the median
beside it. Results in µs per call.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import jax
import jax.numpy as jnp

import anybind as ab
from anybind.routes import _callback, _pyffi

jax.config.update("jax_enable_x64", True)


def _former_in_views(buffers) -> list:
    views = [b.__array__() for b in buffers]
    for v in views:
        v.setflags(write=False)
    return views


def _case(route: str, n: int):
    """A jitted call on its route (lowered now, while the route is chosen)."""
    def identity(x):
        return x
    op = ab.bind(identity, shape=ab.like(0), name=f"identity_{route}_{n}")
    x = jnp.ones(n)
    _pyffi.enabled = route == "handler"
    saved = _callback._in_views
    if route == "callback, former views":
        _callback._in_views = _former_in_views
    try:
        f = jax.jit(op).lower(x).compile()
    finally:
        _pyffi.enabled = True
    former = route == "callback, former views"

    def call():
        if former:
            _callback._in_views = _former_in_views
        try:
            f(x).block_until_ready()
        finally:
            _callback._in_views = saved
    return call


def _sample(call, ms: float = 20.0) -> float:
    k, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        t = time.perf_counter() - t0
        if t > ms / 1e3:
            return t / k * 1e6
        k *= 2


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    routes = ["handler", "callback", "callback, former views"]
    for n in (1, 10**6):
        cases = {r: _case(r, n) for r in routes}
        for c in cases.values():
            c()
        samples: dict = {r: [] for r in routes}
        gc.disable()
        try:
            for i in range(args.repeats):
                for r in routes[i % 3:] + routes[:i % 3]:
                    samples[r].append(_sample(cases[r]))
        finally:
            gc.enable()
        for r in routes:
            print(f"n = {n:>7}  {r:<24} min {min(samples[r]):8.2f} µs  "
                  f"median {statistics.median(samples[r]):8.2f} µs")


if __name__ == "__main__":
    main()
