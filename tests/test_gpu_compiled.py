"""Compiled device code: a launcher of ``ab.GPU_SIGNATURE`` bound with ``device=True``,
run by the FFI shim's CUDA handler with XLA's stream and device buffers, no Python in
the call (``routes._gpu_device`` handing it to ``routes._compiled``, ``_shim.c``).

Without a GPU the shim's CUDA handler's work runs on the CPU (the ``simulated``
fixture: its CPU twin, ``anybind_gpu_handler_on_cpu``, which passes no stream, on
host buffers), so the binding, the operands, batching by rows, derivative rules and
the errors are tested everywhere; programs are also lowered for CUDA, which JAX
does without a GPU. The tests marked ``gpu`` build ``tests/cuda/cube.cu`` with
nvcc and run it on the GPU; they are skipped where JAX sees no GPU or nvcc is
missing.
"""
import ctypes
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _compiled, _gpu_device, _host, _shimlib
from helpers import assert_close, randn

RESTYPE, ARGTYPES = ab.ctypes_signature(device=True)
# err as a pointer: a Python callback gets a c_char_p argument as a copy, not writable
LAUNCHER = ctypes.CFUNCTYPE(RESTYPE, *[ctypes.c_void_p if t is ctypes.c_char_p else t
                                       for t in ARGTYPES])
HOST = ctypes.CFUNCTYPE(*(lambda r, a: (r, *a))(*ab.ctypes_signature()))
CUDA_DIR = __import__("pathlib").Path(__file__).resolve().parent / "cuda"


@pytest.fixture(autouse=True)
def _cpu_programs_on_the_cpu(request):
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _array(ptr, shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    ctype = np.ctypeslib.as_ctypes_type(np.dtype(dtype))
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), (n,)).reshape(shape)


def _shape(shapes, ranks, i):
    return tuple(shapes[i][d] for d in range(ranks[i]))


_CODES = {ab.dtype_code(d): np.dtype(d) for d in (np.float32, np.float64)}


