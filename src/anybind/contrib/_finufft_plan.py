"""Plans: NUFFTs on points fixed once, as ops (ducc0's ``plan`` and ``plan3``).

A plan sorts its points and sizes its kernel once; every transform after that
skips that work, which is what an iterative solver repeating A and Aᴴ wants.
Each ``Plan`` binds its own ops, linear in the values (the points are fixed
numbers, not arguments): the type 1 op's transpose is the type 2 op with the
same sign and vice versa, and type 3's transpose runs ducc0's adjoint with the
other sign. So ``jit``, ``grad``, ``jvp``, ``linear_transpose`` and ``vmap``
(the batch goes to ducc0 as more transforms) work to every order.

ducc0's plans are not reentrant: each plan has a lock, held for each transform,
so threads calling the same plan take turns (each transform uses ``nthreads``).
The ducc0 plan lives as long as its ``Plan`` or any op or compiled program that
uses its ops.
"""
from __future__ import annotations

import threading

import jax
import numpy as np

import anybind as ab

from . import require, reshaped
from ._ducc0_nufft import in_double
from ._finufft_ops import keywords
from ._finufft_options import NestedOpts, Opts

ducc0 = require("ducc0", "anybind.contrib.finufft")

__all__ = ["Plan", "Plan3"]


def _concrete(where: str, points) -> list:
    out = []
    for i, p in enumerate(points):
        try:
            p = np.asarray(p)
        except jax.errors.TracerArrayConversionError as e:
            raise TypeError(f"{where}: point array {i} is traced; a plan is built from fixed "
                            f"points, so make it outside jit/grad/vmap (its transforms may "
                            f"be used inside them)") from e
        if p.dtype in (np.float32, np.float64):  # as JAX would take them (x64 or not)
            p = p.astype(jax.dtypes.canonicalize_dtype(p.dtype))
        if p.ndim != 1 or p.dtype not in (np.float32, np.float64):
            raise TypeError(f"{where}: point array {i} must be 1-D float32 or float64 "
                            f"(M,), got {p.dtype}{list(p.shape)}")
        if not np.isfinite(p).all():
            j = int(np.flatnonzero(~np.isfinite(p))[0])
            raise ValueError(f"{where}: point array {i} has a NaN or infinite entry "
                             f"(at {j}: {p[j]}); a transform with it is NaN")
        out.append(p)
    if len({(p.dtype, p.shape) for p in out}) != 1:
        raise TypeError(f"{where}: the point arrays must share one shape and dtype, got "
                        f"{[f'{p.dtype}{list(p.shape)}' for p in out]}")
    return out


class _Locked:
    """A ducc0 plan and the lock its calls take (ducc0's plans are not reentrant)."""

    def __init__(self, plan, double: bool):
        self.plan, self.double, self.lock = plan, double, threading.Lock()

    def __call__(self, method: str, data, out, **kw) -> None:
        target = out
        if self.double:
            data = data.astype(np.complex128)
            target = np.empty(out.shape, np.complex128)
        with self.lock:
            getattr(self.plan, method)(**kw, **{self._in(method): data,
                                                self._out(method): target})
        if target is not out:
            out[...] = target

    @staticmethod
    def _in(method: str) -> str:
        return {"nu2u": "points", "u2nu": "grid"}.get(method, "points_in")

    @staticmethod
    def _out(method: str) -> str:
        return "out" if method in ("nu2u", "u2nu") else "points_out"


def _source_check(where: str, source, dtype, core: tuple) -> None:
    if source.dtype != dtype or tuple(source.shape[len(source.shape) - len(core):]) != core:
        raise TypeError(f"{where}: the source must be {np.dtype(dtype).name} (..., "
                        f"{', '.join(map(str, core))}) for this plan, got "
                        f"{source.dtype}{list(source.shape)}")


