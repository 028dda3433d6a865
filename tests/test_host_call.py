"""The host call: errors, lifetime, side effects, threads, what host code sees."""
import gc
import re
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import anybind as ab
from anybind.core import _errors as _hostcall
from anybind.routes import _pyffi as _hostffi
from helpers import assert_close, host_call_count, randn


@pytest.fixture(autouse=True)
def _cpu_programs():
    """These tests are about the CPU's host routes (which handler runs, what host code
    sees there): on a machine with a GPU they run on its CPU device too."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield

# ----------------------------------------------------------------- exceptions

def _raising(where: str):
    """An op whose function or one rule raises ValueError("boom in <where>") for x[0] > 100."""
    def check(x, what):
        if what == where and np.any(x > 100):
            raise ValueError(f"boom in {what}")

    def fn(x):
        check(x, "function")
        return 2 * x

    def jvp(p, t):
        check(p[0], "jvp")
        return 2 * t[0]

    def vjp(p, ct):
        check(p[0], "vjp")
        return (2 * ct,)

    def vmap_rule(n, b, x):
        check(x, "vmap")
        return 2 * x, True

    return ab.bind(fn, shape=ab.like(0), jvp=jvp, vjp=vjp, vmap=vmap_rule, name=f"raise_{where}")


def _linear_raising():
    def transpose(ct):
        if np.any(ct > 100):
            raise ValueError("boom in transpose")
        return (2 * ct,)
    return ab.bind(lambda x: 2 * x, shape=ab.like(0), linear=True, transpose=transpose,
                   name="raise_transpose")


CALLS = {
    "function": lambda op, x: op(x),
    "jvp": lambda op, x: jax.jvp(op, (x,), (x,))[1],
    "vjp": lambda op, x: jax.grad(lambda x: op(x).sum())(x),
    "vmap": lambda op, x: jax.vmap(op)(jnp.stack([x, x])),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("where", list(CALLS))
def test_exception_reaches_caller_and_later_calls_work(where, jit):
    op = _raising(where)
    f = (lambda x: CALLS[where](op, x))
    f = jax.jit(f) if jit else f
    good, bad = randn(3), randn(3) + 1000.0
    ok = np.asarray(f(good))
    with pytest.raises(Exception, match=rf"(?s)raise_{where}.*boom in {where}"):
        np.asarray(f(bad))
    np.testing.assert_array_equal(np.asarray(f(good)), ok)  # the process and the op still work
    with pytest.raises(Exception, match=f"boom in {where}"):  # and it raises again
        np.asarray(f(bad))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_exception_in_transpose_rule(jit):
    op = _linear_raising()
    f = lambda c: jax.linear_transpose(op, c)(c)[0]
    f = jax.jit(f) if jit else f
    np.testing.assert_allclose(f(randn(3)), 2 * randn(3))
    with pytest.raises(Exception, match=r"(?s)raise_transpose.*boom in transpose"):
        np.asarray(f(randn(3) + 1000.0))
    np.testing.assert_allclose(f(randn(3)), 2 * randn(3))


@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_exception_in_one_batch_row(mode):
    def fn(x):
        if np.any(x > 100):
            raise ValueError("bad row")
        return x + 1

    op = ab.bind(fn, shape=ab.like(0), vmap=mode, name=f"row_{mode}")
    xs = np.stack([randn(3), randn(3) + 1000.0])
    with pytest.raises(Exception, match=r"(?s)row_.*bad row"):
        np.asarray(jax.jit(jax.vmap(op))(xs))
    np.testing.assert_allclose(jax.vmap(op)(xs[:1]), xs[:1] + 1)


# ------------------------------------------------------------------ lifetime

def _compiled_programs():
    """Compile programs using ops that nothing else references, then drop the ops."""
    op = ab.bind(lambda x: x * 3, shape=ab.like(0), name="ephemeral", vmap="vectorized",
                 jvp=lambda p, t: 3 * t[0], vjp=lambda p, ct: (3 * ct,))
    lin = ab.bind(lambda x: x * 5, shape=ab.like(0), linear=True, name="ephemeral_linear",
                  transpose=lambda ct: (5 * ct,))
    x = randn(3)
    progs = {
        "primal": jax.jit(lambda x: op(x)).lower(x).compile(),
        "grad": jax.jit(jax.grad(lambda x: op(x).sum())).lower(x).compile(),
        "jvp": jax.jit(lambda x: jax.jvp(op, (x,), (x,))[1]).lower(x).compile(),
        "vmap": jax.jit(jax.vmap(op)).lower(np.stack([x, x])).compile(),
        "transpose": jax.jit(lambda c: jax.linear_transpose(lin, c)(c)[0]).lower(x).compile(),
    }
    lowered = jax.jit(lambda x: op(x) + lin(x)).lower(x)  # compiled only after the ops are gone
    return progs, lowered, weakref.ref(op._core)


def test_aot_compiled_call_works_after_op_is_deleted():
    progs, lowered, _ = _compiled_programs()
    gc.collect()
    x = randn(3, seed=4)
    np.testing.assert_allclose(progs["primal"](x), 3 * x)
    np.testing.assert_allclose(progs["grad"](x), 3 * np.ones(3))
    np.testing.assert_allclose(progs["jvp"](x), 3 * x)
    np.testing.assert_allclose(progs["vmap"](np.stack([x, x])), 3 * np.stack([x, x]))
    np.testing.assert_allclose(progs["transpose"](x), 5 * x)
    np.testing.assert_allclose(lowered.compile()(x), 8 * x)


def test_op_is_released_with_the_programs_that_use_it():
    """Keeping the function alive must not mean leaking it forever."""
    progs, lowered, ref = _compiled_programs()
    del progs, lowered
    jax.clear_caches()
    gc.collect()
    assert ref() is None


# -------------------------------------------------------------- side effects

def _counting(has_side_effect: bool, **kw):
    calls = []

    def fn(x):
        calls.append(1)
        return x * 2

    op = ab.bind(fn, shape=ab.like(0), has_side_effect=has_side_effect,
                 name=f"count_{has_side_effect}", jvp=lambda p, t: 2 * t[0],
                 vjp=lambda p, ct: (2 * ct,), **kw)
    return op, calls


SIDE_EFFECT_PROGRAMS = {  # (program of the op, calls it must make with has_side_effect=True)
    "eager": (lambda op: op, 1),
    "jit": (lambda op: jax.jit(op), 1),
    "jit_unused": (lambda op: jax.jit(lambda x: (op(x), x)[1]), 1),
    "jit_twice": (lambda op: jax.jit(lambda x: op(x) + op(x)), 2),
    "grad": (lambda op: jax.grad(lambda x: op(x).sum()), 1),
    "jit_grad": (lambda op: jax.jit(jax.grad(lambda x: op(x).sum())), 1),
    "value_and_grad": (lambda op: jax.value_and_grad(lambda x: op(x).sum()), 1),
    "checkpoint_grad": (lambda op: jax.jit(jax.grad(jax.checkpoint(
        lambda x: jnp.sin(op(x)).sum()))), 1),
    "fori_loop": (lambda op: jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, c: op(c), x)), 3),
    "scan": (lambda op: jax.jit(lambda x: lax.scan(
        lambda c, _: (op(c), None), x, length=4)[0]), 4),
    "cond_taken": (lambda op: jax.jit(lambda x: lax.cond(True, op, lambda x: x, x)), 1),
    "cond_not_taken": (lambda op: jax.jit(lambda x: lax.cond(False, op, lambda x: x, x)), 0),
    "jacrev": (lambda op: jax.jacrev(op), 1),
    "jacfwd": (lambda op: jax.jacfwd(op), 1),
}


@pytest.mark.parametrize("program", list(SIDE_EFFECT_PROGRAMS))
def test_side_effect_runs_exactly_once_per_call(program):
    op, calls = _counting(True)
    make, n = SIDE_EFFECT_PROGRAMS[program]
    f = make(op)
    jax.block_until_ready(f(randn(3)))
    assert len(calls) == n
    calls.clear()
    jax.block_until_ready(f(randn(3)))  # and again on the next call of the same program
    assert len(calls) == n


@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_side_effect_under_vmap(mode):
    """Per row in sequential mode (the function sees rows), once in vectorized mode."""
    op, calls = _counting(True, vmap=mode)
    jax.block_until_ready(jax.jit(jax.vmap(op))(randn((4, 3))))
    assert len(calls) == (4 if mode == "sequential" else 1)


def test_pure_calls_may_be_dropped_or_merged():
    op, calls = _counting(False)
    jax.block_until_ready(jax.jit(lambda x: (op(x), x)[1])(randn(3)))
    assert calls == []  # unused: dead code
    jax.block_until_ready(jax.jit(lambda x: op(x) + op(x))(randn(3)))
    assert len(calls) == 1  # merged
    assert not jax.make_jaxpr(op)(randn(3)).effects
    assert jax.make_jaxpr(_counting(True)[0])(randn(3)).effects


# ---------------------------------------------------------------- threads

@pytest.mark.parametrize("mode", ["sequential", "vectorized"])
def test_calls_from_several_threads_at_once(mode):
    op = ab.bind(lambda a: a @ np.swapaxes(a, -1, -2), shape=lambda a: jax.ShapeDtypeStruct(
        a.shape[:-1] + a.shape[-2:-1], a.dtype), vmap=mode, name=f"gram_{mode}",
        jvp=lambda p, t: p[0] @ np.swapaxes(t[0], -1, -2) + t[0] @ np.swapaxes(p[0], -1, -2),
        vjp=lambda p, ct: ((ct + np.swapaxes(ct, -1, -2)) @ p[0],))
    jitted = jax.jit(op)
    grad = jax.jit(jax.grad(lambda a: op(a).sum()))
    vmapped = jax.jit(jax.vmap(op))
    errors, barrier = [], threading.Barrier(4)

    def work(t):
        try:
            barrier.wait()
            for i in range(15):
                a = randn((3, 2), seed=100 * t + i)
                np.testing.assert_allclose(jitted(a), a @ a.T, rtol=1e-12)
                np.testing.assert_allclose(op(a), a @ a.T, rtol=1e-12)
                np.testing.assert_allclose(grad(a), 2 * np.ones((3, 3)) @ a, rtol=1e-12)
                b = np.stack([a, 2 * a])
                np.testing.assert_allclose(vmapped(b), b @ np.swapaxes(b, 1, 2), rtol=1e-12)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---------------------------------------------------------- what host code sees

def test_host_function_and_rules_see_read_only_numpy_arrays():
    seen = {}

    def record(name, *arrays):
        seen[name] = [(type(a), a.flags.writeable) for a in arrays]

    def fn(x, *, k):
        record("fn", x, k)
        return x * k

    def jvp(p, t, *, k):
        record("jvp", p[0], t[0], k)
        return t[0] * k

    def vjp(p, ct, *, k):
        record("vjp", p[0], ct, k)
        return (ct * k,)

    def vmap_rule(n, b, x, *, k):
        record("vmap", x, k)
        return x * k, True

    op = ab.bind(fn, shape=ab.like(0), jvp=jvp, vjp=vjp, vmap=vmap_rule, name="viewer")
    x, k = randn(3), randn(3, seed=1)
    op(x, k=k)
    jax.jvp(lambda x: op(x, k=k), (x,), (x,))
    jax.grad(lambda x: op(x, k=k).sum())(x)
    jax.vmap(lambda x: op(x, k=k))(np.stack([x, x]))
    assert set(seen) == {"fn", "jvp", "vjp", "vmap"}
    for name, views in seen.items():
        for typ, writeable in views:
            assert typ is np.ndarray, name
            if name != "vjp":  # (a vjp's zero-filled cotangent may be made on the host)
                assert not writeable, name


def test_writing_into_an_input_raises_and_leaves_it_unchanged():
    def fn(x):
        x[0] = 123.0
        return x

    op = ab.bind(fn, shape=ab.like(0), name="scribbler")
    x = jnp.asarray(randn(3))
    before = np.asarray(x).copy()
    with pytest.raises(Exception, match=r"(?s)scribbler.*read-only"):
        np.asarray(jax.jit(op)(x))
    np.testing.assert_array_equal(np.asarray(x), before)


def test_result_is_copied_out_of_host_memory():
    """The returned array is written into XLA's buffer: later host changes do not leak in."""
    store = np.arange(3.0)
    op = ab.bind(lambda x: store, shape=ab.like(0), name="returns_global")
    out = jax.jit(op)(np.zeros(3))
    store[:] = -1
    np.testing.assert_array_equal(np.asarray(out), np.arange(3.0))


