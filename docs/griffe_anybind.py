"""Griffe extension for anybind's API reference (see mkdocs.yml).

- Docstring examples (``>>>`` runs) become fenced ``pycon`` blocks, so Markdown
  does not read them as block quotes.
- reStructuredText simple tables (the module tables, rows between ``===  ===``
  rules) become Markdown tables; a row whose first cell is empty continues the
  row above.
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
_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def rst_tables(text: str) -> str:
    """Turn each reStructuredText simple table (three ``=`` rules) into a Markdown table."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        rules = [j for j in range(i, len(lines)) if _RULE.match(lines[j])][:3]
        if len(rules) < 3 or rules[0] != i:
            out.append(lines[i])
            i += 1
            continue
        spans = [m.span() for m in re.finditer(r"=+", lines[i])]

        def cells(line: str, spans=spans) -> list[str]:
            return [line[a:(spans[k + 1][0] if k + 1 < len(spans) else None)].strip()
                    .replace("|", "\\|") for k, (a, _) in enumerate(spans)]

        head = [" ".join(c) for c in zip(*(cells(x) for x in lines[rules[0] + 1:rules[1]]))]
        rows: list[list[str]] = []
        for line in lines[rules[1] + 1:rules[2]]:
            row = cells(line)
            if rows and not row[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], row)]
            elif line.strip():
                rows.append(row)
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                *("| " + " | ".join(r) + " |" for r in rows)]
        i = rules[2] + 1
    return "\n".join(out)


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
        if obj.docstring is not None:
            obj.docstring.value = rst_tables(fence_doctests(obj.docstring.value))

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
