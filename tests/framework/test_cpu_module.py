"""What is specific to the compiled CPU module (``ndarray_backend_cpu``).

The device protocol itself (values and errors of every function on every module) is checked by
tests/framework/test_device_protocol.py; this file covers the compiled module's own machinery: each
instruction-set variant of the matrix-product engine (selected with NEEDLE_CPU_ISA in a child
process) against numpy at awkward sizes and layouts, the direct / blocked / threaded / batched
paths, the tiled lecture exhibit, the buffer cache and allocation counters, and hostile
arguments, which must raise and never crash.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from needle import backend_ndarray as nd

pytestmark = [
    pytest.mark.ndarray,
    pytest.mark.skipif(not nd.cpu().enabled(), reason="cpu() is not built here"),
]


@pytest.fixture(scope="module")
def mod():
    return nd.ndarray_backend_cpu


def put(mod, x: np.ndarray):
    """A module buffer holding the float32 array x (flattened, row-major)."""
    x = np.ascontiguousarray(x, dtype=np.float32).ravel()
    buf = mod.Array(x.size)
    mod.from_numpy(x, buf)
    return buf


def strided_product(mod, a_base, a_strides, a_offset, b_base, b_strides, b_offset, batch, m, n, p):
    """matmul_strided on views of the flat numpy buffers a_base and b_base; returns the result
    and numpy's product of the same views."""
    A = np.lib.stride_tricks.as_strided(
        a_base[a_offset:], (batch, m, n), [4 * s for s in a_strides]
    )
    B = np.lib.stride_tricks.as_strided(
        b_base[b_offset:], (batch, n, p), [4 * s for s in b_strides]
    )
    out = mod.Array(batch * m * p)
    mod.matmul_strided(
        put(mod, a_base),
        a_strides,
        a_offset,
        put(mod, b_base),
        b_strides,
        b_offset,
        out,
        batch,
        m,
        n,
        p,
    )
    got = mod.to_numpy(out, (batch, m, p), (m * p, p, 1), 0)
    return got, np.matmul(A.astype(np.float64), B.astype(np.float64))


# Layouts of a (batch, rows, cols) operand inside a flat buffer: (strides, offset, buffer size).
def layouts(batch, r, c):
    return {
        "compact": ((r * c, c, 1), 0, batch * r * c),
        "transposed": ((r * c, 1, r), 0, batch * r * c),
        "shared": ((0, c, 1), 0, r * c),  # one matrix for the whole batch
        "padded rows": ((r * (c + 3), c + 3, 1), 2, batch * r * (c + 3) + 2),
        "flipped": ((r * c, -c, 1), (r - 1) * c, batch * r * c),  # rows in reverse order
        "column stride 2": ((r * c * 2, c * 2, 2), 1, batch * r * c * 2 + 1),
    }


SIZES = [
    (1, 1, 1, 1),
    (2, 3, 5, 7),
    (1, 13, 1, 17),
    (3, 1, 33, 40),
    (2, 40, 29, 1),
    (1, 47, 48, 48),
    (1, 49, 48, 48),
    (2, 97, 130, 65),
    (1, 200, 300, 37),
]


def check_product(got, expected, n):
    tol = 2e-5 * np.sqrt(max(n, 1)) * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_strided_layouts(mod, size):
    """Every pair of operand layouts gives numpy's product, on the direct and blocked paths."""
    batch, m, n, p = size
    rng = np.random.default_rng(sum(size))
    la, lb = layouts(batch, m, n), layouts(batch, n, p)
    for (_, (sa, oa, za)), (_, (sb, ob, zb)) in zip(la.items(), list(lb.items())[::-1]):
        a = rng.standard_normal(za).astype(np.float32)
        b = rng.standard_normal(zb).astype(np.float32)
        got, expected = strided_product(mod, a, sa, oa, b, sb, ob, batch, m, n, p)
        check_product(got, expected, n)


