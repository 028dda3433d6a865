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
                            bind the function to a stable name (the op's name,
                            ``name.jvp``, ...), so that a program exported in
                            another process finds it by that name; a name means
                            one function while an op bound there lives
``link``                    the name and key a program calls a function by: a
                            key of this process, or the stable name's (export)
``lower``                   the lowering of one role: the operands of the
                            convention below, zeros for absent tangents, one
                            custom call, the outputs the primitive declares; the
                            shim is told the call, and runs no other
``_validate``               the shim asks about a call by stable name that this
                            process never lowered (a deserialised program): is it
                            one the op's shape rule gives (``_signatures``)?
==========================  ====================================================

The shim itself (built at install, else at first use into a verified cache,
and registered with XLA at import where it is at hand) is ``_shimlib``.

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
``"expand_dims"`` ops and vmap rules are called once with the batched shapes
(``"broadcast_all"`` is for Python host code, which gets broadcast views; a
compiled function sees each operand's dims and indexes an unbatched one's single
row itself, so it is bound ``"expand_dims"``).
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import threading
import weakref
from typing import Any

import jax.ffi
import jax.numpy as jnp
import numpy as np

from ..core import _jax
from ..core._batching import host_mode
from ..core._code import cffi_ctype, cffi_ffi, compiled_kind, is_compiled
from ..core._jax import ShapedArray
from ..core._lowering import Site
from ..core.roles import Layout
from . import _dtypes, _layout, _shimlib, _signatures, _state
from ._host import cpu_only

TARGET = _shimlib.TARGET

C_SIGNATURE = (
    "int32_t (*)(void *const *ins, void *const *outs, const int64_t *const *shapes, "
    "const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out, "
    "char *err, int64_t err_size)")
"""anybind's C calling convention, as a C function-pointer type.

A compiled function (or rule) gets its n_in input and n_out output buffers,
their shapes, ranks and dtype codes (``ab.dtype_code``), and room for an error
message; it returns 0 on success.
"""

GPU_SIGNATURE = (
    "int32_t (*)(void *stream, void *const *ins, void *const *outs, "
    "const int64_t *const *shapes, const int64_t *ranks, const int32_t *dtypes, "
    "int64_t n_in, int64_t n_out, char *err, int64_t err_size)")
"""anybind's C calling convention for device code (``ab.bind(launch, device=True)``).

The same as ``C_SIGNATURE`` after XLA's CUDA stream (a ``cudaStream_t``): a
launcher, compiled ahead of time, that queues its kernels on that stream on
XLA's device buffers (``ins``, ``outs``) and returns 0 without synchronising.
Shapes, ranks and dtypes are host memory.
"""

# pointer (p) or 64-bit integer (q) parameters, in order; the result is a 32-bit integer
_PARAMS = "ppppp" "qq" "pq"
_GPU_PARAMS = "p" + _PARAMS  # device code: XLA's stream first
_PARAMS_STATE = _PARAMS + "p"  # an op with ab.State: void *state last

_DTYPE_CODES = _dtypes.COMPILED


def dtype_code(dtype: Any) -> int:
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


