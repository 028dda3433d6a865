"""Compiled ops under test: C kernels (a small library built here with the system
compiler, reached through ctypes and cffi) and Numba ``@cfunc`` kernels, all of
anybind's C calling convention, with pure-JAX references in ``ops.py`` style.

Importing this module binds every op under a fixed name, so a program exported
in one process runs in another that imports it (``test_compiled_export.py``).

=================  ===========================================================
op                 what it exercises
=================  ===========================================================
mul(flavour, m)    x1·x2² with compiled jvp and vjp; C via ctypes or cffi, or
                   Numba; vmap mode m; leading-axis broadcasting in C
cumsum             linear=True with a compiled transpose (reverse cumsum)
exp                compiled fwd/bwd pair keeping exp(x) as the residual
axpby              a pytree argument and an array keyword operand, Numba
abs_count          a float and an int64 output (rules see float leaves only)
scale_int          an int64 positional input (no tangent or cotangent for it)
checked_sqrt       returns an error status and message for negative input
gil_held           writes PyGILState_Check() seen from inside the call
spin               busy-waits x[0] seconds, then copies x
overlap            how many calls of it ran at once (per-device calls under shard_map)
=================  ===========================================================
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numba
import numpy as np

import anybind as ab

C_SOURCE = r"""
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define ARGS void *const *ins, void *const *outs, const int64_t *const *shapes, \
             const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, \
             char *err, int64_t err_size

static int64_t size(const int64_t *shape, int64_t rank) {
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) n *= shape[d];
  return n;
}
#define N(i) size(shapes[i], ranks[i])

/* Every operand float64, and the expected counts. */
static int32_t expect(ARGS, int64_t want_in, int64_t want_out) {
  if (n_in != want_in || n_out != want_out) {
    snprintf(err, err_size, "expected %lld inputs and %lld outputs, got %lld and %lld",
             (long long)want_in, (long long)want_out, (long long)n_in, (long long)n_out);
    return 1;
  }
  for (int64_t i = 0; i < n_in + n_out; ++i)
    if (dtypes[i] != 12) {
      snprintf(err, err_size, "operand %lld has dtype code %d, expected float64 (12)",
               (long long)i, dtypes[i]);
      return 2;
    }
  return 0;
}
#define EXPECT(a, b) do { int32_t s = expect(ins, outs, shapes, ranks, dtypes, n_in, n_out, \
                                            err, err_size, a, b); if (s) return s; } while (0)
/* Inputs may have a leading axis of 1 where the output's is a batch: i % size. */
#define IN(k, i) (((const double *)ins[k])[(i) % N(k)])

int32_t mul(ARGS) {                      /* y = x1·x2² */
  EXPECT(2, 1);
  double *y = outs[0];
  for (int64_t i = 0, n = N(2); i < n; ++i) y[i] = IN(0, i) * IN(1, i) * IN(1, i);
  return 0;
}

int32_t mul_jvp(ARGS) {                  /* ẏ = x2²·ẋ1 + 2·x1·x2·ẋ2 */
  EXPECT(4, 1);
  double *t = outs[0];
  for (int64_t i = 0, n = N(4); i < n; ++i)
    t[i] = IN(1, i) * IN(1, i) * IN(2, i) + 2 * IN(0, i) * IN(1, i) * IN(3, i);
  return 0;
}

int32_t mul_vjp(ARGS) {                  /* (xb1, xb2) = (x2²·ȳ, 2·x1·x2·ȳ) */
  EXPECT(3, 2);
  double *a = outs[0], *b = outs[1];
  for (int64_t i = 0, n = N(3); i < n; ++i) {
    a[i] = IN(1, i) * IN(1, i) * IN(2, i);
    b[i] = 2 * IN(0, i) * IN(1, i) * IN(2, i);
  }
  return 0;
}

/* Cumulative sum along the last axis and its transpose, the reversed one. */
static int32_t cumsum_dir(ARGS, int reverse) {
  EXPECT(1, 1);
  int64_t r = ranks[0], m = r ? shapes[0][r - 1] : 1, rows = m ? N(0) / m : 0;
  const double *x = ins[0];
  double *y = outs[0];
  for (int64_t row = 0; row < rows; ++row) {
    double s = 0;
    for (int64_t j = 0; j < m; ++j) {
      int64_t k = row * m + (reverse ? m - 1 - j : j);
      s += x[k];
      y[k] = s;
    }
  }
  return 0;
}
#define PASS ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size
int32_t cumsum(ARGS) { return cumsum_dir(PASS, 0); }
int32_t cumsum_t(ARGS) { return cumsum_dir(PASS, 1); }

