"""``python -m anybind info``: what this install of anybind has, for a bug report.

=================  ==============================================================
section            what it reports
=================  ==============================================================
``versions``       anybind, Python, the platform, jax, jaxlib, NumPy, and each
                   package of the extras for users (installed or not)
``extras``         each extra of the package metadata: complete, or what it lacks
``routes``         the Python FFI handler (``_pycall``): built, loaded or not;
                   the compiled shim (``_shim``): built at install, else whether a
                   C compiler and XLA's header can build it at first use; the GPU
``shim cache``     where shims built at first use go, and its state (private or
                   not, the builds it holds)
``jax window``     the releases of jax, jaxlib and NumPy the metadata requires,
                   and whether those installed satisfy them
``tested``         the oldest and newest Python, jax, NumPy and torch CI tests
                   (``anybind._window``), and where the installed ones fall
=================  ==============================================================

Nothing here builds or writes anything: a missing handler is reported, not made.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import stat
import tempfile
from pathlib import Path

CORE = ("jax", "jaxlib", "numpy")
TOOLING = ("test", "docs", "bench", "dev")  # extras for working on anybind, not for using it
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)(;.*)?$")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirements() -> tuple[list[str], dict[str, list[str]]]:
    """(the core requirements, {extra: its requirements}) from anybind's metadata.

    >>> core, extras = requirements()
    >>> any(r.startswith("jax>=") for r in core)
    True
    """
    try:
        reqs = importlib.metadata.requires("anybind") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return [], {}
    core: list[str] = []
    extras: dict[str, list[str]] = {}
    for req in reqs:
        extra = _EXTRA.search(req)
        spec = req.split(";")[0].strip()
        (extras.setdefault(extra.group(1), []) if extra else core).append(spec)
    return core, extras


def _name(spec: str) -> str:
    m = _REQUIREMENT.match(spec)
    return m.group(1) if m else spec


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: ``"0.10.2.dev1"`` -> ``(0, 10, 2)``."""
    nums = []
    for part in version.split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        nums.append(int(m.group()))
        if m.group() != part:
            break
    return tuple(nums)


