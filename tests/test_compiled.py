"""Compiled functions (ctypes, cffi, Numba) bound with ab.bind: the call path, the
transformation matrix against pure-JAX references, errors, the GIL and the shim.

The ops are in ``compiled_ops.py``; references are plain ``jax.numpy``.
"""
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import anybind as ab
import compiled_ops as co
from anybind.routes import _shimlib
from helpers import (
    assert_close,
    check_first_order,
    check_transpose_identity,
    host_call_count,
    randn,
    run_fresh_python,
)
from ops import mul_ref

X1, X2 = randn((2, 3)), randn((2, 3), seed=1)
MODES = ("sequential", "vectorized")


def _no_callback(lowered) -> None:
    text = lowered.as_text()
    assert "anybind_compiled" in text and host_call_count(text) == 0


# ------------------------------------------------------------------ the call

@pytest.mark.parametrize("flavour", co.FLAVOURS)
def test_call_is_one_ffi_custom_call_with_no_python(flavour):
    op = co.mul(flavour)
    assert_close(op(X1, X2), mul_ref(X1, X2))
    assert_close(jax.jit(op)(X1, X2), mul_ref(X1, X2))
    _no_callback(jax.jit(op).lower(X1, X2))
    # a derivative program calls only compiled code too
    _no_callback(jax.jit(jax.grad(lambda a, b: op(a, b).sum())).lower(X1, X2))


@pytest.mark.parametrize("flavour", co.FLAVOURS)
@pytest.mark.parametrize("mode", MODES)
def test_first_order_against_differences_and_transpose_identity(flavour, mode):
    op = co.mul(flavour, mode)
    check_first_order(op, (X1, X2))
    check_first_order(jax.jit(op), (X1, X2))
    t = randn((2, 3), seed=5)
    assert_close(jax.jvp(op, (X1, X2), (t, X1))[1], jax.jvp(mul_ref, (X1, X2), (t, X1))[1])
    assert_close(jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1))(X1, X2),
                 jax.grad(lambda a, b: mul_ref(a, b).sum(), argnums=(0, 1))(X1, X2))


@pytest.mark.parametrize("mode", MODES)
def test_jacobians_linearize_and_linear_transpose(mode):
    op = co.mul("ctypes", mode)
    x1, x2 = X1[0], X2[0]
    for jac in (jax.jacfwd, jax.jacrev):
        assert_close(jac(op, argnums=(0, 1))(x1, x2), jax.jacfwd(mul_ref, argnums=(0, 1))(x1, x2))
    y, f_lin = jax.linearize(op, x1, x2)
    assert_close(f_lin(x2, x1), jax.jvp(mul_ref, (x1, x2), (x2, x1))[1])
    ct = randn(3, seed=3)
    assert_close(jax.linear_transpose(f_lin, x1, x2)(ct),
                 jax.vjp(mul_ref, x1, x2)[1](ct))


@pytest.mark.parametrize("flavour", co.FLAVOURS)
@pytest.mark.parametrize("mode", MODES)
def test_vmap_batched_and_broadcast_arguments(flavour, mode):
    op = co.mul(flavour, mode)
    b1, b2 = randn((4, 2, 3), seed=6), randn((4, 2, 3), seed=7)
    for axes, args in (((0, 0), (b1, b2)), ((0, None), (b1, X2)), ((None, 0), (X1, b2)),
                       ((1, 0), (jnp.moveaxis(b1, 0, 1), b2))):
        assert_close(jax.vmap(op, axes)(*args), jax.vmap(mul_ref, axes)(*args))
    # nested vmap merges into one batch axis, still one FFI call
    f = jax.vmap(jax.vmap(op, (0, None)), (None, 0))
    assert_close(f(b1, b2), jax.vmap(jax.vmap(mul_ref, (0, None)), (None, 0))(b1, b2))
    lowered = jax.jit(f).lower(b1, b2).as_text()
    assert lowered.count("anybind_compiled") == 1
    assert (f"anybind_rows = {16 if mode == 'sequential' else 0}" in lowered)


@pytest.mark.parametrize("mode", MODES)
def test_derivatives_under_vmap_and_vmap_under_derivatives(mode):
    op = co.mul("numba", mode)
    b1 = randn((4, 2, 3), seed=8)

    def loss(f):
        return lambda a, b: (f(a, b) ** 2).sum()
    assert_close(jax.vmap(jax.grad(loss(op)), (0, None))(b1, X2),
                 jax.vmap(jax.grad(loss(mul_ref)), (0, None))(b1, X2))
    assert_close(jax.grad(lambda a: loss(jax.vmap(op, (0, None)))(a, X2))(b1),
                 jax.grad(lambda a: loss(jax.vmap(mul_ref, (0, None)))(a, X2))(b1))
    assert_close(jax.vmap(jax.jacfwd(op), (0, None))(b1[:, 0], X2[0]),
                 jax.vmap(jax.jacfwd(mul_ref), (0, None))(b1[:, 0], X2[0]))


