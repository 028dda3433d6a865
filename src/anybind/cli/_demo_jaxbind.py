"""JAXbind's three demos (``demos/0*.py`` in NIFTy-PPL/JAXbind), ported to anybind.

The same functions, declared the anybind way; ``python -m anybind demo``
runs each under every transformation against a pure-JAX reference.

===================  ==============================  ===============================
JAXbind demo         the function                    anybind declaration
===================  ==============================  ===============================
01 linear function   ``scipy.fft.fftn``,              ``linear=True``, a vmap rule and a
                     ``norm="forward"``               batched variant of the transpose
02 multilinear       (x, y) ↦ (x·y, x·y)             ``multilinear=True``, a transpose
                                                     per argument
03 nonlinear         (x, y) ↦ (x·y, y²), x fixed     x a keyword operand; host jvp, vjp
===================  ==============================  ===============================

A lesson in JAX's transpose convention: JAXbind's demo 01 declares
``conj(fftn(conj(ȳ)))``, the adjoint F^H·ȳ, as the transpose. JAX transposes
complex-linear maps without conjugation (the pairing ⟨a, b⟩ = Re Σ a·b), so
the transpose of F is Fᵀ = F: the DFT matrix is symmetric, and the transpose
of ``fftn`` is ``fftn`` itself. ``fftn_with_adjoint_as_transpose()`` binds the
demo's declaration as it stands, and ``ab.check`` rejects it in its
``transpose`` check.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import anybind as ab

# ---------------------------------------------------- 01: scipy.fft.fftn, linear

def _fftn(x, workers=None, batch_axes: int = 0):
    """scipy.fft.fftn over every axis after the first ``batch_axes`` (norm="forward")."""
    import scipy.fft
    return scipy.fft.fftn(x, axes=range(batch_axes, x.ndim), norm="forward", workers=workers)


def fftn_op(transpose=None) -> ab.Op:
    """F·x = fftn(x, norm="forward"), linear. Under vmap the function's vmap rule and the
    transpose's batched variant transform all axes but the batch axis: one SciPy call per
    batch, as JAXbind's ``func_can_batch=True``."""
    op = ab.bind(lambda x, *, workers=None: _fftn(x, workers), shape=ab.like(0), linear=True,
                 name="scipy_fftn",
                 vmap=lambda size, in_batched, x, *, workers=None: (_fftn(x, workers, 1),
                                                                     in_batched[0]))
    op.def_transpose(transpose or (lambda ct, *, workers=None: (_fftn(ct, workers),)),
                     vmap=lambda ct, *, workers=None: (_fftn(ct, workers, 1),))
    return op


def fftn_with_adjoint_as_transpose() -> ab.Op:
    """Demo 01's declaration as it stands: the adjoint F^H·ȳ = conj(F·conj(ȳ)) as the
    transpose. Wrong under JAX's convention (the transpose is F itself); ab.check says so."""
    return fftn_op(lambda ct, *, workers=None: (np.conj(_fftn(np.conj(ct), workers)),))


# ------------------------------------------------ 02: (x, y) ↦ (x·y, x·y), multilinear

def mlin_op() -> ab.Op:
    """Linear in x and in y separately; the transposes are demo 02's mlin_T1 and mlin_T2."""
    return ab.bind(lambda x, y: (x * y, x * y), shape=lambda x, y: (x, x), multilinear=True,
                   vmap="expand_dims", name="mlin",
                   transpose=(lambda p, ct: p[1] * ct[0] + p[1] * ct[1],   # x̄ = y·ā + y·b̄
                              lambda p, ct: p[0] * ct[0] + p[0] * ct[1]))  # ȳ = x·ā + x·b̄


# ------------------------------------------- 03: (x, y) ↦ (x·y, y²), x not differentiated

def nonlin_op() -> ab.Op:
    """JAXbind's ``first_n_args_fixed=1``: x is a keyword operand (traced, batched, never
    differentiated); demo 03's derivative and its transpose are the jvp and vjp rules."""
    return ab.bind(lambda y, *, x: (x * y, y * y), shape=lambda y, *, x: (y, y),
                   vmap="expand_dims", name="nonlin",
                   jvp=lambda p, t, *, x: (x * t[0], 2 * p[0] * t[0]),
                   vjp=lambda p, ct, *, x: (x * ct[0] + 2 * p[0] * ct[1],))


# --------------------------------------------------------------- the demo's cases

def cases(Case, rng) -> list:
    """The three ports as ``_demo.Case``s (passed in, to keep the import one-way)."""
    r = rng()
    z = r.uniform(size=(10, 10)) + 1j * r.uniform(size=(10, 10))
    fftn = fftn_op()
    ref = lambda x: jnp.fft.fftn(x, norm="forward")
    ri = lambda f: lambda v: (lambda y: jnp.concatenate([jnp.real(y).ravel(),
                                                         jnp.imag(y).ravel()]))(
        f((v[:100] + 1j * v[100:]).reshape(10, 10)))
    c1 = Case("JAXbind 01: scipy.fft.fftn", fftn, ((z,), {}), fftn, ref, z,
              np.stack([z, 2 * z, 1j * z]), ri(fftn), ri(ref), r.normal(size=200),
              lin=fftn, lin_ref=ref, lin_x=z)

    x, y = r.uniform(size=(10, 10)), r.uniform(size=(10, 10))
    mlin = mlin_op()
    mref = lambda x, y: (x * y, x * y)
    cat = lambda f: lambda v: jnp.concatenate([o.ravel() for o in f(v[:100].reshape(10, 10),
                                                                     v[100:].reshape(10, 10))])
    c2 = Case("JAXbind 02: multilinear", mlin, ((x, y), {}), lambda x: mlin(x, y),
              lambda x: mref(x, y), x, np.stack([x, 2 * x, x**2]), cat(mlin), cat(mref),
              np.concatenate([x.ravel(), y.ravel()]),
              lin=lambda y: mlin(x, y), lin_ref=lambda y: mref(x, y), lin_x=y)

    xf, yv = 4 + np.zeros(5), 6 + r.normal(size=5)
    nonlin = nonlin_op()
    nref = lambda y: (xf * y, y * y)
    f3 = lambda y: nonlin(y, x=xf)
    g = lambda f: lambda y: jnp.concatenate(f(y))
    c3 = Case("JAXbind 03: nonlinear", nonlin, ((yv,), {"x": xf}), f3, nref, yv,
              np.stack([yv, 2 * yv, yv**2]), g(f3), g(nref), yv, hessian=False)
    return [c1, c2, c3]
