"""Griffe extension for anybind's API reference (see mkdocs.yml).

- Docstring examples (``>>>`` runs) become fenced ``pycon`` blocks, so Markdown
  does not read them as block quotes.
- Members the public classes get at run time (``Op.def_jvp`` and the other
  rule methods forward to the op behind the handle) are taken from the
  functions they wrap, wherever those live, and a runtime docstring fills in
  where the source has none (``Op.torch``).
"""
from __future__ import annotations

import importlib
import inspect
import re

import griffe

_PROMPT = re.compile(r"^(\s*)>>> ")


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (prompt, continuation, output) in a pycon fence."""
    lines, out, i, fenced = text.splitlines(), [], 0, False
    while i < len(lines):
        m = _PROMPT.match(lines[i])
        if lines[i].lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not m:
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)
        block = []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
    return "\n".join(out)


class AnybindReference(griffe.Extension):
    def on_object(self, *, obj, loader, **kwargs) -> None:
        if obj.docstring is not None and ">>> " in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        if pkg.name != "anybind":
            return
        runtime = importlib.import_module("anybind")
        for name in runtime.__all__:
            if name in runtime._LAZY:  # functions that need torch to import, not classes
                continue
            cls = getattr(runtime, name)
            if not inspect.isclass(cls) or name not in pkg.members:
                continue
            static = pkg[name]
            static = static.final_target if static.is_alias else static
            for attr, value in vars(cls).items():
                if attr.startswith("_"):
                    continue
                wrapped = getattr(value, "__wrapped__", None)
                if wrapped is not None:
                    path = f"{wrapped.__module__}.{wrapped.__qualname__}"
                    try:
                        target = loader.modules_collection[path]
                    except KeyError:
                        raise RuntimeError(f"anybind.{name}.{attr} wraps {path}, which the API "
                                           f"reference cannot find in the sources") from None
                    static.set_member(attr, griffe.Alias(attr, target, parent=static))
                elif attr in static.members and static[attr].docstring is None and value.__doc__:
                    static[attr].docstring = griffe.Docstring(
                        fence_doctests(inspect.cleandoc(value.__doc__)), parent=static[attr])
