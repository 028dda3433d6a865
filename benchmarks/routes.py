"""The routes that ``run.py`` compares: each way a user can bring host code into
a compiled JAX program, written for the same functions.

Every builder returns ``{route name: (jitted function, arguments)}``; the first
route of each group is native ``jax.numpy``, which is also the reference the
other routes are checked against before they are timed.

The functions:

- ``mul``:   f(x1, x2) = x1·x2²;  ∂f·(ẋ1, ẋ2) = x2²·ẋ1 + 2·x1·x2·ẋ2;
             ∂fᵀ·ȳ = (x2²·ȳ, 2·x1·x2·ȳ)
- ``tanh``:  g(x) = tanh(A·x) for a fixed 100×100 A;  ∂gᵀ·ȳ = Aᵀ·((1 − g²)·ȳ)
- ``solve``: x = A⁻¹·b;  b̄ = A⁻ᵀ·x̄,  Ā = −b̄·xᵀ  (one LU factorisation of A)
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from jax.experimental.buffer_callback import buffer_callback

import anybind as ab

try:
    import jaxbind
except ImportError:  # the optional `bench` extra
    jaxbind = None

HAVE_INPLACE = "out" in inspect.signature(ab.bind).parameters
HAVE_FWD_BWD = hasattr(ab.Op, "def_fwd") and hasattr(ab.Op, "def_bwd")
HAVE_INPLACE_RULES = "out" in inspect.signature(ab.Op.def_vjp).parameters

Cases = dict[str, tuple[Callable[..., Any], tuple]]


def sds(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


# ----------------------------------------------------------------- f = x1·x2²

def np_mul(x1, x2):
    return x1 * x2**2


def np_mul_jvp(x1, x2, d1, d2):
    return x2**2 * d1 + 2 * x1 * x2 * d2


def np_mul_vjp(x1, x2, ct):
    return x2**2 * ct, 2 * x1 * x2 * ct


def native_mul(x1, x2):
    return x1 * x2**2


# anybind, return form, both batching modes.
def _anybind_mul(vmap: str, **kw) -> ab.Op:
    op = ab.bind(np_mul, shape=ab.like(0), vmap=vmap, name=f"mul_{vmap}", **kw)
    op.def_jvp(lambda p, t: np_mul_jvp(*p, *t))
    op.def_vjp(lambda p, ct: np_mul_vjp(*p, ct))
    return op


ab_mul = _anybind_mul("vectorized")
ab_mul_seq = _anybind_mul("sequential")

if HAVE_INPLACE:
    def _mul_into(x1, x2, *, out):
        out[...] = x1 * x2**2  # the same NumPy work as the raw buffer_callback below

    def _mul_into_no_temporaries(x1, x2, *, out):
        np.multiply(x2, x2, out=out)
        np.multiply(out, x1, out=out)

    ab_mul_inplace = ab.bind(_mul_into, shape=ab.like(0), vmap="vectorized", out=True,
                             name="mul_inplace")
    ab_mul_inplace.def_jvp(lambda p, t: np_mul_jvp(*p, *t))
    ab_mul_inplace.def_vjp(lambda p, ct: np_mul_vjp(*p, ct))
    ab_mul_inplace_nt = ab.bind(_mul_into_no_temporaries, shape=ab.like(0), out=True,
                                name="mul_inplace_nt")


if HAVE_INPLACE_RULES:
    def _mul_vjp_into(primals, ct, *, out):
        """The raw buffer_callback VJP's NumPy, written into XLA's cotangent buffers."""
        x1, x2 = primals
        out[0][...] = x2**2 * ct
        out[1][...] = 2 * x1 * x2 * ct

    def _mul_vjp_into_no_temporaries(primals, ct, *, out):
        x1, x2 = primals
        b1, b2 = out
        if b1 is not None:
            np.multiply(x2, x2, out=b1)
            b1 *= ct
        if b2 is not None:
            np.multiply(x1, x2, out=b2)
            b2 *= ct
            b2 *= 2

    ab_mul_vjp_inplace = _anybind_mul("vectorized")
    ab_mul_vjp_inplace.def_vjp(_mul_vjp_into, out=True)
    ab_mul_vjp_inplace_nt = _anybind_mul("vectorized")
    ab_mul_vjp_inplace_nt.def_vjp(_mul_vjp_into_no_temporaries, out=True)


# jax.pure_callback, and a custom_vjp around it.
def pc_mul(x1, x2):
    return jax.pure_callback(np_mul, sds(x1), x1, x2, vmap_method="expand_dims")


@jax.custom_vjp
def pc_mul_vjp(x1, x2):
    return pc_mul(x1, x2)


def _pc_fwd(x1, x2):
    return pc_mul(x1, x2), (x1, x2)


def _pc_bwd(res, ct):
    x1, x2 = res
    return jax.pure_callback(np_mul_vjp, (sds(x1), sds(x2)), x1, x2, ct,
                             vmap_method="expand_dims")


pc_mul_vjp.defvjp(_pc_fwd, _pc_bwd)


# Raw jax.experimental.buffer_callback, and a custom_vjp around it.
def _bc_mul_host(ctx, out, x1, x2):
    np.asarray(out)[...] = np.asarray(x1) * np.asarray(x2)**2


def _bc_mul_host_no_temporaries(ctx, out, x1, x2):
    o = np.asarray(out)
    np.multiply(np.asarray(x2), np.asarray(x2), out=o)
    np.multiply(o, np.asarray(x1), out=o)


def _bc_vjp_host(ctx, out, x1, x2, ct):
    x1, x2, ct = np.asarray(x1), np.asarray(x2), np.asarray(ct)
    np.asarray(out[0])[...] = x2**2 * ct
    np.asarray(out[1])[...] = 2 * x1 * x2 * ct


def _bc_vjp_host_no_temporaries(ctx, out, x1, x2, ct):
    x1, x2, ct = np.asarray(x1), np.asarray(x2), np.asarray(ct)
    b1, b2 = np.asarray(out[0]), np.asarray(out[1])
    np.multiply(x2, x2, out=b1)
    b1 *= ct
    np.multiply(x1, x2, out=b2)
    b2 *= ct
    b2 *= 2


def bc_mul(x1, x2, vmap_method="broadcast_all"):
    return buffer_callback(_bc_mul_host, sds(x1), vmap_method=vmap_method)(x1, x2)


def bc_mul_nt(x1, x2):
    return buffer_callback(_bc_mul_host_no_temporaries, sds(x1))(x1, x2)


def bc_mul_seq(x1, x2):
    return bc_mul(x1, x2, vmap_method="sequential")


@jax.custom_vjp
def bc_mul_vjp(x1, x2):
    return bc_mul(x1, x2)


def _bc_fwd(x1, x2):
    return bc_mul(x1, x2), (x1, x2)


def _bc_bwd(res, ct):
    x1, x2 = res
    return buffer_callback(_bc_vjp_host, (sds(x1), sds(x2)),
                           vmap_method="broadcast_all")(x1, x2, ct)


bc_mul_vjp.defvjp(_bc_fwd, _bc_bwd)


@jax.custom_vjp
def bc_mul_vjp_nt(x1, x2):
    return bc_mul(x1, x2)


bc_mul_vjp_nt.defvjp(_bc_fwd, lambda res, ct: buffer_callback(
    _bc_vjp_host_no_temporaries, (sds(res[0]), sds(res[1])))(*res, ct))


# JAXbind: (out, args, kwargs_dump) functions, hand-written abstract evaluation.
# The bound functions take no keywords, so none of them unpickles kwargs_dump.
def _jb_mul(out, args, kwargs_dump):
    x1, x2 = args
    out[0][()] = x1 * x2**2


def _jb_mul_jvp(out, args, kwargs_dump):
    x1, x2, d1, d2 = args
    out[0][()] = x2**2 * d1 + 2 * x1 * x2 * d2


def _jb_mul_vjp(out, args, kwargs_dump):
    x1, x2, ct = args
    out[0][()] = x2**2 * ct
    out[1][()] = 2 * x1 * x2 * ct


def _jb_abstract(*args, **kwargs):
    return ((args[0].shape, args[0].dtype),)


def _jb_abstract_T(*args, **kwargs):
    return ((args[0].shape, args[0].dtype),) * 2


if jaxbind is not None:
    _jb_mul_op = jaxbind.get_nonlinear_call(_jb_mul, (_jb_mul_jvp, _jb_mul_vjp),
                                            _jb_abstract, _jb_abstract_T)

    def jb_mul(x1, x2):
        return _jb_mul_op(x1, x2)[0]


# ----------------------------------------------------------------- the groups

def mul_inputs(shape) -> tuple:
    n = int(np.prod(shape))
    x1 = jnp.linspace(0.5, 1.5, n, dtype=jnp.float64).reshape(shape)
    x2 = jnp.linspace(-1.0, 2.0, n, dtype=jnp.float64).reshape(shape)
    return x1, x2


def call_routes() -> dict[str, Callable]:
    """Forward f(x1, x2) under jit."""
    r = {"native jnp": native_mul, "pure_callback": pc_mul, "buffer_callback": bc_mul}
    if jaxbind is not None:
        r["JAXbind"] = jb_mul
    r["anybind"] = ab_mul
    if HAVE_INPLACE:
        r["anybind out=True"] = ab_mul_inplace
    return r


def grad_routes() -> dict[str, Callable]:
    """The functions whose grad of sum(f) is taken."""
    r = {"native jnp": native_mul, "custom_vjp+pure_callback": pc_mul_vjp,
         "custom_vjp+buffer_callback": bc_mul_vjp}
    if jaxbind is not None:
        r["JAXbind"] = jb_mul
    r["anybind"] = ab_mul
    if HAVE_INPLACE:
        r["anybind out=True"] = ab_mul_inplace
    if HAVE_INPLACE_RULES:
        r["anybind def_vjp(out=True)"] = ab_mul_vjp_inplace
    return r


def _grad_sum(f):
    return jax.grad(lambda x1, x2: f(x1, x2).sum(), argnums=(0, 1))


def calls(n: int) -> Cases:
    args = mul_inputs((n,))
    return {k: (jax.jit(f), args) for k, f in call_routes().items()}


def grads(n: int) -> Cases:
    args = mul_inputs((n,))
    return {k: (jax.jit(_grad_sum(f)), args) for k, f in grad_routes().items()}


def _vmap_routes() -> dict[str, Callable]:
    r = {"native jnp": native_mul,
         "buffer_callback broadcast_all": bc_mul,
         "buffer_callback sequential": bc_mul_seq,
         "pure_callback expand_dims": pc_mul}
    if jaxbind is not None:
        r["JAXbind (default batching)"] = jb_mul
    r["anybind vectorized"] = ab_mul
    r["anybind sequential"] = ab_mul_seq
    return r


def vmaps(rows: int = 1000, cols: int = 100) -> Cases:
    args = mul_inputs((rows, cols))
    return {k: (jax.jit(jax.vmap(f)), args) for k, f in _vmap_routes().items()}


def vmap_grads(rows: int = 1000, cols: int = 100) -> Cases:
    args = mul_inputs((rows, cols))
    r = {"native jnp": native_mul, "custom_vjp+buffer_callback": bc_mul_vjp,
         "custom_vjp+pure_callback": pc_mul_vjp}
    if jaxbind is not None:
        r["JAXbind (default batching)"] = jb_mul
    r["anybind vectorized"] = ab_mul
    r["anybind sequential"] = ab_mul_seq
    return {k: (jax.jit(jax.vmap(_grad_sum(f))), args) for k, f in r.items()}


def _mul_vjp_needs(primals, ct, *, needs):
    """Computes only the cotangents asked for (symbolic_zeros=True gives ``needs``)."""
    x1, x2 = primals
    return (x2**2 * ct if needs[0] else None, 2 * x1 * x2 * ct if needs[1] else None)


ab_mul_needs = ab.bind(np_mul, shape=ab.like(0), vmap="vectorized", name="mul_needs")
ab_mul_needs.def_vjp(_mul_vjp_needs, symbolic_zeros=True)


def grads_first_arg(n: int) -> Cases:
    """grad of sum(f) with respect to x1 alone: is the cotangent of x2 skipped?"""
    args = mul_inputs((n,))
    r = {"native jnp": native_mul, "custom_vjp+buffer_callback": bc_mul_vjp}
    if jaxbind is not None:
        r["JAXbind"] = jb_mul
    r["anybind vjp (computes both)"] = ab_mul
    r["anybind vjp, symbolic_zeros + needs"] = ab_mul_needs
    return {k: (jax.jit(jax.grad(lambda x1, x2, f=f: f(x1, x2).sum())), args)
            for k, f in r.items()}


def numpy_row_loop(rows: int = 1000, cols: int = 100) -> Callable[[], None]:
    """The NumPy work of a sequential vmap by itself: f on each row, written to out."""
    x1, x2 = (np.asarray(a) for a in mul_inputs((rows, cols)))
    out = np.empty_like(x1)

    def loop():
        for b in range(rows):
            out[b] = np_mul(x1[b], x2[b])
    return loop


# ------------------------------------------------- jacrev of g(x) = tanh(A·x)

M = 100
_A = np.random.default_rng(0).standard_normal((M, M)) / np.sqrt(M)


def np_tanh(x):                  # x: (..., M); a leading batch axis is allowed
    return np.tanh(x @ _A.T)


def np_tanh_vjp(x, ct):
    y = np_tanh(x)
    return ((1 - y**2) * ct) @ _A


def native_tanh(x):
    return jnp.tanh(jnp.asarray(_A) @ x)


def _anybind_tanh(vmap: str) -> ab.Op:
    op = ab.bind(np_tanh, shape=ab.like(0), vmap=vmap, name=f"tanh_{vmap}")
    op.def_vjp(lambda p, ct: (np_tanh_vjp(p[0], ct),))
    return op


ab_tanh = _anybind_tanh("vectorized")
ab_tanh_seq = _anybind_tanh("sequential")


@jax.custom_vjp
def pc_tanh(x):
    return jax.pure_callback(np_tanh, sds(x), x, vmap_method="expand_dims")


pc_tanh.defvjp(lambda x: (pc_tanh(x), x),
               lambda x, ct: (jax.pure_callback(np_tanh_vjp, sds(x), x, ct,
                                                vmap_method="expand_dims"),))


def _jb_tanh(out, args, kwargs_dump):
    out[0][()] = np_tanh(args[0])


def _jb_tanh_jvp(out, args, kwargs_dump):
    x, dx = args
    out[0][()] = (1 - np_tanh(x)**2) * (dx @ _A.T)


def _jb_tanh_vjp(out, args, kwargs_dump):
    x, ct = args
    out[0][()] = np_tanh_vjp(x, ct)


if jaxbind is not None:
    _jb_tanh_op = jaxbind.get_nonlinear_call(
        _jb_tanh, (_jb_tanh_jvp, _jb_tanh_vjp), _jb_abstract,
        lambda *a, **k: ((a[0].shape, a[0].dtype),))

    def jb_tanh(x):
        return _jb_tanh_op(x)[0]


def jacrevs() -> Cases:
    x = jnp.linspace(-1.0, 1.0, M, dtype=jnp.float64)
    r = {"native jnp": native_tanh, "custom_vjp+pure_callback": pc_tanh}
    if jaxbind is not None:
        r["JAXbind (default batching)"] = jb_tanh
    r["anybind vectorized"] = ab_tanh
    r["anybind sequential"] = ab_tanh_seq
    return {k: (jax.jit(jax.jacrev(f)), (x,)) for k, f in r.items()}


# ----------------------------------- residuals: grad of sum(A⁻¹·b) with LU reuse

N_LU = 500
LU_COUNT = [0]


def lu_factor(a):
    """scipy.linalg.lu_factor, counted, so run.py can show how often each route factorises."""
    LU_COUNT[0] += 1
    return scipy.linalg.lu_factor(a)


def np_solve(a, b):
    return scipy.linalg.lu_solve(lu_factor(a), b)


def _solve_cotangents(lu_piv, x, xbar):
    bbar = scipy.linalg.lu_solve(lu_piv, xbar, trans=1)
    return -np.outer(bbar, x), bbar


def np_solve_vjp_recompute(a, b, xbar):
    """The backward pass without residuals: factorise A again."""
    lu_piv = lu_factor(a)
    return _solve_cotangents(lu_piv, scipy.linalg.lu_solve(lu_piv, b), xbar)


ab_solve = ab.bind(np_solve, shape=lambda a, b: b, name="solve_recompute")
ab_solve.def_vjp(lambda p, xbar: np_solve_vjp_recompute(*p, xbar))


def _pc_solve_fwd_host(a, b):
    lu, piv = lu_factor(a)
    return scipy.linalg.lu_solve((lu, piv), b), lu, piv.astype(np.int32)


@jax.custom_vjp
def pc_solve(a, b):
    return jax.pure_callback(np_solve, sds(b), a, b, vmap_method="sequential")


def _pc_solve_fwd(a, b):
    x, lu, piv = jax.pure_callback(
        _pc_solve_fwd_host,
        (sds(b), sds(a), jax.ShapeDtypeStruct(b.shape, jnp.int32)), a, b,
        vmap_method="sequential")
    return x, (x, lu, piv)


def _pc_solve_bwd(res, xbar):
    x, lu, piv = res
    return jax.pure_callback(lambda x, lu, piv, xbar: _solve_cotangents((lu, piv), x, xbar),
                             (sds(lu), sds(x)), x, lu, piv, xbar, vmap_method="sequential")


pc_solve.defvjp(_pc_solve_fwd, _pc_solve_bwd)


def solve_inputs() -> tuple:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((N_LU, N_LU)) + N_LU**0.5 * np.eye(N_LU)
    return jnp.asarray(a), jnp.asarray(rng.standard_normal(N_LU))


def solve_routes() -> dict[str, Callable]:
    r = {"native jnp": jnp.linalg.solve,
         "custom_vjp+pure_callback, saves LU": pc_solve,
         "anybind vjp, refactorises": ab_solve}
    if HAVE_FWD_BWD:
        r["anybind def_fwd/def_bwd, saves LU"] = ab_solve_saved
    return r


if HAVE_FWD_BWD:
    ab_solve_saved = ab.bind(np_solve, shape=lambda a, b: b, name="solve_saved")

    @ab_solve_saved.def_fwd(residuals=lambda a, b: (
            a, jax.ShapeDtypeStruct(b.shape, np.int32), b))
    def _solve_fwd(a, b):
        lu, piv = lu_factor(a)
        x = scipy.linalg.lu_solve((lu, piv), b)
        return x, (lu, piv.astype(np.int32), x)

    @ab_solve_saved.def_bwd
    def _solve_bwd(res, xbar):
        lu, piv, x = res
        return _solve_cotangents((lu, piv), x, xbar)


def solves() -> Cases:
    """value_and_grad, so that the forward value is used and cannot be dropped by XLA."""
    args = solve_inputs()
    return {k: (jax.jit(jax.value_and_grad(lambda a, b, f=f: f(a, b).sum(), argnums=(0, 1))),
                args)
            for k, f in solve_routes().items()}



# ------------------------- vmap of a linear op: grad through a batched transpose

FFT_BATCH, FFT_SHAPE = 2000, (8, 8)


def fft_inputs() -> tuple:
    r = np.random.default_rng(2)
    shape = (FFT_BATCH,) + FFT_SHAPE
    return (jnp.asarray(r.standard_normal(shape) + 1j * r.standard_normal(shape)),)


def _np_fft2(x):                 # the last two axes; leading (batch) axes are left alone
    return np.fft.fft2(x, axes=(-2, -1))


def _anybind_fft2(vmap: str) -> ab.Op:
    """Linear; the DFT matrix is symmetric, so under JAX's (unconjugated) transpose
    convention the transpose is the DFT itself."""
    op = ab.bind(_np_fft2, shape=ab.like(0), linear=True, name=f"fft2_{vmap}",
                 vmap=(lambda size, in_batched, x: (_np_fft2(x), in_batched[0]))
                 if vmap == "rule" else vmap)
    op.def_transpose(lambda ct: (_np_fft2(ct),))
    return op


ab_fft2_rule = _anybind_fft2("rule")
ab_fft2_seq = _anybind_fft2("sequential")


def _jb_fft2(out, args, kwargs_dump):
    """JAXbind's form (its demo 01): transform every axis that is not a batch axis."""
    (x,) = args
    batch = jaxbind.load_kwargs(kwargs_dump).get("batch_axes") or ((),)
    axes = [i for i in range(x.ndim) if i not in batch[0]]
    out[0][()] = np.fft.fftn(x, axes=axes)


