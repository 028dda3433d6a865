"""Ops that nothing uses any more are collected whole (see ``anybind.core._lifetime``).

Binding, calling and dropping many ops runs in a fresh subprocess, so that the
process's memory and JAX's rule tables start from a known state.
"""
import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.core import _lifetime
from helpers import assert_close

pytestmark = pytest.mark.slow  # starts processes that churn thousands of ops

_CHURN = textwrap.dedent("""
    import ctypes, gc, json, sys, time
    import numpy as np, jax, jax.numpy as jnp, psutil
    import anybind as ab
    from anybind.core import _lifetime

    def make(i):
        op = ab.bind(np.sin, shape=ab.like(0), name=f"churn{i}")
        op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
        op.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
        return op

    def use(op, x):
        op(x).block_until_ready()
        jax.jit(jax.grad(lambda v: op(v).sum()))(x).block_until_ready()

    def settle():  # XLA's threads let go of a finished program's callbacks soon after
        for _ in range(100):
            gc.collect()
            ops = sum(type(o) is ab.Op for o in gc.get_objects())
            if not ops:
                break
            time.sleep(0.05)
        return ops

    def rss():
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed pages back (glibc)
        except (OSError, AttributeError):
            pass
        return psutil.Process().memory_info().rss

    x = jnp.linspace(0.0, 1.0, 3)
    for i in range(5):  # JAX's own first-use allocations
        use(make(i), x)
    settle()
    before, tables = rss(), _lifetime.table_sizes()
    for i in range(int(sys.argv[1])):
        use(make(i), x)
    ops = settle()
    after = rss()
    print(json.dumps(dict(grown=after - before, ops=ops, tables=tables,
                          tables_after=_lifetime.table_sizes())))
""")


def test_ops_made_used_and_dropped_are_collected_whole():
    """150 ops, each called eagerly and under jit(grad), then dropped: nothing stays."""
    n = 150
    out = subprocess.run([sys.executable, "-c", _CHURN, str(n)], capture_output=True,
                         text=True, check=True, env={**os.environ, "JAX_ENABLE_X64": "1"})
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ops"] == 0
    assert res["tables_after"] == res["tables"]
    # Before the fix each op kept its eager executable: about 1.4 MB, 210 MB here.
    assert res["grown"] < 40e6, f"the process grew by {res['grown'] / 1e6:.1f} MB"


_HEAP = textwrap.dedent("""
    import gc, sys, tracemalloc
    import numpy as np, jax.numpy as jnp
    import anybind as ab

    def use(i):
        op = ab.bind(np.sin, shape=ab.like(0), name=f"heap{i}",
                     vjp=lambda p, ct: (np.cos(p[0]) * ct,))
        op(x).block_until_ready()

    x = jnp.linspace(0.0, 1.0, 4)
    for i in range(50):  # JAX's own first-use allocations
        use(i)
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.get_traced_memory()[0]
    n = int(sys.argv[1])
    for i in range(n):
        use(100 + i)
    gc.collect()
    print((tracemalloc.get_traced_memory()[0] - before) / n)
""")


def test_dropped_ops_leave_at_most_a_kilobyte_each():
    """300 host ops bound, called and dropped: Python's heap grows by at most about 1 KB
    per op (it grew by 19-36 KB per op while every eager program had a name of its own,
    which keyed JAX's bounded caches)."""
    out = subprocess.run([sys.executable, "-c", _HEAP, "300"], capture_output=True,
                         text=True, check=True)
    per_op = float(out.stdout.strip().splitlines()[-1])
    assert per_op < 1024, f"{per_op:.0f} bytes per dropped op"


def _sin_op(name="lifetime_sin"):
    op = ab.bind(np.sin, shape=ab.like(0), name=name)
    op.def_jvp(lambda p, t: np.cos(p[0]) * t[0])
    op.def_vjp(lambda p, ct: (np.cos(p[0]) * ct,))
    return op


def _collected(ref) -> bool:
    jax.jit(lambda v: v + 1)(0.0)  # JAX keeps the program it ran last
    gc.collect()
    return ref() is None


def _in_tables(prim) -> bool:
    return any(prim in table for table in _lifetime._TABLES)


