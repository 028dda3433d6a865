"""Every misuse raises a real exception that names the op, the rule, the
argument or output, and what was expected versus what was received."""
import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import randn
from ops import CASES

X = randn(3)


def _raises(exc, pattern, fn, *args):
    """fn(*args) raises ``exc`` matching ``pattern``; a run-time error counts when it surfaces."""
    with pytest.raises(exc, match=pattern) as info:
        jax.block_until_ready(fn(*args))
    assert not isinstance(info.value, AssertionError)
    return info.value


# ------------------------------------------------------------- missing rules

def test_missing_rules_name_the_op_and_the_rule_to_add():
    op = ab.bind(np.sin, shape=ab.like(0), name="no_rules")
    for f in (jax.grad(lambda x: op(x).sum()), lambda x: jax.jvp(op, (x,), (x,)),
              jax.jacfwd(op), jax.jacrev(op)):
        _raises(ab.MissingRuleError, r"(?s)'no_rules'.*def_jvp.*def_vjp", f, X)


def test_host_jvp_only_cannot_do_reverse_mode():
    op = ab.bind(np.sin, shape=ab.like(0), name="jvp_only", jvp=lambda p, t: np.cos(p[0]) * t[0])
    np.testing.assert_allclose(jax.jvp(op, (X,), (X,))[1], np.cos(X) * X)
    for f in (jax.grad(lambda x: op(x).sum()), jax.jacrev(op),
              lambda x: jax.linear_transpose(jax.linearize(op, x)[1], x)(x)):
        _raises(ab.MissingRuleError, r"(?s)'jvp_only'.*vjp.*def_vjp", f, X)


def test_host_vjp_only_cannot_do_forward_mode():
    op = ab.bind(np.sin, shape=ab.like(0), name="vjp_only",
                 vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    np.testing.assert_allclose(jax.grad(lambda x: op(x).sum())(X), np.cos(X))
    for f in (lambda x: jax.jvp(op, (x,), (x,)), jax.jacfwd(op),
              jax.hessian(lambda x: op(x).sum())):
        _raises(ab.MissingRuleError, r"(?s)'vjp_only'.*jvp.*def_jvp", f, X)


def test_linear_op_without_transpose():
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, name="lin_no_t")
    np.testing.assert_allclose(jax.jvp(op, (X,), (X,))[1], 2 * X)  # forward mode needs nothing
    for f in (jax.grad(lambda x: op(x).sum()), lambda x: jax.linear_transpose(op, x)(x)):
        _raises(ab.MissingRuleError, r"(?s)'lin_no_t'.*transpose.*def_transpose", f, X)


def test_higher_order_of_host_rules_says_to_make_them_traced():
    op = CASES["mul"].make("vectorized")
    e = _raises(ab.MissingRuleError, r"(?s)'mul_vectorized'.*(vjp|jvp) rule.*traced=True",
                jax.hessian(lambda x: op(x, x).sum()), X)
    assert "host" in str(e)


def test_missing_rule_is_raised_before_anything_runs():
    calls = []
    op = ab.bind(lambda x: calls.append(1) or x, shape=ab.like(0), name="lazy_fail")
    with pytest.raises(ab.MissingRuleError):
        jax.jit(jax.grad(lambda x: op(x).sum())).lower(X)
    assert calls == []


def test_library_frames_are_hidden_from_the_traceback():
    op = ab.bind(np.sin, shape=ab.like(0), name="hidden_frames")
    try:
        jax.grad(lambda x: op(x).sum())(X)
    except ab.MissingRuleError as e:
        files = [f.filename for f in traceback.extract_tb(e.__traceback__)]
    package = os.path.dirname(os.path.abspath(ab.__file__))  # (a checkout may be called
    assert files and not [f for f in files  # anybind too: its tests/ are the user's frames)
                          if os.path.abspath(f).startswith(package + os.sep)]


# ------------------------------------------------- rules returning wrong things

