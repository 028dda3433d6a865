"""``shard=`` rules on one device: their errors, ab.check's shard check, unchanged results.

The many-device behaviour is tested in ``tests/many_devices`` (see test_many_devices.py).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close, check_first_order, randn


def scale_op(**kw):
    opts = dict(shape=ab.like(0), shard="b n, n -> b n", replicated=("n",), name="scale",
                jvp=lambda p, t: t[0] * np.sin(p[1]) + p[0] * np.cos(p[1]) * t[1],
                vjp=lambda p, ct: (ct * np.sin(p[1]), (ct * p[0] * np.cos(p[1])).sum(0)))
    opts.update(kw)
    return ab.bind(lambda x, w: x * np.sin(w), **opts)


# ------------------------------------------------------------------ errors at bind

@pytest.mark.parametrize("shard, replicated, match", [
    ("b n, n", (), "exactly one '->'"),
    ("b n -> b n -> b", (), "exactly one '->'"),
    ("b (n m) -> b", (), "compound factors are not supported"),
    ("b ... -> b", (), r"'\.\.\.' may only lead"),
    ("b b -> b", (), "appears twice"),
    ("b n -> b n", ("k",), r"names factor\(s\) \['k'\].*factors are \['b', 'n'\]"),
    ("elementwise", ("n",), "splits every axis"),
    (None, ("n",), "needs a shard= rule"),
    (3, (), "must be a rule string"),
])
def test_malformed_rules_are_type_errors_at_bind(shard, replicated, match):
    with pytest.raises(TypeError, match=r"anybind op 'op'.*" + match):
        ab.bind(np.sin, shape=ab.like(0), shard=shard, replicated=replicated, name="op")


def test_shard_and_side_effects_do_not_mix():
    with pytest.raises(TypeError, match="has_side_effect=True.*per shard"):
        ab.bind(np.sin, shape=ab.like(0), shard="elementwise", has_side_effect=True)


# ------------------------------------------------------------- errors at first call

@pytest.mark.parametrize("args, kwargs, match", [
    ((np.ones((4, 3)),), {}, r"has 2 operand\(s\), but the op is called with 1 positional"),
    ((np.ones((4, 3)), np.ones(3), np.ones(3)), {},
     r"has 2 operand\(s\), but the op is called with 3 positional"),
    ((np.ones(4), np.ones(3)), {},
     r"gives positional input leaf 0 \(float64\[4\]\) the factors 'b n', which need rank 2"),
    ((np.ones((4, 3)), np.ones(5)), {},
     r"factor 'n' has size 3 in positional input leaf 0 \(float64\[4, 3\]\) but 5 in "
     r"positional input leaf 1 \(float64\[5\]\)"),
])
def test_rules_that_do_not_fit_the_call_name_the_operand(args, kwargs, match):
    op = ab.bind(lambda *a: a[0], shape=ab.like(0), shard="b n, n -> b n", name="fit")
    with pytest.raises(TypeError, match=r"anybind op 'fit': shard rule 'b n, n -> b n'.*" + match):
        op(*args, **kwargs)
    with pytest.raises(TypeError, match=match):  # under jit too, at trace time
        jax.jit(op)(*args, **kwargs)


def test_output_count_and_rank_are_checked():
    two = ab.bind(lambda x: (x, x), shape=lambda x: (x, x), shard="b -> b", name="two")
    with pytest.raises(TypeError, match=r"has 1 output\(s\), but the op returns 2"):
        two(np.ones(3))
    rank = ab.bind(lambda x: x.sum(), shape=lambda x: jax.ShapeDtypeStruct((), x.dtype),
                   shard="b -> b", name="rank")
    with pytest.raises(TypeError, match=r"gives output 0 \(float64\[\]\) the factors 'b'"):
        rank(np.ones(3))


def test_keyword_operands_follow_the_positional_leaves():
    op2 = ab.bind(lambda x, *, w: x * w, shape=ab.like(0), shard="b n, n m -> b n", name="kw2")
    with pytest.raises(TypeError, match=r"keyword argument \['w'\] \(float64\[2\]\).*rank 2"):
        op2(np.ones((4, 2)), w=np.ones(2))


def test_elementwise_needs_one_shape():
    op = ab.bind(np.add, shape=ab.like(0), shard="elementwise", name="add")
    with pytest.raises(TypeError, match=r"shard rule 'elementwise' needs every operand and "
                                        r"output to have one shape"):
        op(np.ones((4, 3)), np.ones(3))


def test_ellipsis_rules_fit_any_leading_axes():
    op = ab.bind(lambda x: np.fft.fft(x), shape=ab.like(0), shard="... n -> ... n",
                 replicated=("n",), name="fft_last")
    for shape in [(8,), (3, 8), (2, 3, 8)]:
        x = randn(shape, np.complex128)
        assert_close(op(x), np.fft.fft(x))


def test_residuals_need_a_shape_to_split_like():
    op = ab.bind(np.exp, shape=ab.like(0), shard="b -> b", name="res")
    op.def_fwd(lambda x: (np.exp(x), np.exp(x).sum()),
               residuals=lambda x: jax.ShapeDtypeStruct((), x.dtype))
    op.def_bwd(lambda r, ct: (ct,))
    with pytest.raises(TypeError, match=r"residual leaf 0 of the fwd rule \(float64\[\]\) has "
                                        r"the shape of no operand or output"):
        op(np.ones(3))


# -------------------------------------------------------- one device: unchanged

def test_one_device_results_and_derivatives_are_unchanged():
    op = scale_op()
    x, w = randn((6, 3)), randn(3, seed=1)
    assert_close(jax.jit(op)(x, w), x * np.sin(w))
    check_first_order(op, (x, w))
    g = jax.jit(jax.grad(lambda x, w: jnp.sum(op(x, w) ** 2), argnums=(0, 1)))(x, w)
    assert_close(g, jax.grad(lambda x, w: jnp.sum((x * jnp.sin(w)[None, :]) ** 2),
                                  argnums=(0, 1))(x, w))
    assert "CustomSPMDPartitioning" not in jax.jit(op).lower(x, w).as_text()


# -------------------------------------------------------------------- ab.check

def test_check_verifies_each_splittable_factor():
    rep = ab.check(scale_op(), randn((6, 3)), randn(3, seed=1))
    rows = [(r.check, r.where, r.status) for r in rep.rows if r.check == "shard"]
    assert rows == [("shard", "factor 'b'", "ok")]
    ew = ab.bind(np.sin, shape=ab.like(0), shard="elementwise", name="ew", vmap="vectorized")
    rows = [r.where for r in ab.check(ew, randn((4, 3))).rows if r.check == "shard"]
    assert rows == ["factor axis 0", "factor axis 1"]


def _rows(x):
    return jax.ShapeDtypeStruct(x.shape[:-1], x.dtype)


@pytest.mark.parametrize("fn, shape, shard, where", [
    (lambda x: np.cumsum(x, axis=0), ab.like(0), "b n -> b n", "factor 'b' → output"),
    (lambda x: np.fft.fft(x), ab.like(0), "b n -> b n", "factor 'n' → output"),  # FFT axis
    (lambda x: (x, x.sum(-1)), lambda x: (x, _rows(x)), "b n -> b n, b",
     "factor 'n' → output[1]"),  # a contraction
])
def test_check_catches_a_wrong_rule(fn, shape, shard, where):
    x = randn((4, 6), np.complex128)
    op = ab.bind(fn, shape=shape, shard=shard, name="wrong")
    with pytest.raises(ab.RuleError) as e:
        ab.check(op, x)
    assert e.value.check == "shard" and e.value.where == where
    assert "keep the factor whole (replicated=)" in str(e.value)
    fixed = ab.bind(fn, shape=shape, shard=shard, replicated=("b", "n"), name="fixed")
    assert [r.status for r in ab.check(fixed, x).rows if r.check == "shard"] == ["skipped"]


@pytest.mark.slow  # starts a process
def test_cli_reports_a_wrong_rule(tmp_path):
    (tmp_path / "rules.py").write_text(textwrap.dedent('''
        import numpy as np
        import anybind as ab
        cumsum = ab.bind(lambda x: np.cumsum(x, axis=0), shape=ab.like(0), shard="b -> b",
                         name="cumsum", examples=lambda: ((np.arange(1.0, 7.0),), {}))
    '''))
    r = subprocess.run([sys.executable, "-m", "anybind", "check", "rules.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "shard" in r.stdout and "factor 'b'" in r.stdout and "FAIL" in r.stdout


# --------------------------------------------------------------------- contrib

@pytest.mark.slow  # tens of seconds: ab.check of every contrib op's split factors
def test_contrib_rules_check_where_they_split():
    """The contrib ops' rules hold where they split (ab.check's shard check)."""
    pytest.importorskip("ducc0")
    from anybind.contrib._ducc0_sht import n_real_alm
    from anybind.contrib.ducc0 import c2c, healpix_synthesis, nu2u, r2c
    from anybind.contrib.scipy import jv
    cases = [
        (c2c, (randn((4, 6), np.complex128),), {"axes": (1,)}, ["factor 'a0'"]),
        (r2c, (randn((4, 6)),), {"axes": (1,)}, ["factor 'a0'"]),
        (nu2u, (randn((2, 7), np.complex128), np.linspace(-3, 3, 14).reshape(7, 2)),
         {"n_modes": (4, 5)}, ["factor axis 0 (from the right) of '...'"]),
        (healpix_synthesis, (randn((2, 1, n_real_alm(3))),), {"nside": 2, "lmax": 3},
         ["factor axis 0 (from the right) of '...'"]),
        (jv, (np.linspace(0.5, 2.0, 6).reshape(2, 3),), {"v": np.array([0.5, 1.5, 2.0])},
         ["factor 'd0'", "factor 'd1'"]),
    ]
    for op, args, kw, where in cases:
        rows = [r for r in ab.check(op, *args, **kw).rows if r.check == "shard"]
        assert [(r.where, r.status) for r in rows] == [(w, "ok") for w in where], op.name