def test_control_flow_and_checkpoint():
    op = co.mul("cffi")

    def program(f):
        def run(x, w):
            def body(c, _):
                c = f(c, w) * 0.5
                return c, c.sum()
            c, ys = lax.scan(body, x, None, length=4)
            c = lax.cond(ys[-1] > 0, lambda c: f(c, w), lambda c: -c, c)
            return jax.checkpoint(lambda c: f(c, c))(c).sum()
        return run
    x, w = 0.3 * X1, 1.1 + 0.1 * X2
    assert_close(jax.jit(program(op))(x, w), program(mul_ref)(x, w))
    assert_close(jax.jit(jax.grad(program(op), argnums=(0, 1)))(x, w),
                 jax.grad(program(mul_ref), argnums=(0, 1))(x, w))


# -------------------------------------------------------------- other rules

@pytest.mark.parametrize("mode", MODES)
def test_linear_op_with_compiled_transpose_all_orders(mode):
    op = co.cumsum(mode)
    x, ct = randn((2, 5)), randn((2, 5), seed=2)
    assert_close(op(x), co.cumsum_ref(x))
    check_transpose_identity(op, x, randn((2, 5), seed=3), ct)
    assert_close(jax.linear_transpose(op, x)(ct), jax.linear_transpose(co.cumsum_ref, x)(ct))

    def energy(f):
        return lambda x: (jnp.sin(f(x)) ** 2).sum()
    assert_close(jax.hessian(energy(op))(x[0]), jax.hessian(energy(co.cumsum_ref))(x[0]))
    xs = randn((3, 2, 5), seed=4)
    assert_close(jax.vmap(jax.grad(energy(op)))(xs), jax.vmap(jax.grad(energy(co.cumsum_ref)))(xs))


@pytest.mark.parametrize("mode", MODES)
def test_fwd_bwd_pair_beside_a_host_jvp_rule(mode):
    op = co.exp(mode)
    x = 0.5 * X1
    check_first_order(op, (x,))
    _no_callback(jax.jit(jax.grad(lambda x: op(x).sum())).lower(x))
    xs = randn((3, 2, 3), seed=9) * 0.5
    assert_close(jax.vmap(jax.grad(lambda x: (op(x) * x).sum()))(xs),
                 jax.vmap(jax.grad(lambda x: (co.exp_ref(x) * x).sum()))(xs))
    # the jvp is a Python host rule: forward mode goes through the host route
    assert host_call_count(jax.jit(lambda x: jax.jvp(op, (x,), (x,))).lower(x)) == 1


@pytest.mark.parametrize("mode", MODES)
def test_pytree_argument_and_keyword_operand(mode):
    op = co.axpby(mode)
    d, w = {"x": X1, "y": X2}, randn((2, 3), seed=4)
    assert_close(op(d, w=w), co.axpby_ref(d, w=w))
    g = jax.grad(lambda d: (op(d, w=w) ** 2).sum())(d)
    assert_close(g, jax.grad(lambda d: (co.axpby_ref(d, w=w) ** 2).sum())(d))
    ws = randn((4, 2, 3), seed=10)
    assert_close(jax.vmap(lambda w: op(d, w=w))(ws), jax.vmap(lambda w: co.axpby_ref(d, w=w))(ws))


def test_compiled_vmap_rule_gets_batched_shapes():
    k = co.clib("ctypes")
    op = ab.bind(k["mul"], shape=ab.like(0), name="cmul_vmap_rule")
    op.def_vmap(k["mul"])  # mul broadcasts a leading axis of 1: a valid batching rule
    b1 = randn((4, 3), seed=11)
    assert_close(jax.vmap(op, (0, None))(b1, X2[0]), jax.vmap(mul_ref, (0, None))(b1, X2[0]))
    assert "anybind_name = \"cmul_vmap_rule.vmap\"" in jax.jit(jax.vmap(op)).lower(b1, b1).as_text()


def test_host_function_with_compiled_rules_and_traced_rules_beside():
    k = co.clib("ctypes")
    op = ab.bind(lambda a, b: a * b**2, shape=ab.like(0), jvp=k["mul_jvp"], name="host_cmul")
    op.def_vjp(lambda p, ct: (p[1] ** 2 * ct, 2 * p[0] * p[1] * ct), traced=True)
    check_first_order(op, (X1, X2))


# ------------------------------------------------------------------- errors

