"""The compiled route: a role implemented by compiled code runs as an XLA FFI call.

A Numba ``@cfunc``, a ctypes function (with ``argtypes``) or a cffi function
pointer of anybind's C calling convention (``C_SIGNATURE``) runs inside the
compiled program with no Python, no GIL and no copies: every role lowers to a
custom call to one FFI handler, the shim (``_shim.c``), which looks the
function up by a stable name and calls it on XLA's own buffers.

==========================  ====================================================
piece                       what it does
==========================  ====================================================
``is_compiled``             whether a function or rule is compiled code
``adopt``                   at bind / ``def_*`` time: check the signature and
                            register the function under a stable name (the op's
                            name, ``name.jvp``, ...), so that a program exported
                            in another process finds it by that name
``lower``                   the lowering of one role: the operands of the
                            convention below, zeros for absent tangents, one
                            custom call, the outputs the primitive declares
``load_shim``               the shim: built at install, else at first use into
                            a cache directory, else a clear error
==========================  ====================================================

The operands of each role, as flat leaves (``x`` positional, ``k`` keyword
operands, ``r`` residuals; tangents and cotangents only for floating leaves,
zeros where JAX has a symbolic zero):

=========  ==========================  ==========================
role       ins                         outs
=========  ==========================  ==========================
function   x…, k…                      y…
fwd        x…, k…                      y…, r…
jvp        x…, k…, ẋ…                  ẏ…             ∂f(x)·ẋ
vjp        x…, k…, ȳ…                  x̄…             ∂f(x)ᵀ·ȳ
bwd        k…, r…, ȳ…                  x̄…             ∂f(x)ᵀ·ȳ from r
transpose  k…, ȳ…                      x̄…             Aᵀ·ȳ
vmap       as the function, batched    y…, batched
=========  ==========================  ==========================

Under ``vmap`` every operand has a leading batch axis (of length 1 when it
is not batched) and every output one of the batch's length. ``"sequential"``
ops are called once per row by the shim, inside one FFI call;
``"vectorized"`` ops and vmap rules are called once with the batched shapes.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax.ffi
import numpy as np

from ..core import _jax
from ..core._batching import host_mode
from ..core._code import cffi_ctype, cffi_ffi, compiled_kind, is_compiled
from ..core._jax import ShapedArray
from ..core._lowering import Site
from ._host import cpu_only

TARGET = "anybind_compiled"
SHIM_VERSION = 1  # must equal anybind_shim_version() in _shim.c

C_SIGNATURE = (
    "int32_t (*)(void *const *ins, void *const *outs, const int64_t *const *shapes, "
    "const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, "
    "char *err, int64_t err_size)")
"""anybind's C calling convention, as a C function-pointer type.

