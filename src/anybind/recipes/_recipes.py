"""Recipes: derivative tricks as features, built on ``ab.bind``'s public API only.

==================  =================================================================
name                what it is
==================  =================================================================
reversible_loop     ``fori_loop`` whose reverse mode rebuilds each state with the
                    inverse step instead of storing it: memory flat in the steps
root                x*(θ) with f(x*, θ) = 0 from a host solver, differentiated by
                    the implicit function theorem: ẋ = −(∂f/∂x)⁻¹·∂f/∂θ·θ̇
fixed_point         x*(θ) = g(x*, θ) from a host iteration: ``root`` of g(x, θ) − x
==================  =================================================================

Both are one trick. The value comes from a computation whose inputs are
``stop_gradient``-ed (the forward loop, the host solver), so JAX stores and
differentiates nothing there; then an op ``P(θ, y) = y`` (``_pinned``) carries the
derivatives of y with respect to θ as traced jvp/vjp rules. Inside those rules
y is taken as ``P(θ, y)`` again, so differentiating a rule sees y's dependence
on θ, and second (and higher) derivatives are right. The tangent of y itself is
ignored: y never carries one, since it is computed from stopped inputs.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util
from jax.flatten_util import ravel_pytree

from .._api import Op, VmapMode, bind

__all__ = ["reversible_loop", "root", "fixed_point"]


def _stop(tree):
    return tree_util.tree_map(lax.stop_gradient, tree)


def _require_inexact(what: str, tree) -> None:
    for path, leaf in tree_util.tree_flatten_with_path(tree)[0]:
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            raise TypeError(f"{what}: every leaf must be floating or complex, but "
                            f"{tree_util.keystr(path) or 'the value'} has dtype "
                            f"{jnp.result_type(leaf)}")


# ------------------------------------------------------------ reversible loop

def reversible_loop(body_fwd: Callable[[Any, Any], Any], body_bwd: Callable[[Any, Any], Any],
                    init_val: Any, nsteps: int) -> Any:
    """``lax.fori_loop(0, nsteps, body_fwd, init_val)`` whose reverse mode stores no states.

    Reverse mode walks the loop backwards: from the final state it rebuilds
    state i with ``body_bwd(i, state_{i+1})`` and pulls the cotangent through
    ``body_fwd(i, ·)``, one step at a time, so its memory does not grow with
    ``nsteps`` (``lax.fori_loop`` keeps every state). Forward mode is the
    loop's own jvp. Works under ``jit``, ``vmap``, ``grad``, ``jvp`` and to
    higher orders (the backward loop is JAX code, differentiated by JAX).

    Args:
      body_fwd: ``(i, state) -> state``, the loop body (JAX code).
      body_bwd: ``(i, state_{i+1}) -> state_i``, its inverse. Exact inversion is
        the caller's promise; rounding in it enters the gradient.
      init_val: the initial state, a pytree of floating or complex arrays.
      nsteps: the number of steps, a Python int.

    The bodies must not close over values being differentiated (pass them in
    the state instead): derivatives flow through ``init_val`` only.

    >>> import anybind as ab, jax, jax.numpy as jnp
    >>> fwd = lambda i, x: x * x + 1e-5
    >>> bwd = lambda i, x: jnp.sqrt(x - 1e-5)
    >>> g = jax.grad(lambda x: ab.reversible_loop(fwd, bwd, x, 3).sum())
    >>> float(g(jnp.array(0.9)))  # d/dx x⁸ at 0.9 (almost: the 1e-5 shifts it)
    3.826...
    """
    if not isinstance(nsteps, (int, np.integer)) or nsteps < 0:
        raise TypeError(f"ab.reversible_loop: nsteps must be a non-negative Python int, got "
                        f"{nsteps!r}")
    _require_inexact("ab.reversible_loop's init_val", init_val)
    op = _reversible_op(body_fwd, body_bwd, int(nsteps))
    final = lax.fori_loop(0, int(nsteps), body_fwd, _stop(init_val))
    return op(init_val, final)


@functools.lru_cache(maxsize=64)
def _reversible_op(body_fwd, body_bwd, nsteps: int) -> Op:
    def loop(x0):
        return lax.fori_loop(0, nsteps, body_fwd, x0)

    op = _pinned(f"reversible_loop_{getattr(body_fwd, '__name__', 'body')}")

    @op.def_jvp(traced=True)
    def _(primals, tangents):
        """∂x_N/∂x_0·ẋ_0: the loop's own forward mode."""
        (x0, _), (dx0, _) = primals, tangents
        return jax.jvp(loop, (x0,), (dx0,))[1]

    @op.def_vjp(traced=True)
    def _(primals, ct):
        """(∂x_N/∂x_0)ᵀ·x̄_N: states rebuilt backwards, cotangent pulled one step at a time."""
        x0, xn = primals
        xn = op(x0, xn)  # x_N as a function of x_0, for derivatives of this rule

        def step(k, carry):
            x, c = carry
            i = nsteps - 1 - k
            prev = body_bwd(i, x)
            _, pull = jax.vjp(lambda v: body_fwd(i, v), prev)
            return prev, pull(c)[0]
        return lax.fori_loop(0, nsteps, step, (xn, ct))[1], None
    return op


