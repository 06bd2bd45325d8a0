"""NDArray arithmetic, comparisons, reductions, matmul, flip and pad against numpy (hw3).

Inputs come in three memory layouts (compact, a permuted view, a strided slice with an offset)
so every op is also checked on the ``compact()`` path it takes before calling a kernel.
"""

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as st
from ndarray_strategies import SEEDS, SETTINGS, SHAPES, SHAPES_NONEMPTY, rand

import needle as ndl
from benchmarks.bench_ndarray import MATMUL_SIZES
from needle import backend_ndarray as nd

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":  # under NEEDLE_BACKEND=np the array is numpy's, not this NDArray
    pytest.skip("the NDArray suite runs with NEEDLE_BACKEND=nd", allow_module_level=True)

LAYOUTS = st.sampled_from(["compact", "permuted", "sliced"])
TOL = dict(rtol=1e-5, atol=1e-6)


def make(x: np.ndarray, device, layout: str) -> nd.NDArray:
    """An NDArray holding ``x`` in the given memory layout."""
    if layout == "compact":
        return nd.array(x, device=device)
    if layout == "permuted":  # the reversed-axes view of a transposed copy
        t = nd.array(np.array(x.transpose(), order="C"), device=device)
        return t.permute(tuple(reversed(range(x.ndim))))
    # every other element of a larger buffer, starting one element in
    big = np.full(tuple(2 * n + 1 for n in x.shape), np.nan, dtype=np.float32)
    big[(slice(1, None, 2),) * x.ndim] = x
    view = nd.array(big, device=device)[(slice(1, None, 2),) * x.ndim]
    assert view.shape == x.shape
    return view


# ---- element-wise ----------------------------------------------------------------------------
def _cmp(f):
    return lambda x, y: f(x, y).astype(np.float32)


BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "truediv": (lambda a, b: a / b, np.divide),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "maximum_fn": (nd.maximum, np.maximum),
    "eq": (lambda a, b: a == b, _cmp(np.equal)),
    "ne": (lambda a, b: a != b, _cmp(np.not_equal)),
    "ge": (lambda a, b: a >= b, _cmp(np.greater_equal)),
    "gt": (lambda a, b: a > b, _cmp(np.greater)),
    "le": (lambda a, b: a <= b, _cmp(np.less_equal)),
    "lt": (lambda a, b: a < b, _cmp(np.less)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(BINARY))
@given(shape=SHAPES, seed=SEEDS, layouts=st.tuples(LAYOUTS, LAYOUTS))
@settings(SETTINGS, max_examples=15)
@pytest.mark.hw3_ewise_ops
def test_ewise_binary(device, name, shape, seed, layouts):
    ours, theirs = BINARY[name]
    rng = np.random.default_rng(seed)
    if name in ("eq", "ne", "ge", "gt", "le", "lt", "maximum", "maximum_fn"):
        # few distinct values, so ties are common
        x = rng.integers(-1, 2, shape).astype(np.float32)
        y = rng.integers(-1, 2, shape).astype(np.float32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.standard_normal(shape).astype(np.float32)
        if name == "truediv":
            y = np.where(y < 0, y - 0.5, y + 0.5).astype(np.float32)
    a, b = make(x, device, layouts[0]), make(y, device, layouts[1])
    out = ours(a, b)
    assert out.shape == x.shape and out.device == device and out.is_compact()
    result = out.numpy()
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, theirs(x, y), **TOL)
    np.testing.assert_array_equal(a.numpy(), x)  # inputs untouched


