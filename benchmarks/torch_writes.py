"""What keeping torch code's writes out of XLA's buffers costs per ``from_torch`` call.

Candidates, on f(x) = sin(x)·2 (it writes nothing, so each candidate's cost is its
overhead alone), eager and jitted, at n = 1, 10³, 10⁶ float64:

- ``views``: tensors over XLA's buffers, no check (the floor; a write lands);
- ``views + version counters``: the same, then each input's version counter read
  (O(1)); finds an in-place write only after it landed, and never a ``.numpy()``,
  ``data_ptr()`` or kept-tensor write;
- ``copies``: every input a private copy (what ``from_torch`` does): no write by
  any path reaches XLA's buffer.

Run: ``python benchmarks/torch_writes.py`` (prints a table; CPU µs per call (``time.process_time``:
every thread, not the waits of a busy machine), the best of
``ROUNDS`` rounds that interleave the candidates).
"""
import time

import jax
import jax.numpy as jnp
import torch

import anybind as ab
from anybind.torch import _torch, _torch_engine


def timer(f, x, reps):
    """A function that times ``reps`` calls, in µs per call (after a warm-up)."""
    for _ in range(10):
        jax.block_until_ready(f(x))

    def once():
        t = time.process_time()
        for _ in range(reps):
            r = f(x)
        jax.block_until_ready(r)
        return (time.process_time() - t) / reps * 1e6
    return once


ROUNDS = 8


def views(a):
    return _torch_engine.as_tensor(a)


def main():
    jax.config.update("jax_enable_x64", True)
    copy = _torch_engine._private
    checked = []

    def versioned(a):
        t = views(a)
        checked.append(t)
        return t

    def fn(x):
        out = torch.sin(x) * 2
        while checked:
            _torch.version_of(checked.pop())
        return out
    candidates = (("views", views), ("views + version counters", versioned),
                  ("copies", copy))
    timers = {}
    for name, make in candidates:
        _torch_engine._private = make
        try:
            for n in (1, 1000, 1_000_000):
                op = ab.from_torch(fn, name="sin2", mode="call")
                x = jnp.ones(n)
                reps = 500 if n < 10**5 else 20
                timers[name, n] = (make, timer(op, x, reps), timer(jax.jit(op), x, reps))
        finally:
            _torch_engine._private = copy
    best = {k: [float("inf"), float("inf")] for k in timers}
    for _ in range(ROUNDS):  # rounds interleave the candidates: a busy moment hits all
        for key, (make, eager, jitted) in timers.items():
            _torch_engine._private = make
            try:
                best[key] = [min(best[key][0], eager()), min(best[key][1], jitted())]
            finally:
                _torch_engine._private = copy
    rows = [(name, n, *best[name, n]) for name, n in timers]
    print(f"torch {torch.__version__}, jax {jax.__version__}")
    print("| candidate | n | eager µs | jit µs |\n|---|---|---|---|")
    for name, n, e, j in rows:
        print(f"| {name} | {n} | {e:.1f} | {j:.1f} |")


if __name__ == "__main__":
    main()