class Plan:
    """Type 1 and 2 NUFFTs on fixed points: ``Plan(n_modes, *points, eps=1e-6, opts=None)``.

    ``points``: D concrete 1-D arrays (M,), float32 or float64; ``n_modes``: an
    int or D ints. ``plan.nufft1(source, iflag=1)`` maps (..., M) to
    (..., *n_modes) and ``plan.nufft2(source, iflag=-1)`` back, as jax-finufft's
    ``nufft1``/``nufft2`` on these points (same conventions and options), under
    ``jit``, ``grad``, ``vmap``, in the source only.

    >>> import numpy as np, jax, jax.numpy as jnp
    >>> from anybind.contrib.finufft import Plan, nufft1
    >>> x = np.random.default_rng(0).uniform(-np.pi, np.pi, 50)
    >>> plan = Plan(16, x, eps=1e-9)
    >>> c = np.ones(50, complex)
    >>> bool(jnp.allclose(plan.nufft1(c), nufft1(16, c, x, eps=1e-9), atol=1e-4))
    True
    >>> normal = jax.jit(lambda f: plan.nufft1(plan.nufft2(f), iflag=1))   # AᴴA
    >>> normal(np.ones(16, complex)).shape
    (16,)
    """

    def __init__(self, n_modes: int | tuple[int, ...], *points: np.ndarray, eps: float = 1e-6,
                 opts: Opts | NestedOpts | None = None):
        where = "anybind.contrib.finufft.Plan"
        pts = _concrete(where, points)
        nd = len(pts)
        if not 1 <= nd <= 3:
            raise ValueError(f"{where}: 1 to 3 point arrays, got {nd}")
        self.n_modes = tuple(int(n) for n in np.atleast_1d(n_modes))
        if len(self.n_modes) != nd or min(self.n_modes) < 1:
            raise ValueError(f"{where}: n_modes must give {nd} positive sizes, got {n_modes!r}")
        self.dtype = np.result_type(pts[0].dtype, np.complex64)
        self.n_points = pts[0].shape[0]
        kw = keywords(where, opts, 1, nd, eps, 1)
        double = in_double(self.dtype, nd, kw)
        coord = np.stack(pts, axis=-1).astype(np.float64 if double else pts[0].dtype)
        plan = ducc0.nufft.plan(
            nu2u=True, coord=coord, grid_shape=self.n_modes, epsilon=kw["epsilon"],
            nthreads=kw["nthreads"], fft_order=kw["fft_order"],
            **{k: kw[k] for k in ("sigma_min", "sigma_max") if k in kw})
        run = _Locked(plan, double)
        modes, m, dtype = self.n_modes, self.n_points, self.dtype

        def t1(values, *, out, iflag: int) -> None:
            if m == 0 or out.size == 0:  # no points: an empty sum (ducc0 has no answer)
                out[...] = 0
                return
            run("nu2u", values.reshape((-1, m)), reshaped(out, (-1,) + modes),
                forward=iflag < 0)

        def t2(grid, *, out, iflag: int) -> None:
            if out.size:
                run("u2nu", grid.reshape((-1,) + modes), reshaped(out, (-1, m)),
                    forward=iflag < 0)

        def spec1(source, *, iflag):
            _source_check(f"{where}.nufft1", source, dtype, (m,))
            return jax.ShapeDtypeStruct(source.shape[:-1] + modes, dtype)

        def spec2(source, *, iflag):
            _source_check(f"{where}.nufft2", source, dtype, modes)
            return jax.ShapeDtypeStruct(source.shape[:len(source.shape) - nd] + (m,), dtype)

        self._t1 = ab.bind(t1, shape=spec1, linear=True, out=True, vmap="expand_dims",
                           name="finufft_plan_nufft1")
        self._t2 = ab.bind(t2, shape=spec2, linear=True, out=True, vmap="expand_dims",
                           name="finufft_plan_nufft2")
        self._t1.def_transpose(lambda ct, *, out, iflag: t2(ct, out=out[0], iflag=iflag),
                               out=True)
        self._t2.def_transpose(lambda ct, *, out, iflag: t1(ct, out=out[0], iflag=iflag),
                               out=True)

    def nufft1(self, source: jax.typing.ArrayLike, iflag: int = 1) -> jax.Array:
        """Type 1 on the plan's points: (..., M) ↦ (..., *n_modes)."""
        return self._t1(source, iflag=1 if int(iflag) >= 0 else -1)

    def nufft2(self, source: jax.typing.ArrayLike, iflag: int = -1) -> jax.Array:
        """Type 2 on the plan's points: (..., *n_modes) ↦ (..., M)."""
        return self._t2(source, iflag=1 if int(iflag) >= 0 else -1)


