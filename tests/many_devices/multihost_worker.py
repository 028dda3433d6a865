"""One of two processes (4 CPU devices each) running a per-shard op on 8 global devices.

``python multihost_worker.py PROCESS_ID PORT``: joins ``jax.distributed`` on
127.0.0.1:PORT, shards a global (16, 4) array over all 8 devices, runs an
anybind op under jit and jit(grad), and compares its own shards with a
single-process reference. Prints one JSON line; exits 1 on a mismatch.
"""
import json
import os
import sys
import threading

pid, port = int(sys.argv[1]), int(sys.argv[2])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                           initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import anybind as ab  # noqa: E402

lock, calls = threading.Lock(), []


def record(role, *arrays):
    with lock:
        calls.append([role] + [list(np.shape(a)) for a in arrays])


def f(x, w):
    record("f", x, w)
    return x * np.sin(w)[None, :]


def vjp(p, ct):
    x, w = p
    record("vjp", x, ct)
    return ct * np.sin(w)[None, :], (ct * x * np.cos(w)[None, :]).sum(0)


op = ab.bind(f, shape=ab.like(0), shard="b n, n -> b n", replicated=("n",), name="scale",
             vjp=vjp)
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
x_np = np.arange(64.0).reshape(16, 4) / 10
w_np = np.linspace(0.1, 0.9, 4)
x = jax.make_array_from_callback(x_np.shape, NamedSharding(mesh, P("x")), lambda i: x_np[i])
w = jax.make_array_from_callback(w_np.shape, NamedSharding(mesh, P()), lambda i: w_np[i])


def loss(fn):
    return lambda x, w: jnp.sum(fn(x, w) ** 2)


ref = lambda x, w: x * jnp.sin(w)[None, :]
y_ref = np.asarray(ref(x_np, w_np))
gx_ref, gw_ref = (np.asarray(g) for g in jax.grad(loss(ref), argnums=(0, 1))(x_np, w_np))
y = jax.jit(op)(x, w)
gx, gw = jax.jit(jax.grad(loss(op), argnums=(0, 1)))(x, w)
ok = all(np.allclose(s.data, want[s.index]) for arr, want in ((y, y_ref), (gx, gx_ref),
                                                             (gw, gw_ref))
         for s in arr.addressable_shards)
jax.block_until_ready((y, gx, gw))
print(json.dumps({"process": jax.process_index(), "local_devices": jax.local_device_count(),
                  "global_devices": jax.device_count(), "ok": bool(ok), "calls": calls,
                  "sharding": str(y.sharding.spec)}), flush=True)
jax.distributed.shutdown()
sys.exit(0 if ok else 1)