SCALAR = {
    "add": (lambda a, s: a + s, lambda x, s: x + s),
    "radd": (lambda a, s: s + a, lambda x, s: s + x),
    "sub": (lambda a, s: a - s, lambda x, s: x - s),
    "rsub": (lambda a, s: s - a, lambda x, s: s - x),
    "mul": (lambda a, s: a * s, lambda x, s: x * s),
    "rmul": (lambda a, s: s * a, lambda x, s: s * x),
    "truediv": (lambda a, s: a / s, lambda x, s: x / s),
    "rtruediv": (lambda a, s: s / a, lambda x, s: s / x),
    "maximum": (lambda a, s: a.maximum(s), np.maximum),
    "eq": (lambda a, s: a == s, _cmp(np.equal)),
    "ne": (lambda a, s: a != s, _cmp(np.not_equal)),
    "ge": (lambda a, s: a >= s, _cmp(np.greater_equal)),
    "gt": (lambda a, s: a > s, _cmp(np.greater)),
    "le": (lambda a, s: a <= s, _cmp(np.less_equal)),
    "lt": (lambda a, s: a < s, _cmp(np.less)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(SCALAR))
@given(
    shape=SHAPES,
    seed=SEEDS,
    layout=LAYOUTS,
    scalar=st.sampled_from([-2, -1, 0, 1, 3]) | st.floats(-3, 3, width=32),
)
@settings(SETTINGS, max_examples=15)
@pytest.mark.hw3_scalar_ops
def test_scalar_ops(device, name, shape, seed, layout, scalar):
    ours, theirs = SCALAR[name]
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, shape).astype(np.float32)  # integers: ties with the scalar
    x += rng.choice(np.array([0, 0.5], np.float32), shape)
    if name == "truediv" and abs(scalar) < 0.1:
        scalar = 2.0
    if name == "rtruediv":
        x = np.where(x == 0, 1.5, x).astype(np.float32)
    out = ours(make(x, device, layout), scalar)
    assert out.shape == x.shape and out.is_compact()
    np.testing.assert_allclose(
        out.numpy(), np.asarray(theirs(x, np.float32(scalar)), dtype=np.float32), **TOL
    )


@pytest.mark.parametrize("device", DEVICES)
@given(
    shape=SHAPES,
    seed=SEEDS,
    layout=LAYOUTS,
    exponent=st.sampled_from([0, 1, 2, 3, 0.5, -1, 1.5, -2.0]),
)
@SETTINGS
@pytest.mark.hw3_scalar_ops
def test_scalar_power(device, shape, seed, layout, exponent):
    x = np.abs(rand(seed, shape)) + np.float32(0.1)
    out = make(x, device, layout) ** exponent
    np.testing.assert_allclose(out.numpy(), x ** np.float32(exponent), rtol=1e-5, atol=1e-6)


UNARY = {
    "neg": (lambda a: -a, np.negative),
    "log": (lambda a: a.log(), np.log),
    "exp": (lambda a: a.exp(), np.exp),
    "tanh": (lambda a: a.tanh(), np.tanh),
    "log_fn": (nd.log, np.log),
    "exp_fn": (nd.exp, np.exp),
    "tanh_fn": (nd.tanh, np.tanh),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(UNARY))
