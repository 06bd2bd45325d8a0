"""The CUDA device module ``ndarray_backend_cuda`` against numpy (hw3).

Two groups:

* Everywhere the module is built: it imports, has every name of the device protocol,
  ``is_available()`` agrees with ``device_count()`` and ``ndl.cuda().enabled()``, and without a
  GPU an allocation raises a RuntimeError that says CUDA is not available (no crash).
* GPU tests (skipped unless ``cuda().enabled()``): every protocol function on random shapes,
  strides (0 and negative too) and offsets, compared with independent numpy computations
  (fancy-index gathers for strided views, the numpy device module for element-wise ops);
  matmul at tile and non-tile sizes; reductions over short and very long rows; bad arguments
  raising ValueError at the border.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import needle as ndl
from needle import backend_ndarray as nd

pytestmark = pytest.mark.ndarray

mod = nd.ndarray_backend_cuda
ref = nd.ndarray_backend_numpy
GPU = mod is not None and nd.cuda().enabled()

needs_module = pytest.mark.skipif(mod is None, reason="the CUDA module is not built (no nvcc)")
needs_gpu = pytest.mark.skipif(not GPU, reason="no GPU: cuda() is not enabled here")

SETTINGS = settings(
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SEEDS = st.integers(0, 2**32 - 1)

PROTOCOL = [
    "Array",
    "to_numpy",
    "from_numpy",
    "fill",
    "compact",
    "ewise_setitem",
    "scalar_setitem",
    "ewise_add",
    "scalar_add",
    "ewise_mul",
    "scalar_mul",
    "ewise_div",
    "scalar_div",
    "scalar_power",
    "ewise_maximum",
    "scalar_maximum",
    "ewise_eq",
    "scalar_eq",
    "ewise_ge",
    "scalar_ge",
    "ewise_log",
    "ewise_exp",
    "ewise_tanh",
    "matmul",
    "reduce_max",
    "reduce_sum",
]


# ---- everywhere the module is built --------------------------------------------------------------
@needs_module
def test_module_has_the_device_protocol():
    assert mod.__device_name__ == "cuda"
    assert isinstance(mod.__tile_size__, int) and mod.__tile_size__ > 0
    missing = [name for name in PROTOCOL if not hasattr(mod, name)]
    assert not missing, f"missing from ndarray_backend_cuda: {missing}"
    # the numpy reference module defines the same protocol
    assert all(hasattr(ref, name) for name in PROTOCOL)


@needs_module
def test_is_available_matches_device_count_and_enabled():
    count = mod.device_count()
    assert isinstance(count, int) and count >= 0
    assert mod.is_available() == (count > 0)
    assert nd.cuda().enabled() == mod.is_available()
    assert ndl.cuda().enabled() == mod.is_available() or ndl.BACKEND == "np"


@needs_module
def test_negative_array_size_is_a_value_error():
    with pytest.raises(ValueError, match="non-negative"):
        mod.Array(-1)


@needs_module
@pytest.mark.skipif(GPU, reason="a GPU is visible")
@pytest.mark.parametrize("size", [0, 1, 1000])
def test_allocation_without_gpu_raises_runtime_error(size):
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        mod.Array(size)


@pytest.mark.skipif(GPU, reason="a GPU is visible")
def test_ndarray_on_cuda_without_gpu_raises():
    assert not nd.cuda().enabled()
    with pytest.raises(RuntimeError, match=r"cuda\(\)"):
        nd.array([1.0, 2.0], device=nd.cuda())


# ---- helpers for the GPU tests -------------------------------------------------------------------
def upload(x) -> "mod.Array":
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    a = mod.Array(x.size)
    mod.from_numpy(x, a)
    return a


def download(a) -> np.ndarray:
    return mod.to_numpy(a, (a.size,), (1,), 0)


def view_indices(shape, strides, offset) -> np.ndarray:
    """Buffer index of every element of the view, in row-major order (an independent oracle)."""
    idx = np.full(shape, offset, dtype=np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape((-1,) + (1,) * (len(shape) - k - 1))
    return idx


@st.composite
def any_view(draw, max_ndim=5):
    """(buffer size, shape, strides, offset): strides anywhere in [-7, 7], 0 included, so
    elements may repeat; the view lies inside the buffer with some slack on both sides."""
    ndim = draw(st.integers(0, max_ndim))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim)))
    strides = tuple(draw(st.lists(st.integers(-7, 7), min_size=ndim, max_size=ndim)))
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    offset = -lo + draw(st.integers(0, 3))
    size = offset + hi + 1 + draw(st.integers(0, 3))
    return size, shape, strides, offset


@st.composite
def injective_view(draw, max_ndim=4):
    """A view that NDArray can make (slices with any step sign, then a permutation) over a
    compact base: every element is a distinct buffer position, so scatters are deterministic."""
    ndim = draw(st.integers(0, max_ndim))
    base = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    base_strides = [int(np.prod(base[k + 1 :])) for k in range(ndim)]
    shape, strides, offset = [], [], 0
    for n, s in zip(base, base_strides):
        step = draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
        start = draw(st.integers(0, n - 1))
        count = len(range(start, n if step > 0 else -1, step))
        count = draw(st.integers(1, count))
        shape.append(count)
        strides.append(s * step)
        offset += start * s
    perm = draw(st.permutations(range(ndim)))
    size = int(np.prod(base)) + draw(st.integers(0, 3))
    return size, tuple(shape[p] for p in perm), tuple(strides[p] for p in perm), offset


def rand(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- memory and strided copies -------------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("size", [0, 1, 5, 1000, 100_003])
def test_round_trip_and_fill(size):
    x = rand(size, size)
    a = upload(x)
    assert a.size == size
    np.testing.assert_array_equal(download(a), x)
    mod.fill(a, 2.5)
    np.testing.assert_array_equal(download(a), np.full(size, 2.5, np.float32))


@needs_gpu
def test_ptr_is_stable_and_distinct():
    a, b = mod.Array(8), mod.Array(8)
    assert a.ptr() == a.ptr() and a.ptr() != b.ptr() and a.ptr() != 0
    assert mod.Array(0).size == 0


@needs_gpu
def test_from_numpy_converts_dtype_and_layout():
    x = np.arange(12, dtype=np.float64).reshape(3, 4).T  # float64, not C-contiguous
    a = mod.Array(12)
    mod.from_numpy(x, a)
    np.testing.assert_array_equal(download(a), x.astype(np.float32).reshape(-1))


@needs_gpu
@SETTINGS
@given(view=any_view(), seed=SEEDS)
def test_to_numpy_and_compact_match_a_gather(view, seed):
    size, shape, strides, offset = view
    buf = rand(seed, size)
    expected = buf[view_indices(shape, strides, offset)]
    a = upload(buf)
    got = mod.to_numpy(a, shape, strides, offset)
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    out = mod.Array(expected.size)
    mod.compact(a, out, shape, strides, offset)
    np.testing.assert_array_equal(download(out), expected.reshape(-1))


@needs_gpu
@SETTINGS
@given(view=injective_view(), seed=SEEDS)
def test_ewise_setitem_matches_a_scatter(view, seed):
    size, shape, strides, offset = view
    buf, src = rand(seed, size), rand(seed + 1, shape)
    idx = view_indices(shape, strides, offset).reshape(-1)
    assert len(np.unique(idx)) == idx.size
    expected = buf.copy()
    expected[idx] = src.reshape(-1)
    out = upload(buf)
    mod.ewise_setitem(upload(src), out, shape, strides, offset)
    np.testing.assert_array_equal(download(out), expected)


@needs_gpu
@SETTINGS
@given(view=any_view(), seed=SEEDS)
def test_scalar_setitem_matches_a_scatter(view, seed):
    size, shape, strides, offset = view
    buf = rand(seed, size)
    expected = buf.copy()
    expected[view_indices(shape, strides, offset).reshape(-1)] = -3.25
    out = upload(buf)
    mod.scalar_setitem(int(np.prod(shape)), -3.25, out, shape, strides, offset)
    np.testing.assert_array_equal(download(out), expected)


@needs_gpu
def test_strided_copies_at_max_dims_and_over_a_large_view():
    # 16 dimensions (the limit), a few of them longer than 1, with mixed-sign strides
    shape = (2, 1, 3, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 3, 1)
    strides = (-40, 5, 13, 0, 7, 0, 1, 2, 3, 3, 9, 9, 9, 9, -1, 4)
    offset = 45
    buf = rand(0, 200)
    a = upload(buf)
    np.testing.assert_array_equal(
        mod.to_numpy(a, shape, strides, offset), buf[view_indices(shape, strides, offset)]
    )
    # size-1 dimensions drop out and contiguous neighbours merge; 17 that cannot is too many
    mod.compact(a, mod.Array(1), (1,) * 17, (1,) * 17, 0)
    with pytest.raises(ValueError, match="more than 16 dimensions"):
        mod.compact(
            upload(np.zeros(9)), mod.Array(2**17), (2,) * 17, tuple(k % 2 for k in range(17)), 0
        )
    # a transposed view with more elements than one grid covers (grid-stride loop)
    rows, cols = 4099, 4097
    big = rand(1, rows * cols)
    out = mod.Array(rows * cols)
    mod.compact(upload(big), out, (cols, rows), (1, cols), 0)
    np.testing.assert_array_equal(download(out), big.reshape(rows, cols).T.reshape(-1))


@needs_gpu
def test_empty_views_are_no_ops():
    a = upload(np.arange(4))
    assert mod.to_numpy(a, (0, 3), (3, 1), 0).shape == (0, 3)
    mod.compact(a, mod.Array(0), (2, 0), (1, 1), 0)
    mod.scalar_setitem(0, 9.0, a, (0,), (1,), 2)
    np.testing.assert_array_equal(download(a), np.arange(4, dtype=np.float32))


# ---- element-wise --------------------------------------------------------------------------------
EWISE = ["ewise_add", "ewise_mul", "ewise_div", "ewise_maximum", "ewise_eq", "ewise_ge"]
SCALAR = ["scalar_add", "scalar_mul", "scalar_div", "scalar_maximum", "scalar_eq", "scalar_ge"]


def _run(module, name, *arrays, scalar=None):
    """Run ``module.name`` on fresh buffers of that module holding ``arrays``; numpy result."""
    bufs = []
    for x in arrays:
        b = module.Array(x.size)
        module.from_numpy(np.ascontiguousarray(x, np.float32), b)
        bufs.append(b)
    out = module.Array(arrays[0].size)
    args = [bufs[0]] + ([scalar] if scalar is not None else []) + bufs[1:] + [out]
    getattr(module, name)(*args)
    return module.to_numpy(out, (out.size,), (1,), 0)


@needs_gpu
@pytest.mark.parametrize("name", EWISE)
@pytest.mark.parametrize("size", [1, 33, 4097])
def test_ewise_ops_match_the_numpy_module(name, size):
    # small integers make ties, so eq / ge see both outcomes; b avoids 0 for the division
    a = np.random.default_rng(size).integers(-3, 4, size).astype(np.float32)
    b = np.random.default_rng(size + 1).integers(1, 4, size).astype(np.float32)
    b *= np.where(np.arange(size) % 2, 1, -1).astype(np.float32)
    np.testing.assert_allclose(_run(mod, name, a, b), _run(ref, name, a, b), rtol=1e-6)


@needs_gpu
@pytest.mark.parametrize("name", SCALAR)
@pytest.mark.parametrize("val", [-2.0, 0.5, 1.0])
def test_scalar_ops_match_the_numpy_module(name, val):
    a = np.random.default_rng(7).integers(-4, 5, 1000).astype(np.float32) / 2
    np.testing.assert_allclose(
        _run(mod, name, a, scalar=val), _run(ref, name, a, scalar=val), rtol=1e-6
    )


@needs_gpu
@pytest.mark.parametrize("val", [2.0, 3.0, 0.5, -1.0, -0.5, 0.0, 1.7])
def test_scalar_power_matches_the_numpy_module(val):
    a = np.abs(rand(int(abs(val) * 10), 777)) + 0.1
    np.testing.assert_allclose(
        _run(mod, "scalar_power", a, scalar=val),
        _run(ref, "scalar_power", a, scalar=val),
        rtol=2e-6,
    )
    signed = np.array([-2.0, -1.0, 0.0, 1.0, 3.0], np.float32)
    if float(val).is_integer():  # negative bases: defined for integer exponents only
        with np.errstate(divide="ignore"):
            expected = _run(ref, "scalar_power", signed, scalar=val)
        np.testing.assert_allclose(
            _run(mod, "scalar_power", signed, scalar=val), expected, rtol=2e-6
        )


@needs_gpu
@pytest.mark.parametrize("name", ["ewise_log", "ewise_exp", "ewise_tanh"])
def test_unary_ops_match_the_numpy_module(name):
    a = rand(3, 5000) * 4
    if name == "ewise_log":
        a = np.abs(a) + 1e-3
    np.testing.assert_allclose(_run(mod, name, a), _run(ref, name, a), rtol=2e-6, atol=1e-7)


@needs_gpu
def test_special_values_follow_numpy():
    nan, inf = np.float32("nan"), np.float32("inf")
    a = np.array([nan, 1.0, nan, -inf, 0.0, 2.0], np.float32)
    b = np.array([1.0, nan, nan, 3.0, 0.0, inf], np.float32)
    for name in ["ewise_maximum", "ewise_eq", "ewise_ge", "ewise_add", "ewise_div"]:
        with np.errstate(invalid="ignore"):
            expected = _run(ref, name, a, b)
        np.testing.assert_array_equal(_run(mod, name, a, b), expected, err_msg=name)
    np.testing.assert_array_equal(
        _run(mod, "scalar_maximum", a, scalar=0.5), np.maximum(a, np.float32(0.5))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(
            _run(mod, "ewise_log", np.array([0.0, -1.0], np.float32)),
            np.log(np.array([0.0, -1.0], np.float32)),
        )


@needs_gpu
def test_ewise_over_more_elements_than_one_grid_covers():
    n = 65535 * 256 + 1001  # beyond the largest grid: the grid-stride loop covers the rest
    a = np.arange(n, dtype=np.float32) % 1000
    out = _run(mod, "scalar_add", a, scalar=1.0)
    np.testing.assert_array_equal(out, a + 1)


# ---- matmul --------------------------------------------------------------------------------------
MATMUL_SIZES = [
    (1, 1, 1),
    (4, 4, 4),
    (8, 8, 8),
    (16, 16, 16),
    (64, 64, 64),
    (128, 128, 128),  # tile multiples
    (5, 7, 3),
    (1, 300, 1),
    (65, 33, 130),
    (129, 1, 257),
    (3, 1000, 2),
    (100, 9, 100),
    (2100, 40, 2100),  # enough output tiles for the 128x128-tile kernel on any GPU
]


@needs_gpu
@pytest.mark.parametrize("m,n,p", MATMUL_SIZES)
def test_matmul_matches_numpy(m, n, p):
    a, b = rand(m * n, (m, n)), rand(m + n + p, (n, p))
    out = mod.Array(m * p)
    mod.matmul(upload(a), upload(b), out, m, n, p)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(
        download(out).reshape(m, p), expected, rtol=1e-4, atol=1e-5 * np.sqrt(n) * 4
    )


@needs_gpu
def test_matmul_with_empty_sizes():
    out = mod.Array(6)
    mod.fill(out, 7.0)
    mod.matmul(mod.Array(0), mod.Array(0), out, 2, 0, 3)  # inner size 0: zeros
    np.testing.assert_array_equal(download(out), np.zeros(6, np.float32))
    mod.matmul(mod.Array(0), upload(np.ones(6)), mod.Array(0), 0, 2, 3)


@needs_gpu
def test_ndarray_matmul_and_views_on_cuda():
    dev = nd.cuda()
    x, y = rand(1, (37, 20)), rand(2, (45, 37))
    a, b = nd.array(x, device=dev), nd.array(y, device=dev)
    np.testing.assert_allclose(
        (a.permute((1, 0)) @ b.permute((1, 0))).numpy(), x.T @ y.T, rtol=1e-4, atol=1e-4
    )
    np.testing.assert_array_equal(a.flip((0, 1)).numpy(), x[::-1, ::-1])
    np.testing.assert_array_equal(a.pad(((1, 2), (0, 1))).numpy(), np.pad(x, ((1, 2), (0, 1))))
    np.testing.assert_allclose(a.sum(axis=0).numpy(), x.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(
        a.max(axis=1, keepdims=True).numpy(), x.max(axis=1, keepdims=True)
    )


# ---- reductions ----------------------------------------------------------------------------------
REDUCE_SHAPES = [
    (1, 1),
    (7, 1),
    (3, 33),
    (5, 1000),
    (4, 1024),
    (4, 1025),
    (2, 5000),
    (3, 100_003),
    (1, 1 << 20),
    (1000, 3),
    (200, 2000),
]


@needs_gpu
@pytest.mark.parametrize("rows,length", REDUCE_SHAPES)
def test_reductions_match_numpy(rows, length):
    x = rand(rows * length, (rows, length))
    a = upload(x)
    out = mod.Array(rows)
    mod.reduce_max(a, out, length)
    np.testing.assert_array_equal(download(out), x.max(axis=1))
    mod.reduce_sum(a, out, length)
    expected = x.astype(np.float64).sum(axis=1)
    # float32 accumulation error stays far below one element's magnitude, so a dropped or
    # doubled element fails
    np.testing.assert_allclose(
        download(out), expected, rtol=1e-5, atol=1e-7 * np.abs(x).sum(axis=1).max()
    )


@needs_gpu
def test_reductions_over_more_rows_than_one_grid_covers():
    rows = 65535 * 8 + 77  # one warp per row, 8 warps per block
    x = rand(5, (rows, 2))
    out = mod.Array(rows)
    mod.reduce_sum(upload(x), out, 2)
    np.testing.assert_allclose(download(out), x.sum(axis=1), rtol=1e-6, atol=1e-6)


@needs_gpu
def test_reductions_special_cases():
    x = np.array([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf]], np.float32)
    out = mod.Array(2)
    mod.reduce_max(upload(x), out, 3)
    np.testing.assert_array_equal(download(out), x.max(axis=1))  # NaN propagates like numpy
    # the input may be longer than out.size * reduce_size, as in the numpy module
    mod.reduce_sum(upload(np.arange(7)), out, 3)
    np.testing.assert_array_equal(download(out), [3.0, 12.0])
    # the course functions need reduce_size >= 1, as in the other modules; `reduce` takes
    # empty extents: the sum is 0, the max has no identity
    for fn in (mod.reduce_sum, mod.reduce_max):
        with pytest.raises(ValueError, match="must be positive"):
            fn(mod.Array(0), out, 0)
    mod.reduce(mod.__reduce_ops__.index("sum"), mod.Array(0), (2, 0), (0, 1), 0, 1, out)
    np.testing.assert_array_equal(download(out), [0.0, 0.0])
    with pytest.raises(ValueError, match="no identity"):
        mod.reduce(mod.__reduce_ops__.index("max"), mod.Array(0), (2, 0), (0, 1), 0, 1, out)


# ---- the border: bad arguments raise ValueError, CUDA failures RuntimeError ----------------------
@needs_gpu
def test_bad_arguments_raise_value_errors():
    a, out = upload(np.arange(12)), mod.Array(12)
    with pytest.raises(ValueError, match="outside the buffer of 12"):
        mod.compact(a, out, (3, 4), (4, 1), 1)
    with pytest.raises(ValueError, match="outside the buffer"):
        mod.to_numpy(a, (2, 2), (-1, 1), 0)
    with pytest.raises(ValueError, match="outside the buffer"):
        mod.to_numpy(a, (2,), (1,), -1)
    with pytest.raises(ValueError, match="differ in length"):
        mod.compact(a, out, (3, 4), (4,), 0)
    with pytest.raises(ValueError, match="out has 12 elements, expected 6"):
        mod.compact(a, out, (2, 3), (3, 1), 0)
    with pytest.raises(ValueError, match="a has 12 elements, expected 6"):
        mod.ewise_setitem(a, out, (2, 3), (3, 1), 0)
    with pytest.raises(ValueError, match="size 5 does not match"):
        mod.scalar_setitem(5, 1.0, out, (2, 3), (3, 1), 0)
    with pytest.raises(ValueError, match="b has 3 elements"):
        mod.ewise_add(a, mod.Array(3), out)
    with pytest.raises(ValueError, match="a has 12 elements"):
        mod.ewise_exp(a, mod.Array(4))
    with pytest.raises(ValueError, match="numpy array has 5 elements"):
        mod.from_numpy(np.zeros(5, np.float32), out)
    # matmul's buffers may be longer than the product needs, as in the other modules
    with pytest.raises(ValueError, match=r"matmul: b has 12 elements, needs at least 16"):
        mod.matmul(a, a, mod.Array(12), 3, 4, 4)
    with pytest.raises(ValueError, match="negative size"):
        mod.matmul(a, a, out, -1, 4, 3)
    with pytest.raises(ValueError, match="reducing 5 each"):
        mod.reduce_sum(a, mod.Array(3), 5)
    with pytest.raises(TypeError):
        mod.fill(None, 1.0)  # None is no buffer


@needs_gpu
def test_failed_allocation_is_a_memory_error_and_not_sticky():
    with pytest.raises(ValueError, match="too large"):
        mod.Array(1 << 55)  # more elements than any buffer may have
    with pytest.raises(MemoryError, match="cudaMalloc"):
        mod.Array(1 << 45)  # 128 TiB
    a = upload(np.arange(3))  # the error was cleared: later calls work
    mod.synchronize()
    np.testing.assert_array_equal(download(a), [0.0, 1.0, 2.0])
