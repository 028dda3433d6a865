"""Every order for compiled code: a compiled rule bound as an op with compiled rules
of its own (a rule of the rule) gives ``jax.hessian``, ``jacfwd(jacrev)`` and
``ab.check`` at order 2; where a compiled rule has none, the error says so.

The op is x1·x2² (``ops.mul_ref``); its jvp rule J(x1, x2, ẋ1, ẋ2) and vjp rule
V(x1, x2, ȳ) are C functions bound as ops, each with a compiled jvp and vjp.
"""
import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
import compiled_ops as co
from compiled_ops import build_library
from helpers import assert_close, check_first_order, randn
from ops import mul_ref

SOURCE = r"""
#include <stdint.h>
#define ARGS void *const *ins, void *const *outs, const int64_t *const *shapes, \
             const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, \
             char *err, int64_t err_size
static int64_t size(const int64_t *shape, int64_t rank) {
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) n *= shape[d];
  return n;
}
#define N(i) size(shapes[i], ranks[i])
/* operands may have a leading axis of 1 where the outputs' is a batch: i % size */
#define IN(k) (((const double *)ins[k])[i % N(k)])
#define OUT(k) (((double *)outs[k])[i])
#define LOOP for (int64_t i = 0, n = N(n_in); i < n; ++i)
static int f64(ARGS) {
  for (int64_t k = 0; k < n_in + n_out; ++k) if (dtypes[k] != 12) return 1;
  return 0;
}
#define CHECK if (f64(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size)) return 1

/* J = x2² t1 + 2 x1 x2 t2, ins x1 x2 t1 t2 | a1 a2 b1 b2 */
int32_t jvp_jvp(ARGS) {
  CHECK;
  LOOP {
    double x1 = IN(0), x2 = IN(1), t1 = IN(2), t2 = IN(3), a1 = IN(4), a2 = IN(5);
    OUT(0) = 2 * x2 * a2 * t1 + x2 * x2 * IN(6) + 2 * a1 * x2 * t2 + 2 * x1 * a2 * t2
             + 2 * x1 * x2 * IN(7);
  }
  return 0;
}
/* ins x1 x2 t1 t2 | g -> cotangents of x1, x2, t1, t2 */
int32_t jvp_vjp(ARGS) {
  CHECK;
  LOOP {
    double x1 = IN(0), x2 = IN(1), t1 = IN(2), t2 = IN(3), g = IN(4);
    OUT(0) = 2 * x2 * t2 * g;
    OUT(1) = 2 * x2 * t1 * g + 2 * x1 * t2 * g;
    OUT(2) = x2 * x2 * g;
    OUT(3) = 2 * x1 * x2 * g;
  }
  return 0;
}
/* V = (x2² c, 2 x1 x2 c), ins x1 x2 c | a1 a2 dc */
int32_t vjp_jvp(ARGS) {
  CHECK;
  LOOP {
    double x1 = IN(0), x2 = IN(1), c = IN(2), a1 = IN(3), a2 = IN(4), dc = IN(5);
    OUT(0) = 2 * x2 * a2 * c + x2 * x2 * dc;
    OUT(1) = 2 * a1 * x2 * c + 2 * x1 * a2 * c + 2 * x1 * x2 * dc;
  }
  return 0;
}
/* ins x1 x2 c | g1 g2 -> cotangents of x1, x2, c */
int32_t vjp_vjp(ARGS) {
  CHECK;
  LOOP {
    double x1 = IN(0), x2 = IN(1), c = IN(2), g1 = IN(3), g2 = IN(4);
    OUT(0) = 2 * x2 * c * g2;
    OUT(1) = 2 * x2 * c * g1 + 2 * x1 * c * g2;
    OUT(2) = x2 * x2 * g1 + 2 * x1 * x2 * g2;
  }
  return 0;
}
"""
_lib = ctypes.CDLL(str(build_library(SOURCE, "anybind-test-rule-of-rule")))
K = dict(co.clib("ctypes"))
for _name in ("jvp_jvp", "jvp_vjp", "vjp_jvp", "vjp_vjp"):
    K[_name] = getattr(_lib, _name)
    K[_name].restype, K[_name].argtypes = ab.ctypes_signature()

MODES = ("sequential", "expand_dims")
X1, X2 = randn((2, 3)), 1.0 + 0.5 * randn((2, 3), seed=1)


@functools.cache
def mul(mode="sequential"):
    """x1·x2² with a jvp op and a vjp op, each with compiled rules of its own."""
    jvp_op = ab.bind(K["mul_jvp"], shape=ab.like(0), jvp=K["jvp_jvp"], vjp=K["jvp_vjp"],
                     vmap=mode, name=f"rr_mul_jvp_{mode}")
    vjp_op = ab.bind(K["mul_vjp"], shape=lambda x1, x2, c: (x1, x2), jvp=K["vjp_jvp"],
                     vjp=K["vjp_vjp"], vmap=mode, name=f"rr_mul_vjp_{mode}")
    return ab.bind(K["mul"], shape=ab.like(0), jvp=jvp_op, vjp=vjp_op, vmap=mode,
                   name=f"rr_mul_{mode}")


def energy(f):
    return lambda a, b: (jnp.sin(f(a, b)) ** 2).sum()


@pytest.mark.parametrize("mode", MODES)
def test_rules_of_the_rules_check_against_differences(mode):
    op = mul(mode)
    check_first_order(op, (X1, X2))
    check_first_order(op.jvp_rule.fn, (X1, X2, X2, X1))  # each rule op's own rules
    check_first_order(op.vjp_rule.fn, (X1, X2, X1))


