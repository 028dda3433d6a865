"""Trust: what host code may keep, what a crafted program may call, what a cached
binary must be before it is loaded, and errors that always name their op.

Anything that could crash the process runs in a fresh one (``run_fresh_python``),
so that a segfault fails the test instead of ending the run.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from anybind.routes import _callback, _pyffi
from helpers import fresh_stdout, randn, run_fresh_python

BIG = 4_000_000  # 32 MB of float64: freed memory is unmapped, so a dangling read faults

ROUTES = {"handler": True, "buffer_callback": False}  # route -> _pyffi.enabled


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
        jax.block_until_ready(failing(np.ones({n})))
    except Exception as e:  # the HostError itself, or (run asynchronously) XLA's error
        from anybind.core._errors import find_host_error
        e = e if isinstance(e, ab.HostError) else find_host_error(e)
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


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("route", ROUTES)
def test_a_kept_input_view_is_an_error_naming_the_op_and_input_not_a_crash(route):
    out = fresh_stdout(run_fresh_python(_KEEP.format(handler=ROUTES[route], what="x", n=BIG,
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


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("route", ROUTES)
def test_a_kept_view_derived_from_an_input_is_an_error_too(route):
    out = fresh_stdout(run_fresh_python(_KEEP.format(handler=ROUTES[route], what="x[1:].T", n=BIG,
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


@pytest.mark.slow  # starts a process
def test_a_crafted_call_with_other_operands_is_refused_before_host_code_runs():
    out = fresh_stdout(run_fresh_python("""
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


def test_a_failure_walks_the_heap_only_when_a_view_is_kept(monkeypatch):
    """The buffer callback looks for views derived from XLA's buffers (a walk of Python's
    whole heap, seconds in a large process) only when, the failure's frames let go, a
    view is still held: not for every exception host code raises."""
    monkeypatch.setattr(_pyffi, "enabled", False)
    walks: list = []
    monkeypatch.setattr(_callback, "repoint_kept", walks.append)
    kept: list = []

    def fails(x):
        raise ValueError("plain failure")

    def keeps_then_fails(x):
        kept.append(x[1:])
        raise ValueError("failure that kept a view")
    for fn, walked in ((fails, 0), (keeps_then_fails, 1)):
        op = ab.bind(fn, shape=ab.like(0), name=fn.__name__)
        with pytest.raises(jax.errors.JaxRuntimeError, match=f"anybind op '{fn.__name__}'"):
            jax.block_until_ready(jax.jit(op)(np.ones(3)))
        assert len(walks) == walked, fn.__name__
    assert [len(k) for k in walks] == [1]  # the one input view the second function kept


def test_views_handed_to_jax_or_left_in_garbage_are_no_false_alarm(host_route):
    """A view that only jaxlib's garbage (a zero-copy transfer into JAX) or a reference
    cycle awaiting the collector still holds when host code returns is not kept."""
    cos = jax.jit(jnp.cos)

    def to_jax(x):
        return np.asarray(cos(x)) + np.asarray(jnp.sin(x))

    def in_a_cycle(x):
        cycle: list = [x[1:]]
        cycle.append(cycle)
        return x * 2

    x = randn(5, seed=1)
    for fn, want in ((to_jax, np.cos(x) + np.sin(x)), (in_a_cycle, 2 * x)):
        op = ab.bind(fn, shape=ab.like(0), name=fn.__name__)
        for f in (op, jax.jit(op)):
            for _ in range(3):
                np.testing.assert_allclose(f(x), want, rtol=1e-6)


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


# ----------------------------------------------------- the compiled route (issue 20)

