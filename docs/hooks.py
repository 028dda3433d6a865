"""mkdocs hooks (see mkdocs.yml): the performance page's figures; repository-only text.

The figures are drawn from the benchmark results by ``docs/gen_figures.py`` at
every build and added to the site as generated files under ``figures/``; none
is written into ``docs/`` or committed.

Text between ``<!-- repository-only ... -->`` and ``<!-- /repository-only -->``
is for readers of the Markdown files (the API reference's signatures, which the
site renders in full from the docstrings) and is left out of the site.

A code block that the docs tests write to a file (``<!-- docs-test: file PATH -->``
above its fence) shows PATH as its title, unless its fence gives one.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_figures  # noqa: E402

REPOSITORY_ONLY = re.compile(r"^<!-- repository-only\b.*?^<!-- /repository-only -->\n",
                             re.MULTILINE | re.DOTALL)
FILE_BLOCK = re.compile(r"^(<!--\s*docs-test:[^>]*\bfile\s+(\S+)[^>]*-->\n"
                        r"(?:[ \t]*<!--\s*docs-test:[^>]*-->\n)*)"   # the block's other markers
                        r"([ \t]*)(`{3,}|~{3,})(\w*)[ \t]*$", re.MULTILINE)


def on_files(files, config):
    with tempfile.TemporaryDirectory() as tmp:
        for path in gen_figures.generate(Path(tmp)):
            files.append(File.generated(config, f"figures/{path.name}",
                                        content=path.read_bytes()))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = REPOSITORY_ONLY.sub("", markdown)
    return FILE_BLOCK.sub(lambda m: f'{m[1]}{m[3]}{m[4]}{m[5]} title="{m[2]}"', markdown)
