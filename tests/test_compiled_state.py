"""``ab.State``: compiled code keeps an object of its own (here a polynomial's
coefficients, built once by C code), passed as an FFI attribute, alive as long as
the op or a program using it, freed once after.

The C library counts its creates and frees, so each test sees exactly when the
object goes. The references are plain ``jax.numpy`` polynomials.
"""
import ctypes
import gc
import pickle
import threading

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import anybind as ab
from compiled_ops import build_library
from helpers import assert_close, check_first_order, randn

SOURCE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ARGS void *const *ins, void *const *outs, const int64_t *const *shapes, \
             const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, \
             char *err, int64_t err_size, void *state

typedef struct { int64_t k; double c[]; } poly;  /* p(x) = c[0] + c[1] x + ... */

static int64_t made = 0, freed = 0;
int64_t poly_made(void) { return __atomic_load_n(&made, __ATOMIC_SEQ_CST); }
int64_t poly_freed(void) { return __atomic_load_n(&freed, __ATOMIC_SEQ_CST); }

void *poly_new(const double *c, int64_t k) {
  poly *p = malloc(sizeof(poly) + k * sizeof(double));
  p->k = k;
  for (int64_t i = 0; i < k; ++i) p->c[i] = c[i];
  __atomic_add_fetch(&made, 1, __ATOMIC_SEQ_CST);
  return p;
}
void poly_free(void *p) {
  ((poly *)p)->k = -1;  /* a use after free would see no coefficients */
  free(p);
  __atomic_add_fetch(&freed, 1, __ATOMIC_SEQ_CST);
}

static double value(const poly *p, double x, int d) {  /* p(x), or p'(x) with d */
  double s = 0;
  for (int64_t i = p->k - 1; i >= d; --i) s = s * x + (d ? i : 1) * p->c[i];
  return s;
}

