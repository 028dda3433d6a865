"""The installed wheel as a user gets it: run from outside the checkout, with no C compiler.

`.ci/run` installs the repaired (manylinux) wheel into a fresh virtual environment and
runs this file there, with PATH holding only that environment and an empty shim cache,
so both C handlers must come from the wheel: a host op under jit(vmap(grad)) through the
Python FFI handler, and a compiled (Numba) op through the shim. cibuildwheel runs it on
every release wheel (pyproject's [tool.cibuildwheel]).
"""
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numba
import numpy as np

import anybind as ab
from anybind.cli import _info

jax.config.update("jax_enable_x64", True)

info = _info.gather()
here = Path(ab.__file__).resolve()
assert Path(sys.prefix).resolve() in here.parents, f"anybind imported from {here}, not the venv"
routes = info["routes"]
assert routes["python_handler"]["loaded"], json.dumps(routes, indent=1)
assert routes["compiled_shim"]["built"], json.dumps(routes, indent=1)
if os.environ.get("ANYBIND_SMOKE_NO_COMPILER"):  # .ci/wheel; cibuildwheel's images have one
    assert routes["compiled_shim"]["compiler"] is None, "a C compiler is on PATH"
assert not info["shim_cache"]["exists"], "the shim cache is not empty"

# A host op under jit(vmap(grad)), with its rules in NumPy.
mul = ab.bind(lambda x1, x2: x1 * x2**2, shape=ab.like(0), vmap="vectorized", name="mul",
              jvp=lambda p, t: p[1]**2 * t[0] + 2 * p[0] * p[1] * t[1],
              vjp=lambda p, ct: (p[1]**2 * ct, 2 * p[0] * p[1] * ct))
x1, x2 = np.linspace(0.5, 2.0, 12).reshape(4, 3), np.linspace(-1.0, 1.0, 12).reshape(4, 3)
g = jax.jit(jax.vmap(jax.grad(lambda a, b: mul(a, b).sum(), argnums=1)))(x1, x2)
ref = jax.jit(jax.vmap(jax.grad(lambda a, b: (a * b**2).sum(), argnums=1)))(x1, x2)
np.testing.assert_allclose(g, ref, rtol=1e-12)


# A compiled op: a Numba cfunc of anybind's C convention, called by the shim.
@numba.cfunc(ab.numba_signature())
def cmul(ins, outs, shapes, ranks, dtypes, n_in, n_out, err, err_size):
    if dtypes[0] != 12 or dtypes[1] != 12:
        return 1
    n = 1
    for d in range(ranks[0]):
        n *= shapes[0][d]
    a, b = numba.carray(ins[0], n, np.float64), numba.carray(ins[1], n, np.float64)
    y = numba.carray(outs[0], n, np.float64)
    for i in range(n):
        y[i] = a[i] * b[i] ** 2
    return 0


op = ab.bind(cmul, shape=ab.like(0), name="cmul")
np.testing.assert_allclose(jax.jit(op)(x1, x2), x1 * x2**2, rtol=1e-15)
np.testing.assert_allclose(jax.vmap(op)(jnp.asarray(x1), jnp.asarray(x2)), x1 * x2**2,
                           rtol=1e-15)
assert not _info.shim_cache()["exists"], "a shim was built: the wheel's was not used"
print(f"wheel smoke test passed: anybind {ab.__version__} from {here.parent}, "
      f"jax {jax.__version__}, host op under jit(vmap(grad)) and a compiled op")
