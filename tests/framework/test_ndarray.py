"""NDArray construction, devices, views, ``compact`` and ``__setitem__`` against numpy (hw3).

Every view is checked three ways: its values (numpy applies the same view), its strides and
offset (numpy's byte strides // 4 and data-pointer difference // 4 over the same C-contiguous
base), and that it shares the base's buffer (``_handle.ptr()`` is equal).
"""

import numpy as np
import pytest
from conftest import DEVICES
from hypothesis import given
from hypothesis import strategies as st
from ndarray_strategies import SEEDS, SETTINGS, SHAPES, SHAPES_NONEMPTY, rand

import needle as ndl
from needle import backend_ndarray as nd

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":  # under NEEDLE_BACKEND=np the array is numpy's, not this NDArray
    pytest.skip("the NDArray suite runs with NEEDLE_BACKEND=nd", allow_module_level=True)


def np_strides(view: np.ndarray) -> tuple:
    """numpy's strides in float32 elements."""
    return tuple(s // 4 for s in view.strides)


def row_major(shape) -> tuple:
    """Row-major strides in elements: the product of the dimensions to the right."""
    return tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))


def np_offset(view: np.ndarray, base: np.ndarray) -> int:
    """Offset in elements of ``view``'s first element from the start of ``base``."""
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4


def assert_view_of(view, base, expected: np.ndarray, expected_base: np.ndarray):
    """``view`` shares ``base``'s buffer and has the values, strides, offset numpy gives.

    The stride of a size-1 dimension is never used, and numpy sets it freely (0 after
    broadcast_to), so strides are compared on the other dimensions only.
    """
    assert view._handle.ptr() == base._handle.ptr()
    assert view.shape == expected.shape
    np.testing.assert_array_equal(view.numpy(), expected)
    if expected.size:
        used = [i for i, n in enumerate(expected.shape) if n > 1]
        assert [view.strides[i] for i in used] == [np_strides(expected)[i] for i in used]
        assert view._offset == np_offset(expected, expected_base)


@st.composite
def index_for(draw, shape):
    """An NDArray index for ``shape`` (ints, slices with negative start/stop, positive steps)
    and the numpy index that selects the same elements while keeping every dimension."""
    ours, theirs = [], []
    for n in shape[: draw(st.integers(0, len(shape)))]:
        if n > 0 and draw(st.booleans()):  # an int cannot index an empty dimension
            i = draw(st.integers(-n, n - 1))
            ours.append(i)
            theirs.append(slice(i % n, i % n + 1))
        else:
            sl = slice(
                draw(st.none() | st.integers(-n, n)),
                draw(st.none() | st.integers(-n, n)),
                draw(st.none() | st.integers(1, 3)),
            )
            ours.append(sl)
            theirs.append(sl)
    if len(ours) == 1 and draw(st.booleans()):
        return ours[0], tuple(theirs)  # a bare index, not a tuple
    return tuple(ours), tuple(theirs)


# ---- devices -------------------------------------------------------------------------------------
def test_device_names_and_equality():
    assert str(ndl.cpu()) == "cpu()"
    assert str(ndl.cuda()) == "cuda()"
    assert str(ndl.cpu_numpy()) == "cpu_numpy()"
    assert repr(ndl.cpu_numpy()) == "cpu_numpy()"
    assert ndl.cpu() == ndl.cpu() and ndl.cpu_numpy() == nd.cpu_numpy()
    assert ndl.cpu() != ndl.cpu_numpy() and ndl.cpu() != ndl.cuda()
    assert ndl.cpu() != "cpu"
    assert hash(ndl.cpu()) == hash(nd.cpu())
    assert nd.BackendDevice("cpu", None) == ndl.cpu()  # equality is by name only
    assert ndl.all_devices() == [ndl.cpu(), ndl.cuda(), ndl.cpu_numpy()]
    assert nd.default_device() == nd.cpu_numpy()  # the course's NDArray default
    assert ndl.Device is nd.BackendDevice


