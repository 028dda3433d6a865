"""``ab.bind(order="F")``: compiled code gets column-major operands and gives
column-major results, under every transformation, batched calls included.

The kernels here read and write column-major (as Fortran does): a matrix-vector
product with its jvp and vjp, the same product as a linear op of x with its
transpose, and two probes that copy memory byte for byte, which show the
order XLA hands over for every dtype. A Fortran library built with gfortran
(skipped without it) checks the refusal of an unstated order.
"""
import ctypes
import functools
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from compiled_ops import build_library
from helpers import (
    assert_close,
    check_first_order,
    check_transpose_identity,
    randn,
    run_fresh_python,
)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <stdio.h>

#define ARGS void *const *ins, void *const *outs, const int64_t *const *shapes, \
             const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, \
             char *err, int64_t err_size

static int64_t item(int32_t code) {
  switch (code) {
    case 1: case 2: case 6: return 1;
    case 3: case 7: case 10: case 16: return 2;
    case 4: case 8: case 11: return 4;
    case 5: case 9: case 12: case 15: return 8;
    case 18: return 16;
    default: return -1;
  }
}

static int64_t count(const int64_t *shape, int64_t rank) {
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

/* out: the output's bytes are the input's, in memory order (sizes equal). */
int32_t copy_bytes(ARGS) {
  int64_t size = item(dtypes[0]);
  if (size < 0 || dtypes[n_in] != dtypes[0]) return 1;
  memcpy(outs[0], ins[0], (size_t)(count(shapes[n_in], ranks[n_in]) * size));
  return 0;
}

/* Column-major A (m, n[, B]) times x (n[, B]) -> y (m[, B]), trailing batch axes of
   B or 1 (broadcast), as an "expand_dims" call in order F gets them. */
#define BATCH(k, base) (ranks[k] > (base) ? shapes[k][base] : 1)
#define MATVEC(T)                                                                      \
  static void matvec_##T(const T *A, const T *x, T *y, int64_t m, int64_t n,          \
                         int64_t b, int64_t bA, int64_t bx, int add) {                 \
    for (int64_t k = 0; k < b; ++k) {                                                  \
      const T *Ak = A + (bA == 1 ? 0 : k) * m * n, *xk = x + (bx == 1 ? 0 : k) * n;    \
      for (int64_t i = 0; i < m; ++i) {                                                \
        T s = add ? y[k * m + i] : 0;                                                  \
        for (int64_t j = 0; j < n; ++j) s += Ak[i + j * m] * xk[j];                    \
        y[k * m + i] = s;                                                              \
      }                                                                                \
    }                                                                                  \
  }                                                                                    \
  /* x̄ = Aᵀ ȳ, and Ā = ȳ xᵀ if Abar */                                                \
  static void matvec_t_##T(const T *A, const T *x, const T *ct, T *Abar, T *xbar,       \
                           int64_t m, int64_t n, int64_t b, int64_t bA, int64_t bx,     \
                           int64_t bc) {                                               \
    for (int64_t k = 0; k < b; ++k) {                                                  \
      const T *Ak = A + (bA == 1 ? 0 : k) * m * n, *ck = ct + (bc == 1 ? 0 : k) * m;   \
      for (int64_t j = 0; j < n; ++j) {                                                \
        T s = 0;                                                                       \
        for (int64_t i = 0; i < m; ++i) s += Ak[i + j * m] * ck[i];                    \
        xbar[k * n + j] = s;                                                           \
      }                                                                                \
      if (Abar) {                                                                      \
        const T *xk = x + (bx == 1 ? 0 : k) * n;                                       \
        for (int64_t j = 0; j < n; ++j)                                                \
          for (int64_t i = 0; i < m; ++i) Abar[k * m * n + i + j * m] = ck[i] * xk[j]; \
      }                                                                                \
    }                                                                                  \
  }
MATVEC(float)
MATVEC(double)

