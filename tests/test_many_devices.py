"""Runs the many-device tests (``tests/many_devices/md_*.py``) in processes of their own.

They need 8 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``),
which must be set before JAX starts; the rest of the suite keeps one device.
"""
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # starts processes (many host devices, multi-process)

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
    if proc.returncode == 5 and "SKIPPED" in proc.stdout:  # the whole file needs an extra
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    # a crash's report starts with the crashing thread's frames: keep its head
    err = proc.stderr[max(proc.stderr.find("Current thread"), 0):][:6000] \
        if proc.returncode < 0 else proc.stderr[-4000:]
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-8000:]}\n{err}"


def test_two_processes_with_jax_distributed():
    """2 processes × 4 CPU devices: each runs only its own shards, results as on one process."""
    import json
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    worker = HERE / "many_devices" / "multihost_worker.py"
    procs = [subprocess.Popen([sys.executable, str(worker), str(i), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240))
    finally:
        for p in procs:  # on a timeout or failure, leave nothing running
            if p.poll() is None:
                p.kill()
                p.communicate()
    results = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"worker failed ({p.returncode}):\n{out}\n{err[-4000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["process"] for r in results) == [0, 1]
    for r in results:
        assert r["ok"] and r["local_devices"] == 4 and r["global_devices"] == 8
        # this process's 4 devices, each on its (2, 4) rows; the weight whole
        assert sorted(map(tuple, map(lambda c: (c[0], tuple(c[1])), r["calls"]))) == (
            [("f", (2, 4))] * 8 + [("vjp", (2, 4))] * 4)