def _jb_fft2_abstract(x, batch_axes=None, **kwargs):
    out_ax = batch_axes[0][-1] if batch_axes and batch_axes[0] else ()
    return ((x.shape, x.dtype, out_ax),)


if jaxbind is not None:
    _jb_fft2_op = jaxbind.get_linear_call(_jb_fft2, _jb_fft2, _jb_fft2_abstract,
                                          _jb_fft2_abstract, func_can_batch=True)

    def jb_fft2(x):
        return _jb_fft2_op(x)[0]


def vmap_fft_grads(loss: str = "sum") -> Cases:
    """jit(grad(loss(vmap(fft2)))) over FFT_BATCH arrays of FFT_SHAPE, complex128.

    ``loss="sum"``: Σ Re y, whose gradient needs only the transpose (XLA drops the
    forward call); ``"abs2"``: Σ |y|², which needs the forward call and the transpose.
    """
    r = {"native jnp": lambda x: jnp.fft.fft2(x)}
    if jaxbind is not None:
        r["JAXbind func_can_batch=True"] = jb_fft2
    r["anybind vmap=rule"] = ab_fft2_rule
    r["anybind sequential"] = ab_fft2_seq
    reduce = (lambda y: jnp.sum(jnp.real(y))) if loss == "sum" else \
        (lambda y: jnp.sum(jnp.abs(y) ** 2))
    return {k: (jax.jit(jax.grad(lambda x, f=f: reduce(jax.vmap(f)(x)))), fft_inputs())
            for k, f in r.items()}
