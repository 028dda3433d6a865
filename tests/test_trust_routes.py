"""Trust: what host code may keep, what a crafted program may call, what a cached
binary must be before it is loaded, and errors that always name their op.

Anything that could crash the process runs in a fresh one (``run_fresh_python``),
so that a segfault fails the test instead of ending the run.
"""
import re
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _pyffi
from helpers import randn, run_fresh_python

BIG = 4_000_000  # 32 MB of float64: freed memory is unmapped, so a dangling read faults

ROUTES = {"handler": True, "buffer_callback": False}  # route -> _pyffi.enabled


def _ok(res) -> str:
    """The fresh process's stdout, after checking it ended normally (a signal fails here)."""
    if res.returncode < 0:
        raise AssertionError(f"the process died of {signal.Signals(-res.returncode).name}:\n"
                             f"{res.stdout}\n{res.stderr[-3000:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


# --------------------------------------------- host code keeping views (issue 20, item 1)

_KEEP = """
    import numpy as np, jax, anybind as ab
    from anybind.routes import _pyffi
    jax.config.update("jax_enable_x64", True)
    _pyffi.enabled = {handler}
    kept = []

    def keep(x):
        kept.append({what})
        return 2 * x

    def keep_out(x, *, out):
        out[...] = 2 * x
        kept.append(out)

    def failed(x):
        y = x[1:]  # a derived view in a local of the failing frame
        raise ValueError("boom")

    ops = {{"function": ab.bind(keep, shape=ab.like(0), name="keeper"),
            "out": ab.bind(keep_out, shape=ab.like(0), out=True, name="out_keeper")}}
    for name, op in ops.items():
        for call in (op, jax.jit(op)):
            x = np.full({n}, 3.0)
            try:
                jax.block_until_ready(call(x))
                print("no error")
            except Exception as e:
                print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
    print("KEPT", len(kept), [float(np.asarray(k).sum()) for k in kept] if {read} else "")
    failing = ab.bind(failed, shape=ab.like(0), name="failing")
    try:
        failing(np.ones({n}))
    except ab.HostError as e:
        print("FAILED", str(e))
        tb = e.__cause__.__traceback__
        while tb is not None:  # whatever a post-mortem debugger could read
            for v in tb.tb_frame.f_locals.values():
                if isinstance(v, np.ndarray):
                    float(v.sum())
            tb = tb.tb_next
    fine = ab.bind(lambda x: 2 * x, shape=ab.like(0), name="fine")
    print("FINE", fine(np.ones(3)).tolist(), jax.jit(fine)(np.ones(3)).tolist())
"""


def _errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("ERROR", "no error"))]


@pytest.mark.parametrize("route", ROUTES)
def test_a_kept_input_view_is_an_error_naming_the_op_and_input_not_a_crash(route):
    out = _ok(run_fresh_python(_KEEP.format(handler=ROUTES[route], what="x", n=BIG,
                                            read=ROUTES[route])))
    errors = _errors(out)
    assert len(errors) == 4, out
    for line in errors[:2]:
        assert re.search(r"HostError:? anybind op 'keeper': the function kept a reference to "
                         r"input 0 past the end of the call", line), line
    for line in errors[2:]:
        assert re.search(r"HostError:? anybind op 'out_keeper': the function kept a reference "
                         r"to output 0", line), line
    if ROUTES[route]:  # the handler's kept views hold a copy: they read as they were
        assert "KEPT 4 [12000000.0, 12000000.0, 24000000.0, 24000000.0]" in out, out
    assert "FAILED anybind op 'failing': the function raised ValueError: boom" in out
    assert "FINE [2.0, 2.0, 2.0] [2.0, 2.0, 2.0]" in out


@pytest.mark.parametrize("route", ROUTES)
def test_a_kept_view_derived_from_an_input_is_an_error_too(route):
    out = _ok(run_fresh_python(_KEEP.format(handler=ROUTES[route], what="x[1:].T", n=BIG,
                                            read=False)))
    errors = _errors(out)
    assert len(errors) == 4, out
    assert all(re.search(r"HostError:? anybind op '(out_)?keeper': the function kept a "
                         r"reference to (in|out)put 0", line) for line in errors), out
    assert "FINE [2.0, 2.0, 2.0]" in out


def test_views_given_back_are_reused_and_nothing_is_reported():
    if _pyffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    seen = []
    op = ab.bind(lambda x: (seen.append(id(x.base)), x * 2)[1], shape=ab.like(0),
                 name="reuses_leases")
    f = jax.jit(op)
    for _ in range(3):
        np.testing.assert_array_equal(f(np.ones(3)), 2 * np.ones(3))
    assert len(set(seen)) == 1  # one lease, given back after each call