def test_error_status_reaches_the_caller_naming_the_op():
    op = co.checked_sqrt()
    x = np.array([4.0, -1.0, 9.0])
    with pytest.raises(ab.HostError, match=r"anybind op 'checked_sqrt_sequential': the compiled "
                       r"function returned status 7: negative input -1 at index 1"):
        op(x)
    with pytest.raises(Exception, match=r"anybind op 'checked_sqrt_sequential'.*status 7"):
        jax.block_until_ready(jax.jit(op)(x))
    with pytest.raises(Exception, match=r"status 7 at batch index 1: negative input -2"):
        jax.block_until_ready(jax.jit(jax.vmap(op))(np.array([[1.0], [-2.0]])))
    assert_close(op(np.array([4.0, 9.0])), np.array([2.0, 3.0]))  # the process lives on


def test_trace_time_checks_of_shapes_and_dtypes():
    op = co.mul("ctypes")
    with pytest.raises(TypeError, match=r"'cmul_ctypes_sequential'.*static keyword.*scale"):
        op(X1, X2, scale=2)
    # the C kernel itself refuses a dtype it was not written for, with a message
    with pytest.raises(ab.HostError, match=r"operand 0 has dtype code 11, expected float64"):
        op(X1.astype(np.float32), X2.astype(np.float32))


def test_bind_refuses_a_wrong_signature_or_missing_argtypes():
    import ctypes
    lib = ctypes.CDLL(str(co.LIB_PATH))
    with pytest.raises(TypeError, match=r"argtypes are not set.*ab.ctypes_signature"):
        ab.bind(lib.mul, shape=ab.like(0), name="no_argtypes")
    f = lib.cumsum
    f.restype, f.argtypes = ctypes.c_int32, [ctypes.c_void_p] * 3
    with pytest.raises(TypeError, match=r"not of anybind's C calling convention.*got 3 param"):
        ab.bind(f, shape=ab.like(0), name="bad_signature")
    with pytest.raises(TypeError, match=r"compiled code.*cannot be traced"):
        ab.bind(co.clib("ctypes")["mul"], traced=True, name="traced_compiled")
    import numba
    bad = numba.cfunc("float64(float64)")(lambda x: x)
    with pytest.raises(TypeError, match=r"jvp rule is a numba function.*got 1 parameter"):
        ab.bind(np.sin, shape=ab.like(0), jvp=bad, name="bad_numba_rule")


def test_export_of_a_python_host_op_names_the_op():
    op = ab.bind(np.sin, shape=ab.like(0), name="host_sin_blocks_export")
    with pytest.raises(ValueError, match=r"'host_sin_blocks_export'.*Python host code.*jax.export"):
        jax.export.export(jax.jit(op))(X1)


# ---------------------------------------------------------------------- GIL

def test_compiled_call_runs_without_the_gil():
    held = co.gil_held()
    assert float(jax.jit(held)(np.zeros(1))[0]) == 0.0
    # the same C function called from Python (ctypes releases the GIL too) as a host op
    # through the Python route holds it: the check can tell the two apart
    py = ab.bind(lambda x: np.full_like(x, float(ctypes_gil_check())), shape=ab.like(0),
                 name="gil_in_host_call")
    assert float(jax.jit(py)(np.zeros(1))[0]) == 1.0


def ctypes_gil_check() -> int:
    import ctypes
    return ctypes.pythonapi.PyGILState_Check()


def test_python_thread_runs_during_a_long_compiled_call():
    op = jax.jit(co.spin())
    op(np.zeros(1)).block_until_ready()  # compile first
    ticks, stop = [], threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(time.perf_counter())
    worker = threading.Thread(target=count)
    worker.start()
    try:
        start = time.perf_counter()
        op(np.full(1, 0.4)).block_until_ready()
        end = time.perf_counter()
    finally:
        stop.set()
        worker.join()
    during = [t for t in ticks if start < t < end]
    # the thread ran all through the call, not in one burst at a switch point
    assert len(during) > 1000
    assert max(np.diff([start] + during + [end])) < 0.5 * (end - start)


# ------------------------------------------------------------------- the shim

def test_shim_builds_at_first_use_and_names_a_missing_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _shimlib._from_cache(build=True)
    assert path.parent == tmp_path / "anybind"
    assert _shimlib._open(path, strict=True).anybind_shim_version() == _shimlib.SHIM_VERSION
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(_shimlib.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"no C compiler was found.*Python host functions work"):
        _shimlib._from_cache(build=True)


def test_signature_helpers():
    assert ab.dtype_code(np.float64) == 12 and ab.dtype_code(np.complex128) == 18
    with pytest.raises(TypeError, match="no compiled-call dtype code for"):
        ab.dtype_code(np.dtype("datetime64[s]"))
    assert "int32_t" in ab.C_SIGNATURE and ab.ctypes_signature()[1][5] is __import__(
        "ctypes").c_int64


