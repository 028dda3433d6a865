"""The recipes in ``python -m anybind demo``, each against plain JAX reverse mode.

=====================  =============================================================
recipe                 what the demo runs
=====================  =============================================================
``symmetric=True``     gravitational forces by chunked direct summation (a scan),
                       grad of Σ|F|²: reverse mode runs the forces' jvp instead of
                       keeping every chunk's residuals
``reversible_loop``    grad through 1000 steps of a reversible pendulum step,
                       states rebuilt backwards instead of stored
=====================  =============================================================

Each reports the gradient's error against plain JAX's and both compiled
programs' temporary memory. ``benchmarks/recipes.py`` measures the same at
larger sizes, with peak RSS and time.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import anybind as ab


def direct_forces(x, *, chunk: int, eps: float = 0.1):
    """Softened gravitational forces Fᵢ = Σⱼ (xⱼ − xᵢ)/(|xⱼ − xᵢ|² + ε²)^{3/2} on N
    unit masses at ``x`` (N×3), ``chunk`` rows at a time (a scan), so no N×N array.

    F = −∇Φ for the potential Φ, so ∂F/∂x = −∇²Φ is symmetric.
    """
    n = x.shape[0]

    def chunk_forces(_, i):
        xi = lax.dynamic_slice_in_dim(x, i * chunk, chunk)
        d = x[None, :, :] - xi[:, None, :]
        w = (jnp.sum(d * d, axis=-1) + eps**2) ** -1.5
        return None, jnp.sum(d * w[..., None], axis=1)
    return lax.scan(chunk_forces, None, jnp.arange(n // chunk))[1].reshape(n, 3)


forces = ab.bind(direct_forces, traced=True, symmetric=True, name="direct_forces")


def results(rng: Callable, error: Callable) -> list:
    """Each recipe's gradient against plain JAX's, and their compiled temporary memory."""
    out = []
    x = jnp.asarray(rng().normal(size=(1024, 3)))
    loss = lambda f: jax.grad(lambda x: jnp.sum(f(x, chunk=128) ** 2))
    out.append(("direct summation, N = 1024 in 8 chunks: grad of Σ|F|², symmetric=True",
                loss(forces), loss(direct_forces), (x,)))
    step = lambda i, s: (s[0] + 0.01 * s[1], s[1] - 0.01 * jnp.sin(s[0] + 0.01 * s[1]))
    back = lambda i, s: (s[0] - 0.01 * (s[1] + 0.01 * jnp.sin(s[0])), s[1] + 0.01 * jnp.sin(s[0]))
    q = jnp.asarray(rng().normal(size=(64, 64)))
    rloss = lambda loop: jax.grad(lambda q: jnp.sum(loop(q) ** 2))
    out.append(("ab.reversible_loop, 1000 steps of a 64×64 pendulum: grad",
                rloss(lambda q: ab.reversible_loop(step, back, (q, q), 1000)[0]),
                rloss(lambda q: lax.fori_loop(0, 1000, step, (q, q))[0]), (q,)))
    rows = []
    for name, mine, ref, args in out:
        mine, ref = (jax.jit(f).lower(*args).compile() for f in (mine, ref))
        err = error(mine(*args), ref(*args))
        rows.append({"recipe": name, "error": err, "status": "ok" if err <= 1e-8 else "FAIL",
                     "temp_bytes": mine.memory_analysis().temp_size_in_bytes,
                     "jax_temp_bytes": ref.memory_analysis().temp_size_in_bytes})
    return rows