def _bad_rules(kind, traced):
    """An op whose `kind` returns something of the wrong shape, dtype or count."""
    xp = jnp if traced else np
    bad = {
        "shape": lambda v: v[:2],
        "dtype": lambda v: v.astype(xp.float32),
        "count": lambda v: (v, v),
    }[kind]
    op = ab.bind(np.sin, shape=ab.like(0), name=f"bad_{kind}_{traced}")
    op.def_jvp(lambda p, t: bad(t[0]), traced=traced)
    op.def_vjp(lambda p, ct: (bad(ct),) if kind != "count" else (ct, ct), traced=traced)
    return op


EXPECT = {  # what the message must say, beyond the op and the rule
    "shape": r"(?s)\(?2.*3|float64\[2\].*float64\[3\]",
    "dtype": r"(?s)float32.*float64",
    "count": r"(?s)(2|tuple)",
}


@pytest.mark.parametrize("traced", [False, True], ids=["host", "traced"])
@pytest.mark.parametrize("kind", ["shape", "dtype", "count"])
@pytest.mark.parametrize("rule", ["jvp", "vjp"])
def test_rule_returning_wrong_output(rule, kind, traced):
    op = _bad_rules(kind, traced)
    f = (lambda x: jax.jvp(op, (x,), (x,))[1]) if rule == "jvp" else \
        jax.grad(lambda x: op(x).sum())
    e = _raises(Exception, rf"(?s)'bad_{kind}_{traced}'.*{rule} rule", f, X)
    assert __import__("re").search(EXPECT[kind], str(e)), str(e)


@pytest.mark.parametrize("traced", [False, True], ids=["host", "traced"])
def test_transpose_rule_returning_wrong_shape(traced):
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, traced=traced,
                 name=f"bad_transpose_{traced}")
    op.def_transpose(lambda ct: (ct[:2],), traced=traced)
    _raises(Exception, rf"(?s)'bad_transpose_{traced}'.*transpose rule.*2.*3",
            lambda x: jax.linear_transpose(op, x)(x), X)


VMAP_RULES = {  # (rule, what the message must say after the op and "vmap rule")
    "shape": (lambda n, b, x: (x[:, :2], True), r".*2.*3"),
    "dtype": (lambda n, b, x: (x.astype(np.float32), True), r".*float32.*float64"),
    "unbatched_flag": (lambda n, b, x: (2 * x, False), r".*\(2, 3\)|2, 3"),
    "not_a_pair": (lambda n, b, x: 2 * x, r".*pair"),
}


@pytest.mark.parametrize("traced", [False, True], ids=["host", "traced"])
@pytest.mark.parametrize("kind", list(VMAP_RULES))
def test_vmap_rule_returning_wrong_shape_or_not_a_pair(kind, traced):
    rule, tail = VMAP_RULES[kind]
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), traced=traced, vmap=rule,
                 name=f"bad_vmap_{kind}_{traced}")
    _raises(Exception, rf"(?s)'bad_vmap_{kind}_{traced}'.*vmap rule{tail}", jax.vmap(op),
            randn((2, 3)))


def test_vjp_rule_with_wrong_cotangent_structure():
    op = ab.bind(lambda d: d["a"] * d["b"], shape=lambda d: d["a"], name="bad_ct_tree",
                 vjp=lambda p, ct: ((ct, ct),))  # a tuple where a dict is expected
    d = {"a": X, "b": X}
    _raises(Exception, r"(?s)'bad_ct_tree'.*vjp rule.*argument 0.*structure",
            jax.grad(lambda d: op(d).sum()), d)


# ----------------------------------------------- function outputs vs the spec

@pytest.mark.parametrize("wrap", ["eager", "jit", "vmap_sequential", "vmap_vectorized"])
@pytest.mark.parametrize("bad", ["shape", "dtype", "broadcastable", "scalar", "none", "count"])
def test_function_output_mismatch_names_op_output_declared_and_returned(bad, wrap):
    ret = {
        "shape": lambda x: x[..., :2],
        "dtype": lambda x: x.astype(np.float32),
        "broadcastable": lambda x: x[..., :1],  # never broadcast silently
        "scalar": lambda x: 1.0 if x.ndim == 1 else np.ones(x.shape[:1]),
        "none": lambda x: None,
        "count": lambda x: (x, x),
    }[bad]
    mode = wrap.split("_")[1] if wrap.startswith("vmap") else "sequential"
    op = ab.bind(ret, shape=ab.like(0), vmap=mode, name=f"out_{bad}")
    f = {"eager": op, "jit": jax.jit(op)}.get(wrap, jax.vmap(op))
    x = randn((2, 3)) if wrap.startswith("vmap") else X
    pattern = {
        "shape": r"(?s)'out_shape'.*output 0.*\(2, 2\)|\(2,\).*\(2, 3\)|\(3,\)",
        "dtype": r"(?s)'out_dtype'.*output 0.*float32.*float64",
        "broadcastable": r"(?s)'out_broadcastable'.*output 0.*1.*3",
        "scalar": r"(?s)'out_scalar'.*output 0.*3",
        "none": r"(?s)'out_none'.*(None|output 0)",
        "count": r"(?s)'out_count'.*(output|structure)",
    }[bad]
    _raises(Exception, pattern, f, x)