@pytest.mark.parametrize("op", [co.mul("cffi", "vectorized"), co.cumsum(), co.exp()],
                         ids=["mul", "cumsum", "exp"])
def test_ab_check_verifies_compiled_rules(op):
    x = 0.5 * X1
    report = ab.check(op, x, X2) if op.name.startswith("cmul") else ab.check(op, x)
    assert "FAIL" not in str(report)


def test_docstring_examples_run():
    import doctest

    import anybind.contrib.nbody as nbody
    parser = doctest.DocTestParser()
    for obj in (ab.numba_signature, ab.ctypes_signature, ab.dtype_code, nbody):
        test = parser.get_doctest(obj.__doc__, {}, obj.__name__, None, 0)
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
        assert result.failed == 0, f"docstring example of {obj.__name__} failed"


def test_integer_leaves_have_no_tangents_in_the_convention():
    x, k = randn((2, 3)), np.arange(6).reshape(2, 3) - 2
    op, ref = co.abs_count(), co.abs_count_ref
    for f in (op, jax.jit(op)):
        y, count = f(x)
        assert_close(y, jnp.abs(x)) and int(count) == int(np.sum(x > 0))
        assert count.dtype == np.int64
    check_first_order(lambda x: op(x)[0], (x,))
    assert_close(jax.grad(lambda x: (op(x)[0] ** 2).sum())(x),
                 jax.grad(lambda x: (ref(x)[0] ** 2).sum())(x))
    xs = randn((4, 2, 3), seed=12)
    assert_close(jax.vmap(op)(xs), jax.vmap(ref)(xs))
    s, sref = co.scale_int(), co.scale_int_ref
    check_first_order(s, (x, k))
    assert_close(jax.vmap(jax.grad(lambda x, k: (s(x, k) ** 2).sum()), (0, None))(xs, k),
                 jax.vmap(jax.grad(lambda x, k: (sref(x, k) ** 2).sum()), (0, None))(xs, k))


def test_empty_batch_makes_no_call():
    op = co.checked_sqrt()
    assert jax.vmap(op)(np.zeros((0, 3))).shape == (0, 3)


@pytest.mark.slow  # starts a process
def test_per_device_calls_run_in_parallel_under_shard_map():
    """Two CPU devices: both shards' calls are seen running at the same time."""
    res = run_fresh_python("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import jax, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        jax.config.update("jax_enable_x64", True)
        import compiled_ops
        mesh = jax.make_mesh((2,), ("d",))
        f = jax.jit(jax.shard_map(compiled_ops.overlap(), mesh=mesh, in_specs=P("d"),
                                  out_specs=P("d")))
        x = jax.device_put(np.full(2, 5.0), NamedSharding(mesh, P("d")))
        print(np.asarray(f(x)).tolist())
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[2.0, 2.0]"


def test_rules_batch_by_their_own_vmap_mode_or_batched_variant():
    k = co.clib("ctypes")
    b1, b2 = randn((4, 2, 3), seed=13), randn((4, 2, 3), seed=14)

    def tangents(op):
        return jax.vmap(lambda a, b: jax.jvp(op, (a, b), (b, a))[1])
    want = tangents(mul_ref)(b1, b2)
    for vmap, rows, name in (("vectorized", 0, '"own_mode.jvp"'),
                             (k["mul_jvp"], 0, '"own_variant.jvp.vmap"')):
        tag = "own_mode" if isinstance(vmap, str) else "own_variant"
        op = ab.bind(k["mul"], shape=ab.like(0), vmap="sequential", name=tag)
        op.def_jvp(k["mul_jvp"], vmap=vmap)
        assert_close(jax.jit(tangents(op))(b1, b2), want)
        text = jax.jit(tangents(op)).lower(b1, b2).as_text()
        jvp_call = [line for line in text.splitlines() if f"anybind_name = {name}" in line]
        assert len(jvp_call) == 1 and f"anybind_rows = {rows}" in jvp_call[0]


def test_compiled_transposes_of_a_multilinear_op_are_refused_clearly():
    k = co.clib("ctypes")
    op = ab.bind(k["mul"], shape=ab.like(0), multilinear=True, name="multilinear_compiled")
    op.def_transpose(k["mul_vjp"], argnum=0)
    op.def_transpose(k["mul_vjp"], argnum=1)
    with pytest.raises(TypeError, match=r"'multilinear_compiled' is multilinear.*host or traced"):
        jax.grad(lambda a: op(a, X2).sum())(X1)


def test_repr_and_check_report_say_compiled():
    op = co.mul("numba")
    assert repr(op).startswith("<anybind op 'cmul_numba_sequential' compiled")
    assert "(compiled;" in str(ab.check(op, X1, X2)).splitlines()[0]