def test_host_rules_are_ordinary_python_with_concrete_values():
    branches = []

    def jvp(p, t):
        (x,), (dx,) = p, t
        if x[0] > 0:  # a Python branch on a concrete value
            branches.append("pos")
        else:
            branches.append("neg")
        return np.where(x > 0, 1.0, -1.0) * dx

    op = ab.bind(np.abs, shape=ab.like(0), jvp=jvp, name="abs_py")
    f = jax.jit(lambda x: jax.jvp(op, (x,), (np.ones(2),))[1])
    np.testing.assert_array_equal(f(np.array([1.0, -2.0])), [1.0, -1.0])
    np.testing.assert_array_equal(f(np.array([-1.0, 2.0])), [-1.0, 1.0])
    assert branches == ["pos", "neg"]


def test_redefining_a_rule_takes_effect_eagerly_and_under_jit():
    op = ab.bind(np.sin, shape=ab.like(0), name="redefined", jvp=lambda p, t: 1 * t[0])
    x = randn(3)
    np.testing.assert_allclose(jax.jvp(op, (x,), (np.ones(3),))[1], np.ones(3))
    op.def_jvp(lambda p, t: 2 * t[0])
    jit_t = jax.jit(lambda x: jax.jvp(op, (x,), (np.ones(3),))[1])(x)
    eager_t = jax.jvp(op, (x,), (np.ones(3),))[1]
    np.testing.assert_allclose(jit_t, 2 * np.ones(3))
    np.testing.assert_allclose(eager_t, 2 * np.ones(3))


