"""What the fuzzers (``test_fuzz.py`` on JAX, ``test_torch_fuzz.py`` on PyTorch) share.

==================  ==============================================================
piece               what it is
==================  ==============================================================
``ci``, ``long``    hypothesis profiles: ``ci`` (default) a fixed, derandomized
                    set of examples; ``long`` (``ANYBIND_FUZZ=long``)
                    ``ANYBIND_FUZZ_EXAMPLES`` random ones (default 10⁴)
``fuzz``            runs an example function under the profile: the long profile
                    records every failing example and fails at the end, the ci
                    profile fails on the first; ``ANYBIND_FUZZ_LOG`` names a file
                    that gets one line per example
``Fixed``           stands for hypothesis's ``data`` in hand-picked stacks
==================  ==============================================================
"""
from __future__ import annotations

import os
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, settings, strategies as st

settings.register_profile(
    "ci", max_examples=40, derandomize=True, deadline=None, database=None,
    suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile(
    "long", max_examples=int(os.environ.get("ANYBIND_FUZZ_EXAMPLES", 10_000)), deadline=None,
    database=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
PROFILE = os.environ.get("ANYBIND_FUZZ", "ci")


def fuzz(run_example: Callable[[object], str], **ci) -> None:
    """Run ``run_example(data)`` (which returns a one-line note of what it ran) for
    every example of the profile; ``ci`` overrides the ci profile's settings."""
    failures = []
    log = os.environ.get("ANYBIND_FUZZ_LOG")
    profile = settings(settings.get_profile(PROFILE), **(ci if PROFILE == "ci" else {}))

    @profile
    @given(st.data())
    def run(data):
        try:
            line = "ok   " + run_example(data)
        except AssertionError as e:
            if PROFILE != "long":
                raise
            failures.append(str(e).splitlines()[0])
            line = "FAIL " + failures[-1]
        if log:
            with open(log, "a") as f:
                f.write(line + "\n")

    run()
    assert not failures, f"{len(failures)} failing stacks:\n" + "\n".join(failures)


class Fixed:
    """Stands for hypothesis's ``data``: fixed choices, and the first option otherwise."""

    def __init__(self, choices: dict, layers: list):
        self.choices, self.layers = choices, iter(layers)

    def draw(self, strategy, label=None):
        if label == "layer":
            return next(self.layers)
        if label in self.choices:
            return self.choices[label]
        leading = ("in_axes", "argnum", "out_axes", "in_dims", "out_dims")
        return 0 if label.startswith(leading) else None
