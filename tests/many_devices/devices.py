"""Support for the many-device tests: 8 simulated CPU devices, meshes, recorders.

The files here (``md_*.py``) are not collected by the main suite, which keeps
one device; ``tests/test_many_devices.py`` runs each in its own process with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (set here too, so a file
also runs on its own: ``python -m pytest tests/many_devices/md_jit.py``).
"""
from __future__ import annotations

import os
import re
import threading

FLAG = "--xla_force_host_platform_device_count=8"
if FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAG).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

if jax.device_count() != 8:
    raise RuntimeError(f"the many-device tests need 8 CPU devices ({FLAG} before JAX starts); "
                       f"got {jax.device_count()}")

N_DEV = 8


def mesh(axis_type: str = "auto", shape=(8,), names=("x",)):
    """A mesh of the 8 devices with Auto (``jax.sharding.Mesh``'s default) or Explicit axes."""
    kind = AxisType.Explicit if axis_type == "explicit" else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(names))


def put(x, m, *spec):
    return jax.device_put(np.asarray(x), NamedSharding(m, P(*spec)))


_COLLECTIVES = re.compile(r"\b(all-gather|all-to-all|collective-permute)\b")


def collectives(compiled_text: str) -> list:
    """Gathers and reshuffles in a compiled program's HLO (all-reduce is a sum, allowed)."""
    return sorted(set(_COLLECTIVES.findall(compiled_text)))


def hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


class Recorder:
    """Records (role, shapes) of each host call, from whichever thread XLA runs it on."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []

    def __call__(self, role: str, *arrays) -> None:
        with self.lock:
            self.calls.append((role, tuple(np.shape(a) for a in arrays)))

    def take(self, role: str | None = None) -> list:
        with self.lock:
            calls, self.calls = self.calls, []
        return [c for c in calls if role is None or c[0] == role]


def spec(a) -> tuple:
    """The partition spec of an array (its type's under Explicit axes), one entry per axis."""
    s = jax.typeof(a).sharding.spec if isinstance(a, jax.core.Tracer) else a.sharding.spec
    return tuple(s) + (None,) * (np.ndim(a) - len(s))
