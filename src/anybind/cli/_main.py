"""The command line: ``python -m anybind check|demo|info``.

``check MODULE[:NAME]`` imports a module (or a ``.py`` file), finds the op
``NAME`` or every ``ab.Op`` the module defines, and runs ``ab.check`` on each
with the inputs its ``examples=`` gives. ``demo`` runs the transformation
matrix on real NumPy, SciPy and ducc0 functions. Both exit 1 when anything is
wrong and 2 on a usage error. ``info`` reports what this install has (``_info``).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from types import ModuleType

DESCRIPTION = """\
anybind: bind any Python function into JAX as a primitive that works under
every transformation. Commands:

  check MODULE[:NAME]  numerically verify the rules of one op, or of every op in
                       a module (ops need examples=...); exit 1 on a wrong rule
  demo                 bind real NumPy/SciPy/ducc0 functions, run jit, vmap, jvp,
                       grad, jacfwd, jacrev, hessian, linear_transpose and
                       ab.check on each against pure-JAX references
  info                 versions, the routes this install has (C handlers built or
                       not, GPU), the shim cache and the JAX window: for bug reports

Run `python -m anybind COMMAND --help` for a command's options."""


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m anybind``.

    >>> parser().parse_args(["check", "mymodule:op"]).target
    'mymodule:op'
    """
    p = argparse.ArgumentParser(prog="python -m anybind", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    c = sub.add_parser(
        "check", help="verify the rules of ops with ab.check",
        description="Run ab.check on the op NAME of MODULE, or on every ab.Op defined in "
                    "MODULE, with the example inputs given by the op's examples=. MODULE "
                    "is an importable module name or a path to a .py file. Prints a table "
                    "per op and a summary; exits 1 if any rule is wrong, 2 if nothing "
                    "could be checked.")
    c.add_argument("target", metavar="MODULE[:NAME]",
                   help="module (dotted name or .py path), optionally :NAME of one op")
    c.add_argument("--rtol", type=float, default=None,
                   help="relative tolerance for every comparison (default: by dtype)")
    c.add_argument("--atol", type=float, default=None, help="absolute tolerance added")
    c.add_argument("--seed", type=int, default=0, help="seed of the random directions")
    c.add_argument("--x64", action="store_true", help="enable jax_enable_x64 first")
    c.add_argument("--torch", action="store_true",
                   help="also run the checks through op.torch (needs anybind[torch])")
    c.add_argument("--json", action="store_true", help="print the reports as JSON")
    d = sub.add_parser(
        "demo", help="run the transformation matrix on real NumPy/SciPy/ducc0 functions",
        description="Bind scipy.special.gammaln (derivatives of every order), numpy.fft.fft "
                    "and ducc0.fft.c2c (linear, with transposes), scipy.linalg.lu_solve "
                    "(linear in b) and numpy.sort (integer index output); run jit, vmap, "
                    "jvp, grad, jacfwd, jacrev, hessian, linear_transpose and ab.check on "
                    "each, compare with pure-JAX references and print op × transformation "
                    "with ✓/✗, max relative error and time. Exits 1 if anything is wrong.")
    d.add_argument("--json", action="store_true", help="print the results as JSON")
    i = sub.add_parser(
        "info", help="report versions, the routes this install has, the shim cache",
        description="Print anybind's, Python's, jax's, jaxlib's and NumPy's versions and those "
                    "of the optional packages of each extra; the routes available in this "
                    "install (the Python FFI handler and the compiled shim built at install "
                    "or not, a C compiler to build the shim at first use, GPUs seen by JAX); "
                    "the shim cache's location and state; and the JAX window of the package "
                    "metadata. Builds and writes nothing. Exits 1 if the installed jax, "
                    "jaxlib or NumPy is outside the window.")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m anybind`` and the ``anybind`` script; returns the exit code."""
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser().print_help()
        return 2
    import jax
    # host code runs on the CPU backend: keep example arrays there on GPU machines too
    with jax.default_device(jax.devices("cpu")[0]):
        if args.command == "info":
            from . import _info
            return _info.run(as_json=args.json)
        return check_command(args) if args.command == "check" else demo_command(args)


def demo_command(args) -> int:
    from . import _demo
    out = _demo.run(show=None if args.json else print)
    if args.json:
        print(json.dumps(out, indent=1, ensure_ascii=False))
    return 0 if out["ok"] else 1


def _import(target: str) -> ModuleType:
    if target.endswith(".py") or os.sep in target:
        path = os.path.abspath(target)
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {target!r} as a Python file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(target)


def find_ops(target: str) -> list:
    """(label, op) pairs for ``MODULE[:NAME]``; raises LookupError when there are none."""
    from .._api import Op
    mod_name, _, name = target.partition(":")
    if not mod_name:
        raise LookupError(f"expected MODULE[:NAME] or FILE.py[:NAME], got {target!r}")
    mod = _import(mod_name)
    if name:
        obj = mod
        for part in name.split("."):
            if not hasattr(obj, part):
                raise LookupError(f"module {mod_name!r} has no attribute {name!r}")
            obj = getattr(obj, part)
        if not isinstance(obj, Op):
            raise LookupError(f"{target!r} is a {type(obj).__name__}, not an op made by ab.bind")
        return [(name, obj)]
    ops, seen = [], set()
    for attr, obj in vars(mod).items():
        if isinstance(obj, Op) and id(obj) not in seen:
            seen.add(id(obj))
            ops.append((attr, obj))
    if not ops:
        raise LookupError(f"module {mod_name!r} defines no ops made by ab.bind")
    return ops


def check_command(args) -> int:
    import jax

    from ..check import RuleError, check
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    try:
        ops = find_ops(args.target)
    except (ImportError, LookupError, ValueError) as e:
        print(f"anybind check: {e}", file=sys.stderr)
        return 2
    summary, reports = [], []
    for label, op in ops:
        if op.examples is None:
            summary.append((label, "skipped", "no examples= to check it with"))
            continue
        try:
            report = check(op, rtol=args.rtol, atol=args.atol, seed=args.seed,
                           torch=args.torch)
            status, note = "ok", f"{sum(r.status == 'ok' for r in report.rows)} checks passed"
        except RuleError as e:
            report, status, note = e.report, "FAIL", str(e)
        except Exception as e:  # the examples or the op itself are broken
            report, status, note = None, "FAIL", f"{type(e).__name__}: {e}"
        summary.append((label, status, note))
        if report is not None:
            reports.append(report)
            if not args.json:
                print(report, end="\n\n")
    failed = [s for s in summary if s[1] == "FAIL"]
    if args.json:
        print(json.dumps({"ok": not failed, "reports": [r.to_dict() for r in reports],
                          "summary": [dict(zip(("op", "status", "note"), s)) for s in summary]},
                         indent=1, ensure_ascii=False))
    else:
        w = max(len(s[0]) for s in summary)
        print(f"{'op'.ljust(w)}  status   note")
        for label, status, note in summary:
            print(f"{label.ljust(w)}  {status:<7}  {note}")
    if len(failed) == 0 and all(s[1] == "skipped" for s in summary):
        return 2
    return 1 if failed else 0