# ------------------------------- crafted calls of Python host code (issue 20, item 12)

def _callback_key(text: str) -> int:
    return int(re.search(r"anybind_callback = (-?\d+)", text).group(1))


def test_host_callback_keys_are_random_63_bit_numbers():
    if _pyffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), name="keyed")
    keys = [_callback_key(jax.jit(lambda x, i=i: op(x) + i).lower(randn(3)).as_text())
            for i in range(4)]
    assert len(set(keys)) == 4
    assert all(2**40 < k < 2**63 for k in keys)  # fails with odds 4·2⁻²³


def test_a_crafted_call_with_other_operands_is_refused_before_host_code_runs():
    out = _ok(run_fresh_python("""
        import re, numpy as np, jax, anybind as ab
        jax.config.update("jax_enable_x64", True)
        ran = []
        victim = ab.bind(lambda x: (ran.append(1), 2 * x)[1], shape=ab.like(0), name="victim")
        lowered = jax.jit(victim).lower(np.ones(4))
        key = int(re.search(r"anybind_callback = (-?\\d+)", lowered.as_text()).group(1))
        held = lowered.compile()  # the program of that key, alive: the key is live
        def crafted(shape, dtype, n_out=1):
            outs = [jax.ShapeDtypeStruct((4,), np.float64)] * n_out
            call = jax.ffi.ffi_call("anybind_python", outs if n_out != 1 else outs[0])
            return call(np.ones(shape, dtype), anybind_callback=np.int64(key))
        for args in (((1 << 21,), np.float64), ((4,), np.float32), ((2, 2), np.float64),
                     ((4,), np.float64, 2)):
            try:
                jax.block_until_ready(crafted(*args))
                print("no error")
            except Exception as e:
                print("ERROR", str(e).replace(chr(10), " "))
        print("RAN", len(ran), held(np.ones(4)).tolist(), len(ran))
    """))
    errors = [line for line in out.splitlines() if line.startswith(("ERROR", "no error"))]
    assert len(errors) == 4, out
    assert "input 0 of float64[2097152], but its program declared float64[4]" in errors[0]
    assert "input 0 of float32[4], but its program declared float64[4]" in errors[1]
    assert "input 0 of float64[2, 2], but its program declared float64[4]" in errors[2]
    assert "with 1 inputs and 2 outputs, but its program declared 1 and 1" in errors[3]
    assert all("anybind op 'victim': the function was called with" in e for e in errors)
    assert "RAN 0 [2.0, 2.0, 2.0, 2.0] 1" in out  # host code ran only for its own program


# ------------------------------------ errors with broken messages (issue 20, item 6)

class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str failed")


@pytest.fixture(params=list(ROUTES))
def host_route(request, monkeypatch):
    if ROUTES[request.param] and _pyffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    monkeypatch.setattr(_pyffi, "enabled", ROUTES[request.param])
    return request.param


@pytest.mark.parametrize("exc, shown", [
    (_BadStr(), r"_BadStr: <str\(\) of the exception raised RuntimeError>"),
    (ValueError("lone \udc80 surrogate"), r"ValueError: lone \\udc80 surrogate"),
    (ab.HostError("user's own \ud800"), r"HostError: user's own \\ud800"),
], ids=["str-raises", "surrogate", "hosterror-surrogate"])
def test_an_exception_with_a_broken_message_still_names_the_op(host_route, exc, shown):
    def fn(x):
        raise exc
    op = ab.bind(fn, shape=ab.like(0), name="broken_message")
    with pytest.raises(ab.HostError, match=r"anybind op 'broken_message': the function raised "
                       + shown) as info:
        op(np.ones(3))
    assert info.value.__cause__ is exc
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"anybind op 'broken_message': the function raised " + shown):
        jax.block_until_ready(jax.jit(op)(np.ones(3)))
    with pytest.raises(ab.HostError, match="anybind op 'broken_message'"), ab.debug():
        jax.block_until_ready(jax.jit(op)(np.ones(3) + 1))


def test_a_base_exception_of_host_code_names_the_op():
    if _pyffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")

    class Stop(BaseException):
        pass

    def fn(x):
        raise Stop("stopped \udc80")
    op = ab.bind(fn, shape=ab.like(0), name="base_exception")
    with pytest.raises(Exception, match=r"anybind op 'base_exception': the function raised "
                       r".*Stop: stopped \\udc80"):
        jax.block_until_ready(jax.jit(op)(np.ones(3)))