def test_output_pytree_structure_mismatch():
    op = ab.bind(lambda x: {"a": x}, shape=lambda x: (x, x), name="wrong_tree")
    _raises(Exception, r"(?s)'wrong_tree'.*function.*structure", op, X)


# -------------------------------------------------------------- the spec

@pytest.mark.parametrize("spec,pattern", [
    (ab.like(1), r"(?s)'spec_err'.*like\(1\).*1 positional"),
    (lambda x, y: x, r"(?s)'spec_err'.*output spec.*missing"),
    (lambda x: x["a"], r"(?s)'spec_err'.*output spec.*subscriptable"),
    ((3,), r"(?s)'spec_err'.*shape and dtype"),
    (None, r"(?s)'spec_err'.*needs an output spec"),
])
def test_shape_spec_not_matching_inputs(spec, pattern):
    op = ab.bind(np.sin, shape=spec, name="spec_err")
    _raises(TypeError, pattern, op, X)


def test_like_must_be_a_non_negative_index():
    with pytest.raises(TypeError, match="like"):
        ab.like(-1)
    with pytest.raises(TypeError, match="like"):
        ab.like("0")


def test_linear_op_needs_inexact_inputs_and_outputs():
    op = ab.bind(lambda x: x, shape=ab.like(0), linear=True, name="int_linear")
    _raises(TypeError, r"(?s)'int_linear'.*linear.*int", op, np.arange(3))


# ---------------------------------------------------------------- keywords

@pytest.mark.parametrize("value,typename", [([1, 2], "list"), ({"a": 1}, "dict"),
                                            ((np.ones(2), 1), "tuple")])
def test_unhashable_static_keyword_is_named(value, typename):
    op = ab.bind(lambda x, *, opt: x, shape=ab.like(0), name="static_kw")
    _raises(TypeError, rf"(?s)'static_kw'.*'opt'.*{typename}", lambda x: op(x, opt=value), X)


def test_static_keywords_equal_but_of_different_type_are_different_calls():
    def fn(x, *, flag):
        return x * (10.0 if isinstance(flag, bool) else 1.0)

    for first, second in ((True, 1), (1, True), (1.0, 1), (0, False)):
        op = ab.bind(fn, shape=ab.like(0), name="typed_static")
        for flag in (first, second):
            want = X * (10.0 if isinstance(flag, bool) else 1.0)
            np.testing.assert_allclose(op(X, flag=flag), want)
            np.testing.assert_allclose(jax.jit(lambda x: op(x, flag=flag))(X), want)


KEYWORD_DIFFS = {
    "grad": lambda op: jax.grad(lambda w: op(X, w=w).sum()),
    "jvp": lambda op: (lambda w: jax.jvp(lambda w: op(X, w=w), (w,), (w,))),
    "jacfwd": lambda op: jax.jacfwd(lambda w: op(X, w=w)),
    "jacrev": lambda op: jax.jacrev(lambda w: op(X, w=w)),
    "vmap_grad": lambda op: jax.vmap(jax.grad(lambda w: op(X, w=w).sum())),
}


@pytest.mark.parametrize("how", list(KEYWORD_DIFFS))
def test_differentiating_a_keyword_operand(how):
    op = ab.bind(lambda x, *, w: x * w, shape=ab.like(0), name="kw_operand",
                 jvp=lambda p, t, *, w: t[0] * w, vjp=lambda p, ct, *, w: (ct * w,))
    w = randn((2, 3)) if how.startswith("vmap") else X
    _raises(TypeError, r"(?s)'kw_operand'.*keyword argument.*'w'.*non-differentiable.*positional",
            KEYWORD_DIFFS[how](op), w)