@given(shape=SHAPES, seed=SEEDS, layout=LAYOUTS)
@settings(SETTINGS, max_examples=15)
@pytest.mark.hw3_ewise_ops
def test_unary(device, name, shape, seed, layout):
    ours, theirs = UNARY[name]
    x = 2 * rand(seed, shape)
    if name.startswith("log"):
        x = np.abs(x) + np.float32(1e-3)
    out = ours(make(x, device, layout))
    assert out.shape == x.shape
    np.testing.assert_allclose(out.numpy(), theirs(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_ops_by_hand(device):
    a = nd.array([[1.0, -2.0], [0.0, 4.0]], device=device)
    b = nd.array([[3.0, -2.0], [1.0, 2.0]], device=device)
    np.testing.assert_array_equal((a + b).numpy(), [[4, -4], [1, 6]])
    np.testing.assert_array_equal((a / b).numpy(), np.float32([[1 / 3, 1], [0, 2]]))
    np.testing.assert_array_equal((2 - a).numpy(), [[1, 4], [2, -2]])
    np.testing.assert_array_equal((8 / b).numpy(), np.float32([[8 / 3, -4], [8, 4]]))
    np.testing.assert_array_equal((a == b).numpy(), [[0, 1], [0, 0]])
    np.testing.assert_array_equal((a > b).numpy(), [[0, 0], [0, 1]])
    np.testing.assert_array_equal((a**2).numpy(), [[1, 4], [0, 16]])
    np.testing.assert_array_equal(a.maximum(0).numpy(), [[1, 0], [0, 4]])


@pytest.mark.parametrize("device", DEVICES)
def test_ops_on_empty_arrays(device):
    a = nd.empty((0, 3), device=device)
    for out in (a + a, a * 2, a.exp(), a == 1.0, a.maximum(a)):
        assert out.shape == (0, 3)
    assert (2 - a).shape == (0, 3)


# ---- reductions ------------------------------------------------------------------------------
@st.composite
def reduction_case(draw):
    shape = draw(SHAPES_NONEMPTY)
    n = len(shape)
    axis = draw(
        st.none()
        | st.integers(-n, n - 1)
        | st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True).map(tuple)
    )
    return shape, axis, draw(st.booleans())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max", "sum_fn"])
@given(case=reduction_case(), seed=SEEDS, layout=LAYOUTS)
@SETTINGS
@pytest.mark.hw3_reductions
def test_reductions(device, op, case, seed, layout):
    shape, axis, keepdims = case
    x = rand(seed, shape)
    a = make(x, device, layout)
    if op == "sum_fn":
        out = nd.sum(a, axis=axis, keepdims=keepdims)
    else:
        out = getattr(a, op)(axis=axis, keepdims=keepdims)
    expected = getattr(np, op[:3])(x.astype(np.float64), axis=axis, keepdims=keepdims)
    if axis is None and not keepdims:
        expected = np.reshape(expected, (1,))  # the course's convention for a full reduction
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw3_reductions
def test_reductions_by_hand(device):
    a = nd.array(np.arange(24, dtype=np.float32).reshape(2, 3, 4), device=device)
    assert a.sum().shape == (1,) and a.sum().numpy()[0] == 276
    assert a.sum(keepdims=True).shape == (1, 1, 1)
    np.testing.assert_array_equal(a.sum(axis=1).numpy(), [[12, 15, 18, 21], [48, 51, 54, 57]])
    np.testing.assert_array_equal(
        a.max(axis=2, keepdims=True).numpy().reshape(-1), [3, 7, 11, 15, 19, 23]
    )
    np.testing.assert_array_equal(a.max(axis=(0, 2)).numpy(), [15, 19, 23])
    np.testing.assert_array_equal(a.sum(axis=-1).numpy(), [[6, 22, 38], [54, 70, 86]])
    z = nd.empty((2, 0), device=device)
    np.testing.assert_array_equal(z.sum(axis=1).numpy(), [0, 0])
    assert z.sum(axis=0).shape == (0,)


# ---- matmul ----------------------------------------------------------------------------------
def tile_of(device) -> int:
    return getattr(device.mod, "__tile_size__", 4)


@st.composite
def matmul_sizes(draw, tile: int):
    def size():
        return draw(
            st.sampled_from([1, tile - 1, tile, tile + 1, 2 * tile, 3 * tile])
            | st.integers(1, 3 * tile + 1)
        )

    if draw(st.booleans()):  # every size a multiple of the tile: the tiled path where it exists
        return tuple(tile * draw(st.integers(1, 4)) for _ in range(3))
    return size(), size(), size()


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), seed=SEEDS, layouts=st.tuples(LAYOUTS, LAYOUTS))
@SETTINGS
@pytest.mark.hw3_matmul
def test_matmul(device, data, seed, layouts):
    m, n, p = data.draw(matmul_sizes(tile_of(device)))
    x, y = rand(seed, (m, n)), rand(seed + 1, (n, p))
    out = make(x, device, layouts[0]) @ make(y, device, layouts[1])
    assert out.shape == (m, p) and out.is_compact()
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "m,n,p",
    [
        (1, 7, 1),
        (7, 1, 5),
        (1, 1, 1),
        (1, 16, 8),
        (16, 1, 16),
        (8, 8, 8),
        (32, 64, 16),
        (64, 64, 64),
        (33, 17, 9),
        (3, 0, 4),
    ],
)
@pytest.mark.hw3_matmul
def test_matmul_shapes(device, m, n, p):
    x, y = rand(0, (m, n)), rand(1, (n, p))
    out = nd.array(x, device=device) @ nd.array(y, device=device)
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