def numba_signature(device: bool = False, state: bool = False) -> Any:
    """The Numba signature of anybind's C calling convention, for ``numba.cfunc``; with
    ``device=True``, of device code's (``GPU_SIGNATURE``: the stream first).

    ``state=True``: with a tenth parameter, ``void *state``, for an op bound with
    ``state=ab.State(...)``.

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
    stream = [types.voidptr] if device else []
    params = [p(types.voidptr), p(types.voidptr), p(p(i64)), p(i64), p(types.int32), i64, i64,
              p(types.uint8), i64]
    return types.int32(*stream, *params, *([types.voidptr] if state else []))


def ctypes_signature(device: bool = False, state: bool = False) -> tuple:
    """``(restype, argtypes)`` of anybind's C calling convention, for a ctypes function;
    with ``device=True``, of device code's (``GPU_SIGNATURE``: the stream first).

    ``state=True``: with a tenth parameter, ``void *state``, for an op bound with
    ``state=ab.State(...)``.

    >>> import anybind as ab, ctypes
    >>> restype, argtypes = ab.ctypes_signature()
    >>> restype is ctypes.c_int32, len(argtypes)
    (True, 9)

    Set them on a function of a shared library before binding it:
    ``lib.f.restype, lib.f.argtypes = ab.ctypes_signature()``.
    """
    c = ctypes
    p64 = c.POINTER(c.c_int64)
    stream = [c.c_void_p] if device else []
    return c.c_int32, [*stream, c.POINTER(c.c_void_p), c.POINTER(c.c_void_p), c.POINTER(p64),
                       p64, c.POINTER(c.c_int32), c.c_int64, c.c_int64, c.c_char_p, c.c_int64,
                       *([c.c_void_p] if state else [])]


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
#
# A stable name ("f", "f.jvp", ...) is bound to one function at a time: binding
# another under it while an op bound there lives is an error, since programs for
# jax.export link to functions by name alone. Programs of this process link by a
# key per (name, function) instead ("f#0" for the first function bound as "f",
# "f#1" for another once the first's ops are gone, ...), so a name freed by its
# ops and bound again never changes what a compiled program of this process
# calls, and the same program lowered in another process is the same (JAX's
# persistent compilation cache finds it). Such a key takes only the calls
# lowered in this process. The shim's table grows as it fills; its bindings, and
# the functions they call, live as long as the process (a program may run any).

_lock = threading.Lock()


@dataclasses.dataclass(eq=False)
class _Name:
    """What a stable name is bound to."""
    name: str
    address: int
    kind: str
    ops: weakref.WeakSet  # the live ops bound under it, all with this function
    locals: dict  # address -> the key of (name, that function): key_of("name#i")
    fingerprint: int = 0  # what a program exported with it carries (``fingerprint``)
    gpu: bool = False  # device code: a launcher the shim's CUDA handler gives the stream


_names: dict[str, _Name] = {}
_by_key: dict[int, _Name] = {}  # key_of(name) -> what the name is bound to
_keep: dict[int, object] = {}  # address -> a function there: alive while the shim holds it

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


def fingerprint(op, kind: str, fn) -> int:
    """What a program exported with ``fn`` as ``op``'s ``kind`` carries, and the shim checks.

    A hash of the stable name (the op's name and the role), the function's own
    name (a ctypes symbol's, a Numba cfunc's Python function's; cffi pointers
    have none) and ``ab.bind(export_version=)``. It tells a different function
    or version under one name apart; it cannot see code that changed under the
    same function name and version.
    """
    own = getattr(fn, "__name__", None) or getattr(getattr(fn, "_pyfunc", None),
                                                     "__name__", "")
    return key_of(repr((_base(op.name, kind), own, getattr(op, "export_version", None))))


def adopt(op, kind: str, fn, traced: bool, device: bool = False) -> None:
    """Register ``fn`` if it is compiled code: called when an op is bound or a rule set.

    With ``device`` it is device code: a launcher of ``GPU_SIGNATURE``, which
    the shim's CUDA handler calls with XLA's stream.

    The stable name is the op's name for its function and ``name.<rule>`` for
    a rule, so that a program exported in one process calls the same
    functions in another that binds the same ops. Binding a different
    function under a name that a live op holds is an error; the same function
    again (a module imported twice) is not.
    """
    what = compiled_kind(fn)
    if what is None:
        return
    role = _RULE_NAMES[kind]
    if traced:
        raise TypeError(f"anybind op '{op.name}': the {role} is compiled code ({what}), which "
                        f"cannot be traced; leave traced=False")
    classes = _param_classes(fn, what)
    stateful = getattr(op, "compiled_state", None) is not None
    if device and stateful:
        raise TypeError(f"anybind op '{op.name}': state=ab.State(...) is for compiled CPU "
                        f"code; its {role} is device code (device=True)")
    want = _GPU_PARAMS if device else _PARAMS_STATE if stateful else _PARAMS
    if isinstance(classes, str) or classes != (want, "i"):
        got = classes if isinstance(classes, str) else _describe(classes, want)
        if device:
            raise TypeError(
                f"anybind op '{op.name}': the {role} is device code (device=True) and a "
                f"{what} function, but not of anybind's calling convention for device code "
                f"{GPU_SIGNATURE}: {got}. See ab.ctypes_signature(device=True) and "
                f"ab.GPU_SIGNATURE")
        if classes == (_PARAMS_STATE, "i"):
            got += ": a function with a state needs an op bound with state=ab.State(...)"
        elif classes == (_PARAMS, "i"):
            got += (": the op has a state (ab.State), so every compiled function of it takes "
                    "void *state after err_size; see ab.ctypes_signature(state=True)")
        raise TypeError(
            f"anybind op '{op.name}': the {role} is a {what} function, but not of anybind's "
            f"C calling convention {C_SIGNATURE}{' with void *state last' if stateful else ''}"
            f": {got}. See ab.numba_signature(), ab.ctypes_signature() and ab.C_SIGNATURE")
    # now, so that a deserialised program finds it
    lib = _shimlib.register_gpu() if device else _shimlib.register_target()
    _validating(lib)
    address = _address(fn, what)
    name = _base(op.name, kind)
    text = f"anybind op '{op.name}': the compiled {role}"
    fp = fingerprint(op, kind, fn) ^ (1 if stateful else 0)  # a name means one convention
    with _lock:
        entry = _names.get(name)
        if entry is not None and (entry.address != address or entry.fingerprint != fp
                                  or entry.gpu != device):
            holders = [o for o in entry.ops if o is not op]
            if holders:
                raise ValueError(
                    f"anybind op '{op.name}': its compiled {role} would link as '{name}', "
                    f"which another live op ({holders[0]!r}) binds to a different function. "
                    f"A program for jax.export calls its functions by name, so a name means "
                    f"one function: give this op another name= (or drop the other op first)")
        if (entry is None or entry.address != address or entry.fingerprint != fp
                or entry.gpu != device):
            _bind(lib, key_of(name), address, name, text, validate=True, fp=fp, gpu=device,
                  stateful=stateful)
            locals_ = {} if entry is None else entry.locals
            entry = _names[name] = _Name(name, address, kind, weakref.WeakSet(), locals_, fp,
                                         device)
            _by_key[key_of(name)] = entry
        if address not in entry.locals:  # "#" is in no name: no stable key is one of these
            entry.locals[address] = local = key_of(f"{name}#{len(entry.locals)}")
            _bind(lib, local, address, name, text, validate=False, gpu=device,
                  stateful=stateful)
        entry.ops.add(op)
        _keep.setdefault(address, fn)


def _bind(lib, key: int, address: int, name: str, text: str, validate: bool,
          fp: int = 0, gpu: bool = False, stateful: bool = False) -> None:
    status = lib.anybind_bind(key, address, name.encode(), text.encode(), int(validate), fp,
                              int(gpu), int(stateful))
    if status != 0:
        raise MemoryError(f"{text}: the FFI shim could not bind it (status {status})")


def _allow(key: int, rows: int, ins, outs) -> None:
    """Let the binding of ``key`` take this call (as it is lowered, or once checked)."""
    w = _signatures.words(rows, ins, outs, _DTYPE_CODES)
    if w is None:  # symbolic dims (an export): checked when the program runs
        return
    arr = (ctypes.c_int64 * max(len(w), 1))(*w)
    status = _shimlib.load().anybind_allow(key, rows, len(ins), len(outs), arr, len(w))
    if status != 0:
        raise RuntimeError(f"anybind: the FFI shim could not record a call (status {status})")


def _describe(classes, want: str = _PARAMS) -> str:
    params, result = classes
    word = {"p": "pointer", "q": "int64", "i": "int32", "?": "other"}
    return (f"got {len(params)} parameters ({', '.join(word[c] for c in params)}) returning "
            f"{word[result]}; expected {len(want)} parameters "
            f"({', '.join(word[c] for c in want)}) returning int32")


def link(op, kind: str, fn, for_export: bool) -> tuple[str, int]:
    """``(stable name, key)`` that a program calls ``fn`` by, as ``op``'s ``kind``."""
    name, address = _base(op.name, kind), _address(fn, compiled_kind(fn))
    entry = _names.get(name)
    if entry is None or address not in entry.locals:
        raise RuntimeError(f"anybind op '{op.name}': its compiled {_RULE_NAMES[kind]} is not "
                           f"bound under '{name}'")
    if not for_export:
        return name, entry.locals[address]
    if entry.address != address:
        raise ValueError(f"anybind op '{op.name}': '{name}' is now bound to another "
                         f"function, so a program for jax.export cannot link this op's by it")
    return name, key_of(name)


# ---------------------------------------------------------------- the validator

_VALIDATOR = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
    ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int32),
    ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
    ctypes.c_void_p, ctypes.c_int64)