#define DISPATCH(call_f, call_d)                                                       \
  switch (dtypes[0]) {                                                                 \
    case 11: call_f; return 0;                                                         \
    case 12: call_d; return 0;                                                         \
    default: snprintf(err, err_size, "float32 or float64 only"); return 1;             \
  }

/* y = A x; ins A (m, n), x (n) */
int32_t matvec(ARGS) {
  int64_t m = shapes[0][0], n = shapes[0][1], b = BATCH(2, 1);
  DISPATCH(matvec_float(ins[0], ins[1], outs[0], m, n, b, BATCH(0, 2), BATCH(1, 1), 0),
           matvec_double(ins[0], ins[1], outs[0], m, n, b, BATCH(0, 2), BATCH(1, 1), 0))
}

/* ẏ = Ȧ x + A ẋ; ins A, x, Ȧ, ẋ */
int32_t matvec_jvp(ARGS) {
  int64_t m = shapes[0][0], n = shapes[0][1], b = BATCH(4, 1);
  DISPATCH((matvec_float(ins[2], ins[1], outs[0], m, n, b, BATCH(2, 2), BATCH(1, 1), 0),
            matvec_float(ins[0], ins[3], outs[0], m, n, b, BATCH(0, 2), BATCH(3, 1), 1)),
           (matvec_double(ins[2], ins[1], outs[0], m, n, b, BATCH(2, 2), BATCH(1, 1), 0),
            matvec_double(ins[0], ins[3], outs[0], m, n, b, BATCH(0, 2), BATCH(3, 1), 1)))
}

/* (Ā, x̄) = (ȳ xᵀ, Aᵀ ȳ); ins A, x, ȳ */
int32_t matvec_vjp(ARGS) {
  int64_t m = shapes[0][0], n = shapes[0][1], b = BATCH(3, 2);
  DISPATCH(matvec_t_float(ins[0], ins[1], ins[2], outs[0], outs[1], m, n, b, BATCH(0, 2),
                          BATCH(1, 1), BATCH(2, 1)),
           matvec_t_double(ins[0], ins[1], ins[2], outs[0], outs[1], m, n, b, BATCH(0, 2),
                           BATCH(1, 1), BATCH(2, 1)))
}

/* y = A x as a linear map of x: ins x, A (a keyword operand) */
int32_t matvec_x(ARGS) {
  int64_t m = shapes[1][0], n = shapes[1][1], b = BATCH(2, 1);
  DISPATCH(matvec_float(ins[1], ins[0], outs[0], m, n, b, BATCH(1, 2), BATCH(0, 1), 0),
           matvec_double(ins[1], ins[0], outs[0], m, n, b, BATCH(1, 2), BATCH(0, 1), 0))
}