class Plan3:
    """Type 3 NUFFTs on fixed points: ``Plan3(*points, eps=1e-6, opts=None)``.

    ``points``: the D source arrays (M,) and then the D target arrays (N,), as
    for ``nufft3``. ``plan.nufft3(source, iflag=-1)`` maps (..., M) to (..., N)
    under ``jit``, ``grad``, ``vmap``, in the source only.

    >>> import numpy as np, jax.numpy as jnp
    >>> from anybind.contrib.finufft import Plan3, nufft3
    >>> r = np.random.default_rng(0)
    >>> x, s = r.uniform(-1, 1, 30), r.uniform(-20, 20, 12)
    >>> c = np.ones(30, complex)
    >>> bool(jnp.allclose(Plan3(x, s, eps=1e-9).nufft3(c), nufft3(c, x, s, eps=1e-9),
    ...                   atol=1e-4))
    True
    """

    def __init__(self, *points: np.ndarray, eps: float = 1e-6,
                 opts: Opts | NestedOpts | None = None):
        where = "anybind.contrib.finufft.Plan3"
        if len(points) % 2 or not 2 <= len(points) <= 6:
            raise ValueError(f"{where}: the D source point arrays and then the D targets "
                             f"(D = 1, 2 or 3), got {len(points)} arrays")
        nd = len(points) // 2
        src = _concrete(where, points[:nd])
        dst = _concrete(where, points[nd:])
        if src[0].dtype != dst[0].dtype:
            raise TypeError(f"{where}: sources and targets must share a dtype, got "
                            f"{src[0].dtype} and {dst[0].dtype}")
        self.dtype = np.result_type(src[0].dtype, np.complex64)
        self.n_points, self.n_targets = src[0].shape[0], dst[0].shape[0]
        kw = keywords(where, opts, 3, nd, eps, -1)
        double = in_double(self.dtype, nd, kw, stages=2)
        real = np.float64 if double else src[0].dtype
        m, n, dtype = self.n_points, self.n_targets, self.dtype
        plan = None if 0 in (m, n) else ducc0.nufft.experimental.plan3(  # ducc0 needs points
            coord_in=np.stack(src, -1).astype(real), coord_out=np.stack(dst, -1).astype(real),
            epsilon=kw["epsilon"], nthreads=kw["nthreads"],
            **{k: kw[k] for k in ("sigma_min", "sigma_max", "verbosity") if k in kw})
        run = _Locked(plan, double)

        def t3(values, *, out, iflag: int) -> None:
            if plan is None or out.size == 0:  # no points: an empty sum, or no output
                out[...] = 0
                return
            run("exec", values.reshape((-1, m)), reshaped(out, (-1, n)), forward=iflag < 0)

        def t3_transpose(ct, *, out, iflag: int) -> None:
            if plan is None or out[0].size == 0:
                out[0][...] = 0
                return
            # Aᵀ with sign σ is the adjoint of the transform with sign −σ
            run("exec_adjoint", ct.reshape((-1, n)), reshaped(out[0], (-1, m)),
                forward=iflag >= 0)

        def spec(source, *, iflag):
            _source_check(f"{where}.nufft3", source, dtype, (m,))
            return jax.ShapeDtypeStruct(source.shape[:-1] + (n,), dtype)

        self._t3 = ab.bind(t3, shape=spec, linear=True, out=True, vmap="expand_dims",
                           name="finufft_plan_nufft3")
        self._t3.def_transpose(t3_transpose, out=True)

    def nufft3(self, source: jax.typing.ArrayLike, iflag: int = -1) -> jax.Array:
        """Type 3 on the plan's points: (..., M) ↦ (..., N)."""
        return self._t3(source, iflag=1 if int(iflag) >= 0 else -1)
