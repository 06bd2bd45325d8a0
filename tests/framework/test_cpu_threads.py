"""The compiled CPU module's thread pool under the matrix products that share it.

Products from the module's ``split_flops`` on are cut into chunks that the
calling thread and the pool's workers claim (row-major operands without packing, transposed
ones through the packed engine), and batches of smaller products from ``split_flops`` in all
run one product per thread, so which thread computes which part of the result changes from
call to call. These tests check that this never shows: every product gives the
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

# (batch, m, n, p, layout): below and across the split range, a narrow last sliver of B, fewer
# row blocks than chunks, one just under the packed engine's threshold and three above it (each
# thread packing its own B, split by rows and by columns: fewer rows than columns; and one B
# large enough to be packed once for both threads); transposed operands
# ("tn": A stored (n, m), "nt": B stored (p, n), as a linear layer's weight and input gradients
# read them); batches of products below the split size (per-head attention's 32^3).
SIZES = [
    (1, 40, 40, 40, "nn"),
    (1, 48, 48, 48, "nn"),
    (1, 64, 64, 64, "nn"),
    (1, 72, 73, 74, "nn"),
    (1, 37, 130, 90, "nn"),
    (1, 13, 200, 150, "nn"),
    (1, 100, 101, 102, "nn"),
    (1, 5, 300, 700, "nn"),
    (1, 250, 260, 270, "nn"),
    (1, 330, 310, 300, "nn"),
    (1, 100, 700, 400, "tn"),
    (1, 24, 1500, 1450, "nn"),
    (1, 128, 512, 128, "tn"),
    (1, 512, 128, 128, "nt"),
    (1, 72, 73, 74, "tn"),
    (64, 32, 32, 32, "nn"),
    (64, 32, 32, 32, "tn"),
    (12, 20, 30, 40, "nt"),
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
    for k, m, n, p, layout in sizes:
        rng = np.random.default_rng(k * m * n * p)
        a = rng.standard_normal((k, m, n)).astype(np.float32)
        b = rng.standard_normal((k, n, p)).astype(np.float32)
        # stored as the layout says; the strides read them back as (m, n) and (n, p)
        a_mem = a.transpose(0, 2, 1).copy() if layout == "tn" else a
        b_mem = b.transpose(0, 2, 1).copy() if layout == "nt" else b
        a_st = (m * n, 1, m) if layout == "tn" else (m * n, n, 1)
        b_st = (n * p, 1, n) if layout == "nt" else (n * p, p, 1)
        batch = (k,) if k > 1 else ()
        if k == 1:
            a_st, b_st = a_st[1:], b_st[1:]
        A, B = mod.Array(a.size), mod.Array(b.size)
        mod.from_numpy(a_mem.ravel(), A)
        mod.from_numpy(b_mem.ravel(), B)
        digests = []
        for _ in range(calls):
            C = mod.Array(k * m * p)
            mod.fill(C, float("nan"))
            mod.matmul_strided(A, a_st, 0, B, b_st, 0, C, batch, m, n, p)
            got = mod.to_numpy(C, (k, m, p), (m * p, p, 1), 0)
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
    """The sizes above reach into the shared range, three pass the packed engine's own
    threshold (B packed by each thread, split by rows and by columns, and B packed once for
    both), and the batches' products are below split_flops each but above it together."""
    g = nd.ndarray_backend_cpu.__gemm__
    flops = [m * n * p for _, m, n, p, _ in SIZES]
    assert min(flops) < g["split_flops"] <= max(flops)
    above = [(m, n, p) for _, m, n, p, _ in SIZES if m * n * p >= g["parallel_flops"]]
    own = [(m, p) for m, n, p in above if n * p < g["own_pack_floats"]]
    assert any(m >= p for m, p in own) and any(m < p for m, p in own) and len(own) < len(above)
    assert sum(g["split_flops"] <= f for f in flops) >= 6
    assert (
        sum(layout != "nn" and g["split_flops"] <= m * n * p for _, m, n, p, layout in SIZES) >= 3
    )
    batches = [(k, m * n * p) for k, m, n, p, _ in SIZES if k > 1]
    assert batches and all(f < g["split_flops"] <= k * f for k, f in batches)


def test_shared_products_give_the_one_thread_bits():
    """One thread, the default count and 4 threads (more than this machine's CPUs, so chunks
    are claimed by threads that get preempted) give identical bytes, call after call, with
    every element written, within float32 rounding of numpy's float64 product."""
    one, default, four = run_child(1), run_child(None), run_child(4)
    assert one["threads"] == 1 and four["threads"] == 4
    for (k, m, n, p, layout), r1, rd, r4 in zip(
        SIZES, one["products"], default["products"], four["products"]
    ):
        label = f"{k} x {m}x{n}x{p} {layout}"
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


# An LSTM layer forward and backward (the course LSTM LM's sizes and an odd batch): the hex
# digest of every output. The layer splits its batch rows among the threads for the whole
# sequence, so the thread count decides which thread runs which rows.
LSTM_CHILD = textwrap.dedent(
    """
    import hashlib, json
    import numpy as np
    from needle import backend_ndarray as nd

    mod = nd.ndarray_backend_cpu
    out = {"threads": mod.num_threads(), "digests": []}
    for steps, batch, hidden in [(32, 16, 128), (5, 7, 9)]:
        rng = np.random.default_rng(steps + batch + hidden)

        def buf(*shape, scale=1.0):
            b = mod.Array(int(np.prod(shape)))
            mod.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32).ravel(), b)
            return b

        xw, h0, c0 = buf(steps, batch, 4 * hidden), buf(batch, hidden), buf(batch, hidden)
        w = buf(hidden, 4 * hidden, scale=hidden ** -0.5)
        fwd = [mod.Array(n) for n in (steps * batch * hidden, batch * hidden, batch * hidden,
                                      steps * batch * 4 * hidden)]
        mod.lstm_layer_fwd(xw, h0, c0, w, batch, hidden, steps, *fwd)
        d_out, dh, dc = buf(steps, batch, hidden), buf(batch, hidden), buf(batch, hidden)
        bwd = [mod.Array(n) for n in (steps * batch * 4 * hidden, batch * hidden,
                                      batch * hidden, hidden * 4 * hidden)]
        mod.lstm_layer_bwd(d_out, dh, dc, fwd[3], fwd[0], h0, c0, w, batch, hidden, steps, *bwd)
        for b in fwd + bwd:
            data = mod.to_numpy(b, (b.size,), (1,), 0).tobytes()
            out["digests"].append(hashlib.sha256(data).hexdigest())
    print(json.dumps(out))
    """
)


def test_lstm_layer_gives_the_one_thread_bits():
    """The LSTM layer kernels give the same bytes with one thread, the default count and 3
    threads (row blocks of 16 rows: 16; 8 + 8; 5 + 5 + 6)."""
    results = {}
    for threads in (1, None, 3):
        env = dict(os.environ)
        env.pop("OMP_NUM_THREADS", None)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        done = subprocess.run(
            [sys.executable, "-c", LSTM_CHILD], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results[threads] = json.loads(done.stdout.splitlines()[-1])
    assert results[1]["threads"] == 1 and results[3]["threads"] == 3
    assert results[None]["digests"] == results[1]["digests"], "default threads differ"
    assert results[3]["digests"] == results[1]["digests"], "3 threads differ"