def test_keyword_operand_behind_stop_gradient_is_fine():
    op = ab.bind(lambda x, *, w: x * w, shape=ab.like(0), name="kw_stopped",
                 jvp=lambda p, t, *, w: t[0] * w, vjp=lambda p, ct, *, w: (ct * w,))
    g = jax.grad(lambda x: op(x, w=jax.lax.stop_gradient(2 * x)).sum())(X)
    np.testing.assert_allclose(g, 2 * X)


# --------------------------------------------------------- non-linear uses

def test_transposing_a_linear_op_in_its_keyword_operand():
    op = CASES["matvec"].make("vectorized")
    a = randn((4, 3))
    _raises(TypeError, r"(?s)'matvec_vectorized'.*keyword argument.*'a'",
            lambda a: jax.linear_transpose(lambda a: op(X, a=a), a)(randn(4)), a)
    _raises(TypeError, r"(?s)'matvec_vectorized'.*keyword argument.*'a'",
            jax.grad(lambda a: op(X, a=a).sum()), a)


def test_differentiating_the_transpose_in_its_keyword_operand():
    op = CASES["matvec"].make("vectorized")
    y = randn(4)
    transposed = lambda a: jax.linear_transpose(lambda x: op(x, a=a), X)(y)[0]
    _raises(TypeError, r"(?s)'matvec_vectorized'.*keyword argument.*'a'",
            jax.jacfwd(transposed), randn((4, 3)))


def test_transposing_a_tangent_map_in_the_primal():
    """The tangent is not linear in the point it is taken at."""
    op = CASES["mul"].make("vectorized")
    t = randn(3, seed=1)
    e = _raises(TypeError, r"(?s)'mul_vectorized'.*not declared linear in positional input",
                lambda x: jax.linear_transpose(lambda y: jax.jvp(lambda a: op(a, a), (y,), (t,))[1],
                                               x)(x), X)
    assert "jvp rule" in str(e)


# ------------------------------------------------------------- bind itself

def test_bind_rejects_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        ab.bind(3, shape=ab.like(0))
    with pytest.raises(ValueError, match=r"(?s)'sin'.*vmap.*parallel"):
        ab.bind(np.sin, shape=ab.like(0), vmap="parallel")
    op = ab.bind(np.sin, shape=ab.like(0), name="nonlinear")
    with pytest.raises(TypeError, match=r"(?s)'nonlinear'.*def_transpose.*linear=True"):
        op.def_transpose(lambda ct: (ct,))
    with pytest.raises(TypeError, match=r"(?s)'nonlinear'.*def_jvp.*callable"):
        op.def_jvp(42)


def test_positional_argument_that_is_not_an_array():
    op = ab.bind(np.sin, shape=ab.like(0), name="takes_arrays")
    _raises(TypeError, r"(?s)'takes_arrays'.*positional.*str", op, "abc")


@pytest.mark.parametrize("value,dtype", [(2.7, np.int32), (2.7, np.bool_), (1 + 2j, np.float64),
                                         (np.float64(1e300), np.float32), (300, np.uint8)],
                         ids=["float->int32", "float->bool", "complex->float64",
                              "np.float64->float32", "int->uint8"])
def test_python_scalar_results_are_not_cast_lossily(value, dtype):
    """A returned scalar that does not fit the declared dtype is an error naming the op."""
    op = ab.bind(lambda x: value, shape=jax.ShapeDtypeStruct((), dtype), name="lossy_scalar")
    _raises(Exception, r"(?s)'lossy_scalar'.*output 0.*" + np.dtype(dtype).name, op, 1.0)


def test_python_scalar_results_that_fit_are_accepted():
    for value, dtype in [(1, np.float64), (2.0, np.float32), (True, np.bool_), (3, np.int8)]:
        op = ab.bind(lambda x: value, shape=jax.ShapeDtypeStruct((), dtype), name="exact_scalar")
        out = op(1.0)
        assert out.dtype == dtype and out == value