def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` meets the comparisons of a requirement (``"jax>=0.8,<0.11"``).

    >>> satisfies("0.10.2", "jax>=0.8.0"), satisfies("0.7.1", "jax>=0.8.0")
    (True, False)
    """
    m = _REQUIREMENT.match(spec)
    for clause in filter(None, (c.strip() for c in (m.group(3) if m else "").split(","))):
        parts = re.match(r"([<>=!~]*)\s*(.*)", clause)
        op, want = parts.groups() if parts else ("", clause)
        prefix = want.endswith(".*")
        w, h = _release(want.removesuffix(".*")), _release(version)
        if prefix:
            h = h[:len(w)]
        n = max(len(w), len(h))
        w, h = w + (0,) * (n - len(w)), h + (0,) * (n - len(h))
        ok = {"<": h < w, "<=": h <= w, ">": h > w, ">=": h >= w, "==": h == w, "===": h == w,
              "!=": h != w, "~=": h >= w and h[:len(w) - 1] == w[:len(w) - 1]}.get(op or "==")
        if not ok:
            return False
    return True


def compiler() -> str | None:
    """The C compiler that would build the shim at first use ($CC, cc, gcc, clang)."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or (cc if os.path.isfile(cc) else None)
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def _extension(name: str) -> str | None:
    """The file of one of anybind's C extensions, or None where it was not built."""
    spec = importlib.util.find_spec(f"anybind.routes.{name}")
    return spec.origin if spec is not None and spec.origin else None


def python_handler() -> dict:
    """The Python FFI handler: built or not, and loaded into XLA or why not."""
    path = _extension("_pycall")
    if path is None:
        return {"built": False, "path": None, "loaded": False,
                "note": "no C compiler when anybind was installed? Python host code "
                        "takes XLA's buffer callback, with more overhead per call"}
    from ..routes import _pyffi
    try:
        ext = _pyffi.handler()
    except Exception as e:  # noqa: BLE001  (reported, not raised: this is a diagnosis)
        return {"built": True, "path": path, "loaded": False,
                "note": f"loading it failed: {type(e).__name__}: {e}"}
    if ext is None:
        return {"built": True, "path": path, "loaded": False,
                "note": "it does not import (built for another Python or NumPy?); reinstall "
                        "anybind"}
    return {"built": True, "path": path, "loaded": True, "ffi_api": ext.api_version(),
            "note": "Python host code runs on XLA's buffers through anybind's own handler"}


def compiled_shim() -> dict:
    """The compiled route's shim: built at install, or whether it can be built at first use."""
    import jax.ffi
    path = _extension("_shim")
    cc = compiler()
    header = Path(jax.ffi.include_dir()) / "xla" / "ffi" / "api" / "c_api.h"
    out = {"built": path is not None, "path": path, "compiler": cc,
           "xla_header": header.exists()}
    if path is not None:
        out["note"] = "compiled functions (C, Numba, ctypes, cffi) bind"
    elif cc is not None and header.exists():
        out["note"] = f"buildable at first use with {cc}, into the shim cache"
    elif cc is None:
        out["note"] = ("no C compiler ($CC, cc, gcc, clang) to build it at first use: binding "
                       "a compiled function fails (unless the shim cache holds a build); "
                       "Python host code works")
    else:
        out["note"] = f"XLA's FFI header is missing ({header}): it cannot be built"
    return out


def gpu() -> dict:
    """What JAX sees of GPUs, and whether CuPy (device=True code) is installed."""
    import jax
    try:
        devices = [str(d) for d in jax.devices("gpu")]
    except RuntimeError:
        devices = []
    return {"default_backend": jax.default_backend(), "devices": devices,
            "cupy": _version("cupy-cuda12x") or _version("cupy") or None,
            "note": ("host code runs by XLA's GPU callback; device=True code "
                     + ("runs on CuPy views" if importlib.util.find_spec("cupy")
                        else "needs CuPy (anybind[gpu])")) if devices
            else "no GPU seen by JAX: everything runs on the CPU"}


def _why_not_creatable(path: Path) -> str | None:
    """Why the folder ``path`` cannot be made, or None: its nearest existing ancestor
    must be a folder this user may write, where a folder can really be made (tried
    with a temporary one, removed at once: /proc and read-only mounts pass the
    permission check)."""
    ancestor = path.parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable by this user"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".anybind-info-", dir=ancestor))
    except OSError as e:
        return f"a folder cannot be made in {ancestor} ({e.strerror or e})"
    return None


def shim_cache() -> dict:
    """Where shims built at first use go, and what is there (nothing is created)."""
    from ..routes import _shimlib
    path = _shimlib.cache_dir()
    out: dict = {"path": str(path), "exists": False, "private": None, "builds": 0, "bytes": 0}
    try:
        st = os.lstat(path)
    except OSError:
        why = _why_not_creatable(path)
        out["creatable"] = why is None
        out["state"] = ("absent: the first build creates it, readable by this user only"
                        if why is None else
                        f"absent, and it cannot be created: {why}; builds go to a "
                        f"temporary directory, removed once loaded (set XDG_CACHE_HOME to "
                        f"a folder of yours to keep them)")
        return out
    out["exists"] = True
    private = (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
               and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    out["private"] = private
    if not private:
        out["state"] = ("NOT private (another user's, a link, or writable by others): "
                        "nothing there is loaded, builds go to a temporary directory")
        return out
    libs = [p for p in path.glob("shim-*") if p.suffix != ".json" and p.is_file()]
    out["builds"] = len(list(path.glob("shim-*.json")))
    out["bytes"] = sum(p.stat().st_size for p in libs)
    out["state"] = (f"private; {out['builds']} build record(s), {len(libs)} "
                    f"librar{'y' if len(libs) == 1 else 'ies'} ({out['bytes'] // 1024} KiB)")
    return out


def gather() -> dict:
    """Everything ``info`` reports, as plain data (``--json`` prints it as it is)."""
    import anybind
    core, extras = requirements()
    optional = sorted({_name(s) for extra, specs in extras.items() if extra not in TOOLING
                       for s in specs} - set(CORE))
    window = []
    for spec in core:
        have = _version(_name(spec))
        window.append({"requirement": spec, "installed": have,
                       "ok": have is not None and satisfies(have, spec)})
    return {
        "versions": {"anybind": anybind.__version__,
                     "python": f"{platform.python_implementation()} {platform.python_version()}",
                     "platform": f"{platform.system()} {platform.machine()}",
                     **{name: _version(name) for name in CORE},
                     "optional": {name: _version(name) for name in optional}},
        "extras": {extra: sorted(_name(s) for s in specs
                                 if _name(s) not in CORE and _version(_name(s)) is None)
                   for extra, specs in extras.items()},
        "routes": {"python_handler": python_handler(), "compiled_shim": compiled_shim(),
                   "gpu": gpu()},
        "shim_cache": shim_cache(),
        "jax_window": window,
        "tested": tested(),
        "installed_from": str(Path(anybind.__file__).resolve().parent),
    }


def tested() -> dict:
    """{name: (oldest, newest, installed, where)} for the window CI tests.

    >>> tested()["python"][:2]
    ('3.11', '3.13')
    """
    from .._window import TESTED
    out = {}
    for name, (lo, hi) in TESTED.items():
        have = platform.python_version() if name == "python" else _version(name)
        minor = _release(have)[:2] if have else ()  # patch releases of the ends count
        where = ("not installed" if have is None
                 else "older than tested" if minor < _release(lo)[:2]
                 else "newer than tested" if minor > _release(hi)[:2]
                 else "tested window")
        out[name] = (lo, hi, have, where)
    return out


def render(info: dict) -> str:
    """``gather()`` as the text ``python -m anybind info`` prints."""
    v, r, c = info["versions"], info["routes"], info["shim_cache"]
    yes = {True: "yes", False: "no", None: "?"}
    lines = ["anybind " + v["anybind"] + f"  ({info['installed_from']})", "",
             "versions"]
    for key in ("python", "platform", *CORE):
        lines.append(f"  {key:<22}{v[key] or 'not installed'}")
    for name, ver in v["optional"].items():
        lines.append(f"  {name:<22}{ver or '-'}")
    lines += ["", "extras"]
    for extra, missing in info["extras"].items():
        lines.append(f"  {extra:<22}" + ("complete" if not missing
                                           else "lacks " + ", ".join(missing)))
    h, s, g = r["python_handler"], r["compiled_shim"], r["gpu"]
    lines += ["", "routes",
              f"  {'Python FFI handler':<22}"
              + ("built, loaded" if h["loaded"] else "built, NOT loaded" if h["built"]
                 else "NOT built") + f"; {h['note']}",
              f"  {'compiled shim':<22}" + ("built at install" if s["built"]
                                           else "NOT built at install") + f"; {s['note']}",
              f"  {'C compiler':<22}{s['compiler'] or 'none found'}",
              f"  {'XLA FFI header':<22}{yes[s['xla_header']]}",
              f"  {'GPU':<22}" + (", ".join(g["devices"]) or "none")
              + f" (default backend: {g['default_backend']}): {g['note']}",
              "", "shim cache",
              f"  {'location':<22}{c['path']}",
              f"  {'state':<22}{c['state']}",
              "", "jax window (from the package metadata)"]
    if not info["jax_window"]:
        lines.append("  anybind's metadata is not installed (running from a source tree?)")
    for w in info["jax_window"]:
        lines.append(f"  {w['requirement']:<22}installed {w['installed'] or 'none'}: "
                     + ("ok" if w["ok"] else "OUTSIDE THE WINDOW"))
    lines += ["", "tested by CI (oldest – newest)"]
    for name, (lo, hi, have, where) in info["tested"].items():
        lines.append(f"  {name:<22}{lo} – {hi}; installed {have or 'none'}: {where}")
    return "\n".join(lines)


def run(as_json: bool = False) -> int:
    """Print the report; 0 when the installed jax, jaxlib and NumPy are in the window."""
    import json
    info = gather()
    print(json.dumps(info, indent=1) if as_json else render(info))
    return 0 if all(w["ok"] for w in info["jax_window"]) else 1
