"""Shared numerical checks and reference ops for the test suite."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import anybind as ab

SEED = 0


def rng(seed: int = SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


class np_random:
    """The calls of ``jax.random`` that ported suites make their inputs with, drawn by
    NumPy instead: on the CPU each new shape of ``jax.random.normal`` is about a second
    of XLA compiling (its threefry program), which the inputs of a test need not cost.
    A key is a seed; ``split`` derives seeds from it."""

    @staticmethod
    def PRNGKey(seed: int) -> int:  # noqa: N802  (jax.random's name)
        return int(seed)

    @staticmethod
    def split(key: int, num: int = 2) -> list:
        return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(key).spawn(num)]

    @staticmethod
    def normal(key: int, shape=()):
        return jnp.asarray(rng(key).normal(size=shape))

    @staticmethod
    def uniform(key: int, shape=(), minval=0.0, maxval=1.0):
        return jnp.asarray(rng(key).uniform(minval, maxval, size=shape))

    @staticmethod
    def randint(key: int, shape, minval: int, maxval: int):
        return jnp.asarray(rng(key).integers(minval, maxval, size=shape))


def randn(shape, dtype=np.float64, seed: int = SEED) -> np.ndarray:
    r = rng(seed)
    if np.issubdtype(dtype, np.complexfloating):
        return (r.normal(size=shape) + 1j * r.normal(size=shape)).astype(dtype)
    return r.normal(size=shape).astype(dtype)


def assert_close(a, b, rtol=1e-10, atol=1e-10):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def central_difference(f, x, dx, eps=None):
    """(f(x + h·dx) - f(x - h·dx)) / 2h with a step scaled to x."""
    if eps is None:
        scale = max(1.0, float(jnp.max(jnp.abs(jnp.asarray(x)))) if np.size(x) else 1.0)
        eps = 1e-6 * scale
    return jax.tree_util.tree_map(lambda p, m: (p - m) / (2 * eps), f(x + eps * dx),
                                  f(x - eps * dx))


def check_jvp_fd(f, x, dx, rtol=1e-6, atol=1e-6):
    """The JVP of f at x along dx matches central finite differences."""
    _, t = jax.jvp(f, (x,), (dx,))
    assert_close(t, central_difference(f, x, dx), rtol=rtol, atol=atol)


def check_transpose_identity(f, x, dx, ybar, rtol=1e-10, atol=1e-10):
    """⟨ȳ, J·ẋ⟩ = ⟨Jᵀ·ȳ, ẋ⟩ for f at x (⟨a, b⟩ = Re Σ a·b, see ``_inner``)."""
    _, jdx = jax.jvp(f, (x,), (dx,))
    _, pullback = jax.vjp(f, x)
    (jt_ybar,) = pullback(ybar)
    lhs = _inner(ybar, jdx)
    rhs = _inner(jt_ybar, dx)
    np.testing.assert_allclose(lhs, rhs, rtol=rtol, atol=atol)


def _inner(a, b) -> float:
    """Re Σ a·b, without conjugation: the pairing under which JAX's transposes of
    complex maps are transposes (JAX's vjp of z ↦ c·z is ȳ ↦ c·ȳ, not c̄·ȳ)."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.sum(a.real * b.real) - np.sum(a.imag * b.imag))


# ------------------------------------------------------------ pytree checks

def _is_inexact(x) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.inexact)


