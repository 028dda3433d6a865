"""ab.check: passes correct ops, and catches each kind of wrong rule, naming it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
import ops
from helpers import randn

X = np.linspace(0.5, 1.5, 5)
Y = np.linspace(-1.0, 2.0, 5)


# ----------------------------------------------------------------- correct ops

def mul_op(jvp_factor=1.0, **bind_kw):
    """f(x1, x2) = x1·x2², host rules; ``jvp_factor`` scales the jvp's x1 term."""
    return ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), name="mul",
                   jvp=lambda p, t: jvp_factor * p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
                   vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct), **bind_kw)


def sincos(vmap="vectorized"):
    """Host sin and cos whose traced jvp rules call each other: every order."""
    sin = ab.bind(np.sin, shape=ab.like(0), vmap=vmap, name="sin")
    cos = ab.bind(np.cos, shape=ab.like(0), vmap=vmap, name="cos")
    sin.def_jvp(lambda p, t: cos(p[0]) * t[0], traced=True)
    cos.def_jvp(lambda p, t: -sin(p[0]) * t[0], traced=True)
    return sin, cos


def matvec_op(scale=1.0):
    """y = A·x, linear in x, A a keyword operand; ``scale`` corrupts the transpose."""
    return ab.bind(lambda x, *, a: np.einsum("...ij,...j->...i", a, x), linear=True,
                   shape=lambda x, *, a: jax.ShapeDtypeStruct(a.shape[:-1], x.dtype),
                   transpose=lambda ct, *, a: (scale * np.einsum("...ij,...i->...j", a, ct),),
                   vmap="vectorized", name="matvec")


def fft_op():
    """The DFT: complex-linear and symmetric, so its JAX transpose is itself."""
    return ab.bind(lambda x: np.fft.fft(x, axis=-1), shape=ab.like(0), linear=True,
                   transpose=lambda ct: (np.fft.fft(ct, axis=-1),), vmap="vectorized",
                   name="fft")


def sort_op():
    """(sorted x, int64 argsort) along the last axis (torch.func's NumpySort)."""
    def fn(x):
        i = np.argsort(x, axis=-1)
        return np.take_along_axis(x, i, axis=-1), i.astype(np.int64)

    def vjp(p, ct):
        out = np.zeros_like(ct[0])
        np.put_along_axis(out, np.argsort(p[0], axis=-1), ct[0], axis=-1)
        return (out,)

    return ab.bind(fn, shape=lambda x: (x, jax.ShapeDtypeStruct(x.shape, np.int64)),
                   jvp=lambda p, t: (np.take_along_axis(t[0], np.argsort(p[0], axis=-1),
                                                        axis=-1), None),
                   vjp=vjp, vmap="vectorized", name="sort")


def tree_op(drop_term=False):
    """{"a": x, "b": y} ↦ (x·sin y, Σ(x + y)); ``drop_term`` drops a term of the b vjp."""
    def vjp(p, ct):
        (d,), (c0, c1) = p, ct
        c1 = c1[..., None]
        b = c0 * d["a"] * np.cos(d["b"]) + (0 if drop_term else c1)
        return ({"a": c0 * np.sin(d["b"]) + c1, "b": b},)

    return ab.bind(lambda d: (d["a"] * np.sin(d["b"]), (d["a"] + d["b"]).sum(-1)),
                   shape=lambda d: (d["a"], jax.ShapeDtypeStruct(d["a"].shape[:-1],
                                                                 d["a"].dtype)),
                   jvp=lambda p, t: (t[0]["a"] * np.sin(p[0]["b"])
                                     + p[0]["a"] * np.cos(p[0]["b"]) * t[0]["b"],
                                     (t[0]["a"] + t[0]["b"]).sum(-1)),
                   vjp=vjp, vmap="vectorized", name="tree")


def scale_op():
    """Σ_axis w·x^power: ``w`` an array keyword, ``power`` and ``axis`` static."""
    return ab.bind(
        lambda x, *, w, power, axis: (w * x**power).sum(axis=axis),
        shape=lambda x, *, w, power, axis: jax.ShapeDtypeStruct(
            tuple(np.delete(np.array(x.shape), axis)), x.dtype),
        jvp=lambda p, t, *, w, power, axis: (w * power * p[0]**(power - 1) * t[0]).sum(axis),
        vjp=lambda p, ct, *, w, power, axis: (w * power * p[0]**(power - 1)
                                               * np.expand_dims(ct, axis),),
        name="scale")