_validator: list = []  # the ctypes callback, kept alive for the shim
_CODE_DTYPES = {code: np.dtype(jnp.bfloat16 if name == "bfloat16" else name)
                for name, code in _DTYPE_CODES.items()}


def _validating(lib) -> None:
    if not _validator:
        with _lock:
            if not _validator:
                _validator.append(_VALIDATOR(_validate))
                lib.anybind_set_validator(ctypes.cast(_validator[0], ctypes.c_void_p))


def _validate(key, tree, tree_len, rows, n_in, n_out, dtypes, ranks, shapes, err, err_size):
    """The shim asks: is this call, never seen, one the op bound by stable name makes?"""
    try:
        why = _check(key, ctypes.string_at(tree, tree_len).decode("utf-8", "replace")
                     if tree_len > 0 else "", rows, n_in, n_out, dtypes, ranks, shapes)
    except BaseException as e:  # noqa: BLE001  (an error here must refuse the call)
        why = f"checking it failed ({type(e).__name__})"
    if why is None:
        return 0
    text = why.encode("utf-8", "backslashreplace")[:max(err_size - 1, 0)]
    ctypes.memmove(err, text + b"\0", len(text) + 1)
    return 1


def _check(key, tree, rows, n_in, n_out, dtypes, ranks, shapes) -> str | None:
    entry = _by_key.get(key)
    if entry is None:
        return "no op is bound under its name"
    avals = []
    for i in range(n_in + n_out):
        dtype = _CODE_DTYPES.get(dtypes[i])
        if dtype is None:
            return f"operand {i} has a dtype compiled code does not take"
        avals.append(ShapedArray(tuple(shapes[i][d] for d in range(ranks[i])), dtype))
    ins, outs = avals[:n_in], avals[n_in:]
    why = "its op is gone"
    for op in list(entry.ops):
        why = _signatures.check(op, entry.kind, tree, rows, ins, outs)
        if why is None:
            with _lock:
                _allow(key, rows, ins, outs)
            return None
    return why


