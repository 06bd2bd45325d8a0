"""The compiled CPU module's thread pool under the matrix products that share it.

Products from the module's ``split_flops`` up to ``parallel_flops`` are cut into chunks that the
calling thread and the pool's workers claim, so which thread computes which part of the result
changes from call to call. These tests check that this never shows: every product gives the
same bits with one thread, with the default threads and with more threads than CPUs (the
1-thread result is the oracle for the bits, numpy's float64 product for the values); every
chunk is written exactly once (outputs start as NaN); and products issued from several Python
threads at once (which release the GIL) give those same bits.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from needle import backend_ndarray as nd

pytestmark = [
    pytest.mark.ndarray,
    pytest.mark.skipif(not nd.cpu().enabled(), reason="cpu() is not built here"),
]

# (m, n, p): below and across the split range, a narrow last sliver of B, fewer row blocks
# than chunks, and one just under the packed engine's threshold.
SIZES = [
    (40, 40, 40),
    (48, 48, 48),
    (64, 64, 64),
    (72, 73, 74),
    (37, 130, 90),
    (13, 200, 150),
    (100, 101, 102),
    (5, 300, 700),
    (250, 260, 270),
]
CALLS = 30  # repeated products per size: the worker joins some calls and misses others

# Run in a child with a given OMP_NUM_THREADS: every product of SIZES CALLS times into a buffer
# filled with NaN first; prints the thread count and, per size, the hex digest of the first
# result and whether every later call gave the same bytes.
CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np
    from needle import backend_ndarray as nd

    mod = nd.ndarray_backend_cpu
    sizes, calls = json.loads(sys.argv[1]), int(sys.argv[2])
    out = {"threads": mod.num_threads(), "products": []}
    for m, n, p in sizes:
        rng = np.random.default_rng(m * n * p)
        a = rng.standard_normal((m, n)).astype(np.float32)
        b = rng.standard_normal((n, p)).astype(np.float32)
        A, B = mod.Array(a.size), mod.Array(b.size)
        mod.from_numpy(a.ravel(), A)
        mod.from_numpy(b.ravel(), B)
        digests = []
        for _ in range(calls):
            C = mod.Array(m * p)
            mod.fill(C, float("nan"))
            mod.matmul_strided(A, (n, 1), 0, B, (p, 1), 0, C, (), m, n, p)
            got = mod.to_numpy(C, (m, p), (p, 1), 0)
            digests.append(hashlib.sha256(got.tobytes()).hexdigest())
        exact = a.astype(np.float64) @ b.astype(np.float64)
        err = float(np.abs(got - exact).max() / (np.abs(exact).max() + 1))
        out["products"].append(
            {"digest": digests[0], "stable": len(set(digests)) == 1, "err": err,
             "nan": bool(np.isnan(got).any())}
        )
    print(json.dumps(out))
    """
)


def run_child(threads: int | None) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(SIZES), str(CALLS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_split_range_covers_the_sizes():
    """The sizes above reach into the shared range, and the largest stays below the packed
    engine (so every one of them takes the chunked path)."""
    g = nd.ndarray_backend_cpu.__gemm__
    flops = [m * n * p for m, n, p in SIZES]
    assert min(flops) < g["split_flops"] <= max(flops) < g["parallel_flops"]
    assert sum(g["split_flops"] <= f for f in flops) >= 6


def test_shared_products_give_the_one_thread_bits():
    """One thread, the default count and 4 threads (more than this machine's CPUs, so chunks
    are claimed by threads that get preempted) give identical bytes, call after call, with
    every element written, within float32 rounding of numpy's float64 product."""
    one, default, four = run_child(1), run_child(None), run_child(4)
    assert one["threads"] == 1 and four["threads"] == 4
    for (m, n, p), r1, rd, r4 in zip(SIZES, one["products"], default["products"], four["products"]):
        label = f"{m}x{n}x{p}"
        for r in (r1, rd, r4):
            assert not r["nan"], f"{label}: an element was never written"
            assert r["stable"], f"{label}: repeated calls gave different bytes"
            assert r["err"] < 1e-5 * np.sqrt(n), f"{label}: relative error {r['err']}"
        assert rd["digest"] == r1["digest"], f"{label}: default threads differ from one thread"
        assert r4["digest"] == r1["digest"], f"{label}: 4 threads differ from one thread"


def test_products_from_several_python_threads_at_once():
    """Python threads issuing shared-range products together (the kernels release the GIL, so
    callers meet in the pool) get the bytes each product gives alone."""
    mod = nd.ndarray_backend_cpu
    cases = []
    for m, n, p in [(72, 73, 74), (64, 64, 64), (100, 101, 102), (13, 200, 150)]:
        rng = np.random.default_rng(m + n + p)
        a = rng.standard_normal((m, n)).astype(np.float32)
        b = rng.standard_normal((n, p)).astype(np.float32)
        A, B = mod.Array(a.size), mod.Array(b.size)
        mod.from_numpy(a.ravel(), A)
        mod.from_numpy(b.ravel(), B)

        def product(A=A, B=B, m=m, n=n, p=p):
            C = mod.Array(m * p)
            mod.fill(C, float("nan"))
            mod.matmul_strided(A, (n, 1), 0, B, (p, 1), 0, C, (), m, n, p)
            return mod.to_numpy(C, (m, p), (p, 1), 0).tobytes()

        cases.append((product, product()))
    errors = []

    def work(offset: int):
        for i in range(60):
            product, expected = cases[(i + offset) % len(cases)]
            if product() != expected:
                errors.append((offset, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"products differing from their bytes alone: {errors[:5]}"
