#!/usr/bin/env bash
# GPU check of needle's CUDA backend, in one call on a machine with an NVIDIA GPU and nvcc.
#
#   bash benchmarks/gpu_check.sh          (from a fresh checkout; about 2-4 minutes)
#
# 1. builds the compiled modules in place, like `make build` (plain CMake; no network needed:
#    it uses $PYTHON, default python3, with the numpy, pybind11, pytest and hypothesis it has),
#    for this GPU's architecture only (CUDA_ARCH=90 etc. overrides);
# 2. runs the NDArray suites and tests/test_cuda_backend.py on the cuda() device;
# 3. prints matmul GFLOP/s at 1024^3 and 4096^3 (and PyTorch's fp32 figure, TF32 off, when
#    PyTorch with CUDA is installed), plus element-wise and reduction bandwidth.
# Exit status: non-zero when the build, a test or a result check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
status=0

echo "== GPU"
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -1
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
  | head -1 | tr -d ' .')}
ARCH=${ARCH:-90}

echo "== build (CUDA architecture $ARCH)"
start=$(date +%s)
mkdir -p build
log=build/gpu-check.log
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
rm -f needle/backend_ndarray/ndarray_backend_cuda*.so
cmake -S . -B build/gpu-check "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DPython_EXECUTABLE="$(command -v "$PY")" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >"$log" 2>&1 \
  && cmake --build build/gpu-check -j "$(nproc)" >>"$log" 2>&1
if [ $? -ne 0 ] || ! ls needle/backend_ndarray/ndarray_backend_cuda*.so >/dev/null 2>&1; then
  tail -40 "$log"
  echo "BUILD FAILED (or built without the CUDA module: is nvcc on PATH?)"
  exit 1
fi
grep -i "warning" "$log" | head -20
echo "built in $(( $(date +%s) - start )) s"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'EOF' || exit 1
import needle as ndl
from needle.backend_ndarray import ndarray_backend_cuda as m
print(f"is_available={m.is_available()} device_count={m.device_count()} "
      f"cuda().enabled()={ndl.cuda().enabled()}")
assert ndl.cuda().enabled(), "the CUDA module is built but sees no GPU"
EOF

echo "== tests on cuda()"
tests=(tests/test_cuda_backend.py)
for f in tests/test_ndarray*.py; do [ -e "$f" ] && tests+=("$f"); done
# -k cuda: all of test_cuda_backend.py, and the cuda() cases of the NDArray suites
"$PY" -m pytest "${tests[@]}" -q -p no:cacheprovider -k cuda 2>&1 || status=1

echo "== benchmarks"
"$PY" - <<'EOF' || status=1
import time

import numpy as np

from needle.backend_ndarray import ndarray_backend_cuda as m


def upload(x):
    a = m.Array(x.size)
    m.from_numpy(np.ascontiguousarray(x, np.float32), a)
    return a


def timed(fn, reps, sync=m.synchronize):
    """Seconds per call of fn, after one warm-up call."""
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps


rng = np.random.default_rng(0)
for n, reps in [(1024, 50), (4096, 10)]:
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    da, db, out = upload(a), upload(b), m.Array(n * n)
    t = timed(lambda: m.matmul(da, db, out, n, n, n), reps)
    line = f"matmul {n}^3: needle {2 * n**3 / t / 1e9:9.1f} GFLOP/s ({t * 1e3:.2f} ms)"
    got = m.to_numpy(out, (n, n), (n, 1), 0)
    rows = rng.choice(n, 16, replace=False)
    ref = a[rows].astype(np.float64) @ b.astype(np.float64)
    err = np.abs(got[rows] - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"matmul {n}: relative error {err:.2e}"
    try:
        import torch

        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            torch.cuda.synchronize()
            tt = timed(lambda: ta @ tb, reps, torch.cuda.synchronize)
            line += f"; torch fp32 {2 * n**3 / tt / 1e9:9.1f} GFLOP/s (needle/torch {tt / t:.2f})"
    except ImportError:
        pass
    print(line, f"[max rel. error {err:.1e}]")

n = 1 << 26  # 256 MiB per array
x = upload(rng.standard_normal(n, np.float32))
y, out = upload(rng.standard_normal(n, np.float32)), m.Array(n)
t = timed(lambda: m.ewise_add(x, y, out), 10)
print(f"ewise_add over {n} floats: {3 * 4 * n / t / 1e9:.0f} GB/s")
s = m.Array(1)
t = timed(lambda: m.reduce_sum(x, s, n), 10)
print(f"reduce_sum of {n} floats into 1: {4 * n / t / 1e9:.0f} GB/s")
rows = m.Array(n // 256)
t = timed(lambda: m.reduce_sum(x, rows, 256), 10)
print(f"reduce_sum of rows of 256: {4 * n / t / 1e9:.0f} GB/s")
t = timed(lambda: m.compact(x, out, (8192, 8192), (1, 8192), 0), 10)
print(f"compact of an 8192x8192 transpose: {2 * 4 * n / t / 1e9:.0f} GB/s")
EOF

echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
