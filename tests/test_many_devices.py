"""Runs the many-device tests (``tests/many_devices/md_*.py``) in processes of their own.

They need 8 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``),
which must be set before JAX starts; the rest of the suite keeps one device.
"""
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
FILES = sorted(p.name for p in (HERE / "many_devices").glob("md_*.py"))


@pytest.mark.parametrize("name", FILES)
def test_many_devices(name):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        " --xla_force_host_platform_device_count=8").strip()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "many_devices"), str(HERE)] + env.get("PYTHONPATH", "").split(os.pathsep))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
         str(HERE / "many_devices" / name)],
        env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parent)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}"