def test_default_tensor_device_is_the_compiled_cpu_when_built():
    expected = nd.cpu() if nd.cpu().enabled() else nd.cpu_numpy()
    assert nd.default_tensor_device() is expected


def test_a_device_that_failed_to_import_says_why_and_how_to_rebuild():
    dev = nd.BackendDevice("cpu", None, "ImportError: undefined symbol: _ZN6needle4fill")
    assert not dev.enabled()
    for call in (
        dev._check,
        lambda: dev.ewise_binary,
        lambda: nd.array([1.0], device=dev),
        lambda: nd.empty((2,), device=dev),
    ):
        with pytest.raises(
            RuntimeError,
            match=r"cpu\(\) is not enabled: its compiled module "
            r"failed to import \(ImportError: undefined "
            r"symbol.*make build",
        ):
            call()


def test_cache_report_through_the_device():
    assert nd.cpu_numpy().cache_info() is None  # the numpy module keeps no buffer cache
    nd.cpu_numpy().cache_clear()
    mod = nd.cpu().mod
    if mod is not None and hasattr(mod, "cache_info"):
        info = nd.cpu().cache_info()
        assert info == mod.cache_info()
        nd.cpu().cache_clear()


def test_device_forwards_to_its_module():
    dev = ndl.cpu_numpy()
    assert dev.mod is nd.ndarray_backend_numpy
    assert dev.ewise_add is nd.ndarray_backend_numpy.ewise_add
    assert dev.__device_name__ == "cpu_numpy"
    assert dev.enabled()


@pytest.mark.parametrize("name", ["cpu", "cuda"])
def test_compiled_device_enabled_is_consistent(name):
    """enabled() is True exactly when arrays can be made there; otherwise making one fails."""
    dev = getattr(ndl, name)()
    if dev.enabled():
        a = nd.array([1.0, 2.0, 3.0], device=dev)
        np.testing.assert_array_equal(a.numpy(), [1.0, 2.0, 3.0])
        assert dev.__device_name__ == name
    else:
        with pytest.raises(RuntimeError, match=rf"{name}\(\)"):
            nd.array([1.0, 2.0], device=dev)
    if name == "cpu":
        assert dev.enabled() == (nd.ndarray_backend_cpu is not None)
    if nd.ndarray_backend_cuda is None and name == "cuda":
        assert not dev.enabled()


@pytest.mark.parametrize("device", DEVICES)
def test_device_random_and_one_hot(device):
    np.random.seed(3)
    expected_n = np.random.randn(2, 3).astype(np.float32)
    expected_u = np.random.rand(4).astype(np.float32)
    np.random.seed(3)
    a, b = device.randn(2, 3), device.rand(4)
    assert a.device == device and a.shape == (2, 3) and b.shape == (4,)
    np.testing.assert_array_equal(a.numpy(), expected_n)
    np.testing.assert_array_equal(b.numpy(), expected_u)
    h = device.one_hot(4, np.array([2, 0, 3]))
    np.testing.assert_array_equal(h.numpy(), [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])


# ---- construction and memory ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_array_from_nested_lists(device):
    a = nd.array([[1, 2, 3], [4.5, 5, -6]], device=device)
    assert a.shape == (2, 3) and a.ndim == 2 and a.size == 6
    assert a.dtype == "float32" and a.device == device
    assert a.strides == (3, 1) and a.is_compact()
    out = a.numpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 2, 3], [4.5, 5, -6]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "data",
    [
        np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
        np.arange(6, dtype=np.int64),
        np.array([0.1, 1e-8, 3e38, -2.5]),  # float64: rounded to float32
        np.array([[True, False], [False, True]]),
        np.array(2.5),  # 0-d
        [True, False, True],
    ],
    ids=["int32", "int64", "float64", "bool", "scalar", "bool-list"],
)
def test_array_from_numpy_dtypes(device, data):
    a = nd.NDArray(data, device=device)
    expected = np.asarray(data).astype(np.float32)
    assert a.shape == expected.shape
    out = a.numpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
