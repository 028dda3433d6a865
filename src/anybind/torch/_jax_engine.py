"""The JAX engine of the bridges: JAX code on NumPy views of torch's tensors.

What ``ab.to_torch`` needs from JAX (see ``_bridges``; the forms of the derived
functions are ``_torch_engine``'s):

===============  ===================================================================
piece            what it does
===============  ===================================================================
``JaxHost``      ``jax.jit(fn)`` on NumPy views (no copy on the CPU), under x64; its
                 ``tensor_runner`` runs it on torch tensors for the front end's nodes
``JaxVmap``      the vmap rule: ``jax.jit(jax.vmap(fn))``, one call for the batch
``jax_jvp_of``   (x, ẋ) ↦ ∂f(x)·ẋ by ``jax.jvp``
``jax_vjp_of``   (x, ȳ) ↦ ∂f(x)ᵀ·ȳ by ``jax.vjp``
===============  ===================================================================
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import numpy as np
import torch
from jax import tree_util

from ._run import _np_view
from ._torch_engine import _BF16, as_tensor, over, split_static, view_tensor

_F0 = jax.dtypes.float0


def _tangent_or_zero(p, t):
    if t is not None:
        return t
    return np.zeros(np.shape(p), _F0)


def _none_if_f0(t):
    return None if t.dtype == _F0 else t


def jax_jvp_of(fn: Callable) -> Callable:
    """(x, ẋ) ↦ ∂f(x)·ẋ by ``jax.jvp``."""
    def jvp(primals, tangents, **kw):
        primals = tuple(primals)
        ts = tree_util.tree_map(_tangent_or_zero, primals, tuple(tangents))
        _, tout = jax.jvp(lambda *a: fn(*a, **kw), primals, ts)
        return tree_util.tree_map(_none_if_f0, tout)
    jvp.__name__ = f"jvp_of_{getattr(fn, '__name__', 'fn')}"
    return jvp


def jax_vjp_of(fn: Callable) -> Callable:
    """(x, ȳ) ↦ ∂f(x)ᵀ·ȳ by ``jax.vjp``."""
    def vjp(primals, ct, **kw):
        out, pullback = jax.vjp(lambda *a: fn(*a, **kw), *primals)
        cts = tree_util.tree_map(_tangent_or_zero, out, ct)
        return tuple(tree_util.tree_map(_none_if_f0, pullback(cts)))
    vjp.__name__ = f"vjp_of_{getattr(fn, '__name__', 'fn')}"
    return vjp


class JaxHost:
    """A JAX function as host code: ``jax.jit`` of it on the views, under x64.

    ``tensor_runner(call)`` runs it on torch tensors directly (the torch
    front end's nodes use it): CPU tensors go in as NumPy views (no copy),
    results come out through DLPack (no copy). Compiled once per call
    signature; x64 is on while it runs, so torch's float64 stays float64.
    """

    def __init__(self, fn: Callable, name: str):
        self.fn, self.__name__ = fn, name
        self._jits: dict = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<JAX code of {self.__name__}>"

    def _jit(self, key, make: Callable):
        f = self._jits.get(key)
        if f is None:
            with self._lock:
                f = self._jits.setdefault(key, jax.jit(make()))
        return f

    def __call__(self, *args, **kw):
        operands, static = split_static(kw)
        fn = self.fn
        f = self._jit(("plain", tuple(sorted(static.items()))),
                      lambda: lambda a, k: fn(*a, **k, **static))
        with jax.enable_x64(True):
            out = f(args, operands)
        return over(out, np.asarray)

    def tensor_runner(self, call) -> Callable[[list], list]:
        """``run(ops)``: the function on torch tensors for this call (the torch front
        end's nodes use it): no NumPy round trip of the results."""
        n, fn = call.n_in, self.fn
        f = self._jit(call, lambda: lambda *flat: tree_util.tree_leaves(
            fn(*call.args(flat[:n]), **call.kwargs(flat[n:]))))
        x64 = jax.enable_x64

        def run(ops):
            if all(t.is_cpu for t in ops):
                with x64(True):
                    outs = f(*[_jax_in(t) for t in ops])
                # a NumPy view of each result, then DLPack: no copy, several times
                # cheaper than DLPack of the jax.Array (which waits on its own)
                res = [view_tensor(a) if a.dtype != _BF16 else as_tensor(a)
                       for a in map(np.asarray, outs)]
            else:  # device tensors: the results stay on the device
                with x64(True):
                    outs = f(*[t if t.is_cpu else _jax_view(t) for t in ops])
                res = [torch.from_dlpack(o) for o in outs]
            if ops:  # JAX gives an input back unchanged as that same buffer: copy it
                ptrs = {t.data_ptr() for t in ops}
                res = [r.clone() if r.data_ptr() in ptrs and r.numel() else r for r in res]
            return res
        return run


def _jax_in(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as JAX's input: a NumPy view, writable (JAX writes into no input,
    and a read-only array made each call 10-20 % slower at 10³-10⁵ elements)."""
    try:
        return (t.detach() if t.requires_grad else t).numpy()
    except (RuntimeError, TypeError):  # lazy conj/neg, bfloat16, symbolic zeros
        return _np_view(t)


def _jax_view(t: torch.Tensor) -> jax.Array:
    """A device tensor as a JAX array on that device (DLPack: no copy)."""
    if t.requires_grad:
        t = t.detach()
    return jax.dlpack.from_dlpack(t.resolve_conj().resolve_neg().contiguous())


class JaxVmap:
    """The vmap rule of JAX code: ``jax.jit(jax.vmap(fn))``, one call for the whole batch."""

    def __init__(self, fn: Callable, name: str, rule: None = None):
        self.fn, self.__name__ = fn, name
        self._jits: dict = {}

    def __call__(self, axis_size, in_batched, *args, **kw):
        operands = {k: kw[k] for k in in_batched.kwargs}
        static = {k: v for k, v in kw.items() if k not in in_batched.kwargs}
        axes = (over(tuple(in_batched), lambda b: 0 if b else None),
                over(dict(in_batched.kwargs), lambda b: 0 if b else None))
        key = (tree_util.tree_structure(axes), tuple(tree_util.tree_leaves(
            axes, is_leaf=lambda x: x is None)), tuple(sorted(static.items())))
        f = self._jits.get(key)
        if f is None:
            fn = self.fn
            f = self._jits.setdefault(key, jax.jit(jax.vmap(
                lambda a, k: fn(*a, **k, **static), in_axes=axes)))
        with jax.enable_x64(True):
            out = f(args, operands)
        return over(out, np.asarray), True
