"""Which memory order compiled code gets its arrays in: ``ab.bind(order=)``.

XLA keeps arrays row-major, and hands a custom call whatever layout it asks
for (copying where the producer's differs). An op bound with ``order="F"``
asks for column-major operands and results, so that a Fortran routine reads an
``(m, n)`` array as its own ``A(m, n)``.

==================  ===============================================================
piece               what it does
==================  ===============================================================
``order_of``        the order a call of compiled code gets: the op's, or, where it
                    said none, ``"C"``, unless the code comes from a Fortran library
                    and gets an array with two axes longer than 1: a TypeError, since
                    Fortran would silently read the transpose
``minor_to_major``  XLA's layout of one operand: row-major, column-major, or
                    column-major with a leading batch axis outermost (a batch called
                    row by row: each row is one Fortran array)
``fortran_runtime`` why a function's shared library is Fortran's: it needs a
                    Fortran runtime (``libgfortran``, ...), or its symbol table
                    names a Fortran source file; read from the ELF file
==================  ===============================================================

Under ``vmap`` a call of the whole batch at once (``"expand_dims"``, a vmap
rule) gets, in order ``"F"``, every operand with its batch axis *last*
(Fortran's slowest axis: ``A(m, n, B)``), of length 1 where it is not batched;
results likewise. The lowering moves the axis; XLA makes the move a relabelling
where the layouts allow it.

What anybind can know: a ctypes or cffi function's address tells which shared
library holds it, and an ELF library built from Fortran either needs a Fortran
runtime or (unless stripped) names its Fortran source files. What it cannot: a
C declaration carries no memory order, a Numba ``cfunc`` gets raw pointers
(``carray`` reads them row-major, ``farray`` column-major, inside code anybind
does not see), and a stripped library that needs no Fortran runtime, or a C
library that calls Fortran, looks like C. A library with any Fortran source in
it counts as Fortran's, its C functions too (``order="C"`` says otherwise).
"""
from __future__ import annotations

import ctypes
import functools
import struct

_RUNTIMES = ("libgfortran", "libifcore", "libflang", "libFortranRuntime", "libflangrt",
             "libpgf90")


def minor_to_major(rank: int, order: str, batched_rows: bool) -> tuple[int, ...]:
    """XLA's layout of an operand of ``rank`` axes.

    ``batched_rows``: its axis 0 is a batch that the shim splits row by row,
    so it stays outermost and each row is one array in ``order``.
    """
    if order == "C":
        return tuple(range(rank - 1, -1, -1))
    if batched_rows and rank > 0:
        return (*range(1, rank), 0)
    return tuple(range(rank))


def order_of(op, role: str, kind: str, address: int, shapes) -> str:
    """``"C"`` or ``"F"`` for a call of compiled code (of ``compiled_kind`` ``kind``, at
    ``address``) whose arrays have these ``shapes`` (as the function sees them, without a
    batch that the shim splits)."""
    order = getattr(op, "order", None)
    if order is not None:
        return order
    big = max((sum(1 for d in s if not (isinstance(d, int) and d == 1)) for s in shapes),
              default=0)
    if big < 2:
        return "C"  # at most one axis longer than 1: both orders are the same
    found = fortran_runtime(kind, address)
    if found is None:
        return "C"
    library, why = found
    raise TypeError(
        f"anybind op '{op.name}': its compiled {role} comes from {library}, a Fortran library "
        f"({why}), and gets an array with {big} axes longer than 1. Fortran reads arrays "
        f"column-major, so on XLA's row-major buffers it would compute on the transpose. "
        f"Bind the op with order='F' (XLA hands it column-major buffers: an (m, n) array "
        f"arrives as Fortran's A(m, n)), or with order='C' if the routine reads row-major "
        f"buffers itself")


def fortran_runtime(kind: str, address: int) -> tuple[str, str] | None:
    """``(library path, runtime)`` if the function at ``address`` lives in a shared
    library that needs a Fortran runtime; None otherwise (or where that cannot be told)."""
    if kind not in ("ctypes", "cffi"):  # a Numba cfunc: code made in this process
        return None
    path = _library_of(address)
    if path is None:
        return None
    runtime = _needs_fortran(path)
    return None if runtime is None else (path, runtime)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _library_of(address: int | None) -> str | None:
    if not address:
        return None
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):  # no dladdr (not a POSIX system)
        return None
    dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)], ctypes.c_int
    info = _DlInfo()
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode(errors="replace")


_SOURCES = (".f", ".for", ".ftn", ".f77", ".f90", ".f95", ".f03", ".f08")


@functools.cache
def _needs_fortran(path: str) -> str | None:
    """Why an ELF library is Fortran's (it needs a Fortran runtime, or its symbol table
    names a Fortran source file), or None."""
    try:
        needed, files = _elf_names(path)
    except (OSError, ValueError, IndexError, struct.error):
        return None
    for name in needed:
        if name.startswith(_RUNTIMES):
            return f"it needs {name}"
    for name in files:
        if name.lower().endswith(_SOURCES):
            return f"it is built from {name}"
    return None


def _elf_names(path: str) -> tuple[list[str], list[str]]:
    """``(DT_NEEDED entries, source file symbols)`` of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]

    def text(table: int, at: int) -> str:
        start = sections[table][4] + at
        return data[start:data.index(b"\0", start)].decode(errors="replace")
    needed, files = [], []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind == 6:  # SHT_DYNAMIC: (tag, value) pairs
            for pos in range(offset, offset + size, entsize or 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    needed.append(text(link, value))
        elif kind == 2:  # SHT_SYMTAB (gone from a stripped library): STT_FILE symbols
            for pos in range(offset, offset + size, entsize or 24):
                name, info = struct.unpack_from("<IB", data, pos)
                if info & 0xF == 4 and name:
                    files.append(text(link, name))
    return needed, files
