#!/usr/bin/env bash
# GPU check of needle's CUDA backend, in one call on a machine with an NVIDIA GPU and nvcc.
#
#   bash benchmarks/gpu_check.sh          (from a fresh checkout; about 2-4 minutes)
#
# 1. builds the compiled modules in place, like `make build` (plain CMake; no network needed:
#    it uses $PYTHON, default python3, with the numpy, pybind11, pytest and hypothesis it has),
#    for this GPU's architecture only (CUDA_ARCH=90 etc. overrides);
# 2. runs tests/framework/test_cuda_backend.py and the cuda() cases of the device-protocol conformance
#    suite, the fused-kernel tests and the NDArray suites;
# 3. prints matmul GFLOP/s at 1024^3 and 4096^3 (and PyTorch's fp32 figure, TF32 off, when
#    PyTorch with CUDA is installed), the transposed and batched products, plus element-wise
#    (compact and broadcast) and reduction bandwidth.
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
tests=(tests/framework/test_cuda_backend.py)
for f in tests/framework/test_device_protocol.py tests/framework/test_fused.py tests/framework/test_ndarray*.py; do
  [ -e "$f" ] && tests+=("$f")
done
# -k cuda: all of test_cuda_backend.py, and the cuda() cases of the protocol conformance
# suite, the fused kernels and the NDArray suites
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

# transposed operands (BLAS trans flags: no copies) and a batch sharing one matrix
n = 2048
a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
da, db, out = upload(a), upload(b), m.Array(n * n)
for label, sa, sb, rows in [("A @ B", (0, n, 1), (0, n, 1), lambda: a[:8] @ b),
                            ("A.T @ B", (0, 1, n), (0, n, 1), lambda: a.T[:8] @ b),
                            ("A @ B.T", (0, n, 1), (0, 1, n), lambda: a[:8] @ b.T)]:
    t = timed(lambda: m.matmul_strided(da, sa, 0, db, sb, 0, out, 1, n, n, n), 20)
    got, ref = m.to_numpy(out, (8, n), (n, 1), 0), rows()  # the first 8 rows
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"matmul_strided {label}: relative error {err:.2e}"
    print(f"matmul_strided {label} {n}^3: {2 * n**3 / t / 1e9:9.1f} GFLOP/s [err {err:.1e}]")
batch, k = 64, 256
x = rng.standard_normal((batch, k, k), np.float32)
dx, w, out = upload(x), upload(b[:k, :k]), m.Array(batch * k * k)
t = timed(lambda: m.matmul_strided(dx, (k * k, k, 1), 0, w, (0, k, 1), 0, out, batch, k, k, k), 20)
got = m.to_numpy(out, (batch, k, k), (k * k, k, 1), 0)
err = np.abs(got[-1] - x[-1] @ b[:k, :k]).max() / np.abs(x[-1] @ b[:k, :k]).max()
assert err < 1e-5, f"batched matmul_strided: relative error {err:.2e}"
print(f"matmul_strided batch {batch} x {k}^3 (shared B): {2 * batch * k**3 / t / 1e9:9.1f} "
      f"GFLOP/s [err {err:.1e}]")

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
ADD, SUM, MAX = (m.__binary_ops__.index("add"), m.__reduce_ops__.index("sum"),
                 m.__reduce_ops__.index("max"))
t = timed(lambda: m.ewise_binary(ADD, x, (8192, 1), 0, y, (0, 1), 0, out, (8192, 8192)), 10)
print(f"ewise_binary with a broadcast row (8192x8192): {2 * 4 * n / t / 1e9:.0f} GB/s")
cols = m.Array(8192)
t = timed(lambda: m.reduce(SUM, x, (8192, 8192), (1, 8192), 0, 1, cols), 10)
print(f"reduce sum over axis 0 of 8192x8192 (no permute+compact): {4 * n / t / 1e9:.0f} GB/s")
t = timed(lambda: m.reduce(MAX, x, (8192, 8192), (8192, 1), 0, 1, cols), 10)
print(f"reduce max over axis 1 of 8192x8192: {4 * n / t / 1e9:.0f} GB/s")
got = m.to_numpy(cols, (8192,), (1,), 0)
ref = m.to_numpy(x, (8192, 8192), (8192, 1), 0).max(axis=1)
assert np.array_equal(got, ref), "reduce max over axis 1 differs from numpy"
EOF

echo "== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