# ------------------------------------------------------------------------ lowering

def lower(ctx, *args, role: str, kind: str, call, rule, batch, lin, need, mode: str,
          has_side_effect: bool, gpu: bool = False):
    """One role as one custom call to the shim; see the table above. ``gpu``: device
    code in a program for a GPU (the caller checked the platform), run by the shim's
    CUDA handler."""
    op = call.op
    if not gpu:
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
            rule, kind, mode = batched, f"{kind}.vmap", "expand_dims"
    if call.static:
        raise TypeError(
            f"anybind op '{op.name}': a compiled {_RULE_NAMES[kind]} takes arrays only, but "
            f"the call has static keyword(s) {', '.join(k for k, _ in call.static)}; pass "
            f"them as array keyword operands")
    _shimlib.register_gpu() if gpu else _shimlib.register_target()
    if batch is not None and batch.size == 0:  # an empty batch: nothing to call
        return [_jax.full_like_aval(ctx, 0, a) for a in ctx.avals_out]
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
    xs, ks, rs, rest = Layout(role, call).split(ins)
    if role in ("primal", "fwd"):
        outs = list(ctx.avals_out)
    elif role == "jvp":
        ins = xs + ks + filled(lin, rest, call.in_avals, call.float_in)
        outs = list(ctx.avals_out)
    else:
        cts = filled(lin, rest, call.out_avals, call.float_out)
        ins = (ks + rs if kind == "bwd" else xs + ks) + cts  # a transpose has no xs
        floats = [i for i, f in enumerate(call.float_in) if f]
        outs = [ShapedArray(out_lead + call.in_avals[i].shape, call.in_avals[i].dtype)
                for i in floats]
        select = [floats.index(i) for i, k in enumerate(need) if k]
    if batch is not None and mode == "broadcast_all":
        raise TypeError(f"anybind op '{op.name}': its compiled {_RULE_NAMES[kind]} batches "
                        f"'sequential' or 'expand_dims' (it gets every operand's dims, an "
                        f"unbatched one with a leading axis of 1); 'broadcast_all' is for "
                        f"Python host code")
    rows = batch.size if batch is not None and mode == "sequential" else 0
    for_export = ctx.module_context.lowering_parameters.for_export
    name, key = link(op, kind, rule.fn, for_export)
    what = str(compiled_kind(rule.fn))  # the route claims compiled code only
    seen = [tuple(a.shape[1 if rows else 0:]) for a in [a for _, a in ins] + outs]
    order = _layout.order_of(op, _RULE_NAMES[kind], what, _address(rule.fn, what), seen)
    whole = order == "F" and batch is not None and not rows  # the batch axis goes last
    if whole:
        ins = [(_jax.transpose_value(v, _last(len(a.shape))), _moved(a)) for v, a in ins]
        outs = [_moved(a) for a in outs]
    in_avals = [a for _, a in ins]
    with _lock:  # the shim runs the function only on calls its binding was given
        _allow(key, rows, in_avals, outs)
    # a batch of symbolic size (jax.export): -1, the shim reads it off the outputs
    attrs = dict(anybind_key=np.int64(key), anybind_name=name,
                 anybind_rows=np.int64(-1 if _jax.is_symbolic_dim(rows) else rows))
    if call.debug and not gpu:  # outputs filled with a sentinel first, and checked after
        attrs["anybind_debug"] = np.int64(1)
    state = getattr(op, "compiled_state", None)
    if state is not None:  # the program holds it; the call names it
        attrs["anybind_state"] = np.uint64(_state.hold(ctx, op, state)).view(np.int64)
    if for_export:  # how operands group into arguments: a process that never lowered
        tree = _signatures.tree_text(call.args_tree, call.kw_tree)  # this call checks it
        if tree is not None:
            attrs["anybind_tree"] = tree
        # what it is exported with: it runs only where the name's binding is the same
        attrs["anybind_fingerprint"] = np.uint64(_names[name].fingerprint).view(np.int64)
    sub = ctx.replace(avals_in=in_avals, avals_out=outs)
    layouts: dict[str, Any] = {}
    if order == "F":
        layouts = dict(
            operand_layouts=[_layout.minor_to_major(len(a.shape), "F", bool(rows))
                             for a in in_avals],
            result_layouts=[_layout.minor_to_major(len(a.shape), "F", bool(rows))
                            for a in outs])
    results = jax.ffi.ffi_lowering(TARGET, has_side_effect=has_side_effect, **layouts)(
        sub, *[v for v, _ in ins], **attrs)
    results = list(results)
    if whole:  # the batch axis back in front
        results = [_jax.transpose_value(v, _first(len(a.shape))) for v, a in zip(results, outs)]
    return results if select is None else [results[j] for j in select]