def test_matmul_threads_and_batches(mod):
    """Products large enough to use the thread pool (including wide ones whose columns are
    split into groups, and ones with fewer row slivers than threads), mid-sized ones split by
    rows or columns without packing (sizes that leave a short last part), and batches of small
    products that run one product per thread, agree with numpy."""
    g = mod.__gemm__
    assert g["direct_flops"] < g["split_flops"] < g["parallel_flops"]
    rng = np.random.default_rng(7)
    for batch, m, n, p in [
        (1, 300, 400, 500),
        (300, 20, 20, 20),
        (4, 130, 140, 150),
        (1, 1, 3000, 2000),
        (1, 2000, 3000, 1),
        (1, 5, 400, 1100),
        (1, 30, 300, 2100),
        (1, 72, 73, 74),
        (1, 64, 64, 64),
        (1, 37, 130, 90),
        (1, 13, 200, 150),
        (1, 16, 128, 512),
        (1, 20, 150, 97),
        (3, 100, 101, 102),
        (40, 90, 100, 110),
        (1, 250, 260, 270),
        (1, 12, 1000, 2100),
    ]:
        a = rng.standard_normal(batch * m * n).astype(np.float32)
        b = rng.standard_normal(batch * n * p).astype(np.float32)
        got, expected = strided_product(
            mod, a, (m * n, n, 1), 0, b, (n * p, p, 1), 0, batch, m, n, p
        )
        check_product(got, expected, n)


def test_course_matmul_and_naive_agree_with_numpy(mod):
    rng = np.random.default_rng(8)
    for m, n, p in [(1, 1, 1), (5, 0, 3), (31, 17, 45), (128, 64, 96)]:
        a = rng.standard_normal((m, n)).astype(np.float32)
        b = rng.standard_normal((n, p)).astype(np.float32)
        for fn in (mod.matmul, mod.matmul_naive):
            out = mod.Array(m * p)
            fn(put(mod, a), put(mod, b), out, m, n, p)
            check_product(mod.to_numpy(out, (m, p), (p, 1), 0), a.astype(np.float64) @ b, n)