A compiled function (or rule) gets its n_in input and n_out output buffers,
their shapes, ranks and dtype codes (``ab.dtype_code``), and room for an error
message; it returns 0 on success.
"""

# pointer (p) or 64-bit integer (q) parameters, in order; the result is a 32-bit integer
_PARAMS = "ppppp" "qq" "pq"

_DTYPE_CODES = {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6,
                "uint16": 7, "uint32": 8, "uint64": 9, "float16": 10, "float32": 11,
                "float64": 12, "complex64": 15, "bfloat16": 16, "complex128": 18}


def dtype_code(dtype) -> int:
    """The code of ``dtype`` in the ``dtypes`` array a compiled function receives.

    These are XLA's own (``XLA_FFI_DataType`` in ``xla/ffi/api/c_api.h``).

    >>> import anybind as ab, numpy as np
    >>> ab.dtype_code(np.float64), ab.dtype_code("float32"), ab.dtype_code(bool)
    (12, 11, 1)
    """
    name = np.dtype(dtype).name
    if name not in _DTYPE_CODES:
        raise TypeError(f"anybind: no compiled-call dtype code for {name}; supported: "
                        f"{', '.join(_DTYPE_CODES)}")
    return _DTYPE_CODES[name]


def numba_signature():
    """The Numba signature of anybind's C calling convention, for ``numba.cfunc``.

    >>> import anybind as ab, numba, numpy as np
    >>> @numba.cfunc(ab.numba_signature())
    ... def double(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    ...     if dtypes[0] != 11:  # float32 only (ab.dtype_code(np.float32))
    ...         return 1
    ...     n = 1
    ...     for d in range(ranks[0]):
    ...         n *= shapes[0][d]
    ...     x = numba.carray(ins[0], n, np.float32)
    ...     y = numba.carray(outs[0], n, np.float32)
    ...     y[:] = 2 * x
    ...     return 0
    >>> op = ab.bind(double, shape=ab.like(0))
    >>> op(np.arange(3, dtype=np.float32)).tolist()
    [0.0, 2.0, 4.0]
    """
    from numba import types
    p, i64 = types.CPointer, types.int64
    return types.int32(p(types.voidptr), p(types.voidptr), p(p(i64)), p(i64), p(types.int32),
                       i64, i64, p(types.uint8), i64)


def ctypes_signature() -> tuple:
    """``(restype, argtypes)`` of anybind's C calling convention, for a ctypes function.

    >>> import anybind as ab, ctypes
    >>> restype, argtypes = ab.ctypes_signature()
    >>> restype is ctypes.c_int32, len(argtypes)
    (True, 9)

    Set them on a function of a shared library before binding it:
    ``lib.f.restype, lib.f.argtypes = ab.ctypes_signature()``.
    """
    c = ctypes
    p64 = c.POINTER(c.c_int64)
    return c.c_int32, [c.POINTER(c.c_void_p), c.POINTER(c.c_void_p), c.POINTER(p64), p64,
                       c.POINTER(c.c_int32), c.c_int64, c.c_int64, c.c_char_p, c.c_int64]


# ------------------------------------------------------------------ recognising


def _param_classes(fn, kind: str) -> tuple[str, str] | str:
    """The signature as ``(params, result)`` in ``_PARAMS`` letters, or an error text."""
    if kind == "numba":
        from numba import types
        sig = fn._sig

        def letter(t):
            if isinstance(t, (types.CPointer, types.RawPointer)):
                return "p"
            if isinstance(t, types.Integer):
                return {64: "q", 32: "i"}.get(t.bitwidth, "?")
            return "?"
        return "".join(letter(t) for t in sig.args), letter(sig.return_type)
    if kind == "ctypes":
        if fn.argtypes is None:
            return ("its argtypes are not set; set them with "
                    "`f.restype, f.argtypes = ab.ctypes_signature()`")

        def letter(t):
            if t is None:
                return "?"
            if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer):
                return "p"
            if issubclass(t, ctypes._SimpleCData) and t._type_ in "bBhHiIlLqQ":
                return {8: "q", 4: "i"}.get(ctypes.sizeof(t), "?")
            return "?"
        return "".join(letter(t) for t in fn.argtypes), letter(fn.restype)
    ffi, ctype = cffi_ffi(), cffi_ctype(fn)

    def letter(t):
        if t.kind == "pointer":
            return "p"
        if t.kind == "primitive" and ("int" in t.cname or "long" in t.cname):
            return {8: "q", 4: "i"}.get(ffi.sizeof(t), "?")
        return "?"
    if ctype.ellipsis:
        return "it takes variable arguments"
    return "".join(letter(t) for t in ctype.args), letter(ctype.result)


def _address(fn, kind: str) -> int:
    if kind == "numba":
        return int(fn.address)
    if kind == "ctypes":
        return int(ctypes.cast(fn, ctypes.c_void_p).value)
    return int(cffi_ffi().cast("uintptr_t", fn))


# ----------------------------------------------------------------- registration

_lock = threading.Lock()
_by_name: dict[str, int] = {}  # stable name -> address
_names: dict[tuple[str, int], str] = {}  # (base name, address) -> stable name
_keep: list = []  # every registered function stays alive: executables hold its address

_RULE_NAMES = {"function": "function", "jvp": "jvp rule", "vjp": "vjp rule",
               "transpose": "transpose rule", "fwd": "fwd rule", "bwd": "bwd rule",
               "vmap": "vmap rule"}
_RULE_NAMES.update({f"{k}.vmap": f"batched {v}" for k, v in list(_RULE_NAMES.items())
                    if k not in ("function", "vmap")})


def _base(op_name: str, kind: str) -> str:
    return op_name if kind == "function" else f"{op_name}.{kind}"


def key_of(name: str) -> int:
    """The shim's 63-bit key for a stable name (FNV-1a would do; blake2b is at hand)."""
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (h & 0x7FFF_FFFF_FFFF_FFFF) or 1


def adopt(op, kind: str, fn, traced: bool) -> None:
    """Register ``fn`` if it is compiled code: called when an op is bound or a rule set.

    The stable name is the op's name for its function and ``name.<rule>`` for
    a rule, so that a program exported in one process calls the same
    functions in another that binds the same ops. A second, different
    function under a taken name (a module run twice in one process) gets
    ``name#2``, ``name#3``, ... in binding order.
    """
    what = compiled_kind(fn)
    if what is None:
        return
    role = _RULE_NAMES[kind]
    if traced:
        raise TypeError(f"anybind op '{op.name}': the {role} is compiled code ({what}), which "
                        f"cannot be traced; leave traced=False")
    classes = _param_classes(fn, what)
    if isinstance(classes, str) or classes != (_PARAMS, "i"):
        got = classes if isinstance(classes, str) else _describe(classes)
        raise TypeError(
            f"anybind op '{op.name}': the {role} is a {what} function, but not of anybind's "
            f"C calling convention {C_SIGNATURE}: {got}. See ab.numba_signature(), "
            f"ab.ctypes_signature() and ab.C_SIGNATURE")
    lib = load_shim()
    register_target()  # now, so that a deserialised program finds it without lowering
    address = _address(fn, what)
    base = _base(op.name, kind)
    with _lock:
        name = _names.get((base, address))
        if name is None:
            name, i = base, 1
            while name in _by_name:
                i += 1
                name = f"{base}#{i}"
            text = f"anybind op '{op.name}': the compiled {role}".encode()
            status = lib.anybind_register(key_of(name), address, text)
            if status != 0:
                raise RuntimeError(f"anybind op '{op.name}': cannot register its compiled "
                                   f"{role} under '{name}' (status {status}: "
                                   f"{'key taken' if status == 1 else 'table full'})")
            _by_name[name], _names[(base, address)] = address, name
            _keep.append(fn)


def _describe(classes) -> str:
    params, result = classes
    word = {"p": "pointer", "q": "int64", "i": "int32", "?": "other"}
    return (f"got {len(params)} parameters ({', '.join(word[c] for c in params)}) returning "
            f"{word[result]}; expected 9 parameters "
            f"({', '.join(word[c] for c in _PARAMS)}) returning int32")


def stable_name(op, kind: str, fn) -> str:
    return _names[(_base(op.name, kind), _address(fn, compiled_kind(fn)))]


# ------------------------------------------------------------------------ lowering

def lower(ctx, *args, role: str, kind: str, call, rule, batch, lin, need, mode: str,
          has_side_effect: bool):
    """One role as one custom call to the shim; see the table above."""
    op = call.op
    cpu_only(ctx, call, "compiled code")
    if role == "transpose" and getattr(op, "multilinear", False):
        raise TypeError(f"anybind op '{op.name}' is multilinear: its transposes take "
                        f"operands of their own, which compiled code does not get yet; give "
                        f"host or traced transposes (def_transpose(rule, argnum=i))")
    if batch is not None and kind != "vmap" and role != "primal":
        # a rule batches by its own vmap= if given: a mode, or a batched variant
        batched, mode = host_mode(role, rule, op)
        if batched is not rule:
            if not is_compiled(batched.fn):
                raise TypeError(f"anybind op '{op.name}': the compiled {_RULE_NAMES[kind]} "
                                f"has a batched variant (vmap=) that is not compiled code")
            rule, kind, mode = batched, f"{kind}.vmap", "vectorized"
    if call.static:
        raise TypeError(
            f"anybind op '{op.name}': a compiled {_RULE_NAMES[kind]} takes arrays only, but "
            f"the call has static keyword(s) {', '.join(k for k, _ in call.static)}; pass "
            f"them as array keyword operands")
    register_target()
    if batch is not None and batch.size == 0:  # an empty batch: nothing to call
        return [_jax.full_like_aval(ctx, 0, a) for a in ctx.avals_out]
    n, m, r = call.n_in, len(call.kw_avals), len(call.res_avals)
    zero_lead = () if batch is None else (1,)
    out_lead = () if batch is None else (batch.size,)
    ins = list(zip(args, ctx.avals_in))

    def filled(present, operands, avals, floats):
        """Operands for every floating leaf: the present ones, zeros for the rest."""
        it, res = iter(operands), []
        for p, a, f in zip(present, avals, floats):
            if p:
                res.append(next(it))
            elif f:
                z = ShapedArray(zero_lead + a.shape, a.dtype)
                res.append((_jax.full_like_aval(ctx, 0, z), z))
        return res

    select = None
    if role in ("primal", "fwd"):
        outs = list(ctx.avals_out)
    elif role == "jvp":
        ins = ins[:n + m] + filled(lin, ins[n + m + r:], call.in_avals, call.float_in)
        outs = list(ctx.avals_out)
    else:
        lin_at = n + m + r if role == "vjp" else m
        cts = filled(lin, ins[lin_at:], call.out_avals, call.float_out)
        if role == "transpose":
            ins = ins[:m] + cts
        elif kind == "bwd":
            ins = ins[n:n + m + r] + cts
        else:
            ins = ins[:n + m] + cts
        floats = [i for i, f in enumerate(call.float_in) if f]
        outs = [ShapedArray(out_lead + call.in_avals[i].shape, call.in_avals[i].dtype)
                for i in floats]
        select = [floats.index(i) for i, k in enumerate(need) if k]
    rows = batch.size if batch is not None and mode == "sequential" else 0
    name = stable_name(op, kind, rule.fn)
    sub = ctx.replace(avals_in=[a for _, a in ins], avals_out=outs)
    results = jax.ffi.ffi_lowering(TARGET, has_side_effect=has_side_effect)(
        sub, *[v for v, _ in ins], anybind_key=np.int64(key_of(name)), anybind_name=name,
        anybind_rows=np.int64(rows))
    results = list(results)
    return results if select is None else [results[j] for j in select]


def kind_of_role(role: str, call, by_vmap_rule: bool) -> str:
    """Which registered function implements a role: function, jvp, vjp, bwd, ..."""
    if by_vmap_rule:
        return "vmap"
    if role == "primal":
        return "function"
    if role == "vjp" and call.res_tree is not None:
        return "bwd"
    return role


class Route:
    name = "compiled"

    def claims(self, site: Site) -> bool:
        return is_compiled(site.rule.fn)

    def lower(self, site: Site, *args):
        call = site.call
        return lower(site.ctx, *args, role=site.role,
                     kind=kind_of_role(site.role, call, site.by_vmap_rule), call=call,
                     rule=site.rule, batch=site.batch, lin=site.lin, need=site.need,
                     mode="vectorized" if site.by_vmap_rule else call.op.vmap,
                     has_side_effect=site.effect)


# ----------------------------------------------------------------------- the shim

_target_lock = threading.Lock()
_target_registered = False


def register_target() -> None:
    """Register the shim's handler with XLA, once; its target is safe to export."""
    global _target_registered
    if _target_registered:
        return
    with _target_lock:
        if _target_registered:
            return
        lib = load_shim()
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.anybind_handler),
                                    platform="cpu")
        # The target's meaning is fixed by its name and anybind's calling convention,
        # and every process that binds the ops registers it: jax.export may keep it.
        _jax.stable_custom_call_targets().add(TARGET)
        _target_registered = True


