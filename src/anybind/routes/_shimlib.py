"""The FFI shim (``_shim.c``) as a library: found, built at first use, verified, loaded.

=====================  =========================================================
piece                  what it does
=====================  =========================================================
``load``               the shim: the one built at install beside this module,
                       else a verified build in the user's cache, else one built
                       now (raises, naming what is missing, where none can be)
``register_target``    registers the shim's handler with XLA, once; at import
                       where a shim is at hand without building, so that a
                       deserialised program finds anybind's handler (and its
                       messages) before any compiled op is bound
``register_gpu``       registers its CUDA handler (device code: launchers given
                       XLA's stream) under the same target, once, when device
                       code is first bound where JAX has a CUDA backend
=====================  =========================================================

The cache is untrusted: whatever is loaded from it runs with the user's rights,
and ``ctypes.CDLL`` runs a library's constructors before anything can be
checked. So a cached build is loaded only when its directory belongs to the
user and nobody else may write to it (created with mode 0700), the library and
its record (``shim-<digest>.json``: the library's file name and its SHA-256,
written atomically beside it) belong to the user, are plain files and are
writable by nobody else, and the library's hash is the recorded one. Anything
else (a corrupt, foreign or planted file) is never loaded: a fresh build goes
to a fresh name, and the record then names it. Where the cache directory itself
is not private, the build goes to a private temporary directory instead.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import jax.ffi

from ..core import _jax

TARGET = "anybind_compiled"
SHIM_VERSION = 8  # must equal anybind_shim_version() in _shim.c

_lock = threading.Lock()
_registered: list = []  # [the library] once its handler is registered with XLA


_TEMPORARY = "anybind-shim-"  # the prefix of a build folder used once, by one process


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anybind"


def _installed() -> Path | None:
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_shim{suffix}").exists():
            return here / f"_shim{suffix}"
    return None


@functools.cache
def load() -> ctypes.CDLL:
    """The shim library: the one built at install, or one from (or built into) the cache.

    Raises ``RuntimeError`` naming what is missing (a C compiler, jax's FFI
    headers) when neither works; the Python route does not need the shim.
    """
    lib = _usable(_installed())
    if lib is None:
        path = _from_cache(build=True)
        try:
            lib = _open(path, strict=True)
        finally:
            if path.parent.name.startswith(_TEMPORARY):  # loaded: the mapping outlives the file
                shutil.rmtree(path.parent, ignore_errors=True)
    return lib


def _usable(path: Path | None) -> ctypes.CDLL | None:
    return None if path is None else _open(path)


def _open(path: Path, strict: bool = False) -> ctypes.CDLL | None:
    lib = ctypes.CDLL(str(path))
    if lib.anybind_shim_version() != SHIM_VERSION:
        if strict:
            raise RuntimeError(f"anybind: the FFI shim at {path} is version "
                               f"{lib.anybind_shim_version()}, expected {SHIM_VERSION}")
        return None  # a stale build: build a fresh one
    u64, p, i64 = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int64
    lib.anybind_bind.argtypes = [u64, p, ctypes.c_char_p, ctypes.c_char_p, i64, u64, i64, i64]
    lib.anybind_bind.restype = ctypes.c_int32
    lib.anybind_state_set.argtypes = [u64, p]
    lib.anybind_state_set.restype = ctypes.c_int32
    lib.anybind_state_drop.argtypes = [u64]
    lib.anybind_state_drop.restype = ctypes.c_int32
    lib.anybind_allow.argtypes = [u64, i64, i64, i64, ctypes.POINTER(i64), i64]
    lib.anybind_allow.restype = ctypes.c_int32
    lib.anybind_set_validator.argtypes = [p]
    lib.anybind_set_validator.restype = None
    return lib


def register_target(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    """Register the shim's handler with XLA, once; its target is safe to export."""
    if _registered:
        return _registered[0]
    with _lock:
        if not _registered:
            lib = lib or load()
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.anybind_handler),
                                        platform="cpu")
            # The target's meaning is fixed by its name and anybind's calling convention,
            # and every process that binds the ops registers it: jax.export may keep it.
            _jax.stable_custom_call_targets().add(TARGET)
            _registered.append(lib)
    return _registered[0]


_gpu_registered: list = []  # [True] once the CUDA handler is registered