@given(shape=SHAPES, seed=SEEDS)
@SETTINGS
def test_numpy_round_trip(device, shape, seed):
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    assert a.strides == np_strides(x) and a._offset == 0 and a._handle.size == x.size
    np.testing.assert_array_equal(a.numpy(), x)
    assert a.flat.shape == (x.size,)
    np.testing.assert_array_equal(a.flat.numpy(), x.reshape(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_copy_constructor_copies(device):
    a = nd.array([[1.0, 2.0], [3.0, 4.0]], device=device)
    b = nd.NDArray(a)
    assert b.device == device and b._handle.ptr() != a._handle.ptr()
    a[0, 0] = 9.0
    np.testing.assert_array_equal(b.numpy(), [[1, 2], [3, 4]])
    c = nd.NDArray(a.permute((1, 0)))  # a view is copied compactly
    assert c.is_compact()
    np.testing.assert_array_equal(c.numpy(), [[9, 3], [2, 4]])


@pytest.mark.parametrize("src", DEVICES)
@pytest.mark.parametrize("dst", DEVICES)
def test_to_between_devices(src, dst):
    x = rand(1, (3, 4))
    a = nd.array(x, device=src)
    b = a.to(dst)
    assert b.device == dst
    np.testing.assert_array_equal(b.numpy(), x)
    if src == dst:
        assert b is a
    view = a.permute((1, 0))[1:3]  # a strided view travels as its values
    np.testing.assert_array_equal(view.to(dst).numpy(), x.T[1:3])


@pytest.mark.parametrize("device", DEVICES)
def test_fill_empty_full(device):
    a = nd.empty((2, 3), device=device)
    assert a.shape == (2, 3) and a.device == device
    a.fill(1.5)
    np.testing.assert_array_equal(a.numpy(), np.full((2, 3), 1.5, np.float32))
    b = nd.full((4,), -2.0, device=device)
    np.testing.assert_array_equal(b.numpy(), [-2, -2, -2, -2])
    c = device.full((2, 2), 7)
    np.testing.assert_array_equal(c.numpy(), np.full((2, 2), 7, np.float32))
    assert nd.empty((0, 3), device=device).numpy().shape == (0, 3)


def test_default_device_is_used():
    assert nd.array([1.0]).device == ndl.default_device()
    assert nd.empty((2,)).device == ndl.default_device()
    assert nd.full((2,), 3.0).device == ndl.default_device()


# ---- views ---------------------------------------------------------------------------------------
@st.composite
def shape_and_reshape(draw):
    shape = draw(SHAPES)
    size = int(np.prod(shape))
    options = [(size,), tuple(reversed(shape)), shape + (1,), (1,) + shape, (-1,)]
    if len(shape) >= 2:
        options.append((shape[0] * shape[1],) + shape[2:])
        options.append((shape[0], -1))
    return shape, draw(st.sampled_from(options))


@pytest.mark.parametrize("device", DEVICES)
@given(case=shape_and_reshape(), seed=SEEDS)
@SETTINGS
@pytest.mark.hw3_reshape
def test_reshape_is_a_view(device, case, seed):
    shape, new_shape = case
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    b = a.reshape(new_shape)
    expected = x.reshape(new_shape)
    assert_view_of(b, a, expected, x)
    assert b.is_compact() and b.strides == row_major(expected.shape)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), shape=SHAPES, seed=SEEDS)
@SETTINGS
@pytest.mark.hw3_permute
def test_permute_is_a_view(device, data, shape, seed):
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    assert_view_of(a.permute(axes), a, x.transpose(axes), x)


@st.composite
def broadcast_case(draw):
    target = draw(SHAPES)
    lead = draw(st.integers(0, len(target)))
    source = tuple(1 if draw(st.booleans()) else n for n in target[lead:])
    return source, target


