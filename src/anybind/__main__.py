"""Command line: ``python -m anybind check MODULE[:NAME]``, ``demo`` and ``info``.

See ``python -m anybind --help``; the commands live in ``cli/_main.py``.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 a wrong result, 2 usage).

    >>> main(["--help"])  # doctest: +SKIP
    """
    from .cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