def abs2_op(conjugate_convention=False):
    """|z|², real output of a complex input: JAX's vjp is 2·z̄·ȳ (not 2·z·ȳ)."""
    return ab.bind(lambda z: (z * z.conj()).real, name="abs2",
                   shape=lambda z: jax.ShapeDtypeStruct(z.shape, jnp.float64),
                   jvp=lambda p, t: 2 * (p[0].conj() * t[0]).real,
                   vjp=lambda p, ct: ((p[0] if conjugate_convention else p[0].conj())
                                      * 2 * ct,),
                   vmap="vectorized")


def softplus_op():
    """A traced (JAX) function with its own traced jvp: every check applies."""
    op = ab.bind(lambda x: jnp.logaddexp(x, 0.0), traced=True, name="softplus")
    op.def_jvp(lambda p, t: jax.nn.sigmoid(p[0]) * t[0], traced=True)
    return op


A = randn((3, 5), seed=1)
Z = randn((8,), np.complex128, seed=2)
TREE = {"a": randn((2, 4), seed=3), "b": randn((2, 4), seed=4)}

CORRECT = {
    "mul": lambda: (mul_op(vmap="vectorized"), (X, Y), {}),
    "mul sequential": lambda: (mul_op(), (X, Y), {}),
    "sin": lambda: (sincos()[0], (X,), {}),
    "cos sequential": lambda: (sincos("sequential")[1], (Y,), {}),
    "matvec": lambda: (matvec_op(), (X,), {"a": A}),
    "fft": lambda: (fft_op(), (Z,), {}),
    "sort": lambda: (sort_op(), (randn((2, 6), seed=5),), {}),
    "tree": lambda: (tree_op(), (TREE,), {}),
    "scale": lambda: (scale_op(), (X[None] + Y[:, None],),
                      {"w": randn((5,), seed=6), "power": 3, "axis": -1}),
    "abs2": lambda: (abs2_op(), (Z,), {}),
    "softplus": lambda: (softplus_op(), (Y,), {}),
    "mul float32": lambda: (mul_op(vmap="vectorized"),
                            (X.astype(np.float32), Y.astype(np.float32)), {}),
}


@pytest.mark.parametrize("name", CORRECT)
def test_correct_op_passes(name):
    op, args, kwargs = CORRECT[name]()
    report = ab.check(op, *args, **kwargs)
    assert report.ok
    ran = {r.check for r in report.rows if r.status == "ok"}
    assert {"spec", "eager", "jit", "jvp", "vjp", "vmap"} <= ran, str(report)


def test_second_order_checks_run_for_traced_rules():
    report = ab.check(sincos()[0], X)
    ran = {r.check for r in report.rows if r.status == "ok"}
    assert {"2nd-order jvp", "hessian symmetry"} <= ran, str(report)


def test_linear_op_checks_linearity_and_transpose():
    report = ab.check(fft_op(), Z)
    ran = {r.check for r in report.rows if r.status == "ok"}
    assert {"linearity", "transpose", "vmap of transpose"} <= ran, str(report)


def test_host_rules_skip_second_order_with_reason():
    report = ab.check(mul_op(), X, Y)
    skipped = {r.check: r.note for r in report.rows if r.status == "skipped"}
    assert "host rules give first derivatives" in skipped["2nd-order jvp"]


def test_report_table():
    text = str(ab.check(mul_op(vmap="vectorized"), X, Y))
    assert "op 'mul'" in text
    for word in ("check", "status", "error", "tolerance", "jvp", "argument 1", "ok"):
        assert word in text


def test_examples_without_arguments():
    op = mul_op(vmap="vectorized", examples=lambda: ((X, Y), {}))
    assert ab.check(op).ok


def test_no_examples_is_an_error():
    with pytest.raises(TypeError, match="needs example inputs"):
        ab.check(mul_op())


# ----------------------------------------------------------------- wrong rules

def _raises(op, *args, check, where, **kwargs) -> ab.RuleError:
    with pytest.raises(ab.RuleError) as info:
        ab.check(op, *args, **kwargs)
    e = info.value
    assert (e.op, e.check) == (op.name, check), str(e)
    assert where in e.where, str(e)
    assert f"op '{op.name}'" in str(e) and f"'{check}'" in str(e)
    assert e.report is not None and e.report.rows[-1].status == "FAIL"
    return e


def test_catches_jvp_off_by_a_factor_in_one_argument():
    e = _raises(mul_op(jvp_factor=1.01), X, Y, check="jvp", where="argument 0")
    assert e.error > e.tolerance and "exceeds tolerance" in str(e)
    assert "argument 0 → output" in str(e)