@pytest.mark.parametrize("device", DEVICES)
@given(case=broadcast_case(), seed=SEEDS)
@SETTINGS
@pytest.mark.hw3_broadcast_to
def test_broadcast_to_is_a_stride_zero_view(device, case, seed):
    source, target = case
    x = rand(seed, source)
    a = nd.array(x, device=device)
    b = a.broadcast_to(target)
    expected = np.broadcast_to(x, target)
    assert_view_of(b, a, expected, x)
    lead = len(target) - len(source)
    for i, n in enumerate(target):
        if i < lead or (source[i - lead] == 1 and n != 1):
            assert b.strides[i] == 0
    assert nd.broadcast_to(a, target).strides == b.strides


@pytest.mark.parametrize("device", DEVICES)
@given(
    data=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple), seed=SEEDS
)
@SETTINGS
@pytest.mark.hw3_getitem
def test_getitem_is_a_view(device, data, shape, seed):
    ours, theirs = data.draw(index_for(shape))
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    b = a[ours]
    assert b.ndim == a.ndim  # integer indices keep their dimension (size 1)
    assert_view_of(b, a, x[theirs], x)


@pytest.mark.hw3_getitem
def test_getitem_strides_and_offset_by_hand():
    a = nd.array(np.arange(60, dtype=np.float32).reshape(3, 4, 5))
    b = a[1, 1:4:2, -3:]
    assert b.shape == (1, 2, 3)
    assert b.strides == (20, 10, 1)
    assert b._offset == 20 + 5 + 2
    np.testing.assert_array_equal(b.numpy().reshape(-1), [27, 28, 29, 37, 38, 39])
    c = b.permute((2, 0, 1))
    assert c.strides == (1, 20, 10) and c._offset == 27
    assert a[2:2].shape == (0, 4, 5)


@pytest.mark.parametrize("device", DEVICES)
@given(
    data=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), seed=SEEDS
)
@SETTINGS
def test_chained_views(device, data, shape, seed):
    """slice → permute → slice → broadcast composes strides and offsets like numpy."""
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    ours, theirs = data.draw(index_for(shape))
    s0, xs0 = a[ours], x[theirs]
    assert_view_of(s0, a, xs0, x)
    p, xp = s0.permute(axes), xs0.transpose(axes)
    assert_view_of(p, a, xp, x)
    ours, theirs = data.draw(index_for(xp.shape))
    s, xs = p[ours], xp[theirs]
    assert_view_of(s, a, xs, x)
    target = (2,) + tuple(2 if n == 1 else n for n in xs.shape)
    assert_view_of(s.broadcast_to(target), a, np.broadcast_to(xs, target), x)


@st.composite
def strided_case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    strides = tuple(draw(st.lists(st.integers(0, 5), min_size=len(shape), max_size=len(shape))))
    offset = draw(st.integers(0, 3))
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
    return shape, strides, offset, last + 1 + draw(st.integers(0, 3))


@pytest.mark.parametrize("device", DEVICES)
@given(case=strided_case(), seed=SEEDS)
@SETTINGS
def test_as_strided(device, case, seed):
    shape, strides, offset, buffer_size = case
    x = rand(seed, (buffer_size,))
    a = nd.array(x, device=device)
    base = a[offset:]  # as_strided keeps the view's offset
    b = base.as_strided(shape, strides)
    expected = np.lib.stride_tricks.as_strided(x[offset:], shape, tuple(4 * s for s in strides))
    assert_view_of(b, a, expected, x)
    assert b.strides == strides and b._offset == offset


