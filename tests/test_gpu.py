"""Ops in programs compiled for a GPU (``routes._gpu_host``, ``routes._gpu_device``): host
code with transfers, device code on XLA's buffers, and the host fallback of device code on
the CPU.

Without a GPU, programs are lowered for CUDA (JAX lowers for any platform), and
both GPU routes run on the CPU through the CPU versions of the same XLA callbacks
(the ``simulated`` fixture): host code through ``xla_ffi_python_cpu_callback``,
which has the calling convention of the GPU target (host arrays in, host arrays
out), and device code through the CPU buffer callback, with NumPy standing in
for CuPy and a made-up stream; on a machine with a GPU they still run on the
CPU. The tests marked ``gpu`` run the real routes (device code, host code, the
bridges on CUDA tensors; views without copy or synchronisation on XLA's stream;
a CUDA profile without host copies) and are skipped where JAX sees no GPU or
CuPy is missing.
"""
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _gpu_device, _gpu_host, _host
from helpers import assert_close, check_first_order, randn

TOL = dict(rtol=1e-10, atol=1e-10)


def _sin_op(name, vmap="sequential", **bind):
    """sin with host rules (jvp, vjp) and a given batching."""
    return ab.bind(np.sin, shape=ab.like(0), name=name, vmap=vmap,
                   jvp=lambda p, t: np.cos(p[0]) * t[0],
                   vjp=lambda p, ct: (np.cos(p[0]) * ct,), **bind)


def _sin_every_order(name, vmap):
    """sin and cos as host ops whose traced jvp rules call each other: every order."""
    sin = ab.bind(np.sin, shape=ab.like(0), name=f"{name}_sin", vmap=vmap)
    cos = ab.bind(np.cos, shape=ab.like(0), name=f"{name}_cos", vmap=vmap)
    sin.def_jvp(lambda p, t: cos(p[0]) * t[0], traced=True)
    cos.def_jvp(lambda p, t: -sin(p[0]) * t[0], traced=True)
    return sin


