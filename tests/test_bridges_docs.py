"""The Python blocks of the bridges guide and of the migration page run, in order.

Each page's blocks share one namespace, as a reader runs them; JAX's default
dtypes (x64 off), as a reader has them.
"""
import pathlib
import re

import jax
import pytest

pytestmark = pytest.mark.slow  # runs the bridges' docs pages, in processes of their own

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = ["guides/bridges.md", "migration/torch2jax.md"]


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(page):
    path = DOCS / page
    if not path.exists():
        pytest.skip(f"{page} is not in this checkout")
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, page
    ns: dict = {}
    with jax.enable_x64(False):
        for i, block in enumerate(blocks):
            exec(compile(block, f"{page} block {i}", "exec"), ns)
