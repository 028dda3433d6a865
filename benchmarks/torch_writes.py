"""What keeping torch code's writes out of XLA's buffers costs per ``from_torch`` call.

Candidates, on f(x) = sin(x)·2 (it writes nothing, so each candidate's cost is its
overhead alone), eager and jitted, at n = 1, 10³, 10⁶ float64:

- ``views``: tensors over XLA's buffers, no check (the floor; a write lands);
- ``views + version counters``: the same, then each input's version counter read
  (O(1)); finds an in-place write only after it landed, and never a ``.numpy()``,
  ``data_ptr()`` or kept-tensor write;
- ``copies``: every input a private copy (what ``from_torch`` does): no write by
  any path reaches XLA's buffer.

Run: ``python benchmarks/torch_writes.py`` (prints a table; µs per call, best of 5).
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import anybind as ab
from anybind.torch import _torch, _torch_engine


def best(f, x, reps):
    for _ in range(10):
        jax.block_until_ready(f(x))
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            r = f(x)
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t) / reps * 1e6)
    return min(out)


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
    rows = []
    for name, make in (("views", views), ("views + version counters", versioned),
                       ("copies", copy)):
        _torch_engine._private = make
        try:
            for n in (1, 1000, 1_000_000):
                op = ab.from_torch(fn, name="sin2")
                x = jnp.ones(n)
                reps = 2000 if n < 10**5 else 50
                rows.append((name, n, best(op, x, reps), best(jax.jit(op), x, reps)))
        finally:
            _torch_engine._private = copy
    print(f"torch {torch.__version__}, jax {jax.__version__}")
    print("| candidate | n | eager µs | jit µs |\n|---|---|---|---|")
    for name, n, e, j in rows:
        print(f"| {name} | {n} | {e:.1f} | {j:.1f} |")


if __name__ == "__main__":
    main()
