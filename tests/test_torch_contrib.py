"""anybind.contrib ops used from PyTorch: ducc0's c2c against torch.fft, values and
derivatives (vjp, jvp, vmap, second order of a nonlinear function of it)."""
import numpy as np
import pytest
import torch

from helpers import check_torch_first_order, randn

pytest.importorskip("ducc0")
dj = pytest.importorskip("anybind.contrib.ducc0")

F = torch.func

CASES = [  # (ducc0 keywords, the torch.fft equivalent)
    ({}, lambda x: torch.fft.fftn(x)),
    ({"axes": (1,)}, lambda x: torch.fft.fft(x, dim=1)),
    ({"axes": (0, 1), "inorm": 1}, lambda x: torch.fft.fftn(x, norm="ortho")),
    ({"forward": False, "inorm": 2}, lambda x: torch.fft.ifftn(x)),
]


@pytest.mark.parametrize("kw,ref", CASES)
def test_c2c_values_and_gradients_match_torch_fft(kw, ref):
    x = torch.from_numpy(randn((4, 6), np.complex128))
    f = lambda v: dj.c2c.torch(v, **kw)
    torch.testing.assert_close(f(x), ref(x))
    ybar = torch.from_numpy(randn((4, 6), np.complex128, seed=1))
    t = torch.from_numpy(randn((4, 6), np.complex128, seed=2))
    torch.testing.assert_close(F.vjp(f, x)[1](ybar)[0], F.vjp(ref, x)[1](ybar)[0])
    torch.testing.assert_close(F.jvp(f, (x,), (t,))[1], F.jvp(ref, (x,), (t,))[1])
    a = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(a).abs().pow(2).sum(), a)
    (want,) = torch.autograd.grad(ref(a).abs().pow(2).sum(), a)
    torch.testing.assert_close(g, want)
    check_torch_first_order(f, (x,))


def test_c2c_vmap_and_higher_order():
    xs = torch.from_numpy(randn((3, 4, 6), np.complex128))
    torch.testing.assert_close(torch.vmap(lambda v: dj.c2c.torch(v, axes=(1,)))(xs),
                               torch.fft.fft(xs, dim=2))
    # a nonlinear function of the FFT: its Hessian in a real parameter, two ways
    x = torch.from_numpy(randn((4, 6), np.complex128, seed=3))
    s = lambda fft: lambda r: (fft(x * r).abs() ** 4).sum()
    r = torch.from_numpy(randn((4, 6), seed=4))
    got = F.hessian(s(lambda v: dj.c2c.torch(v)))(r)
    torch.testing.assert_close(got, F.hessian(s(torch.fft.fftn))(r))
    a = x.clone().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda v: dj.c2c.torch(v, axes=(0,)), (a,))