def _candidates():
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        yield here / f"_shim{suffix}"


@functools.cache
def load_shim() -> ctypes.CDLL:
    """The shim library: the one built at install, or one built now into a cache dir.

    Raises ``RuntimeError`` naming what is missing (a C compiler, jax's FFI
    headers) when neither works; the Python route does not need the shim.
    """
    for path in _candidates():
        if path.exists():
            lib = _open(path)
            if lib is not None:
                return lib
    return _open(_build_at_first_use(), strict=True)


def _open(path: Path, strict: bool = False) -> ctypes.CDLL | None:
    lib = ctypes.CDLL(str(path))
    if lib.anybind_shim_version() != SHIM_VERSION:
        if strict:
            raise RuntimeError(f"anybind: the FFI shim at {path} is version "
                               f"{lib.anybind_shim_version()}, expected {SHIM_VERSION}")
        return None  # a stale build: build a fresh one
    lib.anybind_register.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p]
    lib.anybind_register.restype = ctypes.c_int32
    return lib


def _build_at_first_use() -> Path:
    source = Path(__file__).resolve().parent / "_shim.c"
    include = Path(jax.ffi.include_dir())
    header = include / "xla" / "ffi" / "api" / "c_api.h"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    if cc is None:
        raise RuntimeError(
            "anybind: binding a compiled function needs anybind's FFI shim, which was not "
            "built when anybind was installed, and no C compiler was found to build it now "
            "(tried $CC, cc, gcc, clang). Install a C compiler and reinstall anybind (or just "
            "retry: it builds at first use). Python host functions work without it.")
    if not header.exists():
        raise RuntimeError(f"anybind: the FFI shim needs XLA's C API header, which jaxlib "
                           f"should ship at {header}; it is missing")
    digest = hashlib.sha256(source.read_bytes() + header.read_bytes()
                            + cc.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anybind"
    target = cache / f"shim-{digest}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        out = Path(tmp) / target.name
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"anybind: building the FFI shim failed ({' '.join(cmd)}):\n"
                               f"{res.stderr.strip()}")
        os.replace(out, target)  # atomic: concurrent first uses race harmlessly
    return target