def _pinned(name: str) -> Op:
    """``P(θ, y) = y``, derivatives with respect to θ from the rules defined by the caller."""
    return bind(lambda theta, y: y, traced=True, name=name)


# -------------------------------------------------------------- root finding

def root(f: Callable[..., Any], solver: Callable[..., Any], *,
         linear_solve: Callable[[Callable, Any], Any] | None = None,
         vmap: VmapMode = "sequential", name: str | None = None) -> Callable[..., Any]:
    """A host solver of f(x, *params) = 0, differentiable by the implicit function theorem.

    Returns ``solve(*params, x0=x0) -> x`` with f(x, *params) = 0. The value
    comes from ``solver(*params, x0=x0)``, host code (SciPy, NumPy) that gets
    NumPy arrays and returns the root (cast to x0's dtypes). Derivatives come
    from ``f``, JAX code: ẋ = −(∂f/∂x)⁻¹·(∂f/∂θ·θ̇) at the root, and reverse
    mode is its transpose, so jvp, grad, jacfwd/jacrev, vmap and second
    derivatives all work; the solver runs once per call and is never
    differentiated.

    Args:
      f: ``f(x, *params) -> residual``, JAX code; the residual is structured
        like x (a square system).
      solver: ``solver(*params, x0=x0) -> x``, host code.
      linear_solve: ``linear_solve(matvec, b) -> v`` solving (∂f/∂x)·v = b with
        ``matvec(v) = ∂f/∂x·v`` (traced), for a matrix-free solve such as
        ``lambda mv, b: jax.scipy.sparse.linalg.gmres(mv, b)[0]``; reverse mode
        calls it with the transposed matvec. By default the Jacobian is formed
        (``jax.jacfwd``) and solved densely.
      vmap: how the host solver batches: ``"sequential"`` (one solve per row,
        the default), ``"expand_dims"``, ``"broadcast_all"`` or a vmap rule, as in
        ``ab.bind``.
      name: a name for the ops; defaults to the solver's.

    ``x0`` is a keyword operand: not differentiated (the root does not depend on
    it); wrap it in ``jax.lax.stop_gradient`` if it is computed from ``params``.

    >>> import anybind as ab, jax, jax.numpy as jnp, numpy as np, scipy.optimize
    >>> f = lambda x, a: x**3 + x - a
    >>> solver = lambda a, x0: scipy.optimize.root(lambda x: x**3 + x - a, x0).x
    >>> cbrt = ab.root(f, solver)
    >>> a = jnp.array([2.0, 10.0])
    >>> x = cbrt(a, x0=jnp.zeros(2))
    >>> np.allclose(jax.jacfwd(lambda a: cbrt(a, x0=jnp.zeros(2)))(a), np.diag(1 / (3 * x**2 + 1)))
    True
    """
    label = name or getattr(solver, "__name__", None) or "root"

    def host(*params, x0):
        x = solver(*params, x0=x0)
        return tree_util.tree_map(lambda r, z: np.asarray(r, dtype=z.dtype), x, x0)

    solve_op = bind(host, shape=lambda *params, x0: x0, vmap=vmap, name=label)
    implicit = _pinned(f"{label}_implicit")

    @implicit.def_jvp(traced=True)
    def _(primals, tangents):
        """ẋ = −(∂f/∂x)⁻¹·(∂f/∂θ·θ̇) at the root x."""
        (params, x), (dparams, _) = primals, tangents
        dparams = _float0_for_none(params, dparams)
        x = implicit(params, x)  # the root as a function of params, for higher orders
        _, fdot = jax.jvp(lambda p: f(x, *p), (params,), (dparams,))
        return tree_util.tree_map(jnp.negative, _solve_jacobian(f, x, params, fdot,
                                                                linear_solve))

    def solve(*params: Any, x0: Any) -> Any:
        _require_inexact(f"ab.root ('{label}'): x0", x0)
        x = solve_op(*_stop(params), x0=x0)
        return implicit(params, x)
    solve.__name__ = label
    solve.__doc__ = f"x with f(x, *params) = 0, by the host solver {label!r} (see ab.root)."
    return solve


