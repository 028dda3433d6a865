"""JAXbind's three demos, ported (``anybind.cli._demo_jaxbind``): what the port must teach.

Every port runs under the whole transformation matrix in ``python -m anybind
demo`` (test_cli); here: demo 01's own declaration, the adjoint as the
transpose of a complex-linear map, is rejected by ab.check with the reason,
and the batched variant of the transpose keeps one SciPy call per batch.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.cli import _demo_jaxbind as demos
from helpers import assert_close, randn


def test_adjoint_as_transpose_is_caught_and_explained():
    z = randn((4, 5), np.complex128)
    with pytest.raises(ab.RuleError, match="adjoint.*without conjugation") as e:
        ab.check(demos.fftn_with_adjoint_as_transpose(), z)
    assert e.value.check == "transpose"
    assert ab.check(demos.fftn_op(), z).ok  # the transpose of the symmetric DFT is itself


def test_fftn_batches_in_one_call(monkeypatch):
    calls = []
    fftn = demos._fftn
    monkeypatch.setattr(demos, "_fftn", lambda x, *a: (calls.append(x.shape), fftn(x, *a))[1])
    op = demos.fftn_op()
    z = randn((6, 4, 5), np.complex128)
    loss = lambda f: (lambda z: jnp.sum(jnp.abs(jax.vmap(f)(z)) ** 2))
    got = jax.jit(jax.grad(loss(op)))(z)
    assert_close(got, jax.grad(loss(lambda x: jnp.fft.fftn(x, norm="forward")))(z))
    assert calls == [(6, 4, 5)] * 2  # the function's vmap rule and the transpose's variant