def _last(rank: int) -> tuple[int, ...]:
    """The permutation that moves axis 0 last."""
    return (*range(1, rank), 0)


def _first(rank: int) -> tuple[int, ...]:
    """The permutation that moves the last axis first."""
    return (rank - 1, *range(rank - 1))


def _moved(a):
    return ShapedArray((*a.shape[1:], a.shape[0]), a.dtype)


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

    def adopt(self, op, kind: str, fn, traced: bool, device: bool, host, where: str) -> None:
        state = getattr(op, "compiled_state", None)
        if kind == "function" and state is not None and not isinstance(state, _state.State):
            raise TypeError(f"anybind op '{op.name}': state must be an ab.State (a pointer "
                            f"and the function that frees it), got {type(state).__name__}")
        adopt(op, kind, fn, traced, device)

    def lower(self, site: Site, *args, gpu: bool = False):
        call = site.call
        return lower(site.ctx, *args, role=site.role,
                     kind=kind_of_role(site.role, call, site.by_vmap_rule), call=call,
                     rule=site.rule, batch=site.batch, lin=site.lin, need=site.need,
                     mode="expand_dims" if site.by_vmap_rule else call.op.vmap,
                     has_side_effect=site.effect, gpu=gpu)


# Which JAX reads which exported program (measured: the export-window tests).
EXPORT_WINDOW = ("jax reads the programs of its own compatibility window only: jax 0.11.1 and "
                 "later refuse programs written by jax 0.8.0 and 0.8.1, and jax 0.8.x cannot "
                 "read those written by jax 0.12 (serialization version 12)")