/* its transpose x̄ = Aᵀ ȳ: ins A, ȳ */
int32_t matvec_x_t(ARGS) {
  int64_t m = shapes[0][0], n = shapes[0][1], b = BATCH(2, 1);
  DISPATCH(matvec_t_float(ins[0], 0, ins[1], 0, outs[0], m, n, b, BATCH(0, 2), 1, BATCH(1, 1)),
           matvec_t_double(ins[0], 0, ins[1], 0, outs[0], m, n, b, BATCH(0, 2), 1,
                           BATCH(1, 1)))
}
"""
_NAMES = ("copy_bytes", "matvec", "matvec_jvp", "matvec_vjp", "matvec_x", "matvec_x_t")
_lib = ctypes.CDLL(str(build_library(SOURCE, "anybind-test-order")))
K = {}
for _name in _NAMES:
    K[_name] = getattr(_lib, _name)
    K[_name].restype, K[_name].argtypes = ab.ctypes_signature()

MODES = ("sequential", "expand_dims")
DTYPES = (np.float32, np.float64)
TOL = {np.float32: dict(rtol=2e-4, atol=2e-4), np.float64: {}}
FD_TOL = {np.float32: dict(rtol=3e-2, atol=3e-2), np.float64: {}}


@functools.cache
def matvec(mode):
    return ab.bind(K["matvec"], shape=lambda A, x: jax.ShapeDtypeStruct(A.shape[:1], A.dtype),
                   jvp=K["matvec_jvp"], vjp=K["matvec_vjp"], order="F", vmap=mode,
                   name=f"matvec_f_{mode}")


@functools.cache
def matvec_x(mode):
    return ab.bind(K["matvec_x"], shape=lambda x, *, A: jax.ShapeDtypeStruct(A.shape[:1], A.dtype),
                   linear=True, transpose=K["matvec_x_t"], order="F", vmap=mode,
                   name=f"matvec_x_f_{mode}")


def ref(A, x):
    return A @ x


def _data(dtype, m=3, n=4, seed=0):
    return randn((m, n), dtype, seed), randn(n, dtype, seed + 1)


# -------------------------------------------------------------- the memory order

ALL_DTYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
              np.uint32, np.uint64, np.float16, jnp.bfloat16, np.float32, np.float64,
              np.complex64, np.complex128)


def _values(shape, dtype, seed=0):
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + 7 * seed
    return (x % 2 == 1) if dtype is np.bool_ else x.astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", MODES)
def test_operands_and_results_arrive_column_major_for_every_dtype(dtype, mode):
    flat = lambda a: jax.ShapeDtypeStruct((int(np.prod(a.shape)),), a.dtype)  # noqa: E731
    memory = ab.bind(K["copy_bytes"], shape=flat, order="F", vmap=mode, name=f"memory_{mode}")
    unflat = ab.bind(K["copy_bytes"], shape=lambda x, *, like: like, order="F", vmap=mode,
                     name=f"unflat_{mode}")
    row = ab.bind(K["copy_bytes"], shape=flat, vmap=mode, name=f"memory_c_{mode}")
    A = _values((2, 3, 4), dtype)
    for f in (memory, jax.jit(memory)):
        np.testing.assert_array_equal(f(A), A.ravel(order="F"))
    np.testing.assert_array_equal(row(A), A.ravel(order="C"))
    x = _values((24,), dtype, seed=1)
    np.testing.assert_array_equal(unflat(x, like=A), x.reshape(A.shape, order="F"))
    # batched: each example's own memory is column-major, whatever the batch axis
    As = np.stack([A, _values(A.shape, dtype, 2), _values(A.shape, dtype, 3)])
    for axis in (0, 2):
        got = jax.vmap(memory, in_axes=axis)(np.moveaxis(As, 0, axis))
        np.testing.assert_array_equal(got, np.stack([a.ravel(order="F") for a in As]))
    xs = np.stack([x, _values((24,), dtype, 4)])
    got = jax.vmap(lambda x: unflat(x, like=A))(xs)
    np.testing.assert_array_equal(got, np.stack([v.reshape(A.shape, order="F") for v in xs]))


def test_the_custom_call_asks_xla_for_column_major_layouts():
    A, x = _data(np.float64)
    text = jax.jit(matvec("sequential")).lower(A, x).as_text()
    assert "operand_layouts = [dense<[0, 1]> : tensor<2xindex>, dense<0> : tensor<1xindex>]" \
        in text
    # a batch split row by row stays outermost; a whole batch goes last (Fortran's A(m, n, B))
    text = jax.jit(jax.vmap(matvec("sequential"))).lower(np.stack([A, A]), np.stack([x, x]))
    assert "dense<[1, 2, 0]> : tensor<3xindex>" in text.as_text()
    text = jax.jit(jax.vmap(matvec("expand_dims"))).lower(np.stack([A, A]), np.stack([x, x]))
    assert "tensor<3x4x2xf64>" in text.as_text()
    assert "operand_layouts = [dense<[0, 1, 2]>" in text.as_text()


# ------------------------------------------------------------------ derivatives

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", MODES)
def test_matvec_numbers_under_every_transformation(dtype, mode):
    op, tol = matvec(mode), TOL[dtype]
    A, x = _data(dtype)
    assert_close(op(A, x), ref(A, x), **tol)
    assert_close(jax.jit(op)(A, x), ref(A, x), **tol)
    if dtype is np.float64:
        check_first_order(op, (A, x))
    dA, dx = _data(dtype, seed=5)
    assert_close(jax.jvp(op, (A, x), (dA, dx)), jax.jvp(ref, (A, x), (dA, dx)), **tol)
    ct = randn(3, dtype, seed=9)
    assert_close(jax.vjp(op, A, x)[1](ct), jax.vjp(ref, A, x)[1](ct), **tol)
    assert_close(jax.grad(lambda A, x: (op(A, x) ** 2).sum(), argnums=(0, 1))(A, x),
                 jax.grad(lambda A, x: (ref(A, x) ** 2).sum(), argnums=(0, 1))(A, x), **tol)
    for jac in (jax.jacfwd, jax.jacrev):
        assert_close(jac(op, argnums=(0, 1))(A, x), jax.jacfwd(ref, argnums=(0, 1))(A, x), **tol)
    _, f_lin = jax.linearize(op, A, x)
    assert_close(jax.linear_transpose(f_lin, A, x)(ct), jax.vjp(ref, A, x)[1](ct), **tol)


@pytest.mark.parametrize("mode", MODES)
def test_matvec_under_vmap_every_axis_and_derivatives_of_it(mode):
    op = matvec(mode)
    As, xs = randn((5, 3, 4), seed=2), randn((5, 4), seed=3)
    A, x = As[0], xs[0]
    for axes, args in (((0, 0), (As, xs)), ((0, None), (As, x)), ((None, 0), (A, xs)),
                       ((2, 1), (np.moveaxis(As, 0, 2), xs.T))):
        assert_close(jax.vmap(op, axes)(*args), jax.vmap(ref, axes)(*args))
        assert_close(jax.jit(jax.vmap(op, axes))(*args), jax.vmap(ref, axes)(*args))
    loss = lambda f: lambda A, x: (jnp.sin(f(A, x)) ** 2).sum()  # noqa: E731
    assert_close(jax.vmap(jax.grad(loss(op), argnums=(0, 1)))(As, xs),
                 jax.vmap(jax.grad(loss(ref), argnums=(0, 1)))(As, xs))
    assert_close(jax.grad(lambda A: loss(jax.vmap(op, (0, None)))(A, x))(As),
                 jax.grad(lambda A: loss(jax.vmap(ref, (0, None)))(A, x))(As))
    assert_close(jax.vmap(jax.jacrev(op, argnums=(0, 1)), (0, None))(As, x),
                 jax.vmap(jax.jacrev(ref, argnums=(0, 1)), (0, None))(As, x))
    ds = randn((5, 3, 4), seed=4), randn((5, 4), seed=5)
    assert_close(jax.vmap(lambda *a: jax.jvp(op, a[:2], a[2:])[1])(As, xs, *ds),
                 jax.vmap(lambda *a: jax.jvp(ref, a[:2], a[2:])[1])(As, xs, *ds))
    # nested vmap: one call, every example right
    Ass = randn((2, 5, 3, 4), seed=6)
    assert_close(jax.vmap(jax.vmap(op, (0, None)), (0, None))(Ass, x),
                 jax.vmap(jax.vmap(ref, (0, None)), (0, None))(Ass, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", MODES)
def test_linear_matvec_with_a_keyword_matrix_every_order(dtype, mode):
    op, tol = matvec_x(mode), TOL[dtype]
    A, x = _data(dtype)
    assert_close(op(x, A=A), ref(A, x), **tol)
    ct, dx = randn(3, dtype, seed=7), randn(4, dtype, seed=8)
    check_transpose_identity(lambda x: op(x, A=A), x, dx, ct, **FD_TOL[dtype])
    assert_close(jax.linear_transpose(lambda x: op(x, A=A), x)(ct), (A.T @ ct,), **tol)
    energy = lambda f: lambda x: (jnp.sin(f(x)) ** 2).sum()  # noqa: E731
    assert_close(jax.hessian(energy(lambda x: op(x, A=A)))(x),
                 jax.hessian(energy(lambda x: ref(A, x)))(x), **tol)
    assert_close(jax.jacfwd(jax.jacrev(energy(lambda x: op(x, A=A))))(x),
                 jax.hessian(energy(lambda x: ref(A, x)))(x), **tol)
    As, xs = randn((5, 3, 4), dtype, seed=2), randn((5, 4), dtype, seed=3)
    assert_close(jax.vmap(lambda x, A: op(x, A=A))(xs, As), jax.vmap(ref)(As, xs), **tol)
    assert_close(jax.vmap(lambda A: op(x, A=A))(As), jax.vmap(ref, (0, None))(As, x), **tol)
    assert_close(jax.vmap(jax.grad(lambda x, A: energy(lambda x: op(x, A=A))(x)))(xs, As),
                 jax.vmap(jax.grad(lambda x, A: energy(lambda x: ref(A, x))(x)))(xs, As), **tol)


def _exported_program(A, x, As):
    op = matvec("sequential")
    return (op(A, x), jax.grad(lambda A: op(A, x).sum())(A), jax.vmap(op, (0, None))(As, x),
            jax.vmap(matvec("expand_dims"), (0, None))(As, x))


@pytest.mark.slow  # starts a process
def test_export_keeps_the_layouts(tmp_path):
    A, x = _data(np.float64)
    As = randn((2, 3, 4), seed=4)
    exported = jax.export.export(jax.jit(_exported_program))(A, x, As)
    assert "operand_layouts = [dense<[0, 1]>" in exported.mlir_module()
    want = [ref(A, x), np.outer(np.ones(3), x), np.einsum("bmn,n->bm", As, x),
            np.einsum("bmn,n->bm", As, x)]
    assert_close(exported.call(A, x, As), want)
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "inputs.npz", A=A, x=x, As=As)
    res = run_fresh_python("""
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        import test_compiled_order as t  # binds the ops the program calls
        t.matvec("sequential"), t.matvec("expand_dims")
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        i = np.load("inputs.npz")
        np.savez("outputs.npz", *exported.call(i["A"], i["x"], i["As"]))
    """, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "outputs.npz")
    assert_close([got[f"arr_{i}"] for i in range(4)], want)


# ------------------------------------------------------ an order left unstated

def test_bad_order_is_refused():
    with pytest.raises(TypeError, match=r"'bad_order': order must be 'C' .* got 'K'"):
        ab.bind(K["matvec"], shape=ab.like(1), order="K", name="bad_order")


FORTRAN = """
module probe_mod
  use iso_c_binding
  implicit none