/* (|x|, number of positive entries as int64): a float and an integer output. */
int32_t abs_count(ARGS) {
  if (n_in != 1 || n_out != 2 || dtypes[0] != 12 || dtypes[1] != 12 || dtypes[2] != 5) return 1;
  double *y = outs[0];
  int64_t *k = outs[1];
  *k = 0;
  for (int64_t i = 0, n = N(0); i < n; ++i) { y[i] = fabs(IN(0, i)); *k += IN(0, i) > 0; }
  return 0;
}
/* jvp: ins x, ẋ -> ẏ for the float output only; vjp: ins x, ȳ -> x̄. Both sign(x)·v. */
int32_t abs_count_rule(ARGS) {
  if (n_in != 2 || n_out != 1) return 1;
  double *t = outs[0];
  for (int64_t i = 0, n = N(0); i < n; ++i) t[i] = ((IN(0, i) > 0) - (IN(0, i) < 0)) * IN(1, i);
  return 0;
}

/* y = x·k for a float x and an int64 k: k has no tangent or cotangent. */
int32_t scale_int(ARGS) {
  if (n_in != 2 || n_out != 1 || dtypes[0] != 12 || dtypes[1] != 5) return 1;
  const int64_t *k = ins[1];
  for (int64_t i = 0, n = N(0); i < n; ++i) ((double *)outs[0])[i] = IN(0, i) * k[i % N(1)];
  return 0;
}
/* jvp: ins x, k, ẋ -> ẏ = k·ẋ; vjp: ins x, k, ȳ -> x̄ = k·ȳ. */
int32_t scale_int_rule(ARGS) {
  if (n_in != 3 || n_out != 1 || dtypes[1] != 5) return 1;
  const int64_t *k = ins[1];
  for (int64_t i = 0, n = N(0); i < n; ++i) ((double *)outs[0])[i] = IN(2, i) * k[i % N(1)];
  return 0;
}

int32_t checked_sqrt(ARGS) {
  EXPECT(1, 1);
  double *y = outs[0];
  for (int64_t i = 0, n = N(0); i < n; ++i) {
    if (IN(0, i) < 0) {
      snprintf(err, err_size, "negative input %g at index %lld", IN(0, i), (long long)i);
      return 7;
    }
    y[i] = sqrt(IN(0, i));
  }
  return 0;
}

int32_t gil_held(ARGS) {                 /* y = PyGILState_Check(), seen from the call */
  EXPECT(1, 1);
  int (*check)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
  if (!check) { snprintf(err, err_size, "PyGILState_Check not found"); return 1; }
  ((double *)outs[0])[0] = check();
  return 0;
}

/* y = the most calls of this function seen running at once, waiting up to x[0]
   seconds for a second one to overlap with this one. */
static int in_flight = 0, most = 0;
int32_t overlap(ARGS) {
  EXPECT(1, 1);
  __atomic_add_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    int m = __atomic_load_n(&most, __ATOMIC_SEQ_CST);
    int now = __atomic_load_n(&in_flight, __ATOMIC_SEQ_CST);
    if (now > m) __atomic_compare_exchange_n(&most, &m, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) + 1e-9 * (t.tv_nsec - t0.tv_nsec) < IN(0, 0) &&
           __atomic_load_n(&most, __ATOMIC_SEQ_CST) < 2);
  __atomic_sub_fetch(&in_flight, 1, __ATOMIC_SEQ_CST);
  double seen = __atomic_load_n(&most, __ATOMIC_SEQ_CST);
  for (int64_t i = 0, n = N(0); i < n; ++i) ((double *)outs[0])[i] = seen;
  return 0;
}

int32_t spin(ARGS) {                     /* busy-wait x[0] seconds; y = x */
  EXPECT(1, 1);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  double wait = IN(0, 0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) + 1e-9 * (t.tv_nsec - t0.tv_nsec) < wait);
  for (int64_t i = 0, n = N(0); i < n; ++i) ((double *)outs[0])[i] = IN(0, i);
  return 0;
}
"""

_C_FUNCTIONS = ("mul", "mul_jvp", "mul_vjp", "cumsum", "cumsum_t", "abs_count", "abs_count_rule",
                "scale_int", "scale_int_rule", "checked_sqrt", "gil_held", "spin", "overlap")


def build_library(source: str, stem: str) -> Path:
    """Compile ``source`` into a shared library, cached by its hash in the temp dir."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"{stem}-{digest}.so"
    if not path.exists():
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / f"{stem}.c", Path(tmp) / path.name
            src.write_text(source)
            subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", str(src),
                            "-o", str(out), "-lm", "-ldl"], check=True)
            os.replace(out, path)
    return path


