#!/usr/bin/env bash
# Everything GPU at once, on a machine with a CUDA GPU, nvcc, JAX's CUDA plugin, CuPy
# and (for the bridges) a CUDA torch: the environment, the C handlers built for this
# Python, the gpu-marked tests, and benchmarks/gpu_compiled.py. Run from the checkout:
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh
#
# Writes env.txt, build.log, tests.log, docs.log, gpu_compiled.json and bench.log under
# $OUT. ONLY=checks,python,... picks the benchmark's sections.
set -u
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY --version
  $PY -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|cupy|torch |numpy|numba|finufft|cufinufft)'
  nvcc --version | tail -2
  echo "cufinufft: $($PY -c 'import cufinufft; print(cufinufft.__version__)' 2>&1 | tail -1)"
  echo "libcufft on the loader path:"; ldconfig -p | grep -i cufft
  echo "cufft in pip packages:"; $PY - <<'EOF'
import glob, site
for d in site.getsitepackages():
    print("\n".join(sorted(glob.glob(f"{d}/nvidia/**/libcufft*.so*", recursive=True))))
EOF
  echo "cufft in the CUDA toolkit:"; ls /usr/local/cuda/lib64/ 2>/dev/null | grep -i cufft
  ls /usr/local/cuda/include/cufft.h 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
$PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1; echo "build: $?"
timeout 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_compiled.py \
  tests/test_gpu.py -W "ignore::FutureWarning" > "$OUT/tests.log" 2>&1
echo "tests: $?"; tail -15 "$OUT/tests.log"
timeout 120 $PY tests/test_docs.py docs/guides/gpu.md > "$OUT/docs.log" 2>&1
echo "docs (gpu.md): $?"; tail -5 "$OUT/docs.log"
cd benchmarks && timeout 300 $PY gpu_compiled.py --json "$OUT/gpu_compiled.json" \
  --repeats "${REPEATS:-30}" --only "${ONLY:-checks,dispatch,in-program,python,bridges}" \
  > "$OUT/bench.log" 2>&1
echo "bench: $?"; cat "$OUT/bench.log" | tail -120