def _float0_for_none(primals, tangents):
    """Integer leaves' tangents arrive as None; JAX's jvp wants float0 zeros."""
    leaves = tree_util.tree_leaves(tangents, is_leaf=lambda t: t is None)
    fixed = [np.zeros(np.shape(p), jax.dtypes.float0) if t is None else t
             for p, t in zip(tree_util.tree_leaves(primals), leaves, strict=True)]
    return tree_util.tree_structure(primals).unflatten(fixed)


def _solve_jacobian(f, x, params, b, linear_solve):
    """(∂f/∂x)⁻¹·b at (x, params), x and b pytrees of the same structure."""
    flat_x, unravel = ravel_pytree(x)
    flat_b, _ = ravel_pytree(b)
    fx = lambda v: ravel_pytree(f(unravel(v), *params))[0]
    if linear_solve is None:
        jac = jax.jacfwd(fx)(flat_x)
        return unravel(jnp.linalg.solve(jac, flat_b))
    matvec = lambda v: jax.jvp(fx, (flat_x,), (v,))[1]
    # reverse mode solves with the transposed matvec, by the same user solver
    solve = lambda mv, r: linear_solve(mv, r)
    return unravel(lax.custom_linear_solve(matvec, flat_b, solve, transpose_solve=solve))


def fixed_point(g: Callable[..., Any], solver: Callable[..., Any], *,
                linear_solve: Callable[[Callable, Any], Any] | None = None,
                vmap: VmapMode = "sequential", name: str | None = None) -> Callable[..., Any]:
    """A host fixed-point iteration x = g(x, *params), differentiable implicitly.

    ``ab.root`` of f(x, θ) = g(x, θ) − x: the derivative is
    ẋ = (I − ∂g/∂x)⁻¹·∂g/∂θ·θ̇. ``solver(*params, x0=x0)`` is host code
    (say, a NumPy iteration) returning the fixed point; ``g`` is JAX code.
    Returns ``solve(*params, x0=x0) -> x``; the other keywords as for ``ab.root``.

    >>> import anybind as ab, jax, jax.numpy as jnp, numpy as np
    >>> def iterate(a, x0):
    ...     x = np.asarray(x0)
    ...     for _ in range(100):
    ...         x = np.cos(a * x)
    ...     return x
    >>> fp = ab.fixed_point(lambda x, a: jnp.cos(a * x), iterate)
    >>> a = jnp.array(0.5)
    >>> x = fp(a, x0=jnp.array(1.0))
    >>> g = jax.grad(lambda a: fp(a, x0=jnp.array(1.0)))(a)
    >>> bool(jnp.allclose(g, -x * jnp.sin(a * x) / (1 + a * jnp.sin(a * x))))
    True
    """
    def residual(x, *params):
        return tree_util.tree_map(jnp.subtract, g(x, *params), x)
    return root(residual, solver, linear_solve=linear_solve, vmap=vmap,
                name=name or getattr(solver, "__name__", None) or "fixed_point")
