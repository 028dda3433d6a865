"""anybind.contrib.finufft's options: jax-finufft 1.3.1's tests/options_test.py, ported,
and what each option does here (ducc0's equivalent, or an error when the call is traced)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.slow  # a ported suite: jax-finufft's own options tests

pytest.importorskip("ducc0")
finufft = pytest.importorskip("anybind.contrib.finufft")
options = finufft.options

from test_finufft_ops import check_close, nudft1, nudft2  # noqa: E402


# ported from jax-finufft tests/options_test.py::test_default_options
@pytest.mark.parametrize("opts", [None, options.Opts()])
def test_default_options(opts):
    assert options.unpack_opts(opts, 1, True) == opts
    assert options.unpack_opts(opts, 2, True) == opts
    assert options.unpack_opts(opts, 1, False) == opts
    assert options.unpack_opts(opts, 2, False) == opts


# ported from jax-finufft tests/options_test.py::test_nested_by_type
def test_nested_by_type():
    opts = options.NestedOpts(type1=options.Opts(spread_debug=True),
                              type2=options.Opts(debug=True))
    assert options.unpack_opts(opts, 1, True) == options.Opts(spread_debug=True)
    assert options.unpack_opts(opts, 2, True) == options.Opts(debug=True)


# ported from jax-finufft tests/options_test.py::test_nested_by_direction
def test_nested_by_direction():
    opts = options.NestedOpts(forward=options.Opts(spread_debug=True),
                              backward=options.Opts(debug=True))
    assert options.unpack_opts(opts, 1, True) == options.Opts(spread_debug=True)
    assert options.unpack_opts(opts, 1, False) == options.Opts(debug=True)


# ported from jax-finufft tests/options_test.py::test_nested_multi
def test_nested_multi():
    opts = options.NestedOpts(
        forward=options.Opts(spread_debug=True),
        backward=options.NestedOpts(type1=options.Opts(spread_debug=True, debug=True),
                                    type2=options.Opts(debug=True)))
    assert options.unpack_opts(opts, 1, True) == options.Opts(spread_debug=True)
    assert options.unpack_opts(opts, 1, False) == options.NestedOpts(
        type1=options.Opts(spread_debug=True, debug=True), type2=options.Opts(debug=True))
    assert options.unpack_opts(options.unpack_opts(opts, 1, False), 1, True) == options.Opts(
        spread_debug=True, debug=True)
    assert options.unpack_opts(options.unpack_opts(opts, 1, False), 2, True) == options.Opts(
        debug=True)


def test_the_public_names_are_jax_finuffts():
    assert finufft.Opts is options.Opts and finufft.NestedOpts is options.NestedOpts
    fields = {f.name for f in __import__("dataclasses").fields(finufft.Opts)}
    assert {"modeord", "nthreads", "upsampfac", "debug", "fftw", "gpu_method"} <= fields
    jf = pytest.importorskip("jax_finufft.options")
    theirs = {f.name: f.default for f in __import__("dataclasses").fields(jf.Opts)}
    ours = {f.name: f.default for f in __import__("dataclasses").fields(finufft.Opts)}
    assert ours == theirs


def _case():
    r = np.random.default_rng(2)
    x, y = r.uniform(-np.pi, np.pi, (2, 30))
    c = r.normal(size=30) + 1j * r.normal(size=30)
    return x, y, c


@pytest.mark.parametrize("opts", [
    finufft.Opts(nthreads=1), finufft.Opts(nthreads=2), finufft.Opts(upsampfac=2.0),
    finufft.Opts(upsampfac=1.25), finufft.Opts(modeord=True, nthreads=1),
    finufft.NestedOpts(type1=finufft.Opts(nthreads=1), backward=finufft.Opts(upsampfac=2.0)),
    finufft.NestedOpts(forward=finufft.Opts(upsampfac=1.25),
                       backward=finufft.NestedOpts(type2=finufft.Opts(nthreads=1))),
    finufft.Opts(gpu_method=finufft.GpuMethod.Shared),   # cuFINUFFT's: ignored on the CPU
])
def test_mapped_options_compute_the_same_transform(opts):
    x, y, c = _case()
    modeord = getattr(opts, "modeord", False)
    got = finufft.nufft1((6, 5), c, x, y, eps=1e-9, opts=opts)
    check_close(got, nudft1(c, [x, y], (6, 5), 1, modeord), 1e-7)
    g = jax.grad(lambda x: jnp.sum(jnp.abs(finufft.nufft1((6, 5), c, x, y, eps=1e-9,
                                                          opts=opts)) ** 2))(x)
    gr = jax.grad(lambda x: jnp.sum(jnp.abs(nudft1(c, [x, y], (6, 5), 1, modeord)) ** 2))(x)
    check_close(g, gr, 1e-6)


def test_nested_options_reach_the_reverse_transforms():
    """NestedOpts.backward becomes the ducc0 keywords of the transposed transform."""
    from anybind.contrib._finufft_ops import keywords
    opts = finufft.NestedOpts(type1=finufft.Opts(nthreads=1),
                              backward=finufft.NestedOpts(type2=finufft.Opts(nthreads=2)))
    kw = keywords("t", opts, 1, 2, 1e-6, 1)
    assert kw["nthreads"] == 1 and dict(kw["reverse_options"])["nthreads"] == 2
    assert dict(kw["reverse_options"])["fft_order"] is False   # the call's grid order
    assert "reverse_options" not in keywords("t", finufft.Opts(nthreads=3), 2, 2, 1e-6, 1)


@pytest.mark.parametrize("name,value", [("spread_debug", 1), ("showwarn", True),
                                        ("fftw", finufft.FftwFlags.Measure),
                                        ("spread_sort", finufft.SpreadSort.Sort),
                                        ("maxbatchsize", 4), ("spread_kerpad", False)])
def test_an_option_without_equivalent_is_an_error_when_traced(name, value):
    x, y, c = _case()
    opts = finufft.Opts(**{name: value})
    with pytest.raises(ValueError, match=rf"nufft1: the FINUFFT option {name}=.* has no "
                                         rf"equivalent in ducc0"):
        jax.make_jaxpr(lambda c: finufft.nufft1((6, 5), c, x, y, opts=opts))(c)
    # also when it is only the backward's: the call is traced with its reverse options
    nested = finufft.NestedOpts(backward=opts)
    with pytest.raises(ValueError, match=f"option {name}="):
        finufft.nufft2(np.ones((4, 4), complex), x, y, opts=nested)


def test_bad_option_values_are_errors():
    x, y, c = _case()
    with pytest.raises(ValueError, match="upsampfac must be 0 .* or in \\[1.2, 2.5\\]"):
        finufft.nufft1((6, 5), c, x, y, opts=finufft.Opts(upsampfac=3.0))
    with pytest.raises(TypeError, match="opts must be an Opts, a NestedOpts or None"):
        finufft.nufft1((6, 5), c, x, y, opts="fast")


def test_eps_below_double_precision_is_raised_to_it():
    """FINUFFT clamps eps to what it can reach, and so does this module."""
    x, y, c = _case()
    got = finufft.nufft1((6, 5), c, x, y, eps=1e-16)
    check_close(got, nudft1(c, [x, y], (6, 5), 1), 1e-12)


def test_single_precision_below_ducc0s_limit_is_computed_in_double():
    x, y, c = _case()
    with jax.enable_x64(False):
        for eps in (1e-6, 1e-7, 1e-9):
            got = finufft.nufft2(np.ones((6, 5), np.complex64) * (1 + 1j),
                                 x.astype(np.float32), y.astype(np.float32), eps=eps)
            assert got.dtype == np.complex64
            want = nudft2(np.ones((6, 5)) * (1 + 1j), [x.astype(np.float32).astype(float),
                                                        y.astype(np.float32).astype(float)], -1)
            # eps 1e-6 runs in single (ducc0's error a few 1e-6); below, double then rounding
            check_close(got, np.asarray(want).astype(np.complex64), 5e-6 if eps == 1e-6 else 3e-7)