def _host_launcher(fn, calls=None):
    """A launcher of GPU_SIGNATURE computing ``fn`` on host buffers (the CPU twin gives
    host buffers): ``outs[0] = fn(*ins)``; records each call's stream in ``calls``."""
    @LAUNCHER
    def launch(stream, ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        if calls is not None:
            calls.append((stream, [_shape(shapes, ranks, i) for i in range(n_in + n_out)]))
        if dtypes[0] not in _CODES:
            msg = f"float32 or float64 only, got dtype code {dtypes[0]}".encode()
            ctypes.memmove(err, msg + b"\0", len(msg) + 1)
            return 1
        args = [_array(ins[i], _shape(shapes, ranks, i), _CODES[dtypes[i]])
                for i in range(n_in)]
        out = _array(outs[0], _shape(shapes, ranks, n_in), _CODES[dtypes[n_in]])
        out[...] = fn(*args)
        return 0
    return launch


@pytest.fixture
def simulated(monkeypatch):
    """The CPU counts as a platform of compiled device code, served by the CPU twin of the
    shim's CUDA handler under a target of its own."""
    lib = _shimlib.register_target()
    jax.ffi.register_ffi_target("anybind_compiled_on_cpu",
                                jax.ffi.pycapsule(lib.anybind_gpu_handler_on_cpu),
                                platform="cpu")
    monkeypatch.setattr(_host, "GPU_PLATFORMS", ("cuda", "rocm", "cpu"))
    monkeypatch.setattr(_gpu_device, "COMPILED_PLATFORMS", ("cuda", "cpu"))
    monkeypatch.setattr(_compiled, "TARGET", "anybind_compiled_on_cpu")


def _cube_op(name, calls=None, **bind):
    cube = _host_launcher(lambda x: x * x * x, calls)
    dcube = _host_launcher(lambda x, t: 3 * x * x * t)
    op = ab.bind(cube, shape=ab.like(0), device=True, host=lambda x: x ** 3, name=name,
                 **bind)
    op.def_jvp(dcube, device=True, host=lambda p, t: 3 * p[0] ** 2 * t[0])
    op.def_vjp(dcube, device=True, host=lambda p, ct: (3 * p[0] ** 2 * ct,))
    return op, (cube, dcube)


# ------------------------------------------------ simulated: the shim's CUDA handler

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_device_code_values_and_rules(simulated, dtype):
    """jit, grad (the compiled vjp), jvp (the compiled jvp rule) against x³ and 3x²·t."""
    calls = []
    op, keep = _cube_op(f"gc_cube_{np.dtype(dtype).name}", calls)
    x, t = randn(7, dtype, seed=1), randn(7, dtype, seed=2)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else {}
    assert_close(jax.jit(op)(x), x ** 3, **tol)
    assert calls and calls[-1][0] is None  # the CPU twin passes no stream
    assert_close(jax.jit(jax.grad(lambda x: (op(x) * t).sum()))(x), 3 * x ** 2 * t, **tol)
    _, jt = jax.jit(lambda x, t: jax.jvp(op, (x,), (t,)))(x, t)
    assert_close(jt, 3 * x ** 2 * t, **tol)


def test_compiled_device_code_under_vmap_by_rows_and_whole(simulated):
    """'sequential': one launch per row, of the row's shape; 'expand_dims': one launch
    with the batched shapes."""
    rows_calls, whole_calls = [], []
    by_rows, k1 = _cube_op("gc_rows", rows_calls)
    whole, k2 = _cube_op("gc_whole", whole_calls, vmap="expand_dims")
    x = randn((4, 3), seed=3)
    assert_close(jax.jit(jax.vmap(by_rows))(x), x ** 3)
    assert [s for _, s in rows_calls] == [[(3,), (3,)]] * 4
    assert_close(jax.jit(jax.vmap(whole))(x), x ** 3)
    assert [s for _, s in whole_calls] == [[(4, 3), (4, 3)]]


def test_compiled_device_code_failure_names_the_op(simulated):
    """A launcher's non-zero status and message reach the caller, naming the op."""
    op, keep = _cube_op("gc_refuses")
    with pytest.raises(Exception, match=r"gc_refuses.*status 1.*dtype code 4"):
        jax.block_until_ready(jax.jit(op)(np.ones(3, np.int32)))


def test_numba_and_cffi_launchers(simulated):
    """A Numba cfunc of ab.numba_signature(device=True) and a cffi function pointer of
    GPU_SIGNATURE are launchers too: called with the stream (none here) and buffers."""
    import cffi
    import numba

    @numba.cfunc(ab.numba_signature(device=True))
    def twice(stream, ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        n = 1
        for d in range(ranks[0]):
            n *= shapes[0][d]
        x = numba.carray(ins[0], n, np.float64)
        y = numba.carray(outs[0], n, np.float64)
        y[:] = 2 * x
        return 0

    ffi = cffi.FFI()
    calls = []

    @ffi.callback("int32_t(void *, void *const *, void *const *, const int64_t *const *, "
                  "const int64_t *, const int32_t *, int64_t, int64_t, char *, int64_t)")
    def thrice(stream, ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        calls.append(stream)
        n = int(np.prod([shapes[0][d] for d in range(ranks[0])]))
        x = np.frombuffer(ffi.buffer(ins[0], 8 * n), np.float64)
        np.frombuffer(ffi.buffer(outs[0], 8 * n), np.float64)[:] = 3 * x
        return 0

    x = randn(5, seed=7)
    for fn, k, name in ((twice, 2, "gc_numba"), (thrice, 3, "gc_cffi")):
        op = ab.bind(fn, shape=ab.like(0), device=True, host=lambda x, k=k: k * x, name=name)
        assert_close(jax.jit(op)(x), k * x)
    assert calls == [ffi.NULL]
    with pytest.raises(TypeError, match="gc_numba_host.*device code.*got 9 parameters"):
        ab.bind(numba.cfunc(ab.numba_signature())(_nine_params), shape=ab.like(0),
                device=True, name="gc_numba_host")


def _nine_params(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    return 0


def test_a_host_binding_is_never_called_by_the_gpu_handler(simulated):
    """The shim refuses a host function called as device code (and so the reverse)."""
    host = HOST(lambda *a: 0)
    op = ab.bind(host, shape=ab.like(0), name="gc_host_fn")
    key = _compiled.link(op, "function", host, for_export=False)[1]
    lowered = jax.ffi.ffi_call("anybind_compiled_on_cpu",
                               jax.ShapeDtypeStruct((3,), jnp.float64))
    with pytest.raises(Exception, match=r"gc_host_fn.*is host code.*compiled for a GPU"):
        jax.block_until_ready(jax.jit(lambda x: lowered(
            x, anybind_key=np.int64(key), anybind_name="gc_host_fn",
            anybind_rows=np.int64(0)))(np.ones(3)))


# -------------------------------------------------------------- lowered for CUDA

def test_compiled_device_code_lowers_to_the_shim_for_cuda():
    """For CUDA: one custom call to the shim's target per role, no Python callback; no
    debug attribute (the GPU handler cannot fill device memory)."""
    op, keep = _cube_op("gc_lowered")
    x = randn(5)
    for f, arg in ((op, x), (jax.grad(lambda x: op(x).sum()), x),
                   (jax.vmap(op), x.reshape(5, 1))):
        text = jax.jit(f).trace(arg).lower(lowering_platforms=("cuda",)).as_text()
        targets = [line for line in text.splitlines() if "stablehlo.custom_call @" in line]
        assert targets and all("@anybind_compiled(" in t for t in targets), targets
    with ab.debug():
        text = jax.jit(op).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "anybind_debug" not in text


def test_compiled_device_code_exports_for_cuda_by_its_stable_name():
    """jax.export for CUDA: the shim's target, called by the op's stable name with the
    fingerprint a process checks before running it (as compiled host code)."""
    op, keep = _cube_op("gc_export")
    exp = jax.export.export(jax.jit(op), platforms=["cuda"])(
        jax.ShapeDtypeStruct((5,), np.float32))
    calls = [line for line in exp.mlir_module().splitlines() if "custom_call" in line]
    assert len(calls) == 1 and "@anybind_compiled(" in calls[0]
    assert "anybind_fingerprint" in calls[0] and 'anybind_name = "gc_export"' in calls[0]
    assert f"anybind_key = {_compiled.key_of('gc_export')} " in calls[0]
    assert jax.export.deserialize(exp.serialize()).platforms == ("cuda",)


def test_compiled_device_code_runs_its_host_fallback_on_the_cpu():
    op, keep = _cube_op("gc_fallback")
    x = randn(6, seed=4)
    assert_close(jax.jit(op)(x), x ** 3)
    assert_close(jax.grad(lambda x: op(x).sum())(x), 3 * x ** 2)
    bare = ab.bind(keep[0], shape=ab.like(0), device=True, name="gc_no_fallback")
    with pytest.raises(NotImplementedError, match="gc_no_fallback.*host fallback"):
        jax.jit(bare)(x)


def test_compiled_device_code_for_rocm_is_a_clear_error():
    op, keep = _cube_op("gc_rocm")
    with pytest.raises(NotImplementedError, match="gc_rocm.*compiled device code.*rocm"):
        jax.jit(op).trace(randn(3)).lower(lowering_platforms=("rocm",))


def test_declarations_of_compiled_device_code_are_checked_at_bind():
    host = HOST(lambda *a: 0)
    with pytest.raises(TypeError, match=r"gc_bad1.*device code.*GPU_SIGNATURE|"
                                        r"gc_bad1.*device code.*stream"):
        ab.bind(host, shape=ab.like(0), device=True, name="gc_bad1")
    launch = LAUNCHER(lambda *a: 0)
    with pytest.raises(TypeError, match=r"gc_bad2.*C calling convention.*got 10 parameters"):
        ab.bind(launch, shape=ab.like(0), name="gc_bad2")
    with pytest.raises(TypeError, match=r"gc_bad3.*host=.*compiled code"):
        ab.bind(launch, shape=ab.like(0), device=True, host=host, name="gc_bad3")
    op = ab.bind(launch, shape=ab.like(0), device=True, name="gc_bad4")
    with pytest.raises(TypeError, match=r"gc_bad4.*jvp rule.*device code"):
        op.def_jvp(host, device=True)
    with pytest.raises(TypeError, match="gc_bad5.*cannot be traced|gc_bad5.*traced"):
        ab.bind(launch, shape=ab.like(0), device=True, traced=True, name="gc_bad5")
    assert ab.GPU_SIGNATURE.startswith("int32_t (*)(void *stream, ")


# ------------------------------------------------------------------- on a GPU

def _gpu_and_nvcc() -> bool:
    try:
        return bool(jax.devices("gpu")) and shutil.which("nvcc") is not None
    except RuntimeError:
        return False


@pytest.fixture(scope="module")
def cube_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda") / "libcube.so"
    arch = "sm_{}{}".format(*jax.devices("gpu")[0].compute_capability.split("."))
    subprocess.run(["nvcc", "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                    str(CUDA_DIR / "cube.cu"), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    for f in (lib.cube, lib.cube_jvp, lib.refuses):
        f.restype, f.argtypes = RESTYPE, ARGTYPES
    return lib


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_and_nvcc(), reason="needs a CUDA GPU seen by JAX, and nvcc")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_compiled_kernel_on_xlas_stream(cube_lib, dtype):
    """An nvcc-built launcher as a device op: values, grad, jvp, vmap by rows and whole,
    the launchers' errors, ab.check against the fallback."""
    lib = cube_lib
    op = ab.bind(lib.cube, shape=ab.like(0), device=True, host=lambda x: x ** 3,
                 name=f"gc_gpu_cube_{np.dtype(dtype).name}")
    op.def_vjp(lib.cube_jvp, device=True, host=lambda p, ct: (3 * p[0] ** 2 * ct,))
    op.def_jvp(lib.cube_jvp, device=True, host=lambda p, t: 3 * p[0] ** 2 * t[0])
    whole = ab.bind(lib.cube, shape=ab.like(0), device=True, host=lambda x: x ** 3,
                    vmap="expand_dims", name=f"gc_gpu_whole_{np.dtype(dtype).name}")
    x, t = randn(1000, dtype, seed=5), randn(1000, dtype, seed=6)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=0)
    assert_close(jax.jit(op)(x), x ** 3, **tol)
    assert_close(jax.jit(jax.grad(lambda x: (op(x) * t).sum()))(x), 3 * x ** 2 * t, **tol)
    assert_close(jax.jit(lambda x, t: jax.jvp(op, (x,), (t,))[1])(x, t), 3 * x ** 2 * t,
                 **tol)
    for f in (op, whole):
        assert_close(jax.jit(jax.vmap(f))(x.reshape(10, 100)), (x ** 3).reshape(10, 100),
                     **tol)
    report = ab.check(op, x[:8])
    assert report.ok, str(report)
    with pytest.raises(Exception, match=r"gc_gpu_cube.*status 1.*dtype code 4"):
        jax.block_until_ready(jax.jit(op)(np.ones(3, np.int32)))
    refuses = ab.bind(lib.refuses, shape=ab.like(0), device=True,
                      name=f"gc_gpu_refuses_{np.dtype(dtype).name}")
    with pytest.raises(Exception, match=r"gc_gpu_refuses.*status 7.*refused 1 inputs"):
        jax.block_until_ready(jax.jit(refuses)(x))