def to_tiles(x: np.ndarray, t: int) -> np.ndarray:
    r, c = x.shape
    return x.reshape(r // t, t, c // t, t).transpose(0, 2, 1, 3).copy()


def test_tiled_exhibit(mod):
    """matmul_tiled computes the product in the (rows/T, cols/T, T, T) layout, and refuses
    sizes that are not multiples of T."""
    t = mod.__tile_size__
    assert mod.__gemm__["tile"] == t
    rng = np.random.default_rng(9)
    m, n, p = 3 * t, 5 * t, 2 * t
    a = rng.standard_normal((m, n)).astype(np.float32)
    b = rng.standard_normal((n, p)).astype(np.float32)
    out = mod.Array(m * p)
    mod.matmul_tiled(put(mod, to_tiles(a, t)), put(mod, to_tiles(b, t)), out, m, n, p)
    got = mod.to_numpy(out, (m // t, p // t, t, t), (p * t, t * t, t, 1), 0)
    check_product(got, to_tiles(a.astype(np.float64) @ b, t), n)
    with pytest.raises(ValueError, match="multiples of the tile size"):
        mod.matmul_tiled(put(mod, a), put(mod, b), out, m, n - 1, p)


ISA_SCRIPT = textwrap.dedent("""
    import json, warnings, numpy as np
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from needle.backend_ndarray import ndarray_backend_cpu as mod
    rng = np.random.default_rng(0)
    worst = 0.0
    for batch, m, n, p, ta, tb in [(1, 37, 71, 53, False, True), (3, 50, 300, 41, True, False),
                                   (2, 130, 257, 70, True, True), (1, 8, 8, 8, False, False),
                                   (1, 13, 300, 1100, False, False),
                                   (1, 25, 60, 70, False, False),
                                   (1, 72, 73, 74, False, False), (1, 61, 90, 80, False, False),
                                   (1, 16, 128, 512, False, False)]:
        A = rng.standard_normal((batch, m, n)).astype(np.float32)
        B = rng.standard_normal((batch, n, p)).astype(np.float32)
        a = np.ascontiguousarray(A.transpose(0, 2, 1) if ta else A).ravel()
        b = np.ascontiguousarray(B.transpose(0, 2, 1) if tb else B).ravel()
        abuf, bbuf, out = mod.Array(a.size), mod.Array(b.size), mod.Array(batch * m * p)
        mod.from_numpy(a, abuf); mod.from_numpy(b, bbuf)
        sa = (m * n, 1, m) if ta else (m * n, n, 1)
        sb = (n * p, 1, n) if tb else (n * p, p, 1)
        mod.matmul_strided(abuf, sa, 0, bbuf, sb, 0, out, batch, m, n, p)
        got = mod.to_numpy(out, (batch, m, p), (m * p, p, 1), 0)
        ref = A.astype(np.float64) @ B
        worst = max(worst, float(np.abs(got - ref).max() / (np.sqrt(n) * np.abs(ref).max())))
    x = rng.standard_normal((300, 517)).astype(np.float32)
    x[7, 100] = np.nan
    xb, o = mod.Array(x.size), mod.Array(300)
    mod.from_numpy(x.ravel(), xb)
    mod.reduce(1, xb, (300, 517), (517, 1), 0, 1, o)
    maxes = mod.to_numpy(o, (300,), (1,), 0)
    mod.reduce(0, xb, (300, 517), (517, 1), 0, 1, o)
    sums = mod.to_numpy(o, (300,), (1,), 0)
    with np.errstate(invalid="ignore"):
        ok_max = bool(np.array_equal(maxes, x.max(axis=1), equal_nan=True))
        ok_sum = bool(np.allclose(sums, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4,
                                  equal_nan=True))
    print(json.dumps({"isa": mod.__gemm__["isa"], "worst": worst, "max": ok_max, "sum": ok_sum,
                      "warnings": [str(w.message) for w in caught]}))
""")


def run_with_isa(isa: str) -> dict:
    env = dict(os.environ, NEEDLE_CPU_ISA=isa)
    res = subprocess.run(
        [sys.executable, "-c", ISA_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
def test_every_instruction_set_agrees_with_numpy(mod, isa):
    """Each variant this CPU can run (NEEDLE_CPU_ISA) computes products and reductions as
    numpy does."""
    if isa not in mod.__gemm__["available"]:
        pytest.skip(f"this CPU cannot run the {isa} kernels")
    result = run_with_isa(isa)
    assert result["isa"] == isa and not result["warnings"]
    assert result["worst"] < 1e-5
    assert result["max"] and result["sum"]


def test_unknown_instruction_set_warns_and_falls_back(mod):
    result = run_with_isa("avx9000")
    assert result["isa"] == mod.__gemm__["available"][0]
    assert any("NEEDLE_CPU_ISA=avx9000" in w for w in result["warnings"])


def test_gemm_description(mod):
    """__gemm__ describes the engine in use: its ISA (one of those available) and blocking."""
    g = mod.__gemm__
    assert g["isa"] in g["available"] and g["isa"] == mod.__matmul_kernel__
    assert g["MC"] % g["MR"] == 0 and g["NR"] % g["VW"] == 0 and g["KC"] > 0


def test_broadcast_and_permuted_operands_on_threads(mod):
    """Large strided element-wise ops and reductions (on the thread pool) agree with numpy."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((600, 700)).astype(np.float32)
    row = rng.standard_normal(700).astype(np.float32)
    col = rng.standard_normal(600).astype(np.float32)
    X, R, C = put(mod, x), put(mod, row), put(mod, col)
    out = mod.Array(x.size)
    add, mx = mod.__binary_ops__.index("add"), mod.__binary_ops__.index("maximum")
    mod.ewise_binary(add, X, (700, 1), 0, R, (0, 1), 0, out, (600, 700))
    np.testing.assert_array_equal(mod.to_numpy(out, (600, 700), (700, 1), 0), x + row)
    mod.ewise_binary(mx, X, (700, 1), 0, C, (1, 0), 0, out, (600, 700))
    np.testing.assert_array_equal(
        mod.to_numpy(out, (600, 700), (700, 1), 0), np.maximum(x, col[:, None])
    )
    y = rng.standard_normal((700, 600)).astype(np.float32)
    mod.ewise_binary(add, X, (1, 700), 0, put(mod, y), (600, 1), 0, out, (700, 600))  # x.T + y
    np.testing.assert_array_equal(mod.to_numpy(out, (700, 600), (600, 1), 0), x.T + y)
    exp = mod.__unary_ops__.index("exp")
    mod.ewise_unary(exp, X, (1, 700), 0, out, (700, 600))
    np.testing.assert_allclose(mod.to_numpy(out, (700, 600), (600, 1), 0), np.exp(x.T), rtol=1e-6)
    for op, ref in ((0, np.sum), (1, np.max)):
        o = mod.Array(700)
        mod.reduce(op, X, (700, 600), (1, 700), 0, 1, o)  # over axis 0 of x
        np.testing.assert_allclose(
            mod.to_numpy(o, (700,), (1,), 0),
            ref(x.astype(np.float64), axis=0),
            rtol=1e-5,
            atol=1e-4,
        )
        o = mod.Array(1)
        mod.reduce(op, X, (600, 700), (700, 1), 0, 0, o)
        np.testing.assert_allclose(mod.to_numpy(o, (), (), 0), ref(x.astype(np.float64)), rtol=1e-5)


def test_buffer_cache_reports_and_empties(mod):
    """cache_info reports what the cache keeps (never above its cap); cache_clear empties it."""
    mod.cache_clear()
    assert mod.cache_info()["bytes"] == 0 and mod.cache_info()["buffers"] == 0
    size = mod.cache_info()["min_bytes"] // 4 + 1000
    bufs = [mod.Array(size) for _ in range(3)]
    del bufs
    info = mod.cache_info()
    assert info["buffers"] == 3 and 3 * size * 4 <= info["bytes"] <= info["cap_bytes"]
    again = mod.Array(size)  # reuses a cached buffer
    assert mod.cache_info()["buffers"] == 2
    del again
    big = mod.cache_info()["max_buffer_bytes"] // 4 - 1000
    many = [mod.Array(big) for _ in range(mod.cache_info()["cap_bytes"] // (big * 4) + 1)]
    del many  # more than the cap: the oldest are freed
    assert 0 < mod.cache_info()["bytes"] <= mod.cache_info()["cap_bytes"]
    mod.cache_clear()
    assert mod.cache_info()["bytes"] == 0 and mod.cache_info()["buffers"] == 0


def test_buffer_cache_keeps_mid_sized_buffers(mod):
    """Buffers from 64 KiB (an attention matrix, a layer's activations) are reused when the
    next allocation has their size, so a training step stops page-faulting fresh heap memory;
    smaller ones go back to malloc."""
    mod.cache_clear()
    assert mod.cache_info()["min_bytes"] == 64 << 10
    a = mod.Array((256 << 10) // 4)
    first = a.ptr()
    del a
    assert mod.cache_info()["buffers"] == 1
    assert mod.Array((256 << 10) // 4).ptr() == first  # the same buffer, handed back
    del_small = mod.Array(1000)
    del del_small
    assert mod.cache_info()["buffers"] == 1  # the freed 4 KB buffer was not kept
    mod.cache_clear()


def test_memory_stats_follow_allocations(mod):
    before = mod.memory_stats()["live_bytes"]
    mod.reset_peak()
    a = mod.Array(1 << 20)
    live = mod.memory_stats()["live_bytes"]
    assert live - before >= 4 << 20
    del a
    stats = mod.memory_stats()
    assert stats["live_bytes"] == before and stats["peak_bytes"] >= live


HUGE = 2**40


def hostile_calls(mod) -> dict:
    """Calls that must raise ValueError, by what is wrong with them."""
    a, b, out = mod.Array(16), mod.Array(16), mod.Array(16)
    return {
        "negative m": lambda: mod.matmul_strided(
            a, (0, 4, 1), 0, b, (0, 4, 1), 0, out, 1, -1, 4, 4
        ),
        "negative batch": lambda: mod.matmul_strided(
            a, (0, 4, 1), 0, b, (0, 4, 1), 0, out, -2, 4, 4, 4
        ),
        "huge m": lambda: mod.matmul_strided(a, (0, 4, 1), 0, b, (0, 4, 1), 0, out, 1, HUGE, 4, 4),
        "huge batch, stride 0": lambda: mod.matmul_strided(
            a, (0, 4, 1), 0, b, (0, 4, 1), 0, out, HUGE, 4, 4, 4
        ),
        "two strides": lambda: mod.matmul_strided(a, (4, 1), 0, b, (0, 4, 1), 0, out, 1, 4, 4, 4),
        "view past the end": lambda: mod.matmul_strided(
            a, (0, 4, 1), 1, b, (0, 4, 1), 0, out, 1, 4, 4, 4
        ),
        "out too small": lambda: mod.matmul_strided(
            a, (0, 4, 1), 0, b, (0, 4, 1), 0, mod.Array(3), 1, 4, 4, 4
        ),
        "matmul huge": lambda: mod.matmul(a, b, out, HUGE, HUGE, HUGE),
        "matmul negative": lambda: mod.matmul(a, b, out, 4, -4, 4),
        "tiled negative": lambda: mod.matmul_tiled(a, b, out, -8, 8, 8),
        "ewise huge shape": lambda: mod.ewise_binary(
            0, a, (0, 0), 0, b, (0, 0), 0, out, (HUGE, HUGE)
        ),
        "ewise negative dim": lambda: mod.ewise_unary(0, a, (1,), 0, out, (-16,)),
        "ewise strides length": lambda: mod.ewise_unary(0, a, (1, 1), 0, out, (16,)),
        "ewise negative offset": lambda: mod.ewise_unary(0, a, (1,), -1, out, (16,)),
        "ewise bad op": lambda: mod.ewise_binary(99, a, (1,), 0, b, (1,), 0, out, (16,)),
        "unary bad op": lambda: mod.ewise_unary(-1, a, (1,), 0, out, (16,)),
        "scalar out size": lambda: mod.ewise_scalar(
            0, a, (1,), 0, 1.0, mod.Array(15), (16,), False
        ),
        "reduce keep": lambda: mod.reduce(0, a, (4, 4), (4, 1), 0, 3, out),
        "reduce negative keep": lambda: mod.reduce(0, a, (4, 4), (4, 1), 0, -1, out),
        "reduce bad op": lambda: mod.reduce(2, a, (4, 4), (4, 1), 0, 1, mod.Array(4)),
        "reduce huge stride": lambda: mod.reduce(0, a, (4, 4), (HUGE, 1), 0, 1, mod.Array(4)),
        "empty max": lambda: mod.reduce(1, a, (4, 0), (4, 1), 0, 1, mod.Array(4)),
        "course reduce size": lambda: mod.reduce_sum(a, out, HUGE),
        "compact huge": lambda: mod.compact(a, out, (HUGE, HUGE, HUGE), (0, 0, 0), 0),
        "setitem negative stride": lambda: mod.ewise_setitem(a, out, (16,), (-1,), 0),
        "softmax label": lambda: mod.softmax_xent(
            a, put(mod, np.full(4, 4.0)), 4, 4, mod.Array(4), mod.Array(16)
        ),
        "softmax sizes": lambda: mod.softmax_xent(a, mod.Array(4), HUGE, HUGE, mod.Array(4), out),
        "layernorm sizes": lambda: mod.layernorm_fwd(a, b, b, 4, 4, 1e-5, out, out, mod.Array(3)),
        "batchnorm no rows": lambda: mod.batchnorm_fwd(a, b, b, 0, 16, 1e-5, out, out, b, b, b),
        "lstm sizes": lambda: mod.lstm_cell_fwd(a, b, 1, 4, out, out, out, out),
        "adam step": lambda: mod.adam_update(a, b, out, out, 0.1, 0.9, 0.99, 1e-8, 0.0, 0),
        "sgd sizes": lambda: mod.sgd_update(a, mod.Array(15), out, 0.1, 0.9, 0.0),
        "negative Array": lambda: mod.Array(-1),
    }


def test_hostile_arguments_raise_value_errors(mod):
    """Huge, negative and inconsistent sizes are ValueErrors, never a crash."""
    for what, call in hostile_calls(mod).items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what} did not raise")


def test_labels_are_checked_before_anything_is_written(mod):
    logits = put(mod, np.zeros(8))
    loss = put(mod, np.full(2, 7.0))
    with pytest.raises(ValueError, match="label"):
        mod.softmax_xent(logits, put(mod, np.array([1.0, 4.0])), 2, 4, loss, mod.Array(8))
    with pytest.raises(ValueError, match="label"):
        mod.softmax_xent(logits, put(mod, np.array([0.5, 1.0])), 2, 4, loss, mod.Array(8))
    np.testing.assert_array_equal(mod.to_numpy(loss, (2,), (1,), 0), [7.0, 7.0])


def test_array_is_a_sized_aligned_buffer_with_checked_sizes(mod):
    """Array(size): a buffer of ``size`` float32 elements, 64-byte aligned; the size may be
    given by keyword or as any integer (numpy's too); other kinds are TypeErrors, negative and
    too large sizes ValueErrors naming the size."""
    for size in (0, 1, 17, np.int64(5)):
        a = mod.Array(size)
        assert a.size == int(size) and a.ptr() % 64 == 0
    assert mod.Array(size=3).size == 3
    for bad in (1.5, None, "4", np.float32(2.0)):
        with pytest.raises(TypeError):
            mod.Array(bad)
    with pytest.raises(TypeError):
        mod.Array()
    with pytest.raises(TypeError):
        mod.Array(4, 5)
    for huge in (1 << 61, 1 << 70, -(1 << 70)):
        with pytest.raises(ValueError, match="Array size"):
            mod.Array(huge)
    with pytest.raises(ValueError, match="non-negative, got -1"):
        mod.Array(-1)
    del a
    before = mod.memory_stats()["live_bytes"]
    a = mod.Array(1000)  # 4000 bytes, rounded up to 64
    assert mod.memory_stats()["live_bytes"] == before + 4032
    del a  # a dropped Array gives its bytes back
    assert mod.memory_stats()["live_bytes"] == before


def test_none_and_wrong_kinds_are_type_errors(mod):
    a = mod.Array(4)
    for call in (
        lambda: mod.ewise_add(a, None, a),
        lambda: mod.ewise_add(a, a, np.zeros(4, np.float32)),
        lambda: mod.fill(a.ptr(), 1.0),
        lambda: mod.ewise_exp(a, "out"),
        lambda: mod.matmul(a, None, a, 2, 2, 1),
        lambda: mod.reduce(0, a, (4,), (1,), 0, 0, None),
        lambda: mod.softmax_xent(a, a, 2, 2, None, a),
        lambda: mod.ewise_binary(0, a, (1,), 0, a, (1.5,), 0, a, (4,)),
        lambda: mod.matmul_strided(a, "abc", 0, a, (0, 2, 1), 0, a, 1, 2, 2, 2),
    ):
        with pytest.raises(TypeError):
            call()


def test_small_calls_keep_working_from_threads(mod):
    """Kernels called from several Python threads at once (small ones keep the GIL, large ones
    release it) give the same results as alone."""
    import threading

    rng = np.random.default_rng(12)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    X = put(mod, x)
    expected = x.astype(np.float64) @ x
    errors = []

    def work():
        for _ in range(5):
            total = mod.Array(x.size)  # a course entry point above the size that frees the GIL
            mod.ewise_add(X, X, total)
            pair = mod.Array(2)
            mod.ewise_add(put(mod, x[0, :2]), put(mod, x[1, :2]), pair)
            try:
                np.testing.assert_array_equal(mod.to_numpy(total, x.shape, (256, 1), 0), x + x)
                first_two = mod.to_numpy(pair, (2,), (1,), 0)
                np.testing.assert_array_equal(first_two, x[0, :2] + x[1, :2])
            except AssertionError as e:  # pragma: no cover - reported below
                errors.append(e)
            out = mod.Array(x.size)
            mod.matmul_strided(X, (0, 256, 1), 0, X, (0, 256, 1), 0, out, 1, 256, 256, 256)
            small = mod.Array(4)
            mod.matmul_strided(X, (0, 256, 1), 0, X, (0, 256, 1), 0, small, 1, 2, 2, 2)
            try:
                check_product(mod.to_numpy(out, (256, 256), (256, 1), 0), expected, 256)
                check_product(
                    mod.to_numpy(small, (2, 2), (2, 1), 0),
                    x[:2, :2].astype(np.float64) @ x[:2, :2],
                    2,
                )
            except AssertionError as e:  # pragma: no cover - reported below
                errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("n, hw, c, stride", [(32, 4, 32, 1), (32, 8, 16, 2), (3, 4, 32, 1)])
def test_conv_gradients_keep_no_batch_sized_buffer(mod, n, hw, c, stride):
    # ResNet-9's small layers: the input adjoint works through groups of images and the weight
    # adjoint through blocks of rows (per-thread scratch), so neither holds an im2col matrix of
    # the whole batch (n·h_out·w_out × 9c floats) as an allocated array; values against numpy.
    rng = np.random.default_rng(n + hw)
    k, pad = 3, 1
    ho = (hw + 2 * pad - k) // stride + 1
    x = rng.standard_normal((n, hw, hw, c)).astype(np.float32)
    w = rng.standard_normal((k, k, c, c)).astype(np.float32)
    g = rng.standard_normal((n, ho, ho, c)).astype(np.float32)
    xb, wb, gb = put(mod, x), put(mod, w), put(mod, g)
    dx, dw = mod.Array(x.size), mod.Array(w.size)
    whole = n * ho * ho * k * k * c * 4
    mod.reset_peak()
    live = mod.memory_stats()["live_bytes"]
    mod.conv_input_grad(gb, wb, k, k, c, c, n, hw, hw, stride, pad, dx)
    mod.conv_weight_grad(xb, gb, n, hw, hw, c, k, k, c, stride, pad, dw)
    extra = mod.memory_stats()["peak_bytes"] - live
    if n >= mod.num_threads():  # (a batch smaller than the thread count keeps one product)
        assert extra < whole // 2, (extra, whole)
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    want_dx, want_dw = np.zeros_like(xp), np.zeros((k, k, c, c))
    for i in range(k):
        for j in range(k):
            win = xp[:, i : i + stride * ho : stride, j : j + stride * ho : stride, :]
            want_dw[i, j] = np.einsum("nhwc,nhwd->cd", win, g)
            want_dx[:, i : i + stride * ho : stride, j : j + stride * ho : stride, :] += np.einsum(
                "nhwd,cd->nhwc", g, w[i, j]
            )
    got_dx = mod.to_numpy(dx, x.shape, (hw * hw * c, hw * c, c, 1), 0)
    got_dw = mod.to_numpy(dw, w.shape, (k * c * c, c * c, c, 1), 0)
    np.testing.assert_allclose(got_dx, want_dx[:, pad:-pad, pad:-pad, :], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got_dw, want_dw, rtol=1e-4, atol=1e-3)