LIB_PATH = build_library(C_SOURCE, "anybind-test-kernels")


@functools.cache
def clib(flavour: str):
    """The test library's functions as ctypes functions or cffi function pointers."""
    if flavour == "ctypes":
        lib = ctypes.CDLL(str(LIB_PATH))
        fns = {}
        for name in _C_FUNCTIONS:
            f = getattr(lib, name)
            f.restype, f.argtypes = ab.ctypes_signature()
            fns[name] = f
        return fns
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("".join(f"int32_t {name}(void *const *ins, void *const *outs, "
                     f"const int64_t *const *shapes, const int64_t *ranks, "
                     f"const int32_t *dtypes, int64_t n_in, int64_t n_out, char *err, "
                     f"int64_t err_size);\n" for name in _C_FUNCTIONS))
    lib = ffi.dlopen(str(LIB_PATH))
    clib._keep = (ffi, lib)
    return {name: ffi.addressof(lib, name) for name in _C_FUNCTIONS}


# ---------------------------------------------------------------------- Numba kernels

# Module-level, so that Numba caches them (tests/__pycache__) for the subprocesses too.
_SIG = ab.numba_signature()


@numba.njit(inline="always")
def _nb_size(shapes, ranks, i):
    n = 1
    for d in range(ranks[i]):
        n *= shapes[i][d]
    return n


@numba.njit(inline="always")
def _nb_arr(ptrs, i, shapes, ranks):
    return numba.carray(ptrs[i], _nb_size(shapes, ranks, i), np.float64)