def register_gpu() -> ctypes.CDLL:
    """Register the shim's CUDA handler under the same target, once.

    Only where JAX has a CUDA backend: registering a target for a platform JAX
    has no plugin for is kept by JAX for later, and is harmless, but there is no
    program to call it.
    """
    lib = register_target()
    if _gpu_registered:
        return lib
    with _lock:
        if not _gpu_registered:
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.anybind_gpu_handler),
                                        platform="CUDA")
            _gpu_registered.append(True)
    return lib


def register_at_import() -> None:
    """Register the handler now if a shim is at hand without building one (cheap)."""
    try:
        lib = _usable(_installed())
        if lib is None:
            path = _from_cache(build=False)
            lib = None if path is None else _open(path)
        if lib is not None:
            register_target(lib)
    except Exception:  # noqa: BLE001  (never fail the import: binding builds and says why)
        pass


# ---------------------------------------------------------------------- the cache

def _source() -> tuple[Path, Path, str | None]:
    source = Path(__file__).resolve().parent / "_shim.c"
    include = Path(jax.ffi.include_dir())
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    return source, include, cc


def _digest(source: Path, header: Path, cc: str) -> str:
    """What names a build: the shim's sources (``_shim.c``, ``_ffi.h``), XLA's header and
    the compiler."""
    return hashlib.sha256(source.read_bytes() + (source.parent / "_ffi.h").read_bytes()
                          + header.read_bytes() + cc.encode()).hexdigest()[:16]


def _private_dir(path: Path) -> bool:
    """Whether ``path`` is a real directory of this user that nobody else may write to."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _own_file(path: Path) -> bool:
    """Whether ``path`` is a plain file (not a link) of this user that only they may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _verified(cache: Path, digest: str, suffix: str) -> Path | None:
    """The cached build that the record names, if every check passes; else None."""
    record = cache / f"shim-{digest}.json"
    if not _own_file(record):
        return None
    try:
        info = json.loads(record.read_text())
        name, want = info["file"], info["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(name, str) and isinstance(want, str)
            and re.fullmatch(rf"shim-{digest}-[0-9a-f]{{16}}{re.escape(suffix)}", name)):
        return None
    path = cache / name
    if not _own_file(path) or _sha256(path) != want:
        return None
    return path


def _from_cache(build: bool) -> Path | None:
    """A verified build in the cache, else (``build``) one built now; else None."""
    source, include, cc = _source()
    header = include / "xla" / "ffi" / "api" / "c_api.h"
    if cc is None:
        if not build:
            return None
        raise RuntimeError(
            "anybind: binding a compiled function needs anybind's FFI shim, which was not "
            "built when anybind was installed, and no C compiler was found to build it now "
            "(tried $CC, cc, gcc, clang). Install a C compiler and reinstall anybind (or just "
            "retry: it builds at first use). Python host functions work without it.")
    if not header.exists():
        if not build:
            return None
        raise RuntimeError(f"anybind: the FFI shim needs XLA's C API header, which jaxlib "
                           f"should ship at {header}; it is missing")
    digest, suffix = _digest(source, header, cc), importlib.machinery.EXTENSION_SUFFIXES[0]
    cache = cache_dir()
    if _private_dir(cache):
        found = _verified(cache, digest, suffix)
        if found is not None and _open(found) is not None:
            return found
    if not build:
        return None
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        pass
    if not _private_dir(cache):  # another's, or open to others: build where only we may
        cache = Path(tempfile.mkdtemp(prefix=_TEMPORARY))  # removed once loaded (``load``)
    return _build(cache, source, include, cc, digest, suffix)


def _build(cache: Path, source: Path, include: Path, cc: str, digest: str,
           suffix: str) -> Path:
    """Build the shim into ``cache`` under a fresh name, and record it there atomically."""
    target = cache / f"shim-{digest}-{secrets.token_hex(8)}{suffix}"
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        out = Path(tmp) / target.name
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(out)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:  # $CC names no program, or one that cannot run
            raise RuntimeError(
                f"anybind: building the FFI shim failed: the C compiler {cc!r} (from $CC, or "
                f"found as cc, gcc or clang) could not be run: {e}. Set CC to a working C "
                f"compiler, or unset it") from e
        if res.returncode != 0:
            raise RuntimeError(f"anybind: building the FFI shim failed ({' '.join(cmd)}):\n"
                               f"{res.stderr.strip()}")
        os.chmod(out, 0o700)
        sha = _sha256(out)
        os.replace(out, target)
        record = Path(tmp) / "record.json"
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"file": target.name, "sha256": sha}, f)
        os.replace(record, cache / f"shim-{digest}.json")  # atomic: the last build wins
    return target
