"""Command line: ``python -m anybind demo``."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import anybind as ab

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["demo"]:
        print("usage: python -m anybind demo")
        return 2
    mul = ab.bind(lambda a, b: a * b**2, shape=ab.like(0), vmap="vectorized", name="mul",
                  jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
                  vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct))
    a, b = jnp.linspace(0.5, 1.5, 4), jnp.linspace(1.0, 2.0, 4)
    g = jax.jit(jax.grad(lambda a, b: mul(a, b).sum(), argnums=(0, 1)))(a, b)
    err = max(float(jnp.abs(g[0] - b**2).max()), float(jnp.abs(g[1] - 2 * a * b).max()))
    print(f"mul: jit(grad) max error {err:.1e}")
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