def test_catches_vjp_that_drops_a_term():
    e = _raises(tree_op(drop_term=True), TREE, check="vjp", where="argument 0['b']")
    assert "vjp rule" in str(e)


def test_catches_transpose_scaled():
    e = _raises(matvec_op(scale=1.5), X, a=A, check="transpose", where="argument 0")
    assert e.error > 0.1


def test_catches_vmap_rule_computing_another_function():
    op = ab.bind(np.sin, shape=ab.like(0), name="sin_badvmap",
                 jvp=lambda p, t: np.cos(p[0]) * t[0],
                 vmap=lambda size, batched, x: (np.sin(x[::-1]) if batched[0] else np.sin(x),
                                                batched[0]))
    e = _raises(op, X, check="vmap", where="all batched")
    assert "vmap rule" in str(e)


def test_catches_vectorized_function_that_mixes_rows():
    op = ab.bind(lambda x: x - x.mean(), shape=ab.like(0), vmap="vectorized", name="center")
    _raises(op, X, check="vmap", where="all batched")


def test_catches_output_spec_with_wrong_shape():
    op = ab.bind(np.cumsum, shape=jax.ShapeDtypeStruct((4,), np.float64), name="cumsum")
    e = _raises(op, X, check="spec", where="output")
    assert "[4]" in str(e) and "[5]" in str(e)


def test_catches_output_spec_with_wrong_dtype_or_structure():
    op = ab.bind(np.cumsum, shape=lambda x: jax.ShapeDtypeStruct(x.shape, np.float32))
    assert "float32" in str(_raises(op, X, check="spec", where="output"))
    op = ab.bind(np.cumsum, shape=lambda x: (x,), name="cumsum_tuple")
    _raises(op, X, check="spec", where="structure")


def test_catches_complex_vjp_with_the_conjugate_convention():
    _raises(abs2_op(conjugate_convention=True), Z, check="vjp", where="argument 0")


def test_catches_nonlinear_op_declared_linear():
    op = ab.bind(np.square, shape=ab.like(0), linear=True, name="square",
                 transpose=lambda ct: (ct,))
    # linearity runs first: the declaration is what is wrong, not a derivative
    e = _raises(op, X, check="linearity", where="all arguments")
    assert "multilinear" not in str(e)  # one argument: not a case for multilinear=True


def test_catches_wrong_second_derivative():
    sin = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="sin_bad2")
    cos = ab.bind(np.cos, shape=ab.like(0), vmap="vectorized", name="cos_bad2")
    sin.def_jvp(lambda p, t: cos(p[0]) * t[0], traced=True)
    cos.def_jvp(lambda p, t: sin(p[0]) * t[0], traced=True)  # sign error
    _raises(sin, X, check="2nd-order jvp", where="all arguments")


def test_a_rule_that_raises_is_reported_with_its_check():
    op = ab.bind(np.sin, shape=ab.like(0), name="sin_raises",
                 jvp=lambda p, t: np.cos(p[0]) @ np.ones((2, 2)))
    e = _raises(op, X, check="jvp", where="argument 0")
    assert "raised" in str(e)


def test_tolerances_can_be_set():
    op = mul_op(jvp_factor=1 + 1e-5)
    with pytest.raises(ab.RuleError):
        ab.check(op, X, Y)
    assert ab.check(op, X, Y, rtol=1e-3).ok


# ------------------------------------------------- every op of the test suite

@pytest.mark.parametrize("mode", ops.VMAP_MODES)
@pytest.mark.parametrize("case", list(ops.CASES.values()), ids=repr)
def test_every_op_of_the_suite_passes(case, mode):
    assert ab.check(case.make(mode), *case.args(), **case.kwargs()).ok


# ------------------------------------------------------------- other op forms

def test_catches_inplace_function_that_leaves_elements_unwritten():
    def fn(x, *, out):
        out[1:] = 3 * x[1:]
    op = ab.bind(fn, shape=ab.like(0), out=True, linear=True, name="partial_write",
                 transpose=lambda ct: (3 * ct,))
    assert "1 of 5 output elements unwritten" in str(_raises(op, X, check="spec",
                                                             where="output"))