def tree_randn_like(tree, seed: int = SEED):
    """Random normal leaves shaped like ``tree``'s (real or complex like each leaf)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = [randn(np.shape(l), np.asarray(l).dtype, seed=seed + i) if _is_inexact(l)
           else np.zeros(np.shape(l), jax.dtypes.float0) for i, l in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def tree_inner(a, b) -> float:
    """Σ over leaves of ⟨a, b⟩ = Re Σ a·b (see ``_inner``)."""
    total = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if _is_inexact(x) and _is_inexact(y):
            total += _inner(x, y)
    return total


def tree_central_difference(f, args: tuple, dargs: tuple, eps=None):
    """Central differences of f(*args) along dargs, for pytree arguments and outputs."""
    leaves = [l for l in jax.tree_util.tree_leaves(args) if _is_inexact(l)]
    if eps is None:
        scale = max([1.0] + [float(np.max(np.abs(l))) for l in leaves if np.size(l)])
        eps = 1e-6 * scale

    def shift(s):
        return jax.tree_util.tree_map(
            lambda x, d: x + s * eps * d if _is_inexact(x) else x, args, dargs)

    plus, minus = f(*shift(1.0)), f(*shift(-1.0))
    return jax.tree_util.tree_map(
        lambda p, m: (np.asarray(p) - np.asarray(m)) / (2 * eps) if _is_inexact(p)
        else np.zeros(np.shape(p), jax.dtypes.float0), plus, minus)


def check_first_order(f, args: tuple, seed: int = 1, rtol=1e-6, atol=1e-6):
    """jvp of f(*args) against central differences, vjp against jvp (transpose identity).

    ``args`` are pytrees; integer leaves get float0 tangents and are held fixed.
    """
    dargs = tree_randn_like(args, seed)
    out, tangent = jax.jvp(f, args, dargs)
    fd = tree_central_difference(f, args, dargs)
    for t, d in zip(jax.tree_util.tree_leaves(tangent), jax.tree_util.tree_leaves(fd),
                    strict=True):
        if _is_inexact(t):
            np.testing.assert_allclose(np.asarray(t), d, rtol=rtol, atol=atol)
    ybar = tree_randn_like(out, seed + 100)
    _, pullback = jax.vjp(f, *args)
    xbar = pullback(ybar)
    np.testing.assert_allclose(tree_inner(ybar, tangent), tree_inner(xbar, dargs),
                               rtol=1e-9, atol=1e-9)


def assert_tree_close(a, b, rtol=1e-10, atol=1e-10):
    """Same structure, same dtypes, close values (exact for integer leaves)."""
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), (
        f"{jax.tree_util.tree_structure(a)} != {jax.tree_util.tree_structure(b)}")
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype, f"dtype {x.dtype} != {y.dtype}"
        assert x.shape == y.shape, f"shape {x.shape} != {y.shape}"
        if _is_inexact(x):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
        elif x.dtype != jax.dtypes.float0:
            np.testing.assert_array_equal(x, y)


def realify(args):
    """(v, build): ``args`` (a pytree) as a function ``build(v)`` of one real vector v,
    each complex leaf made of two halves of v, so that jacfwd and hessian apply."""
    leaves, tdef = jax.tree.flatten(args)
    parts = []
    for l in leaves:
        parts += [np.real(l).ravel()] + ([np.imag(l).ravel()] if np.iscomplexobj(l) else [])
    v = np.concatenate(parts)

    def build(v):
        out, i = [], 0
        for l in leaves:
            n = l.size
            re = v[i:i + n].reshape(l.shape)
            i += n
            if np.iscomplexobj(l):
                re = re + 1j * v[i:i + n].reshape(l.shape)
                i += n
            out.append(re.astype(l.dtype))
        return tdef.unflatten(out)
    return v, build


# the routes of Python code: host code on the CPU (anybind's handler, XLA's buffer
# callback), host code in GPU programs, device code
HOST_TARGETS = ("anybind_python", "xla_buffer_python_cpu_callback",
                "xla_ffi_python_gpu_callback", "xla_buffer_python_gpu_callback")


def host_call_count(lowered) -> int:
    """Number of calls of Python code (custom calls of any route above) in a lowering."""
    text = lowered if isinstance(lowered, str) else lowered.as_text()
    return sum(text.count(f"custom_call @{t}(") for t in HOST_TARGETS)


def jvp_and_vjp(fs, args, dargs, ybar):
    """[(f(*args), its jvp along dargs, its vjp of ybar) for each f], in one compiled program."""
    def run(args, dargs, ybar):
        return [jax.jvp(f, args, dargs) + (jax.vjp(f, *args)[1](ybar),) for f in fs]
    return jax.jit(run)(args, dargs, ybar)


def run_fresh_python(script: str, cwd=None, timeout: float = 600):
    """Run ``script`` in a new Python process that imports this checkout's anybind and
    the tests' modules; returns the ``subprocess.CompletedProcess`` (``timeout``
    seconds, then ``subprocess.TimeoutExpired``)."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import anybind
    tests, src = Path(__file__).resolve().parent, Path(anybind.__file__).resolve().parents[1]
    paths = [str(tests), str(src)] + [os.path.abspath(p) for p in
                                      os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def fresh_stdout(res) -> str:
    """A fresh process's stdout (``run_fresh_python``), after checking it ended normally:
    a signal or a non-zero exit fails here, with what the process printed."""
    import signal

    if res.returncode < 0:
        raise AssertionError(f"the process died of {signal.Signals(-res.returncode).name}:\n"
                             f"{res.stdout}\n{res.stderr[-3000:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


# ------------------------------------------------------------ torch (optional)

def to_torch(tree):
    """NumPy/JAX leaves as torch tensors (same dtypes); other leaves unchanged."""
    import torch
    return jax.tree_util.tree_map(
        lambda x: torch.from_numpy(np.array(x)) if isinstance(x, (np.ndarray, jax.Array))
        else x, tree)


def torch_inner(a, b) -> float:
    """Σ over the floating leaves of Re⟨a, b⟩ = Re Σ conj(a)·b: torch's pairing of a
    gradient with a tangent (torch's gradients of complex maps are conjugated)."""
    import torch
    total = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if x.is_floating_point() or x.is_complex():
            total += float(torch.vdot(x.reshape(-1).to(torch.complex128),
                                      y.reshape(-1).to(torch.complex128)).real)
    return total


def torch_randn_like(tree, seed: int = SEED):
    """Random leaves like ``tree``'s floating ones; None for integer leaves."""
    import torch
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    out = [torch.from_numpy(randn(tuple(l.shape), _TORCH_NP[l.dtype], seed=seed + i))
           if (l.is_floating_point() or l.is_complex()) else None
           for i, l in enumerate(leaves)]
    return jax.tree_util.tree_unflatten(treedef, out)


def _torch_np():
    try:
        import torch
    except ImportError:
        return {}
    return {torch.float32: np.float32, torch.float64: np.float64,
            torch.complex64: np.complex64, torch.complex128: np.complex128}


_TORCH_NP = _torch_np()


def check_torch_first_order(f, args: tuple, seed: int = 1, rtol=1e-6, atol=1e-6):
    """torch.func.jvp of f(*args) against central differences, torch.func.vjp against the
    jvp (⟨ȳ, J·ẋ⟩ = ⟨x̄, ẋ⟩ in torch's conjugate pairing), and .backward() against vjp."""
    import torch
    dargs = torch_randn_like(args, seed)
    zero = lambda t, d: torch.zeros_like(t) if d is None else d
    dfull = jax.tree_util.tree_map(zero, args, dargs, is_leaf=lambda x: x is None)
    out, tangent = torch.func.jvp(f, args, dfull)
    eps = 1e-6 * max([1.0] + [float(l.abs().max()) for l in jax.tree_util.tree_leaves(args)
                              if l.is_floating_point() or l.is_complex()])
    shift = lambda s: jax.tree_util.tree_map(
        lambda x, d: x + s * eps * d if (x.is_floating_point() or x.is_complex()) else x,
        args, dfull)
    fd = jax.tree_util.tree_map(lambda p, m: (p - m) / (2 * eps) if
                                (p.is_floating_point() or p.is_complex()) else p,
                                f(*shift(1.0)), f(*shift(-1.0)))
    for t, d in zip(jax.tree_util.tree_leaves(tangent), jax.tree_util.tree_leaves(fd),
                    strict=True):
        if t.is_floating_point() or t.is_complex():
            np.testing.assert_allclose(t.resolve_conj().numpy(), d.resolve_conj().numpy(),
                                       rtol=rtol, atol=atol)
    floats = lambda tree: [l for l in jax.tree_util.tree_leaves(tree)
                           if l.is_floating_point() or l.is_complex()]
    ybar = torch_randn_like(out, seed + 100)
    g = lambda *a: tuple(floats(f(*a)))
    _, pullback = torch.func.vjp(g, *args)
    xbar = pullback(tuple(l for l in jax.tree_util.tree_leaves(ybar) if l is not None))
    np.testing.assert_allclose(torch_inner(floats(ybar), floats(tangent)),
                               torch_inner(floats(xbar), floats(dfull)), rtol=1e-9, atol=1e-9)
    leaves = [l.detach().clone().requires_grad_() for l in floats(args)]
    it = iter(leaves)
    rebuilt = jax.tree_util.tree_map(
        lambda x: next(it) if (x.is_floating_point() or x.is_complex()) else x, args)
    outs = g(*rebuilt)
    torch.autograd.backward(outs, [y for y in jax.tree_util.tree_leaves(ybar) if y is not None])
    for l, x in zip(leaves, floats(xbar)):
        np.testing.assert_allclose(l.grad.resolve_conj().numpy(), x.resolve_conj().numpy(),
                                   rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ ports of JAX's custom_api_test

def custom_jvp(fn, jvp, **kw):
    """A traced op with a traced jvp rule: the port of ``jax.custom_jvp(fn)``."""
    return ab.bind(fn, traced=True, jvp=jvp, name=kw.pop("name", "f"), **kw)


def custom_vjp(fn, vjp, **kw):
    """A traced op with a traced vjp rule: the port of ``jax.custom_vjp(fn)``."""
    return ab.bind(fn, traced=True, vjp=vjp, name=kw.pop("name", "f"), **kw)


def scan1(f):
    """``x ↦ f(x)`` run as the body of a one-step ``lax.scan`` (JAX's "initial style")."""
    return lambda x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=1)[0]


def transpose_unary(f, x_example):
    """The transpose of the linear map f of one argument, as a function of the cotangent."""
    def transposed(y):
        x, = jax.linear_transpose(f, x_example)(y)
        return x
    return transposed
