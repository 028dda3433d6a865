"""mkdocs hooks (see mkdocs.yml): the performance page's figures.

The figures are drawn from the benchmark results by ``docs/gen_figures.py`` at
every build and added to the site as generated files under ``figures/``; none
is written into ``docs/`` or committed.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_figures  # noqa: E402


def on_files(files, config):
    with tempfile.TemporaryDirectory() as tmp:
        for path in gen_figures.generate(Path(tmp)):
            files.append(File.generated(config, f"figures/{path.name}",
                                        content=path.read_bytes()))
    return files