# The sizes `make bench` times (benchmarks/bench_ndarray.py): on cpu() they take every path of
# the product (the one-thread and shared unpacked kernels, the packed engine with one and
# several K panels, edge rows and columns); the transposed and sliced operands take the packed
# engine's strided packing.
BENCH_SIZES = MATMUL_SIZES  # one list: the test covers exactly what the benchmark times
BENCH_LAYOUTS = [
    ("compact", "compact"),
    ("permuted", "compact"),
    ("compact", "permuted"),
    ("sliced", "permuted"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,p", BENCH_SIZES, ids=lambda v: str(v))
@pytest.mark.parametrize("layouts", BENCH_LAYOUTS, ids="-".join)
def test_matmul_benchmark_sizes(device, m, n, p, layouts):
    """The benchmark's products, with compact, transposed and sliced operands, against a
    float64 product: within float32 rounding of a length-n sum."""
    if layouts[0] == "sliced" and m * n > 1 << 20:
        layouts = ("permuted", "permuted")  # a 2x-strided 2048^2 view would need 64 MB
    rng = np.random.default_rng(m + n + p)
    x = rng.standard_normal((m, n)).astype(np.float32)
    y = rng.standard_normal((n, p)).astype(np.float32)
    out = make(x, device, layouts[0]) @ make(y, device, layouts[1])
    assert out.shape == (m, p) and out.is_compact()
    expected = x.astype(np.float64) @ y.astype(np.float64)
    # terms about 1: float32 rounding of the sum is ~1e-7 * n, one term wrong is ~1
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=2e-6 * n)


class RecordingModule:
    """Forwards to a device module, recording the name and arguments of every kernel call.

    Over the numpy module it adds a numpy ``matmul_tiled`` with tile 4 in the protocol's
    layout (a is (m/t, n/t, t, t) tiles, b (n/t, p/t, t, t), out (m/t, p/t, t, t)), so
    NDArray's tiled exhibit is checked even where no compiled module is built.
    """

    def __init__(self, mod):
        self._mod = mod
        self.calls = []
        self._numpy_tiled = mod is nd.ndarray_backend_numpy
        if self._numpy_tiled:
            self.__tile_size__ = 4

    def _matmul_tiled_numpy(self, a, b, out, m, n, p):
        t = self.__tile_size__
        ta = a.array.reshape(m // t, n // t, t, t)
        tb = b.array.reshape(n // t, p // t, t, t)
        out.array[:] = np.einsum("ikab,kjbc->ijac", ta, tb).reshape(-1)

    def __getattr__(self, name):
        if name == "matmul_tiled" and self._numpy_tiled:
            kernel = self._matmul_tiled_numpy
        else:
            kernel = getattr(self._mod, name)  # AttributeError where the module lacks it
        if name.startswith("__") or name == "Array" or not callable(kernel):
            return kernel

        def record(*args):
            self.calls.append((name, args))
            return kernel(*args)

        return record


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "mult",
    [(1, 1, 1), (2, 3, 1), (3, 2, 4), (1, 1, 0), (2, 0, 2)],
    ids=["1-1-1", "2-3-1", "3-2-4", "p-off", "n-off"],
)
def test_matmul_is_one_strided_call_on_the_operands_own_buffers(device, mult):
    spy = RecordingModule(device.mod)
    dev = nd.BackendDevice(device.name, spy)
    t = getattr(spy, "__tile_size__", 4)
    m, n, p = (t * k if k else t + 1 for k in mult)
    x, y = rand(2, (m, n)), rand(3, (n, p))
    y_view = nd.array(np.array(y.T, order="C"), device=dev).permute((1, 0))  # transposed
    a = nd.array(x, device=dev)
    spy.calls.clear()
    out = a @ y_view
    assert [name for name, _ in spy.calls] == ["matmul_strided"]
    args = spy.calls[0][1]
    # no copies: both operands are passed as their own buffers, the transpose as strides
    assert args[0] is a._handle and args[3] is y_view._handle
    assert tuple(args[4]) == (1, n) and tuple(args[7]) == () and tuple(args[8:]) == (m, n, p)
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m,n,p", [(72, 73, 74), (5, 0, 3), (0, 4, 2), (1, 1, 1)])
def test_compact_matmul_is_the_plain_kernel_with_the_strided_bits(device, m, n, p):
    # Two compact 2-D operands take the course's plain ``matmul`` (no strides to convert); the
    # same product through matmul_strided (a copy of b's buffer, a view that is not known to
    # be compact) gives the same bits.
    spy = RecordingModule(device.mod)
    dev = nd.BackendDevice(device.name, spy)
    x, y = rand(4, (m, n)), rand(5, (n, p))
    a, b = nd.array(x, device=dev), nd.array(y, device=dev)
    spy.calls.clear()
    plain = a @ b
    assert [name for name, _ in spy.calls] == (["matmul"] if m and p else [])
    if m and p:
        assert spy.calls[0][1][0] is a._handle and spy.calls[0][1][1] is b._handle
    b_view = b.permute((1, 0)).permute((1, 0))  # same layout, compactness not yet asked
    spy.calls.clear()
    strided = a @ b_view
    assert [name for name, _ in spy.calls] == (["matmul_strided"] if m and p else [])
    assert plain.shape == (m, p) and np.array_equal(plain.numpy(), strided.numpy())
    np.testing.assert_allclose(plain.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mult", [(1, 1, 1), (2, 3, 1), (3, 2, 4)])
@pytest.mark.hw3_matmul
def test_matmul_tiled_exhibit(device, mult):
    spy = RecordingModule(device.mod)
    dev = nd.BackendDevice(device.name, spy)
    if not hasattr(spy, "matmul_tiled"):
        with pytest.raises(RuntimeError, match="no tiled matmul"):
            nd.array(np.ones((4, 4)), device=dev).matmul_tiled(
                nd.array(np.ones((4, 4)), device=dev)
            )
        return
    t = spy.__tile_size__
    m, n, p = (t * k for k in mult)
    x, y = rand(2, (m, n)), rand(3, (n, p))
    y_view = nd.array(np.array(y.T, order="C"), device=dev).permute((1, 0))  # non-compact
    out = nd.matmul_tiled(nd.array(x, device=dev), y_view)
    assert "matmul_tiled" in [name for name, _ in spy.calls]
    np.testing.assert_allclose(out.numpy(), x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="multiples of the tile size"):
        nd.array(x, device=dev).matmul_tiled(nd.array(rand(4, (n, p + 1)), device=dev))


# ---- the strided fast paths (issue: no needless copies) ----------------------------------------
def spy_device(device):
    spy = RecordingModule(device.mod)
    return spy, nd.BackendDevice(device.name, spy)


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_operands_go_straight_to_the_kernel(device):
    spy, dev = spy_device(device)
    x, y = rand(0, (4, 1, 3)), rand(1, (5, 1))
    a, b = nd.array(x, device=dev), nd.array(y, device=dev)
    spy.calls.clear()
    out = a + b
    assert [name for name, _ in spy.calls] == ["ewise_binary"]
    args = spy.calls[0][1]
    assert args[1] is a._handle and args[4] is b._handle  # no compact copies
    assert tuple(args[2]) == (3, 0, 1) and tuple(args[5]) == (0, 1, 0)
    np.testing.assert_array_equal(out.numpy(), x + y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (2, 0), (-3, -1), (1,), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_are_one_kernel_call_on_the_buffer(device, axis, keepdims):
    spy, dev = spy_device(device)
    x = rand(2, (3, 4, 5))
    a = nd.array(x, device=dev).permute((1, 0, 2))  # non-compact
    xv = x.transpose(1, 0, 2)
    for op in ("sum", "max"):
        spy.calls.clear()
        out = getattr(a, op)(axis=axis, keepdims=keepdims)
        assert [name for name, _ in spy.calls] == ["reduce"]
        assert spy.calls[0][1][1] is a._handle
        np_axis = None if axis == () else axis
        expected = getattr(xv, op)(axis=np_axis, keepdims=keepdims)
        if np_axis is None and not keepdims:
            expected = expected.reshape(1)
        assert out.shape == expected.shape
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


# ---- compact operands go to the course's entry points, with the strided kernels' answers ------
# Shapes: tiny, 0-d, empty, and above the compiled module's thread thresholds (2**16, 2**18).
COMPACT_SHAPES = [(8, 8), (), (3,), (0, 4), (2, 3, 5), (300, 1000)]


def _strided(dev, kernel, code, arrays, shape, *extra):
    """The strided kernel's result over the compact ``arrays`` (the general path)."""
    out = nd.NDArray.make(shape, device=dev)
    views = [x for a in arrays for x in (a._handle, a.strides, 0)]
    if kernel == "ewise_binary":
        getattr(dev, kernel)(code, *views, out._handle, shape)
    elif kernel == "ewise_scalar":
        getattr(dev, kernel)(code, *views, extra[0], out._handle, shape, False)
    else:
        getattr(dev, kernel)(code, *views, out._handle, shape)
    return out.numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", COMPACT_SHAPES)
def test_compact_elementwise_ops_equal_the_strided_kernels_bit_for_bit(device, shape):
    from needle.backend_ndarray import protocol

    x, y = rand(20, shape), rand(21, shape)
    x_pos = np.abs(x) + 0.5  # log, power: defined everywhere
    spy, dev = spy_device(device)
    for op in protocol.COURSE_BINARY:
        a, b = nd.array(x, device=dev), nd.array(y, device=dev)
        code = protocol.BINARY_OPS.index(op)
        method = protocol.BINARY_METHODS[op][0]
        spy.calls.clear()
        got = getattr(a, method)(b)
        assert [n for n, _ in spy.calls] == [f"ewise_{op}"]
        got = got.numpy()
        np.testing.assert_array_equal(got, _strided(dev, "ewise_binary", code, (a, b), shape))
    for op in protocol.COURSE_SCALAR:
        a = nd.array(x_pos, device=dev)
        code = protocol.BINARY_OPS.index(op)
        for value in (2.0, 0.5, -1.3):
            spy.calls.clear()
            got = getattr(a, protocol.BINARY_METHODS[op][0])(value)
            assert [n for n, _ in spy.calls] == [f"scalar_{op}"]
            got = got.numpy()
            want = _strided(dev, "ewise_scalar", code, (a,), shape, value)
            np.testing.assert_array_equal(got, want)
    for op in protocol.COURSE_UNARY:
        a = nd.array(x_pos, device=dev)
        spy.calls.clear()
        got = getattr(a, op)()
        assert [n for n, _ in spy.calls] == [f"ewise_{op}"]
        got = got.numpy()
        want = _strided(dev, "ewise_unary", protocol.UNARY_OPS.index(op), (a,), shape)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", COMPACT_SHAPES[:3] + COMPACT_SHAPES[4:])
def test_compact_trailing_reductions_equal_the_strided_kernel_bit_for_bit(device, shape):
    x = rand(22, shape)
    spy, dev = spy_device(device)
    a = nd.array(x, device=dev)
    ndim = len(shape)
    for axis in [None] + [tuple(range(k, ndim)) for k in range(1, ndim)]:
        for op, code in (("sum", 0), ("max", 1)):
            spy.calls.clear()
            got = getattr(a, op)(axis=axis)
            assert [n for n, _ in spy.calls] == [f"reduce_{op}"], (axis, op)
            keep = 0 if axis is None else axis[0]
            want = nd.NDArray.make(got.shape, device=dev)
            dev.reduce(code, a._handle, shape, a.strides, 0, keep, want._handle)
            np.testing.assert_array_equal(got.numpy(), want.numpy())
            np.testing.assert_allclose(
                got.numpy().reshape(-1),
                getattr(x.astype(np.float64), op)(axis=axis).reshape(-1),
                rtol=1e-4,
                atol=1e-3,
            )
    if ndim >= 2:  # a leading axis, and a permuted (non-compact) array: the strided kernel
        for b, axis in ((a, 0), (a.permute(tuple(range(ndim))[::-1]), ndim - 1)):
            spy.calls.clear()
            b.sum(axis=axis)
            assert [n for n, _ in spy.calls] == ["reduce"]


def test_the_course_entry_point_tables_match_the_compiled_bindings():
    from needle.backend_ndarray import protocol

    header = (ROOT / "src" / "common" / "ndarray_bindings.h").read_text()
    for macro, names in (
        ("NEEDLE_COURSE_BINARY", protocol.COURSE_BINARY),
        ("NEEDLE_COURSE_SCALAR", protocol.COURSE_SCALAR[len(protocol.COURSE_BINARY) :]),
        ("NEEDLE_COURSE_UNARY", protocol.COURSE_UNARY),
    ):
        line = re.search(rf"#define {macro}\(X\)(.*)", header).group(1)
        assert tuple(re.findall(r"X\((\w+)\)", line)) == names, macro
    numpy_module = nd.ndarray_backend_numpy
    for name, params in protocol.COURSE_PARAMS.items():
        assert tuple(inspect.signature(getattr(numpy_module, name)).parameters) == params
        if nd.cpu().enabled():
            assert callable(getattr(nd.cpu().mod, name))


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_broadcasting_follows_numpy(device):
    cases = [((2, 3), (3,)), ((4, 1, 3), (5, 1)), ((1,), (2, 2)), ((), (3, 2)), ((2, 0), (1,))]
    for sx, sy in cases:
        x, y = rand(3, sx), rand(4, sy)
        a, b = nd.array(x, device=device), nd.array(y, device=device)
        for f in (lambda p, q: p - q, lambda p, q: q / p, lambda p, q: p < q):
            np.testing.assert_array_equal(f(a, b).numpy(), f(x, y).astype(np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_reversed_scalar_forms_and_array_exponent(device):
    x = np.abs(rand(5, (3, 4))) + 0.5
    y = rand(6, (3, 4))
    a, b = nd.array(x, device=device), nd.array(y, device=device)
    np.testing.assert_array_equal((2 - a).numpy(), np.float32(2) - x)
    np.testing.assert_array_equal((2 / a).numpy(), np.float32(2) / x)
    np.testing.assert_allclose((2**a).numpy(), np.float32(2) ** x, rtol=2e-6)
    np.testing.assert_allclose((a**b).numpy(), x**y, rtol=2e-6)
    np.testing.assert_allclose((a**0.5).numpy(), np.sqrt(x), rtol=2e-6)
    np.testing.assert_array_equal((3 + a).numpy(), x + np.float32(3))
    np.testing.assert_array_equal((3 * a).numpy(), x * np.float32(3))


@pytest.mark.parametrize("device", DEVICES)
def test_comparisons_follow_ieee_with_nan(device):
    x = np.array([np.nan, 1.0, 2.0, np.nan, -np.inf, 0.0], dtype=np.float32)
    y = np.array([1.0, np.nan, 2.0, np.nan, np.inf, -0.0], dtype=np.float32)
    a, b = nd.array(x, device=device), nd.array(y, device=device)
    with np.errstate(invalid="ignore"):
        for f in (
            lambda p, q: p == q,
            lambda p, q: p != q,
            lambda p, q: p < q,
            lambda p, q: p <= q,
            lambda p, q: p > q,
            lambda p, q: p >= q,
        ):
            np.testing.assert_array_equal(f(a, b).numpy(), f(x, y).astype(np.float32))
            np.testing.assert_array_equal(f(a, np.nan).numpy(), f(x, np.nan).astype(np.float32))
            np.testing.assert_array_equal(f(1.0, a).numpy(), f(1.0, x).astype(np.float32))
    np.testing.assert_array_equal(a.maximum(b).numpy(), np.maximum(x, y))
    np.testing.assert_array_equal(a.minimum(b).numpy(), np.minimum(x, y))
    assert np.isnan(a.max().numpy()[0])


@pytest.mark.parametrize("device", DEVICES)
def test_unary_methods(device):
    x = np.array([[-2.0, -0.5, 0.0], [0.25, 1.0, 30.0]], dtype=np.float32)
    a = nd.array(x, device=device)
    np.testing.assert_array_equal((-a).numpy(), -x)
    np.testing.assert_array_equal(abs(a).numpy(), np.abs(x))
    np.testing.assert_array_equal(a.abs().numpy(), np.abs(x))
    np.testing.assert_array_equal(a.relu().numpy(), np.maximum(x, 0))
    np.testing.assert_array_equal(nd.relu(a).numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(nd.sqrt(abs(a)).numpy(), np.sqrt(np.abs(x)), rtol=1e-6)
    np.testing.assert_allclose(
        a.sigmoid().numpy(), 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(nd.minimum(a, 0.5).numpy(), np.minimum(x, 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 4), (2, 4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((2, 3, 4), (4, 2)),
        ((1, 3, 4), (3, 4, 2)),
        ((2, 0, 4), (2, 4, 3)),
        ((3, 1, 4), (1, 4, 2)),
    ],
)
def test_batched_matmul_follows_numpy(device, sa, sb):
    x, y = rand(7, sa), rand(8, sb)
    a, b = nd.array(x, device=device), nd.array(y, device=device)
    out = a @ b
    expected = np.matmul(x.astype(np.float64), y)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
    # transposed operands (views): (A^T)^T @ B
    at = nd.array(np.ascontiguousarray(np.swapaxes(x, -1, -2)), device=device)
    perm = tuple(range(len(sa) - 2)) + (len(sa) - 1, len(sa) - 2)
    np.testing.assert_allclose((at.permute(perm) @ b).numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_matmul_is_one_call_with_a_shared_matrix(device):
    spy, dev = spy_device(device)
    x, y = rand(9, (4, 3, 5)), rand(10, (5, 2))
    a, b = nd.array(x, device=dev), nd.array(y, device=dev)
    spy.calls.clear()
    out = a @ b
    assert [name for name, _ in spy.calls] == ["matmul_strided"]
    args = spy.calls[0][1]
    assert args[3] is b._handle and tuple(args[4]) == (0, 2, 1)
    assert tuple(args[7]) == (4,) and tuple(args[8:]) == (3, 5, 2)
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_per_head_attention_views_are_read_in_place(device):
    # attention's (B, H, T, D) heads are views of (B, T, H, D): q @ kᵀ and probs @ v must reach
    # the kernel as those buffers, with one stride per batch dimension, and match numpy
    spy, dev = spy_device(device)
    B, T, H, D = 2, 5, 3, 4
    x, y, w = rand(11, (B, T, H, D)), rand(12, (B, T, H, D)), rand(13, (B, H, T, T))
    q = nd.array(x, device=dev).permute((0, 2, 1, 3))
    k = nd.array(y, device=dev).permute((0, 2, 3, 1))  # (B, H, D, T): the transposed keys
    probs = nd.array(w, device=dev)
    for a, b in ((q, k), (probs, q)):
        spy.calls.clear()
        out = a @ b
        assert [name for name, _ in spy.calls] == ["matmul_strided"]
        args = spy.calls[0][1]
        assert args[0] is a._handle and args[3] is b._handle and tuple(args[7]) == (B, H)
        assert tuple(args[1]) == a.strides and tuple(args[4]) == b.strides
        expected = np.matmul(a.numpy().astype(np.float64), b.numpy())
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


# ---- flip and pad ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), shape=SHAPES_NONEMPTY, seed=SEEDS, layout=LAYOUTS)
@SETTINGS
@pytest.mark.hw4_ndarray_flip
def test_flip(device, data, shape, seed, layout):
    axes = tuple(data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True)))
    x = rand(seed, shape)
    a = make(x, device, layout)
    out = a.flip(axes) if data.draw(st.booleans()) else nd.flip(a, axes)
    assert out.is_compact() and out._handle.ptr() != a._handle.ptr()
    np.testing.assert_array_equal(out.numpy(), np.flip(x, axes))
    np.testing.assert_array_equal(a.numpy(), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_ndarray_flip
def test_flip_by_hand(device):
    a = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    np.testing.assert_array_equal(a.flip(1).numpy(), [[2, 1, 0], [5, 4, 3]])
    np.testing.assert_array_equal(a.flip((0, 1)).numpy(), [[5, 4, 3], [2, 1, 0]])
    np.testing.assert_array_equal(a[:, 1:].flip(0).numpy(), [[4, 5], [1, 2]])


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), shape=SHAPES, seed=SEEDS, layout=LAYOUTS)
@SETTINGS
@pytest.mark.hw4_ndarray_pad
def test_pad(device, data, shape, seed, layout):
    pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    x = rand(seed, shape)
    out = make(x, device, layout).pad(pads)
    expected = np.pad(x, pads) if pads else x  # np.pad rejects the empty pad list of a 0-d array
    np.testing.assert_array_equal(out.numpy(), expected)