def _inplace_rules_op(skip_jvp=0, skip_vjp=0, skip_bwd=0, skip_transpose=0):
    """x ↦ 2x (linear) with in-place jvp, vjp or fwd/bwd, and transpose rules that leave
    the first ``skip_*`` elements of their output unwritten."""
    def write(skip):
        def rule(*args, out):
            o = out if isinstance(out, np.ndarray) else out[0]
            np.multiply(args[-1][skip:], 2, out=o[skip:])
        return rule
    lin = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, name="inplace_double")
    lin.def_transpose(write(skip_transpose), out=True)
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), name="inplace_double_rules")
    op.def_jvp(lambda p, t, *, out: write(skip_jvp)(t[0], out=out), out=True)
    if skip_bwd:
        op.def_fwd(lambda x: (2 * x, x), residuals=lambda x: x)
        op.def_bwd(lambda r, ct, *, out: write(skip_bwd)(ct, out=out), out=True)
    else:
        op.def_vjp(lambda p, ct, *, out: write(skip_vjp)(ct, out=out), out=True)
    return lin, op


def test_checks_inplace_rules_write_every_element():
    lin, op = _inplace_rules_op()
    for o in (lin, op):
        rows = [r for r in ab.check(o, X).rows if r.check == "in-place rules"]
        assert rows and all(r.status == "ok" for r in rows)
    for kw, which, role in ((dict(skip_transpose=2), 0, "transpose"),
                            (dict(skip_jvp=1), 1, "jvp"), (dict(skip_vjp=3), 1, "vjp"),
                            (dict(skip_bwd=1), 1, "bwd")):
        e = _raises(_inplace_rules_op(**kw)[which], X, check="in-place rules",
                    where=f"{role} rule")
        assert f"left {list(kw.values())[0]} of 5 elements unwritten" in str(e)


def test_catches_wrong_bwd_rule():
    op = ab.bind(np.square, shape=ab.like(0), name="square_fwd_bwd",
                 jvp=lambda p, t: 2 * p[0] * t[0])
    op.def_fwd(lambda x: (x**2, 3 * x), residuals=lambda x: x)  # residual should be 2x
    op.def_bwd(lambda r, ct: (r * ct,))
    assert "fwd/bwd" in str(_raises(op, X, check="vjp", where="argument 0"))


def test_vjp_without_jvp_is_checked_against_differences():
    good = ab.bind(np.sin, shape=ab.like(0), name="sin_vjp_only",
                   vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    report = ab.check(good, X)
    assert {r.check: r.status for r in report.rows}["jvp"] == "skipped"
    bad = ab.bind(np.sin, shape=ab.like(0), name="sin_vjp_only_bad",
                  vjp=lambda p, ct: (1.01 * np.cos(p[0]) * ct,))
    assert "finite differences" in str(_raises(bad, X, check="vjp", where="argument 0"))


def test_integer_inputs_and_outputs_are_not_differentiated():
    take = ab.bind(lambda x, i: x[i], name="take",
                   shape=lambda x, i: jax.ShapeDtypeStruct(i.shape, x.dtype),
                   jvp=lambda p, t: t[0][p[1]],
                   vjp=lambda p, ct: (np.bincount(p[1], ct, minlength=p[0].size), None))
    assert ab.check(take, X, np.array([0, 2, 2, 4])).ok
    argmax = ab.bind(lambda x: np.argmax(x, axis=-1), vmap="vectorized", name="argmax",
                     shape=lambda x: jax.ShapeDtypeStruct(x.shape[:-1], np.int64))
    report = ab.check(argmax, randn((3, 4)))
    assert {r.check: r.status for r in report.rows}["jvp"] == "skipped"


@pytest.mark.parametrize("x", [np.float64(0.3), np.zeros((0,)), X.astype(np.float16),
                               1e3 * X.astype(np.float32), Z.astype(np.complex64)],
                         ids=["0-d", "empty", "float16", "float32 large", "complex64"])
def test_scalars_empty_arrays_and_low_precision(x):
    sin = ab.bind(np.sin, shape=ab.like(0), vmap="vectorized", name="sin_any",
                  jvp=lambda p, t: np.cos(p[0]) * t[0], vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    assert ab.check(sin, x).ok


def _scaled(linear):
    """sin(a)·x: linear in its argument 1 only."""
    return ab.bind(lambda a, x: np.sin(a) * x, shape=ab.like(1), linear=linear,
                   vmap="vectorized", name="scaled",
                   jvp=lambda p, t: np.cos(p[0]) * p[1] * t[0] + np.sin(p[0]) * t[1],
                   vjp=lambda p, ct: (np.cos(p[0]) * p[1] * ct, np.sin(p[0]) * ct))


def test_op_linear_in_some_arguments():
    report = ab.check(_scaled((1,)), X, Y)
    rows = {(r.check, r.where): r.status for r in report.rows}
    assert rows[("linearity", "argument 1")] == rows[("transpose", "argument 1")] == "ok"
    assert "linear in 1" in str(report)
    _raises(_scaled((0,)), X, Y, check="linearity", where="argument 0")