# ab.serialize's header: these bytes, then the SHA-256 digest of the JAX program after it.
SEALED = b"anybind-export\x00\x01"


def serialize(exported) -> bytes:
    """``exported.serialize()``, sealed with its SHA-256 digest for ``ab.deserialize``.

    ``ab.deserialize`` checks the digest before JAX reads a byte, so a program
    damaged in storage or transit is an error, never a crash of JAX's reader
    (which aborts the process on some single-bit flips). A digest is no signature:
    load programs only from sources you trust (the contracts page).

    >>> import jax, jax.numpy as jnp, anybind as ab
    >>> data = ab.serialize(jax.export.export(jax.jit(jnp.sin))(jnp.ones(3)))
    >>> ab.deserialize(data).in_avals[0].shape
    (3,)
    """
    program = bytes(exported.serialize())
    return SEALED + hashlib.sha256(program).digest() + program


def _unsealed(data: bytes) -> bytes:
    """The JAX program inside ``ab.serialize``'s bytes, checked; other bytes unchanged.

    A header within a few bits of ``SEALED`` is a damaged seal, not JAX's format."""
    head = data[:len(SEALED)]
    flipped = sum(bin(x ^ y).count("1") for x, y in zip(head, SEALED))
    if len(head) < len(SEALED) or flipped > 8:
        return data
    digest, program = data[len(SEALED):len(SEALED) + 32], data[len(SEALED) + 32:]
    if flipped or hashlib.sha256(program).digest() != digest:
        raise ValueError(f"anybind: this exported program is damaged: its bytes (ab.serialize's, "
                         f"{len(data)} bytes) do not match the SHA-256 digest they were sealed "
                         f"with, so JAX is not given them. Export and serialize it again")
    return program


def deserialize(data: bytes | bytearray):
    """``jax.export.deserialize(data)``, checking ``ab.serialize``'s digest first and
    saying which anybind ops a refused program calls.

    ``data`` is ``ab.serialize``'s (damaged bytes are an error before JAX reads
    them) or JAX's own ``Exported.serialize()``'s. JAX alone decides whether it
    can read a program written by another release; where it refuses, the error
    names the compiled anybind ops of this process that the program calls, the
    JAX release reading it, and the window.

    >>> import jax, jax.numpy as jnp, anybind as ab
    >>> exported = jax.export.export(jax.jit(jnp.sin))(jnp.ones(3))
    >>> ab.deserialize(exported.serialize()).in_avals[0].shape
    (3,)
    """
    import jax.export
    blob = _unsealed(bytes(data))
    try:
        return jax.export.deserialize(bytearray(blob))
    except (ValueError, NotImplementedError) as e:
        with _lock:
            names = sorted(n for n in _names if n.encode() in blob)
        calls = (f"calls the anybind ops {names}" if names else
                 "calls no compiled anybind op bound in this process")
        raise ValueError(f"anybind: jax {jax.__version__} cannot read this exported program, "
                         f"which {calls}: {e} ({EXPORT_WINDOW}). Export it again with the jax "
                         f"release that is to read it") from e