contains
  integer(c_int32_t) function probe(ins, outs, shapes, ranks, dtypes, n_in, n_out, &
                                    err, err_size) bind(C, name="probe")
    type(c_ptr), intent(in) :: ins(*), outs(*), shapes(*)
    integer(c_int64_t), intent(in) :: ranks(*)
    integer(c_int32_t), intent(in) :: dtypes(*)
    integer(c_int64_t), value :: n_in, n_out, err_size
    character(kind=c_char), intent(out) :: err(*)
    integer(c_int64_t), pointer :: shape(:)
    real(c_double), pointer :: a(:, :), y(:)
    call c_f_pointer(shapes(1), shape, [2])
    call c_f_pointer(ins(1), a, [shape(1), shape(2)])
    call c_f_pointer(outs(1), y, [shape(1)])
    if (any(a /= a)) then
      print *, "NaN in the input"   ! calls the Fortran runtime
      probe = 1
      return
    end if
    y = sum(a, dim=2)
    probe = 0
  end function
end module
"""


@pytest.fixture(scope="module")
def fortran_probe(tmp_path_factory):
    if shutil.which("gfortran") is None:
        pytest.skip("needs gfortran")
    d = tmp_path_factory.mktemp("fortran")
    (d / "probe.f90").write_text(FORTRAN)
    subprocess.run(["gfortran", "-O2", "-shared", "-fPIC", str(d / "probe.f90"), "-o",
                    str(d / "libprobe.so")], check=True, cwd=d)
    lib = ctypes.CDLL(str(d / "libprobe.so"))
    lib.probe.restype, lib.probe.argtypes = ab.ctypes_signature()
    return lib.probe


def test_a_fortran_library_is_known_by_its_runtime_or_its_sources(fortran_probe, tmp_path):
    from anybind.routes import _layout
    pure = FORTRAN.replace('print *, "NaN in the input"   ! calls the Fortran runtime', "")
    (tmp_path / "probe.f90").write_text(FORTRAN)
    (tmp_path / "pure.f90").write_text(pure)
    for source, flags, lib_name, why in (
            ("probe.f90", ["-s"], "libstripped.so", r"it needs libgfortran"),  # no symbols
            ("pure.f90", [], "libpure.so", r"it is built from pure\.f90")):  # no runtime
        subprocess.run(["gfortran", "-O2", "-shared", "-fPIC", *flags, source, "-o", lib_name],
                       check=True, cwd=tmp_path)
        lib = ctypes.CDLL(str(tmp_path / lib_name))
        lib.probe.restype, lib.probe.argtypes = ab.ctypes_signature()
        op = ab.bind(lib.probe, shape=lambda a: jax.ShapeDtypeStruct(a.shape[:1], a.dtype),
                     name=lib_name.removesuffix(".so"))
        with pytest.raises(TypeError, match=rf"{lib_name}, a Fortran library \({why}"):
            op(randn((3, 4)))
        x = randn((3, 1))  # one axis longer than 1: the same in either order
        assert_close(op(x), x[:, 0])
    assert _layout._needs_fortran("/proc/self/exe") is None


def test_a_fortran_routine_without_an_order_is_refused_on_matrices(fortran_probe):
    rows = lambda a: jax.ShapeDtypeStruct(a.shape[:1], a.dtype)  # noqa: E731
    op = ab.bind(fortran_probe, shape=rows, name="fortran_probe")
    A = randn((3, 4))
    with pytest.raises(TypeError, match=r"'fortran_probe': its compiled function comes from "
                       r".*libprobe\.so, a Fortran library \(it needs libgfortran.*order='F'"):
        op(A)
    with pytest.raises(TypeError, match=r"order='F'"):
        jax.jit(jax.vmap(op))(np.stack([A, A]))
    f = ab.bind(fortran_probe, shape=rows, order="F", name="fortran_probe_f")
    assert_close(f(A), A.sum(axis=1))  # the row sums: Fortran's A(m, n) is the array itself
    assert_close(jax.vmap(f)(np.stack([A, 2 * A])), np.stack([A, 2 * A]).sum(axis=2))
    c = ab.bind(fortran_probe, shape=rows, order="C", name="fortran_probe_c")
    # order='C' said explicitly: the routine reads the row-major buffer as a (3, 4) column-major
    assert_close(c(A), A.ravel().reshape((3, 4), order="F").sum(axis=1))


def test_c_and_numba_code_keep_row_major_without_an_order():
    from anybind.routes import _layout
    from anybind.routes._compiled import _address
    assert _layout.fortran_runtime("ctypes", _address(K["matvec"], "ctypes")) is None
    import compiled_ops as co
    nb = co.numba_kernels()["mul"]
    assert _layout.fortran_runtime("numba", _address(nb, "numba")) is None