def _lowered_for(platform, f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def _targets(text: str) -> set:
    return {line.split("@")[1].split("(")[0] for line in text.splitlines()
            if "stablehlo.custom_call @" in line}


# ------------------------------------------------------ simulated on the CPU

class _Stream:
    """Stands in for a CuPy stream made from XLA's: records which stream is current."""
    current: list = []

    def __init__(self, ptr):
        self.ptr = ptr

    def __enter__(self):
        _Stream.current.append(self)
        return self

    def __exit__(self, *exc):
        _Stream.current.pop()


FAKE_CUPY = types.SimpleNamespace(
    ndarray=np.ndarray, asarray=np.asarray, array_equal=np.array_equal, zeros=np.zeros,
    cuda=types.SimpleNamespace(
        Stream=types.SimpleNamespace(from_external=lambda s: _Stream(s.__cuda_stream__()[1])),
        get_current_stream=lambda: _Stream.current[-1]))
STREAM = 0x5EED


@pytest.fixture(autouse=True)
def _cpu_programs_on_the_cpu(request):
    """Tests not marked ``gpu`` are about CPU programs (or explicit lowerings): on a machine
    with a GPU they still run on the CPU."""
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def simulated(monkeypatch):
    """The CPU counts as a GPU platform, with the CPU twins of XLA's GPU callbacks."""
    monkeypatch.setattr(_host, "GPU_PLATFORMS", ("cuda", "rocm", "cpu"))
    monkeypatch.setattr(_gpu_host, "TARGET", "xla_ffi_python_cpu_callback")
    monkeypatch.setattr(_gpu_device, "TARGET", "xla_buffer_python_cpu_callback")
    monkeypatch.setattr(_gpu_device, "array_module", lambda call: FAKE_CUPY)
    monkeypatch.setattr(_gpu_device, "stream_of", lambda exec_ctx: STREAM)


@pytest.mark.parametrize("vmap", ["sequential", "vectorized"])
def test_host_code_by_the_gpu_route(simulated, vmap):
    """Host code through the GPU route's callback (copies in, copies out): values, every
    check of ab.check, and the route is the one taken."""
    op = _sin_every_order(f"g_host_{vmap}", vmap)
    x = randn((3, 4))
    assert _targets(jax.jit(op).lower(x).as_text()) == {"xla_ffi_python_cpu_callback"}
    assert_close(jax.jit(op)(x), np.sin(x), **TOL)
    report = ab.check(op, x)
    assert report.ok, str(report)
    assert_close(jax.jit(jax.hessian(lambda x: jnp.sum(op(x) ** 2)))(x[0]),
                 np.diag(2 * np.cos(2 * x[0])), rtol=1e-8, atol=1e-8)


def test_host_code_by_the_gpu_route_in_place_and_pytrees(simulated):
    """out=True writes into the host outputs the route allocates; pytree and integer
    outputs; a wrong result is the op's HostError, inside jit too."""
    def sincos(x, *, out):
        np.sin(x, out=out["s"])
        np.cos(x, out=out["c"])
        out["n"][...] = x.size
    op = ab.bind(sincos, out=True, name="g_sincos",
                 shape=lambda x: {"s": x, "c": x, "n": jax.ShapeDtypeStruct((), np.int64)})
    x = randn((5,))
    got = jax.jit(op)(x)
    assert_close(got["s"], np.sin(x), **TOL)
    assert_close(got["c"], np.cos(x), **TOL)
    assert int(got["n"]) == 5
    bad = ab.bind(lambda x: x[:2], shape=ab.like(0), name="g_bad")
    with pytest.raises(ab.HostError, match="g_bad.*shape \\(2,\\).*declared shape \\(5,\\)"):
        bad(x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="g_bad"):
        jax.jit(bad)(x)


def test_device_code_by_the_gpu_route(simulated):
    """Device code and device rules get the stream-bearing arrays, run inside XLA's stream
    and batch in every mode; ab.check's whole matrix passes."""
    streams = []

    def fn(x, *, stream):
        streams.append((stream, _Stream.current[-1].ptr))
        return np.sin(x)

    op = ab.bind(fn, shape=ab.like(0), device=True, name="g_dev",
                 jvp=lambda p, t: np.cos(p[0]) * t[0],
                 vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    x = randn((3, 4))
    assert _targets(jax.jit(op).lower(x).as_text()) == {"xla_buffer_python_cpu_callback"}
    assert_close(op(x), np.sin(x), **TOL)
    assert streams and set(streams) == {(STREAM, STREAM)}
    report = ab.check(op, x)
    assert report.ok, str(report)
    check_first_order(op, (x,))


def test_device_code_in_place_with_a_vmap_rule(simulated):
    """out=True device code and a device vmap rule: one call for the whole batch."""
    calls = []

    def rule(size, in_batched, x, *, out):
        calls.append(size)
        np.multiply(x, 2.0, out=out)

    def double(x, *, out):
        np.multiply(x, 2.0, out=out)

    op = ab.bind(double, shape=ab.like(0), out=True, linear=True, device=True,
                 name="g_dev_double")
    op.def_vmap(rule, out=True, device=True)
    op.def_transpose(lambda ct: (2.0 * ct,), device=True)
    X = randn((6, 3))
    assert_close(jax.jit(jax.vmap(op))(X), 2 * X, **TOL)
    assert calls == [6]
    assert_close(jax.linear_transpose(op, X[0])(X[1])[0], 2 * X[1], **TOL)
    assert ab.check(op, X[0]).ok


# ------------------------------------------------------- lowered for a GPU

def test_host_code_lowers_to_the_gpu_callback():
    """Host code in a program for CUDA: XLA's GPU Python callback, under every role."""
    op = _sin_op("g_lower")
    x = randn((3,))
    for f in (op, jax.grad(lambda x: op(x).sum()), jax.vmap(op),
              lambda x: jax.jvp(op, (x,), (x,))[1]):
        assert _targets(_lowered_for("cuda", f, x)) == {"xla_ffi_python_gpu_callback"}


def test_device_code_lowers_to_the_gpu_buffer_callback(monkeypatch):
    op = ab.bind(lambda x: x, shape=ab.like(0), device=True, name="g_dev_lower")
    x = randn((3,))
    monkeypatch.setitem(sys.modules, "cupy", None)  # as where CuPy is not installed
    with pytest.raises(ImportError, match="g_dev_lower' has device code.*install CuPy"):
        _lowered_for("cuda", op, x)
    monkeypatch.setattr(_gpu_device, "array_module", lambda call: FAKE_CUPY)
    assert _targets(_lowered_for("cuda", op, x)) == {"xla_buffer_python_gpu_callback"}


def test_lowering_for_several_platforms_at_once_is_a_clear_error():
    op = ab.bind(np.sin, shape=ab.like(0), name="g_multi")
    with pytest.raises(NotImplementedError, match="one platform at a time"):
        jax.jit(op).trace(randn((3,))).lower(lowering_platforms=("cpu", "cuda"))


@pytest.mark.parametrize("platforms", [["cuda"], ["cpu", "cuda"]])
def test_exporting_host_code_for_a_gpu_is_a_clear_error(platforms):
    op = ab.bind(np.sin, shape=ab.like(0), name="g_export")
    with pytest.raises(ValueError, match="g_export': its function is Python host code"):
        jax.export.export(jax.jit(op), platforms=platforms)(randn((3,)))


# --------------------------------------------------------- the host fallback

def test_device_code_falls_back_to_host_code_on_the_cpu():
    """On the CPU a device function and its device rules run their host fallbacks."""
    never = lambda *a, **k: pytest.fail("device code ran in a CPU program")
    op = ab.bind(never, shape=ab.like(0), device=True, host=np.sin, name="g_fallback")
    op.def_jvp(never, device=True, host=lambda p, t: np.cos(p[0]) * t[0])
    op.def_vjp(never, device=True, host=lambda p, ct: (np.cos(p[0]) * ct,))
    x = randn((4,))
    assert_close(jax.jit(op)(x), np.sin(x), **TOL)
    assert ab.check(op, x).ok
    assert "device" in repr(op)


def test_device_code_without_a_fallback_is_a_clear_error():
    op = ab.bind(np.sin, shape=ab.like(0), device=True, name="g_nofallback")
    with pytest.raises(NotImplementedError, match="g_nofallback': its function is device "
                                                  "code.*compiled for cpu.*host fallback"):
        op(randn((3,)))
    op = ab.bind(np.sin, shape=ab.like(0), name="g_rule_nofallback")
    op.def_jvp(lambda p, t: np.cos(p[0]) * t[0], device=True)
    with pytest.raises(NotImplementedError, match="its jvp rule is device code"):
        jax.jvp(op, (randn((3,)),), (randn((3,)),))


def test_declarations_are_checked_at_bind():
    with pytest.raises(TypeError, match="device=True.*traced code runs on every platform"):
        ab.bind(jnp.sin, traced=True, device=True, name="g_traced_device")
    with pytest.raises(TypeError, match="host=.*is the host fallback of a device=True"):
        ab.bind(np.sin, shape=ab.like(0), host=np.sin, name="g_host_only")
    op = ab.bind(np.sin, shape=ab.like(0), name="g_rule_decl")
    with pytest.raises(TypeError, match="def_vjp\\(host=...\\) must be a callable"):
        op.def_vjp(np.cos, device=True, host=3)


# ------------------------------------------------------------ on a real GPU

def _gpu_ready() -> bool:
    try:
        import cupy  # noqa: F401
        return bool(jax.devices("gpu"))
    except Exception:
        return False


gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs a CUDA GPU seen by JAX, and CuPy")


@gpu
@pytest.mark.gpu
def test_gpu_device_op_with_cupy_kernels():
    """A CuPy elementwise kernel on XLA's buffers and stream, with device rules, under
    jit, vmap (vectorized and a rule), grad, jvp, linear_transpose and hessian."""
    import cupy as cp
    cube = cp.ElementwiseKernel("T x", "T y", "y = x * x * x", "g_cube")
    op = ab.bind(lambda x: cube(x), shape=ab.like(0), device=True, host=lambda x: x ** 3,
                 vmap="vectorized", name="g_cupy_cube")
    op.def_jvp(lambda p, t: 3 * p[0] ** 2 * t[0], traced=True)
    x = jnp.linspace(-1.0, 1.0, 1000, dtype=jnp.float32)
    assert_close(jax.jit(op)(x), x ** 3, rtol=1e-6, atol=1e-6)
    assert_close(jax.jit(jax.grad(lambda x: op(x).sum()))(x), 3 * x ** 2, rtol=1e-6, atol=1e-6)
    assert_close(jax.jit(jax.vmap(op))(x.reshape(10, 100)), (x ** 3).reshape(10, 100),
                 rtol=1e-6, atol=1e-6)
    assert_close(jax.jit(jax.hessian(lambda x: op(x).sum()))(x[:5]), jnp.diag(6 * x[:5]),
                 rtol=1e-5, atol=1e-5)
    report = ab.check(op, x[:8])
    assert report.ok, str(report)
    with jax.default_device(jax.devices("cpu")[0]):  # the same op in a CPU program
        assert_close(jax.jit(op)(np.asarray(x)), np.asarray(x) ** 3, rtol=1e-6, atol=1e-6)


@gpu
@pytest.mark.gpu
def test_gpu_host_op_in_a_gpu_program():
    """SciPy host code in a GPU program: values and jit(grad) through the transfers."""
    special = pytest.importorskip("scipy.special")
    op = ab.bind(special.gammaln, shape=ab.like(0), name="g_gammaln",
                 vjp=lambda p, ct: (special.digamma(p[0]) * ct,))
    x = jnp.linspace(0.5, 4.0, 100)
    assert jax.jit(op)(x).devices() == {jax.devices("gpu")[0]}
    assert_close(jax.jit(op)(x), special.gammaln(np.asarray(x)), **TOL)
    assert_close(jax.jit(jax.grad(lambda x: op(x).sum()))(x), special.digamma(np.asarray(x)),
                 **TOL)
    report = ab.check(op, x[:8])
    assert report.ok, str(report)


def _busy_program(op):
    """jit(f)(w, x): op(x, s) where s comes out of a chain of large matrix products on w,
    so the GPU is still busy when XLA reaches the op (no while loop: its predicate would
    be read on the host, a synchronisation of its own)."""
    def f(w, x):
        for _ in range(12):
            w = jnp.tanh(w @ w) * 0.5
        return op(x, w[0, :x.shape[0]])
    return jax.jit(f)


@gpu
@pytest.mark.gpu
def test_gpu_device_code_gets_views_on_xlas_stream_without_a_sync():
    """Device code gets CuPy views of XLA's own buffers (the pointer of the jax.Array
    passed in), made without synchronising the device (an event recorded on the stream
    when the code starts is not yet reached: the matrix products before it still run),
    on XLA's stream (the current stream, also given as ``stream=``), ordered after the
    work that produced its inputs (the values read are the finished products)."""
    import cupy as cp
    seen = {}

    def add(x, s, *, stream):
        mark = cp.cuda.Event(disable_timing=True)
        mark.record()
        seen.update(busy=not mark.done, ptr=x.data.ptr, type=type(x), stream=stream,
                    current=cp.cuda.get_current_stream().ptr)
        return x + s

    op = ab.bind(add, shape=ab.like(0), device=True, name="g_views")
    w = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.float32) / 90.0
    x = jax.device_put(np.arange(64, dtype=np.float32), jax.devices("gpu")[0])
    prog = _busy_program(op)
    want = _busy_program(lambda x, s: x + s)(w, x)
    prog(w, x).block_until_ready()  # compiled; the next call is the one looked at
    seen.clear()
    got = prog(w, x).block_until_ready()
    assert seen["type"] is cp.ndarray
    assert seen["ptr"] == x.unsafe_buffer_pointer(), "the view is not XLA's buffer"
    assert seen["stream"] == seen["current"] != 0, "device code is not on XLA's stream"
    assert seen["busy"], "the device was synchronised before the device code ran"
    assert_close(got, want, rtol=1e-6, atol=1e-6)


def _profiled_copies(fn, path) -> tuple[int, int]:
    """(copies between host and device, kernels) in a CUDA profile (CUPTI, through torch's
    profiler: it records every library's work in the process, XLA's too) of fn()."""
    import json
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    copies = sum(e.get("cat") == "gpu_memcpy" and ("HtoD" in e["name"] or "DtoH" in e["name"])
                 for e in events)
    return copies, sum(e.get("cat") == "kernel" for e in events)


@gpu
@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's profiler reports its own setup
def test_gpu_bridges_and_device_code_copy_nothing_through_the_host(tmp_path):
    """A CUDA profile of ab.from_torch in a GPU program, ab.to_torch on CUDA tensors and a
    device op: kernels run and no copy crosses between host and device. Host code in
    the same program does copy (the control that shows the profile sees XLA's copies)."""
    torch = pytest.importorskip("torch")
    gpu0 = jax.devices("gpu")[0]
    x = jax.device_put(np.linspace(-1.0, 1.0, 4096), gpu0)
    t = torch.linspace(-1.0, 1.0, 4096, dtype=torch.float64, device="cuda")
    cube_t = ab.from_torch(lambda x: torch.sin(x) ** 3, name="g_prof_from",
                            mode="call")  # the torch call in a GPU program
    cube_j = ab.to_torch(lambda x: jnp.sin(x) ** 3, name="g_prof_to")
    device = ab.bind(lambda x: x * x * x, shape=ab.like(0), device=True, name="g_prof_dev")
    host = ab.bind(lambda x: x * x * x, shape=ab.like(0), name="g_prof_host")
    grad_t = jax.jit(jax.grad(lambda x: cube_t(x).sum()))
    runs = {"from_torch": lambda: grad_t(x).block_until_ready(),
            "to_torch": lambda: cube_j(t),
            "device op": lambda: jax.jit(device)(x).block_until_ready(),
            "host op": lambda: jax.jit(host)(x).block_until_ready()}
    for run in runs.values():
        run()  # compiled and warm
    for what, run in runs.items():
        copies, kernels = _profiled_copies(run, tmp_path / f"{what.replace(' ', '_')}.json")
        if what == "host op":  # a program of one callback: copies, no kernel
            assert copies >= 2, "the profile saw no copy of host code's operands"
        else:
            assert kernels > 0, f"{what}: the profile saw no kernel"
            assert copies == 0, f"{what}: {copies} copies between host and device"


@gpu
@pytest.mark.gpu
def test_gpu_from_torch_runs_on_xlas_buffers_and_stream():
    """ab.from_torch in a GPU program: the torch function gets CUDA tensors (private
    copies of XLA's buffers, as on the CPU) on XLA's stream; values and jit(grad), vmap,
    hessian against JAX's own."""
    torch = pytest.importorskip("torch")
    import cupy as cp

    from anybind.torch import _torch
    seen = []

    def cube(x):
        if _torch.is_fake(x):  # the bridge finding writes (on fake tensors), not a call
            return torch.sin(x) ** 3
        try:
            ptr = x.data_ptr()
        except RuntimeError:  # torch.func's wrapped tensors have no storage of their own
            ptr = None
        seen.append((x.device.type, ptr, torch.cuda.current_stream().cuda_stream,
                     cp.cuda.get_current_stream().ptr))
        return torch.sin(x) ** 3

    op = ab.from_torch(cube, shape=ab.like(0), name="g_from_torch")
    x = jax.device_put(np.linspace(-1.0, 1.0, 64), jax.devices("gpu")[0])
    f = lambda x: jnp.sin(x) ** 3
    assert_close(jax.jit(op)(x), f(x), **TOL)
    device, ptr, torch_stream, cupy_stream = seen[-1]
    assert device == "cuda" and ptr != x.unsafe_buffer_pointer()  # a copy
    assert torch_stream == cupy_stream != 0
    assert_close(jax.jit(jax.grad(lambda x: op(x).sum()))(x),
                 jax.grad(lambda x: f(x).sum())(x), **TOL)
    X = x.reshape(8, 8)
    assert_close(jax.jit(jax.vmap(op))(X), f(X), **TOL)
    assert_close(jax.jit(jax.hessian(lambda x: op(x).sum()))(x[:4]),
                 jax.hessian(lambda x: f(x).sum())(x[:4]), **TOL)
    assert {s[0] for s in seen} == {"cuda"}, "torch code got a tensor off the GPU"


@gpu
@pytest.mark.gpu
def test_gpu_from_torch_writes_into_a_private_copy():
    """torch code that writes into its input, in a GPU program: it writes into a copy
    (XLA's buffer keeps its values)."""
    pytest.importorskip("torch")
    from anybind.torch import _torch
    seen = []

    def scale_(x, y):
        if not _torch.is_fake(y):  # (the bridge finds writes on fake tensors)
            seen.append(y.data_ptr())
        x.mul_(2)
        return x + y

    op = ab.from_torch(scale_, shape=ab.like(0), name="g_from_torch_writes")
    gpu_dev = jax.devices("gpu")[0]
    x = jax.device_put(np.arange(4.0), gpu_dev)
    y = jax.device_put(np.ones(4), gpu_dev)
    assert_close(jax.jit(op)(x, y), 2 * np.arange(4.0) + 1, **TOL)
    assert_close(x, np.arange(4.0), **TOL)
    assert seen and seen[-1] != y.unsafe_buffer_pointer()  # every input is a copy


@gpu
@pytest.mark.gpu
def test_gpu_to_torch_on_cuda_tensors():
    """ab.to_torch with CUDA tensors: results on the same device, backward, torch.func."""
    torch = pytest.importorskip("torch")
    f = ab.to_torch(lambda x: jnp.sum(jnp.sin(x) ** 2), name="g_to_torch")
    x = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64, device="cuda", requires_grad=True)
    y = f(x)
    assert y.device == x.device
    torch.testing.assert_close(y, torch.sum(torch.sin(x) ** 2), rtol=1e-10, atol=1e-10)
    y.backward()
    assert x.grad.device == x.device
    torch.testing.assert_close(x.grad, torch.sin(2 * x.detach()), rtol=1e-10, atol=1e-10)
    hess = torch.func.hessian(f)(x.detach()[:4])
    torch.testing.assert_close(hess.diagonal(), 2 * torch.cos(2 * x.detach()[:4]),
                               rtol=1e-10, atol=1e-10)
    g = ab.to_torch(lambda x: jnp.sin(x) ** 3, name="g_to_torch_vmap")
    X = x.detach().reshape(8, 8)
    torch.testing.assert_close(torch.vmap(g)(X), torch.sin(X) ** 3, rtol=1e-10, atol=1e-10)


def test_api_docstring_examples_run():
    """ab.bind's examples (the device one among them, on its host fallback) and ab.Op's."""
    import doctest
    parser = doctest.DocTestParser()
    for obj in (ab.bind, ab.Op, *(getattr(ab.Op, f"def_{k}") for k in
                                  ("jvp", "vjp", "transpose", "fwd", "bwd", "vmap"))):
        test = parser.get_doctest(obj.__doc__ or "", {}, obj.__name__, None, 0)
        with jax.enable_x64(False):  # the examples show JAX's default dtypes
            result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
        assert result.failed == 0, f"docstring example of {obj.__name__} failed"