def test_dropped_op_leaves_the_rule_tables():
    """Its primitives leave JAX's rule tables (other tests' ops may come and go
    meanwhile, so the tables' sizes are not compared)."""
    op = _sin_op()
    x = jnp.linspace(0.0, 1.0, 4)
    assert_close(op(x), jnp.sin(x))
    assert_close(jax.jit(jax.vmap(jax.grad(lambda v: op(v).sum())))(x[:, None])[:, 0],  # noqa: F821
                 jnp.cos(x))
    prims = list(op._family.prims.values())
    assert len(prims) >= 3 and all(_in_tables(p) for p in prims)
    ref = weakref.ref(op._core)
    del op
    assert _collected(ref)
    assert not any(_in_tables(p) for p in prims)


@pytest.mark.parametrize("how", ["jit", "make_jaxpr", "checkpoint"])
def test_op_given_to_jax_as_the_function_is_collected(how):
    """jax.jit(op) and jax.make_jaxpr(op) key JAX's caches by the op's handle, which
    the jaxprs they keep do not refer to; once the handle goes, so does the op."""
    op = _sin_op(f"lifetime_{how}")
    x = jnp.linspace(0.0, 1.0, 4)
    if how == "jit":
        assert_close(jax.jit(op)(x), jnp.sin(x))
    elif how == "make_jaxpr":
        assert "lifetime_make_jaxpr" in str(jax.make_jaxpr(op)(x))
    else:
        assert_close(jax.jit(jax.grad(lambda v: jax.checkpoint(op)(v).sum()))(x),  # noqa: F821
                     jnp.cos(x))
    ref = weakref.ref(op._core)
    del op
    assert _collected(ref)


def test_compiled_program_keeps_its_op_alive():
    """A program compiled ahead of time runs after every Python reference is gone."""
    op = _sin_op("lifetime_aot")
    x = jnp.linspace(0.0, 1.0, 4)
    compiled = jax.jit(lambda v: op(v) * 2).lower(x).compile()  # noqa: F821 (called before del)
    ref = weakref.ref(op._core)
    del op
    assert not _collected(ref)
    assert_close(compiled(x), 2 * jnp.sin(x))
    del compiled
    assert _collected(ref)


def test_op_bound_inside_a_trace_outlives_the_trace():
    """An op made inside a jitted function lives as long as the program that uses it."""
    @jax.jit
    def f(v):
        return ab.bind(np.cos, shape=ab.like(0), name="lifetime_inner")(v) + 1
    x = jnp.linspace(0.0, 1.0, 4)
    assert_close(f(x), jnp.cos(x) + 1)
    assert_close(f(x + 1), jnp.cos(x + 1) + 1)


def test_rebinding_the_same_function_gives_a_fresh_op():
    """Binding again gives a new op with its own primitives and eager programs."""
    x = jnp.linspace(0.0, 1.0, 4)
    a, b = _sin_op("lifetime_again"), _sin_op("lifetime_again")
    assert a._family["primal"] is not b._family["primal"]
    assert_close(a(x), b(x))
    assert_close(jax.grad(lambda v: a(v).sum())(x), jax.grad(lambda v: b(v).sum())(x))


def test_equal_calls_compare_without_running_the_collector():
    """A ``Call`` is a weak key of JAX's abstract-evaluation cache, which compares keys in
    the middle of a table lookup: a collection there can free another op's key and erase
    its entry from the table being searched (jaxlib 0.8.0 crashed in
    ``WeakrefLRUCache::GetCache``, on the per-shard derivatives). So comparing two equal,
    distinct calls allocates nothing the collector tracks, and they still compare and hash
    alike, unlike those of another op or another signature."""
    op, other = _sin_op("lifetime_eq"), _sin_op("lifetime_eq")
    call = jax.make_jaxpr(op)(jnp.ones(3)).eqns[0].params["call"]
    twin = call.weak()
    assert twin is not call and twin == call and hash(twin) == hash(call)
    elsewhere = jax.make_jaxpr(other)(jnp.ones(3)).eqns[0].params["call"]
    assert call != elsewhere
    assert call != jax.make_jaxpr(op)(jnp.ones(4)).eqns[0].params["call"]
    collections = []
    record = lambda phase, info: collections.append(phase)  # noqa: E731
    threshold = gc.get_threshold()
    gc.callbacks.append(record)
    gc.set_threshold(1)  # any tracked allocation now starts a collection
    try:
        for _ in range(1000):
            assert twin == call and call == twin and call != elsewhere
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(record)
    assert collections == []