static int64_t count(const int64_t *shape, int64_t rank) {
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

/* out[i] = p(x[i]) (d = 0) or p'(x[i]) * t[i] (d = 1); x and t may have one element
   fewer along a leading batch axis of 1 (expand_dims): indexed modulo their size */
static int32_t run(ARGS, int d) {
  const poly *p = state;
  if (p == NULL || p->k < 1) { snprintf(err, err_size, "no polynomial"); return 3; }
  int64_t n = count(shapes[n_in], ranks[n_in]), nx = count(shapes[0], ranks[0]);
  int64_t nt = d ? count(shapes[1], ranks[1]) : 1;
  switch (dtypes[0]) {
    case 11: {
      const float *x = ins[0], *t = d ? ins[1] : NULL; float *y = outs[0];
      for (int64_t i = 0; i < n; ++i)
        y[i] = (float)(value(p, x[i % nx], d) * (d ? t[i % nt] : 1));
      return 0;
    }
    case 12: {
      const double *x = ins[0], *t = d ? ins[1] : NULL; double *y = outs[0];
      for (int64_t i = 0; i < n; ++i) y[i] = value(p, x[i % nx], d) * (d ? t[i % nt] : 1);
      return 0;
    }
    default: snprintf(err, err_size, "float32 or float64 only"); return 1;
  }
}
#define PASS ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size, state
int32_t poly_eval(ARGS) { return run(PASS, 0); }
int32_t poly_rule(ARGS) { return run(PASS, 1); }   /* jvp (x, ẋ) and vjp (x, ȳ) alike */
int32_t poly_eval_stateless(void *const *ins, void *const *outs, const int64_t *const *shapes,
                            const int64_t *ranks, const int32_t *dtypes, int64_t n_in,
                            int64_t n_out, char *err, int64_t err_size) { return 1; }
"""
LIB = ctypes.CDLL(str(build_library(SOURCE, "anybind-test-state")))
for _name in ("poly_eval", "poly_rule"):
    getattr(LIB, _name).restype, getattr(LIB, _name).argtypes = ab.ctypes_signature(state=True)
LIB.poly_eval_stateless.restype, LIB.poly_eval_stateless.argtypes = ab.ctypes_signature()
LIB.poly_new.restype, LIB.poly_new.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64]
LIB.poly_free.restype, LIB.poly_free.argtypes = None, [ctypes.c_void_p]
LIB.poly_made.restype = LIB.poly_freed.restype = ctypes.c_int64

COEFFS = np.array([0.5, -1.0, 0.25, 0.1])


def new_state(coeffs=COEFFS) -> ab.State:
    c = np.ascontiguousarray(coeffs, np.float64)
    return ab.State(LIB.poly_new(c.ctypes.data, len(c)), free=LIB.poly_free)


def poly_op(mode="sequential", name="poly", state=None):
    return ab.bind(LIB.poly_eval, shape=ab.like(0), jvp=LIB.poly_rule, vjp=LIB.poly_rule,
                   state=new_state() if state is None else state, vmap=mode, name=name)


def ref(x, coeffs=COEFFS):
    return sum(float(c) * x**i for i, c in enumerate(coeffs))


def live() -> int:
    return LIB.poly_made() - LIB.poly_freed()


MODES = ("sequential", "expand_dims")


@pytest.mark.parametrize("dtype", (np.float32, np.float64), ids=("float32", "float64"))
@pytest.mark.parametrize("mode", MODES)
def test_numbers_under_every_transformation(mode, dtype):
    op = poly_op(mode, name=f"poly_{mode}")
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is np.float32 else {}
    x = randn((2, 3), dtype)
    assert_close(op(x), ref(x), **tol)
    assert_close(jax.jit(op)(x), ref(x), **tol)
    loss = lambda f: lambda x: (jnp.sin(f(x)) ** 2).sum()  # noqa: E731
    assert_close(jax.grad(loss(op))(x), jax.grad(loss(ref))(x), **tol)
    assert_close(jax.jvp(op, (x,), (x,)), jax.jvp(ref, (x,), (x,)), **tol)
    xs = randn((4, 2, 3), dtype, seed=2)
    assert_close(jax.vmap(op)(xs), jax.vmap(ref)(xs), **tol)
    assert_close(jax.vmap(jax.grad(loss(op)))(xs), jax.vmap(jax.grad(loss(ref)))(xs), **tol)
    assert_close(jax.jacrev(op)(x[0]), jax.jacfwd(ref)(x[0]), **tol)
    if dtype is np.float64:
        check_first_order(op, (x,))
        assert ab.check(op, x).ok
    _, f_lin = jax.linearize(op, x)
    assert_close(jax.linear_transpose(f_lin, x)(x), jax.vjp(ref, x)[1](x), **tol)


def test_a_numba_cfunc_reads_the_state():
    @numba.cfunc(ab.numba_signature(state=True))
    def scaled(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size, state):
        n = 1
        for d in range(ranks[0]):
            n *= shapes[0][d]
        x, y = numba.carray(ins[0], n, np.float64), numba.carray(outs[0], n, np.float64)
        c = numba.carray(state, 1, np.float64)
        y[:] = c[0] * x
        return 0
    factor = np.array([3.0])
    kept = []
    op = ab.bind(scaled, shape=ab.like(0), linear=True, transpose=scaled, name="nb_scaled",
                 state=ab.State(factor.ctypes.data, free=kept.append))
    x = randn(5)
    assert_close(jax.jit(op)(x), 3 * x)
    assert_close(jax.hessian(_cubed(op))(x), np.diag(162 * x))
    del op
    gc.collect()
    assert kept == [factor.ctypes.data]


# ------------------------------------------------------------------- lifetime

def _cubed(op):
    return lambda x: (op(x) ** 3).sum()


def test_freed_once_when_the_op_and_every_program_are_gone():
    gc.collect()
    before_made, before_freed = LIB.poly_made(), LIB.poly_freed()
    op = poly_op(name="poly_life")
    x = randn(3)
    op(x), jax.jit(op)(x), jax.grad(_cubed(op))(x), jax.vmap(op)(x[:, None])
    compiled = jax.jit(_cubed(op)).lower(x).compile()
    assert LIB.poly_made() == before_made + 1
    del op
    gc.collect()
    assert LIB.poly_freed() == before_freed  # the compiled program holds it
    assert_close(compiled(x), (ref(x) ** 3).sum())
    del compiled
    gc.collect()
    assert LIB.poly_freed() == before_freed + 1


def test_a_state_shared_by_two_ops_goes_with_the_last():
    gc.collect()
    freed = LIB.poly_freed()
    state = new_state()
    a, b = poly_op(name="poly_a", state=state), poly_op(name="poly_b", state=state)
    del state
    x = randn(3)
    assert_close(a(x) + b(x), 2 * ref(x))
    del a
    gc.collect()
    assert LIB.poly_freed() == freed
    assert_close(jax.jit(b)(x), ref(x))
    del b
    gc.collect()
    assert LIB.poly_freed() == freed + 1


def test_ops_bound_and_dropped_in_a_loop_free_every_state():
    gc.collect()
    start = live()
    x = randn(4)
    for i in range(20):
        coeffs = COEFFS * (i + 1)
        op = ab.bind(LIB.poly_eval, shape=ab.like(0), state=new_state(coeffs), name="poly_loop")
        assert_close(jax.jit(op)(x), ref(x, coeffs))
    del op
    gc.collect()
    assert live() == start


# -------------------------------------------------------------------- threads

def test_calls_from_many_threads_share_one_state():
    op = jax.jit(jax.grad(lambda x: (poly_op(name="poly_threads")(x) ** 2).sum()))
    want = jax.grad(lambda x: (ref(x) ** 2).sum())
    inputs = [randn(1000, seed=s) for s in range(8)]
    errors = []

    def work(x):
        try:
            for _ in range(20):
                assert_close(op(x), want(x))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ---------------------------------------------------------------------- errors

def test_export_is_refused_naming_the_op():
    op = poly_op(name="poly_export")
    with pytest.raises(ValueError, match=r"anybind op 'poly_export' has compiled state "
                       r"\(ab.State at 0x[0-9a-f]+\), a pointer into this process that a "
                       r"program for jax.export cannot carry"):
        jax.export.export(jax.jit(jax.grad(lambda x: op(x).sum())))(randn(3))


def test_signatures_must_agree_with_the_state():
    with pytest.raises(TypeError, match=r"'stateless_fn'.*with void \*state last.*got 9 param"
                       r".*ctypes_signature\(state=True\)"):
        ab.bind(LIB.poly_eval_stateless, shape=ab.like(0), state=new_state(),
                name="stateless_fn")
    with pytest.raises(TypeError, match=r"'no_state'.*got 10 parameters.*needs an op bound "
                       r"with state=ab.State"):
        ab.bind(LIB.poly_eval, shape=ab.like(0), name="no_state")
    op = poly_op(name="poly_rule_check")
    with pytest.raises(TypeError, match=r"'poly_rule_check': the vjp rule.*void \*state"):
        op.def_vjp(LIB.poly_eval_stateless)
    with pytest.raises(TypeError, match=r"'not_a_state': state must be an ab.State.*int"):
        ab.bind(LIB.poly_eval, shape=ab.like(0), state=1234, name="not_a_state")
    with pytest.raises(ValueError, match="NULL"):
        ab.State(0)
    with pytest.raises(TypeError, match="pointer must be"):
        ab.State("0x10")
    with pytest.raises(pickle.PicklingError, match="cannot be pickled"):
        pickle.dumps(new_state())


def test_a_program_naming_an_unknown_state_is_refused():
    """A crafted call (a state id no ab.State registered) never reaches the function."""
    from anybind.routes import _compiled
    op = poly_op(name="poly_crafted")
    x = randn(3)
    assert_close(op(x), ref(x))
    name, key = _compiled.link(op, "function", LIB.poly_eval, False)
    call = jax.ffi.ffi_call(_compiled.TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype))
    with pytest.raises(Exception, match=r"'poly_crafted': the compiled function: a program "
                       r"calls it with a state this process never made"):
        jax.block_until_ready(call(x, anybind_key=np.int64(key), anybind_name=name,
                                   anybind_rows=np.int64(0), anybind_state=np.int64(12345)))