def test_eager_errors_reach_their_own_thread():
    """Each thread's failing eager call raises its own error, not another thread's."""
    def fn(x):
        raise ValueError(f"bad input {int(x[0])}")

    op = ab.bind(fn, shape=ab.like(0), name="per_thread_errors")
    wrong, barrier = [], threading.Barrier(4)

    def work(t):
        barrier.wait()
        for _ in range(50):
            try:
                op(np.full(3, float(t)))
            except Exception as e:  # noqa: BLE001 - checked below
                if f"bad input {t}" not in str(e):
                    wrong.append((t, str(e)[-40:]))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


@pytest.mark.parametrize("program", ["jit_grad_unused", "jit_grad", "jit_jvp_unused", "eager_grad"])
def test_side_effect_runs_exactly_once_with_fwd_rule(program):
    """Under reverse mode an op with def_fwd runs the fwd rule instead: still exactly once."""
    calls = []

    def fwd(x):
        calls.append("fwd")
        return 2 * x, x

    op = ab.bind(lambda x: calls.append("fn") or 2 * x, shape=ab.like(0), has_side_effect=True,
                 name="side_effect_fwd", jvp=lambda p, t: 2 * t[0])
    op.def_fwd(fwd, residuals=lambda x: x)
    op.def_bwd(lambda res, ct: (2 * ct,))
    f = {
        "jit_grad_unused": jax.jit(jax.grad(lambda x: (op(x), x.sum())[1])),
        "jit_grad": jax.jit(jax.grad(lambda x: op(x).sum())),
        "jit_jvp_unused": jax.jit(lambda x: jax.jvp(lambda x: (op(x), x)[1], (x,), (x,))),
        "eager_grad": jax.grad(lambda x: (op(x), x.sum())[1]),
    }[program]
    jax.block_until_ready(f(randn(3)))
    assert len(calls) == 1, calls