def _kernels():
    import numba
    sig = ab.numba_signature()

    @numba.cfunc(sig)
    def half(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        n = 1
        for d in range(ranks[1]):
            n *= shapes[1][d]
        x = numba.carray(ins[0], n, np.float64)
        y = numba.carray(outs[0], n, np.float64)
        for i in range(n // 2):  # forgets the second half
            y[i] = x[i]
        return 0

    @numba.cfunc(sig)
    def bad_bytes(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
        err[0], err[1], err[2], err[3] = 0xFF, 0x62, 0xC3, 0  # "\xff" "b" and half a letter
        return 3

    return half, bad_bytes


def test_debug_mode_names_outputs_a_compiled_function_left_unwritten():
    half, _ = _kernels()
    op = ab.bind(half, shape=ab.like(0), name="c_half")
    x = np.arange(1.0, 5.0)
    np.asarray(op(x))  # outside debug mode nothing is checked
    pattern = (r"anybind op 'c_half': the compiled function left 2 of 4 elements of output 0 "
               r"unwritten: \[2\], \[3\]")
    with pytest.raises(ab.HostError, match=pattern), ab.debug():
        op(x)
    with pytest.raises(ab.HostError, match=pattern), ab.debug():  # (ab.debug re-raises it)
        jax.block_until_ready(jax.jit(op)(x))
    with pytest.raises(ab.HostError, match=r"left 6 of 12 elements of output 0 unwritten: "
                       r"\[0, 2\], \[0, 3\], \[1, 2\]"), ab.debug():
        jax.block_until_ready(jax.jit(jax.vmap(op))(np.ones((3, 4))))
    with ab.debug():  # a function that writes everything passes
        np.testing.assert_array_equal(jax.jit(co_mul())(x, x), x**3)


def co_mul():
    import compiled_ops
    return compiled_ops.mul("numba")


def test_a_compiled_message_that_is_not_utf8_still_names_the_op():
    _, bad_bytes = _kernels()
    op = ab.bind(bad_bytes, shape=ab.like(0), name="c_bad_bytes")
    for call in (op, jax.jit(op)):
        with pytest.raises(Exception, match=r"anybind op 'c_bad_bytes': the compiled function "
                           r"returned status 3: \\xffb\\xc3"):
            jax.block_until_ready(call(np.ones(3)))


def test_the_compiled_table_grows_past_8192_names():
    import compiled_ops
    from anybind.routes import _compiled

    class Stand:  # all that binding a compiled function reads of its op
        def __init__(self, name):
            self.name = name
    k = compiled_ops.clib("ctypes")
    stands = [Stand(f"table_{i}") for i in range(8300)]
    for s in stands:
        _compiled.adopt(s, "function", k["mul"], False)
    op = ab.bind(k["mul"], shape=ab.like(0), name="after_8300_names")
    np.testing.assert_array_equal(jax.jit(op)(np.ones(3), np.full(3, 2.0)), np.full(3, 4.0))


_EXPORT = """
    import numpy as np, jax, anybind as ab
    jax.config.update("jax_enable_x64", True)
    import compiled_ops
    k = compiled_ops.clib("ctypes")
    op = ab.bind(k["mul"], shape=ab.like(0), name="{name}")
    x = np.ones(4)
    open("program.bin", "wb").write(jax.export.export(jax.jit(op))(x, x).serialize())
"""


@pytest.mark.slow  # starts a process
def test_a_fresh_process_that_bound_no_compiled_op_names_the_missing_one(tmp_path):
    fresh_stdout(run_fresh_python(_EXPORT.format(name="bound_elsewhere"), cwd=tmp_path))
    out = fresh_stdout(run_fresh_python("""
        import numpy as np, jax, anybind as ab  # no compiled op bound here
        jax.config.update("jax_enable_x64", True)
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        try:
            exported.call(np.ones(4), np.ones(4))
        except Exception as e:
            print("ERROR", str(e).replace(chr(10), " "))
    """, cwd=tmp_path))
    assert ("ERROR" in out and "no compiled function is registered under the name "
            "'bound_elsewhere'" in out), out


@pytest.mark.slow  # starts a process
def test_a_program_links_by_its_ops_name_and_refuses_another_function_there(tmp_path):
    fresh_stdout(run_fresh_python(_EXPORT.format(name="linked_by_name"), cwd=tmp_path))
    out = fresh_stdout(run_fresh_python("""
        import numpy as np, jax, anybind as ab
        jax.config.update("jax_enable_x64", True)
        import compiled_ops
        k = compiled_ops.clib("ctypes")
        other = ab.bind(k["mul_jvp"], shape=lambda a, b, c, d: a, name="linked_by_name")
        exported = jax.export.deserialize(open("program.bin", "rb").read())
        try:
            exported.call(np.ones(4), np.ones(4))
        except Exception as e:
            print("ERROR", str(e).replace(chr(10), " "))
        try:
            ab.bind(k["mul"], shape=ab.like(0), name="linked_by_name")
        except ValueError as e:
            print("BIND", e)
    """, cwd=tmp_path))
    assert re.search(r"ERROR .*anybind op 'linked_by_name': the compiled function: a program "
                     r"exported with another function or export_version under the name "
                     r"'linked_by_name' runs here", out), out
    assert "BIND anybind op 'linked_by_name': its compiled function would link as" in out, out


@pytest.mark.slow  # starts a process
def test_a_crafted_call_of_a_compiled_function_is_checked_against_its_op():
    out = fresh_stdout(run_fresh_python("""
        import numpy as np, jax, anybind as ab
        from anybind.routes import _compiled
        jax.config.update("jax_enable_x64", True)
        import compiled_ops
        victim = compiled_ops.cumsum()  # writes as many elements as its input has
        name = victim.name
        tree = '[{"t":[0]},{"d":{}}]'  # one positional argument, no keywords
        # the fingerprint is no secret: a crafted call can carry the right one
        fp = np.uint64(_compiled.fingerprint(victim, "function", victim.fn)).view(np.int64)

        def crafted(ins, out_shape, key=_compiled.key_of(name), called=name):
            call = jax.ffi.ffi_call("anybind_compiled",
                                    jax.ShapeDtypeStruct(out_shape, np.float64))
            return call(*ins, anybind_key=np.int64(key), anybind_name=called,
                        anybind_rows=np.int64(0), anybind_tree=tree, anybind_fingerprint=fp)
        big = np.ones(1 << 21)  # 16 MB
        cases = {
            "16 MB in, 16 B out": ((big,), (2,)),
            "two inputs": ((big, big), (1 << 21,)),
            "float32": ((big.astype(np.float32),), (1 << 21,)),
            "by rows": ((big[None],), (1, 2), _compiled.key_of(name), name),
            "another name": ((big,), (2,), _compiled.key_of(name), "cmul_cffi_sequential"),
            "random key": ((big,), (2,), 12345, name),
        }
        for what, args in cases.items():
            extra = {"anybind_rows": np.int64(1)} if what == "by rows" else {}
            try:
                if extra:
                    call = jax.ffi.ffi_call("anybind_compiled",
                                            jax.ShapeDtypeStruct((1, 2), np.float64))
                    out = call(big[None], anybind_key=np.int64(_compiled.key_of(name)),
                               anybind_name=name, anybind_rows=np.int64(1), anybind_tree=tree,
                               anybind_fingerprint=fp)
                else:
                    out = crafted(*args)
                jax.block_until_ready(out)
                print(what, "| no error")
            except Exception as e:
                print(what, "| ERROR", str(e).replace(chr(10), " ")[:400])
        # the same call, made right, runs; and one the op's rule gives, not lowered here
        print("OK", crafted((np.arange(4.0),), (4,)).tolist(),
              crafted((np.ones((2, 3)),), (2, 3)).tolist())
    """))
    lines = dict(line.split(" | ", 1) for line in out.splitlines() if " | " in line)
    assert len(lines) == 6, out
    for what in ("16 MB in, 16 B out", "two inputs", "float32", "by rows"):
        assert lines[what].startswith("ERROR") and (
            "anybind op 'ccumsum_sequential': the compiled function was called with "
            "operands it does not take") in lines[what], lines[what]
    assert "for these inputs the op's shape rule gives float64[2097152] -> " \
           "float64[2097152]" in lines["16 MB in, 16 B out"]
    assert "a program called it as 'cmul_cffi_sequential', which is not its name" in \
        lines["another name"]
    assert "no compiled function is registered under the name" in lines["random key"]
    assert "OK [0.0, 1.0, 3.0, 6.0] [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]" in out


# -------------------------------------------------- the shim's cache (issue 20, item 13)

_PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  const char *p = getenv("ANYBIND_TEST_MARKER");
  FILE *f = p ? fopen(p, "w") : NULL;
  if (f) { fputs("the planted library ran", f); fclose(f); }
}
int anybind_shim_version(void) { return 2; }
"""

_PROBE = """
    import ctypes, numpy as np, jax, anybind as ab
    jax.config.update("jax_enable_x64", True)
    f = ctypes.CDLL({lib!r}).mul
    f.restype, f.argtypes = ab.ctypes_signature()
    op = ab.bind(f, shape=ab.like(0), name="cache_probe")
    print("RESULT", jax.jit(op)(np.ones(3), np.full(3, 2.0)).tolist())
    print("LOADED", sorted({{line.split()[-1] for line in open("/proc/self/maps")
                            if "shim-" in line}}))
"""


@pytest.fixture
def bare_package(tmp_path):
    """A copy of anybind without the shim built at install: it must come from the cache."""
    import shutil
    from pathlib import Path
    src = Path(ab.__file__).resolve().parent
    dst = tmp_path / "pkg" / "anybind"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("_shim.*.so", "__pycache__"))
    return tmp_path / "pkg"


def _probe(bare_package, cache, marker):
    import os
    import subprocess
    import sys
    import textwrap

    import compiled_ops
    env = dict(os.environ, PYTHONPATH=str(bare_package), XDG_CACHE_HOME=str(cache),
               ANYBIND_TEST_MARKER=str(marker))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(
        _PROBE.format(lib=str(compiled_ops.LIB_PATH)))], env=env, capture_output=True,
        text=True, timeout=600)
    out = fresh_stdout(res)
    assert "RESULT [4.0, 4.0, 4.0]" in out, out
    return out


def _digest_and_suffix(bare_package) -> tuple[str, str]:
    import importlib.machinery
    from pathlib import Path

    from anybind.routes import _shimlib
    _, include, cc = _shimlib._source()
    source = bare_package / "anybind" / "routes" / "_shim.c"
    digest = _shimlib._digest(source, Path(include) / "xla" / "ffi" / "api" / "c_api.h", cc)
    return digest, importlib.machinery.EXTENSION_SUFFIXES[0]


def _plant(path) -> str:
    import hashlib

    import compiled_ops
    built = compiled_ops.build_library(_PLANTED, "anybind-test-planted")
    path.write_bytes(built.read_bytes())
    return hashlib.sha256(path.read_bytes()).hexdigest()


PLANTS = ["at the name an unchecked cache loads", "recorded, but writable by the group",
          "recorded, but another user's", "recorded, but a symbolic link",
          "recorded, in a directory others may write"]


@pytest.mark.slow  # starts processes: builds shims with the C compiler
@pytest.mark.parametrize("how", PLANTS)
def test_a_planted_library_in_the_cache_is_never_loaded(bare_package, tmp_path, how):
    import json
    import os
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    folder = cache / "anybind"
    folder.mkdir(parents=True, mode=0o700)
    digest, suffix = _digest_and_suffix(bare_package)
    if how == PLANTS[0]:
        planted = folder / f"shim-{digest}{suffix}"
        _plant(planted)
    else:
        planted = folder / f"shim-{digest}-{'0' * 16}{suffix}"
        target = tmp_path / "elsewhere.so" if how == PLANTS[3] else planted
        sha = _plant(target)
        if how == PLANTS[1]:
            os.chmod(planted, 0o775)
        elif how == PLANTS[2]:
            if os.getuid() != 0:
                pytest.skip("making a file another user's needs root")
            os.chown(planted, 4242, 4242)
        elif how == PLANTS[3]:
            planted.symlink_to(target)
        elif how == PLANTS[4]:
            os.chmod(folder, 0o777)
        (folder / f"shim-{digest}.json").write_text(json.dumps(
            {"file": planted.name, "sha256": sha}))
    out = _probe(bare_package, cache, marker)
    assert not marker.exists(), "the planted library was loaded"
    assert str(planted) not in out and str(planted.resolve()) not in out


@pytest.mark.slow  # starts processes: builds shims with the C compiler
def test_the_cache_is_private_and_a_corrupt_build_is_rebuilt_under_a_new_name(
        bare_package, tmp_path):
    import json
    import os
    import stat
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    _probe(bare_package, cache, marker)
    folder = cache / "anybind"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    digest, _ = _digest_and_suffix(bare_package)
    record = folder / f"shim-{digest}.json"
    first = folder / json.loads(record.read_text())["file"]
    assert first.exists()
    first.write_bytes(first.read_bytes()[:1000])  # corrupt it
    out = _probe(bare_package, cache, marker)
    second = folder / json.loads(record.read_text())["file"]
    assert second != first and str(second) in out and str(first) not in out
    record.write_text("{not json")  # a corrupt record: rebuilt too
    _probe(bare_package, cache, marker)