@pytest.mark.parametrize("mode", MODES)
def test_hessians_and_every_nesting_of_second_order(mode):
    op = mul(mode)
    x1, x2 = X1[0], X2[0]
    want = jax.hessian(energy(mul_ref), argnums=(0, 1))(x1, x2)
    assert_close(jax.hessian(energy(op), argnums=(0, 1))(x1, x2), want)
    assert_close(jax.jit(jax.hessian(energy(op), argnums=(0, 1)))(x1, x2), want)
    for outer in (jax.jacfwd, jax.jacrev):
        for inner in (jax.jacfwd, jax.jacrev):
            got = outer(inner(energy(op), argnums=(0, 1)), argnums=(0, 1))(x1, x2)
            assert_close(got, want)
    # the Jacobian of the op itself, differentiated again
    assert_close(jax.jacfwd(jax.jacrev(op))(x1, x2), jax.jacfwd(jax.jacrev(mul_ref))(x1, x2))


@pytest.mark.parametrize("mode", MODES)
def test_second_order_under_vmap(mode):
    op = mul(mode)
    b1, b2 = randn((4, 3), seed=3), 1.0 + 0.5 * randn((4, 3), seed=4)
    h = lambda f: jax.vmap(jax.hessian(energy(f)))  # noqa: E731
    assert_close(h(op)(b1, b2), h(mul_ref)(b1, b2))
    g = lambda f: jax.grad(lambda a, b: jax.vmap(jax.grad(energy(f)))(a, b).sum())  # noqa: E731
    assert_close(g(op)(b1, b2), g(mul_ref)(b1, b2))


def test_ab_check_verifies_second_order():
    report = ab.check(mul(), X1, X2)
    text = str(report)
    assert report.ok, text
    assert "2nd-order jvp" in text and "hessian symmetry" in text
    assert "skip" not in "".join(line for line in text.splitlines() if "2nd" in line).lower()


@pytest.mark.slow  # starts a process
def test_a_hessian_program_exports_and_runs_in_a_fresh_process(tmp_path):
    from helpers import run_fresh_python
    program = jax.jit(jax.hessian(energy(mul()), argnums=(0, 1)))
    x1, x2 = X1[0], X2[0]
    exported = jax.export.export(program)(x1, x2)
    (tmp_path / "program.bin").write_bytes(exported.serialize())
    np.savez(tmp_path / "inputs.npz", x1=x1, x2=x2)
    res = run_fresh_python("""
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        import test_compiled_higher_order as t
        t.mul()
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        i = np.load("inputs.npz")
        np.savez("outputs.npz", *jax.tree.leaves(exported.call(i["x1"], i["x2"])))
    """, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    got = np.load(tmp_path / "outputs.npz")
    want = jax.tree.leaves(jax.hessian(energy(mul_ref), argnums=(0, 1))(x1, x2))
    assert_close([got[f"arr_{i}"] for i in range(len(want))], want)


# ------------------------------------------------------------------- errors

def test_a_plain_compiled_rule_says_compiled_and_shows_the_way():
    op = co.mul("ctypes")
    with pytest.raises(ab.MissingRuleError) as info:
        jax.hessian(energy(op))(X1[0], X2[0])
    text = str(info.value)
    assert "anybind op 'cmul_ctypes_sequential'" in text
    assert "its vjp rule, which is compiled code (a ctypes function)" in text
    assert "host code" not in text
    assert "ab.bind(" in text and "op.def_vjp(vjp_op)" in text and "traced=True" in text
    report = str(ab.check(op, X1, X2))
    assert "host" not in report.lower()
    assert "compiled rules give first derivatives" in report


def test_python_host_rules_say_host_code():
    op = ab.bind(lambda a, b: a * b**2, shape=ab.like(0),
                 jvp=lambda p, t: p[1] ** 2 * t[0] + 2 * p[0] * p[1] * t[1],
                 vjp=lambda p, ct: (p[1] ** 2 * ct, 2 * p[0] * p[1] * ct), name="host_mul_h")
    with pytest.raises(ab.MissingRuleError, match=r"its vjp rule, which is host code\. Host rules"):
        jax.hessian(energy(op))(X1[0], X2[0])


def test_an_op_is_refused_as_another_kind_of_rule():
    op = ab.bind(K["mul"], shape=ab.like(0), name="rr_refuse")
    rule = mul().jvp_rule.fn
    with pytest.raises(TypeError, match=r"an op \('rr_mul_jvp_sequential'\) may be the jvp, "
                       r"vjp or transpose rule.*def_vmap"):
        op.def_vmap(rule)
    with pytest.raises(TypeError, match=r"def_jvp got it"):
        op.def_jvp(rule, vmap="sequential")


def test_a_transpose_rule_op_with_its_own_transpose_gives_every_order():
    k = co.clib("ctypes")
    back = ab.bind(k["cumsum_t"], shape=ab.like(0), linear=True, transpose=k["cumsum"],
                   name="rr_cumsum_t")
    op = ab.bind(k["cumsum"], shape=ab.like(0), linear=True, transpose=back, name="rr_cumsum")
    x, ct = randn(5), randn(5, seed=2)
    assert_close(jax.linear_transpose(op, x)(ct), jax.linear_transpose(co.cumsum_ref, x)(ct))
    e = lambda f: lambda x: (jnp.sin(f(x)) ** 2).sum()  # noqa: E731
    assert_close(jax.hessian(e(op))(x), jax.hessian(e(co.cumsum_ref))(x))
    assert_close(jax.vmap(jax.grad(e(op)))(randn((3, 5), seed=3)),
                 jax.vmap(jax.grad(e(co.cumsum_ref)))(randn((3, 5), seed=3)))