@pytest.mark.parametrize("device", DEVICES)
def test_is_compact(device):
    a = nd.array(np.zeros((2, 3, 4), np.float32), device=device)
    assert a.is_compact()
    assert not a.permute((0, 2, 1)).is_compact()
    assert not a[:, 1:].is_compact()
    assert not a[1].is_compact()  # compact strides, but only part of the buffer
    assert not a[:, :1].broadcast_to((2, 3, 4)).is_compact()
    assert a.reshape((6, 4)).is_compact()
    assert a.permute((0, 1, 2)).is_compact()


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), shape=SHAPES_NONEMPTY, seed=SEEDS)
@SETTINGS
@pytest.mark.hw3_compact
def test_compact(device, data, shape, seed):
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    assert a.compact() is a
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    ours, theirs = data.draw(index_for(x.transpose(axes).shape))
    view, expected = a.permute(axes)[ours], x.transpose(axes)[theirs]
    target = (3,) + expected.shape
    view, expected = view.broadcast_to(target), np.broadcast_to(expected, target)
    c = view.compact()
    assert c.is_compact() and c._offset == 0
    assert c.strides == row_major(expected.shape)
    assert c._handle.size == expected.size
    if expected.size:
        assert c._handle.ptr() != a._handle.ptr()
    np.testing.assert_array_equal(c.numpy(), expected)
    np.testing.assert_array_equal(a.numpy(), x)  # the source is untouched


# ---- __setitem__ ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@given(
    data=st.data(),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
    seed=SEEDS,
    source=st.sampled_from(["compact", "permuted", "broadcast", "scalar"]),
)
@SETTINGS
@pytest.mark.hw3_setitem
def test_setitem(device, data, shape, seed, source):
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    ptr = a._handle.ptr()
    ours, theirs = data.draw(index_for(shape))
    view_shape = x[theirs].shape
    rng = np.random.default_rng(seed + 1)
    if source == "scalar":
        value = float(rng.standard_normal())
        a[ours] = value
    else:
        if source == "broadcast":
            src_shape = tuple(1 if data.draw(st.booleans()) else n for n in view_shape)
        else:
            src_shape = view_shape
        value = rng.standard_normal(src_shape).astype(np.float32)
        if source == "permuted":  # a non-compact source: the transpose of a transposed copy
            src = nd.array(np.array(value.T, order="C"), device=device)
            src = src.permute(tuple(reversed(range(len(src_shape)))))
        else:
            src = nd.array(value, device=device)
        a[ours] = src
    x[theirs] = value
    assert a._handle.ptr() == ptr
    np.testing.assert_array_equal(a.numpy(), x)


@pytest.mark.parametrize("device", DEVICES)
@given(
    data=st.data(), shape=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), seed=SEEDS
)
@SETTINGS
@pytest.mark.hw3_setitem
def test_setitem_through_a_view_writes_the_base(device, data, shape, seed):
    x = rand(seed, shape)
    a = nd.array(x, device=device)
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    ours, theirs = data.draw(index_for(x.transpose(axes).shape))
    v = a.permute(axes)
    value = rand(seed + 1, x.transpose(axes)[theirs].shape)
    v[ours] = nd.array(value, device=device)
    x.transpose(axes)[theirs] = value
    np.testing.assert_array_equal(a.numpy(), x)
    np.testing.assert_array_equal(v.numpy(), x.transpose(axes))


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_from_an_overlapping_view(device):
    """Assigning a view of the same buffer reads the old values first, as numpy does."""
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    a = nd.array(x, device=device)
    a.permute((1, 0))[:, :] = a
    np.testing.assert_array_equal(a.numpy(), x.T)
    b = nd.array(np.arange(6, dtype=np.float32), device=device)
    b[1:6] = b[0:5].compact()
    np.testing.assert_array_equal(b.numpy(), [0, 0, 1, 2, 3, 4])


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_empty_selection_is_a_no_op(device):
    a = nd.array([1.0, 2.0, 3.0], device=device)
    a[2:1] = 5.0
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3])


# ---- module functions ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_module_view_functions(device):
    x = rand(5, (2, 1, 3))
    a = nd.array(x, device=device, dtype="float32")
    np.testing.assert_array_equal(nd.reshape(a, (3, 2)).numpy(), x.reshape(3, 2))
    np.testing.assert_array_equal(
        nd.broadcast_to(a, (4, 2, 5, 3)).numpy(), np.broadcast_to(x, (4, 2, 5, 3))
    )
    assert nd.reshape(a, (6,))._handle.ptr() == a._handle.ptr()
    assert ndl.NDArray is nd.NDArray and ndl.array_api is nd