@numba.cfunc(_SIG, cache=True)
def _nb_mul(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    x1, x2 = _nb_arr(ins, 0, shapes, ranks), _nb_arr(ins, 1, shapes, ranks)
    y = numba.carray(outs[0], _nb_size(shapes, ranks, 2), np.float64)
    for i in range(y.size):
        y[i] = x1[i % x1.size] * x2[i % x2.size] ** 2
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_mul_jvp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    x1, x2 = _nb_arr(ins, 0, shapes, ranks), _nb_arr(ins, 1, shapes, ranks)
    d1, d2 = _nb_arr(ins, 2, shapes, ranks), _nb_arr(ins, 3, shapes, ranks)
    t = numba.carray(outs[0], _nb_size(shapes, ranks, 4), np.float64)
    for i in range(t.size):
        a, b = x1[i % x1.size], x2[i % x2.size]
        t[i] = b * b * d1[i % d1.size] + 2 * a * b * d2[i % d2.size]
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_mul_vjp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    x1, x2, ct = _nb_arr(ins, 0, shapes, ranks), _nb_arr(ins, 1, shapes, ranks), \
        _nb_arr(ins, 2, shapes, ranks)
    n = _nb_size(shapes, ranks, 3)
    a, b = numba.carray(outs[0], n, np.float64), numba.carray(outs[1], n, np.float64)
    for i in range(n):
        u, v, c = x1[i % x1.size], x2[i % x2.size], ct[i % ct.size]
        a[i], b[i] = v * v * c, 2 * u * v * c
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_exp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    x, y = _nb_arr(ins, 0, shapes, ranks), numba.carray(outs[0], _nb_size(shapes, ranks, 1),
                                                    np.float64)
    y[:] = np.exp(x)
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_exp_fwd(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    x = _nb_arr(ins, 0, shapes, ranks)
    y = numba.carray(outs[0], x.size, np.float64)
    r = numba.carray(outs[1], x.size, np.float64)
    y[:] = np.exp(x)
    r[:] = y
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_exp_bwd(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    r, ct = _nb_arr(ins, 0, shapes, ranks), _nb_arr(ins, 1, shapes, ranks)
    xb = numba.carray(outs[0], _nb_size(shapes, ranks, 2), np.float64)
    for i in range(xb.size):
        xb[i] = r[i % r.size] * ct[i % ct.size]
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_axpby(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    # ({"x": x, "y": y}, w=w) -> w·x + y, with leaf order x, y, then w
    x, y, w = _nb_arr(ins, 0, shapes, ranks), _nb_arr(ins, 1, shapes, ranks), \
        _nb_arr(ins, 2, shapes, ranks)
    out = numba.carray(outs[0], _nb_size(shapes, ranks, 3), np.float64)
    for i in range(out.size):
        out[i] = w[i % w.size] * x[i % x.size] + y[i % y.size]
    return 0


@numba.cfunc(_SIG, cache=True)
def _nb_axpby_vjp(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    # ins x, y, w, ȳ -> outs xb = w·ȳ, ȳ̄ = ȳ
    w, ct = _nb_arr(ins, 2, shapes, ranks), _nb_arr(ins, 3, shapes, ranks)
    n = _nb_size(shapes, ranks, 4)
    a, b = numba.carray(outs[0], n, np.float64), numba.carray(outs[1], n, np.float64)
    for i in range(n):
        a[i], b[i] = w[i % w.size] * ct[i % ct.size], ct[i % ct.size]
    return 0


def numba_kernels() -> dict:
    return dict(mul=_nb_mul, mul_jvp=_nb_mul_jvp, mul_vjp=_nb_mul_vjp, exp=_nb_exp,
                exp_fwd=_nb_exp_fwd, exp_bwd=_nb_exp_bwd, axpby=_nb_axpby,
                axpby_vjp=_nb_axpby_vjp)


def kernels(flavour: str) -> dict:
    return numba_kernels() if flavour == "numba" else clib(flavour)


# ------------------------------------------------------------------------------ ops

FLAVOURS = ("ctypes", "cffi", "numba")


@functools.cache
def mul(flavour: str = "ctypes", mode: str = "sequential"):
    """x1·x2² (``ops.mul_ref``) with compiled jvp and vjp rules."""
    k = kernels(flavour)
    return ab.bind(k["mul"], shape=ab.like(0), jvp=k["mul_jvp"], vjp=k["mul_vjp"], vmap=mode,
                   name=f"cmul_{flavour}_{mode}")


def cumsum_ref(x):
    return jnp.cumsum(x, axis=-1)


@functools.cache
def cumsum(mode: str = "sequential"):
    k = clib("ctypes")
    return ab.bind(k["cumsum"], shape=ab.like(0), linear=True, transpose=k["cumsum_t"],
                   vmap=mode, name=f"ccumsum_{mode}")


def exp_ref(x):
    return jnp.exp(x)


@functools.cache
def exp(mode: str = "sequential"):
    k = numba_kernels()
    op = ab.bind(k["exp"], shape=ab.like(0), vmap=mode, name=f"cexp_{mode}")
    op.def_fwd(k["exp_fwd"], residuals=ab.like(0))
    op.def_bwd(k["exp_bwd"])
    # forward mode from a host rule beside the compiled ones
    op.def_jvp(lambda p, t: np.exp(p[0]) * t[0])
    return op


def axpby_ref(d, *, w):
    return w * d["x"] + d["y"]


@functools.cache
def axpby(mode: str = "sequential"):
    k = numba_kernels()
    return ab.bind(k["axpby"], shape=lambda d, *, w: d["x"], vjp=k["axpby_vjp"], vmap=mode,
                   name=f"caxpby_{mode}")


def abs_count_ref(x):
    return jnp.abs(x), jnp.sum(x > 0).astype(jnp.int64)


@functools.cache
def abs_count():
    """A float and an integer output: rules see the float output's tangent only."""
    k = clib("ctypes")
    return ab.bind(k["abs_count"], shape=lambda x: (x, jax.ShapeDtypeStruct((), jnp.int64)),
                   jvp=k["abs_count_rule"], vjp=k["abs_count_rule"], name="cabs_count")


def scale_int_ref(x, k):
    return x * k


@functools.cache
def scale_int():
    """An integer positional input: rules get no tangent or cotangent for it."""
    k = clib("cffi")
    return ab.bind(k["scale_int"], shape=ab.like(0), jvp=k["scale_int_rule"],
                   vjp=k["scale_int_rule"], name="cscale_int")


@functools.cache
def checked_sqrt(mode: str = "sequential"):
    return ab.bind(clib("ctypes")["checked_sqrt"], shape=ab.like(0), vmap=mode,
                   name=f"checked_sqrt_{mode}")


@functools.cache
def gil_held():
    return ab.bind(clib("ctypes")["gil_held"], shape=ab.like(0), name="gil_held")


@functools.cache
def spin():
    return ab.bind(clib("cffi")["spin"], shape=ab.like(0), has_side_effect=True, name="spin")


@functools.cache
def overlap():
    return ab.bind(clib("ctypes")["overlap"], shape=ab.like(0), has_side_effect=True,
                   name="overlap")


def bind_all() -> None:
    """Bind every op, in a fixed order, so that stable names match across processes."""
    for flavour in FLAVOURS:
        for mode in ("sequential", "vectorized"):
            mul(flavour, mode)
    for mode in ("sequential", "vectorized"):
        cumsum(mode)
        exp(mode)
        axpby(mode)
        checked_sqrt(mode)
    abs_count()
    scale_int()
    gil_held()
    spin()
    overlap()


bind_all()