# ------------------------------------------------------------- the CPU routes

BUFFER_CALLBACK = "xla_buffer_python_cpu_callback"
ROUTES = {"handler": True, "buffer_callback": False}  # route -> _hostffi.enabled


@pytest.fixture(params=list(ROUTES))
def route(request, monkeypatch):
    """Each CPU route of host code in turn: anybind's FFI handler, XLA's buffer callback."""
    if ROUTES[request.param] and _hostffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    monkeypatch.setattr(_hostffi, "enabled", ROUTES[request.param])
    return _hostffi.TARGET if ROUTES[request.param] else BUFFER_CALLBACK


def _targets(lowered) -> set:
    return set(re.findall(r"custom_call @(\w+)\(", lowered.as_text()))


def test_host_code_lowers_to_anybinds_handler_where_it_is_built():
    op = ab.bind(np.sin, shape=ab.like(0), name="sin_target")
    lowered = jax.jit(op).lower(randn(3))
    built = _hostffi.handler() is not None
    assert _targets(lowered) == {_hostffi.TARGET if built else BUFFER_CALLBACK}
    assert host_call_count(lowered) == 1
    assert "xla_python_cpu_callback" not in lowered.as_text()
    assert "pure_callback" not in str(jax.make_jaxpr(op)(randn(3)))


def test_each_route_runs_every_transformation(route):
    op = ab.bind(np.sin, shape=ab.like(0), vmap="sequential", name=f"sin_{route}",
                 jvp=lambda p, t: np.cos(p[0]) * t[0], vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    x, xs = randn(3), randn((2, 3), seed=1)
    cases = [(jax.jit(op), (x,), np.sin(x)),
             (jax.jit(jax.grad(lambda x: op(x).sum())), (x,), np.cos(x)),
             (jax.jit(jax.vmap(op)), (xs,), np.sin(xs)),
             (jax.jit(lambda x: lax.scan(lambda c, _: (op(c), None), x, length=3)[0]), (x,),
              np.sin(np.sin(np.sin(x))))]
    for f, args, want in cases:
        assert _targets(f.lower(*args)) == {route}
        assert_close(f(*args), want)
    assert_close(op(x), np.sin(x))  # eager


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float16",
                                   "bfloat16", "float32", "complex64", "complex128"])
