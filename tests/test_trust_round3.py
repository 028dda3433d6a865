"""Trust, round 3: no user code can change a JAX array, kept views never crash,
no false alarms or races, bounded caches, clear errors that name the op, and
exported programs that run only what they were exported with.

Anything that could crash or hang runs in a fresh process (``run_fresh_python``),
so that a segfault or a hang fails the test instead of ending the run.
"""
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _pyffi
from helpers import run_fresh_python

ROUTES = {"handler": True, "buffer_callback": False}  # route -> _pyffi.enabled


def _ok(res) -> str:
    """The fresh process's stdout, after checking it ended normally (a signal fails here)."""
    if res.returncode < 0:
        raise AssertionError(f"the process died of {signal.Signals(-res.returncode).name}:\n"
                             f"{res.stdout}\n{res.stderr[-3000:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


# ------------------------------------------- A1: host code cannot change a JAX array

def _bases(x):
    """``x`` and every object down its chain of bases, as arrays where NumPy makes one."""
    out, b = [x], x.base
    while b is not None:
        out.append(b if isinstance(b, np.ndarray) else np.asarray(b))
        b = getattr(b, "base", None)
    return out


def _writer(how: str):
    def write(x):
        views = {"view": [x], "derived": [x[1:], x.T, x.reshape(-1)[::2]],
                 "bases": _bases(x), "bases_of_derived": _bases(x[::2])}[how]
        for v in views:
            try:
                v.setflags(write=True)
            except ValueError:
                pass  # refused: what must happen
            try:
                v[...] = 99
            except ValueError:
                pass
        return x * 1
    return write


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("how", ["view", "derived", "bases", "bases_of_derived"])
def test_host_code_cannot_make_an_input_writable(route, how, monkeypatch):
    monkeypatch.setattr(_pyffi, "enabled", ROUTES[route])
    op = ab.bind(_writer(how), shape=ab.like(0), name=f"writer_{how}")
    for call in (op, jax.jit(op)):
        a = jnp.arange(4.0)
        np.testing.assert_array_equal(call(a), np.arange(4.0))
        np.testing.assert_array_equal(a, np.arange(4.0))  # the caller's array is unchanged


@pytest.mark.parametrize("route", ROUTES)
def test_setflags_write_on_an_input_view_raises(route, monkeypatch):
    monkeypatch.setattr(_pyffi, "enabled", ROUTES[route])
    seen = []

    def f(x):
        for v in (x, x[1:], x.T, x.reshape(-1)):
            try:
                v.setflags(write=True)
                seen.append("writable")
            except ValueError as e:
                seen.append(str(e))
        return x * 1
    jax.jit(ab.bind(f, shape=ab.like(0), name="flags"))(jnp.ones(3)).block_until_ready()
    assert len(seen) == 4 and "writable" not in seen, seen


def test_outputs_stay_writable_and_leases_are_reused_per_kind():
    if _pyffi.handler() is None:
        pytest.skip("anybind's Python FFI handler was not built (no C compiler at install)")
    bases = []

    def f(x, *, out):
        bases.append((id(x.base), id(out.base)))
        out[...] = 2 * x
    f = jax.jit(ab.bind(f, shape=ab.like(0), out=True, name="writes_out"))
    for _ in range(3):
        np.testing.assert_array_equal(f(np.ones(3)), 2 * np.ones(3))
    assert len(set(bases)) == 1 and bases[0][0] != bases[0][1]


# -------------------------------- H16: a kept derived view is switched to a copy

_KEEP_DERIVED = """
    import gc, numpy as np, jax, jax.numpy as jnp, anybind as ab
    jax.config.update("jax_enable_x64", True)
    kept, holder = [], {{}}

    class Box:
        pass
    box = Box()

    def keep(x):
        kept.append(x[1:])
        kept.append((x[::-2].T,))  # in a tuple the collector no longer tracks
        holder["d"] = x.reshape(-1)[5:]
        box.v = x[2:4]
        return 2 * x

    def keep_out(x, *, out):
        out[...] = 3 * x
        kept.append(out[1:])

    n = {n}
    for op in (ab.bind(keep, shape=ab.like(0), name="keeper"),
               ab.bind(keep_out, shape=ab.like(0), out=True, name="out_keeper")):
        a = jnp.arange(n, dtype=jnp.float64) + 1
        try:
            jax.block_until_ready(jax.jit(op)(a))
            print("no error")
        except Exception as e:
            print("ERROR", str(e).replace(chr(10), " ")[:200])
        del a
    gc.collect()
    junk = [jnp.full(n, 7.0) + i for i in range(4)]  # XLA reuses the freed buffers
    jax.block_until_ready(junk)
    print("SUMS", float(kept[0][:1000].sum()), float(kept[1][0][:2].sum()),
          float(holder["d"][:10].sum()), float(box.v.sum()), float(kept[2][:1000].sum()))
"""


@pytest.mark.skipif(_pyffi.handler() is None, reason="the FFI handler was not built")
def test_kept_derived_views_read_what_the_buffer_held_after_it_is_reused():
    n = 4_000_000  # 32 MB: freed memory is unmapped, so a dangling read faults
    out = _ok(run_fresh_python(_KEEP_DERIVED.format(n=n)))
    assert out.count("ERROR") == 2, out
    assert "anybind op 'keeper': the function kept a reference to input 0" in out
    assert "anybind op 'out_keeper': the function kept a reference to output 0" in out
    expect = [sum(range(2, 1002)), n + (n - 2), sum(range(6, 16)), 3 + 4,
              3 * sum(range(2, 1002))]
    assert f"SUMS {' '.join(str(float(v)) for v in expect)}" in out, out