def test_each_route_gives_host_code_read_only_views_of_every_dtype(route, dtype):
    dtype = jnp.dtype(dtype)
    seen = []

    def reverse(x):
        seen.append((x.dtype, x.flags.writeable, x.shape))
        return np.flip(x).copy()

    op = ab.bind(reverse, shape=ab.like(0), name=f"reverse_{route}_{dtype.name}")
    x = np.arange(5).astype(dtype)
    np.testing.assert_array_equal(np.asarray(jax.jit(op)(x)), x[::-1])
    assert seen == [(dtype, False, (5,))]
    zero_d = np.asarray(jax.jit(op)(x[0]))  # rank 0
    np.testing.assert_array_equal(zero_d, x[0])


def test_each_route_reports_the_users_exception(route):
    op = _raising("function")
    bad = randn(3) + 1000.0
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"HostError: anybind op 'raise_function': the function raised "
                             r"ValueError: boom in function \(in fn, ") as info:
        jax.jit(op)(bad).block_until_ready()
    err = _hostcall.find_host_error(info.value)
    assert isinstance(err, ab.HostError) and isinstance(err.__cause__, ValueError)
    with pytest.raises(ab.HostError, match="boom in function") as eager:  # its own error
        op(bad)
    assert isinstance(eager.value.__cause__, ValueError)
    np.testing.assert_array_equal(jax.jit(op)(randn(3)), 2 * randn(3))


def test_handler_forgets_a_program_once_the_program_is_collected():
    if _hostffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    before = set(_hostffi._registry)
    progs, lowered, ref = _compiled_programs()
    ours = set(_hostffi._registry) - before
    assert ours  # every program registered its callbacks with the handler
    del progs, lowered
    jax.clear_caches()
    gc.collect()
    assert ref() is None and not ours & set(_hostffi._registry)


def test_a_failing_dtype_table_entry_falls_back_to_the_buffer_callback(monkeypatch):
    """An operand that NumPy cannot view takes XLA's buffer callback, as before."""
    if _hostffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    monkeypatch.setattr(_hostffi, "_viewable", _hostffi._viewable - {"float32"})
    op = ab.bind(lambda x: x * 2, shape=ab.like(0), name="f32_fallback")
    x = randn(3).astype(np.float32)
    assert _targets(jax.jit(op).lower(x)) == {BUFFER_CALLBACK}
    assert _targets(jax.jit(op).lower(randn(3))) == {_hostffi.TARGET}
    np.testing.assert_array_equal(jax.jit(op)(x), 2 * x)


def test_without_the_handler_host_code_takes_the_buffer_callback(monkeypatch):
    """As where the extension was not built: no C compiler at install."""
    monkeypatch.setattr(_hostffi, "_loaded", [None])
    op = ab.bind(lambda x: x * 2, shape=ab.like(0), name="no_handler")
    x = randn(3)
    assert _targets(jax.jit(op).lower(x)) == {BUFFER_CALLBACK}
    np.testing.assert_array_equal(jax.jit(op)(x), 2 * x)


# ------------------------------------------------------------------- the mesh

@pytest.mark.parametrize("mode", ["eager", "jit", "grad"])
def test_host_code_sees_no_mesh_of_the_dispatching_thread(mode):
    """As JAX's own callbacks from 0.12: host code, which may run on the thread that
    dispatched the program, does not see that thread's ``jax.set_mesh`` (an Explicit mesh,
    as ``jax.make_mesh`` makes it), so JAX code inside it is not placed on that mesh."""
    seen = []

    def f(x):
        seen.append(jax.sharding.get_abstract_mesh().empty)
        return np.sin(x)

    op = ab.bind(f, shape=ab.like(0), name="meshless", vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    x = jnp.linspace(0.1, 1.0, 4)
    run = {"eager": op, "jit": jax.jit(op), "grad": jax.grad(lambda v: op(v).sum())}[mode]
    with jax.set_mesh(jax.make_mesh((1,), ("x",))):
        got = run(x)
    want = jnp.cos(x) if mode == "grad" else jnp.sin(x)
    assert_close(got, want)
    assert seen and all(seen), seen
    assert jax.sharding.get_abstract_mesh().empty  # and the caller's context is back
