"""Bad input to NDArray raises a Python exception whose message names the problem (hw3).

Each check runs on every enabled device: validation happens in Python before any kernel runs,
so no device may crash, corrupt memory or silently broadcast.
"""

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl
from needle import backend_ndarray as nd

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":  # under NEEDLE_BACKEND=np the array is numpy's, not this NDArray
    pytest.skip("the NDArray suite runs with NEEDLE_BACKEND=nd", allow_module_level=True)


def arange(shape, device) -> nd.NDArray:
    return nd.array(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape), device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: a.maximum(b),
        lambda a, b: a == b,
        lambda a, b: a >= b,
        lambda a, b: a != b,
        lambda a, b: a < b,
    ],
    ids=["add", "sub", "mul", "div", "maximum", "eq", "ge", "ne", "lt"],
)
def test_ewise_shape_mismatch(device, op):
    a, b = arange((2, 3), device), arange((3, 2), device)
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(3, 2\)"):
        op(a, b)
    c = arange((4, 1, 2), device)  # numpy's broadcasting rules: trailing 3 vs 2 do not broadcast
    with pytest.raises(ValueError, match=r"shapes \(1, 2, 3\) and \(4, 1, 2\)"):
        op(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_scalar_operands(device):
    a = arange((2,), device)
    with pytest.raises(TypeError, match="expected a number or an NDArray, got str"):
        a + "1"
    with pytest.raises(TypeError, match="got ndarray"):
        a * np.ones(2)
    with pytest.raises(TypeError, match="expected a number or an NDArray, got str"):
        a ** "2"
    with pytest.raises(TypeError, match="got complex"):
        a + 1j
    with pytest.raises(TypeError, match="got str"):
        a[0] = "x"


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_errors(device):
    a = arange((2, 3), device)
    with pytest.raises(ValueError, match=r"cannot reshape .*\(2, 3\).*6 elements.*\(4, 2\)"):
        a.reshape((4, 2))
    with pytest.raises(ValueError, match="non-compact"):
        a.permute((1, 0)).reshape((6,))
    with pytest.raises(ValueError, match="non-compact"):
        a[:, 1:].reshape((4,))
    with pytest.raises(ValueError, match="only one dimension can be -1"):
        a.reshape((-1, -1))
    with pytest.raises(ValueError, match=r"cannot infer -1 in shape \(4, -1\)"):
        a.reshape((4, -1))
    with pytest.raises(ValueError, match="negative dimension"):
        a.reshape((-2, -3))


@pytest.mark.parametrize("device", DEVICES)
def test_permute_errors(device):
    a = arange((2, 3), device)
    with pytest.raises(ValueError, match=r"\(0, 0\) is not a permutation"):
        a.permute((0, 0))
    with pytest.raises(ValueError, match="is not a permutation"):
        a.permute((0,))
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        a.permute((0, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_errors(device):
    a = arange((2, 3), device)
    with pytest.raises(ValueError, match=r"cannot broadcast shape \(2, 3\) to \(4, 3\).*size 2"):
        a.broadcast_to((4, 3))
    with pytest.raises(ValueError, match=r"cannot broadcast shape \(2, 3\) to \(2, 1\)"):
        a.broadcast_to((2, 1))
    with pytest.raises(ValueError, match="fewer dimensions"):
        a.broadcast_to((3,))
    b = arange((2, 2), device)
    with pytest.raises(ValueError, match=r"cannot broadcast shape \(2, 2\) to \(1, 3\)"):
        a[:1, :] = b  # __setitem__ broadcasts the source to the view


@pytest.mark.parametrize("device", DEVICES)
def test_index_errors(device):
    a = arange((3, 4), device)
    with pytest.raises(IndexError, match="index 3 is out of range for dimension 0 of size 3"):
        a[3]
    with pytest.raises(IndexError, match="index -5 is out of range for dimension 1 of size 4"):
        a[0, -5]
    with pytest.raises(IndexError, match="slice start 5 is out of range for dimension 1"):
        a[:, 5:]
    with pytest.raises(IndexError, match="slice start -4 is out of range for dimension 0"):
        a[-4:]
    with pytest.raises(IndexError, match="slice stop 7 is out of range for dimension 1 of size 4"):
        a[:, 1:7]
    with pytest.raises(IndexError, match="slice stop -9 is out of range"):
        a[:-9]
    with pytest.raises(IndexError, match=r"too many indices \(3\)"):
        a[0, 0, 0]
    with pytest.raises(TypeError, match="indices must be ints or slices, got float"):
        a[1.0]
    with pytest.raises(TypeError, match="got bool"):
        a[True]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        a[3] = 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("step", [-1, -2, 0])
def test_non_positive_step(device, step):
    a = arange((5,), device)
    with pytest.raises(ValueError, match=f"slice step must be positive, got {step}"):
        a[::step]
    with pytest.raises(ValueError, match="step must be positive"):
        a[::step] = 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_errors(device):
    a, b = arange((2, 3), device), arange((2, 3), device)
    with pytest.raises(ValueError, match=r"inner sizes differ: \(2, 3\) @ \(2, 3\)"):
        a @ b
    with pytest.raises(ValueError, match=r"at least 2 dimensions, got shapes \(6,\) and \(6,\)"):
        a.reshape((6,)) @ b.reshape((6,))
    with pytest.raises(ValueError, match=r"batch dimensions .*shapes \(2,\) and \(3,\)"):
        arange((2, 2, 3), device) @ arange((3, 3, 2), device)
    with pytest.raises(TypeError, match="needs an NDArray operand, got float"):
        a @ 2.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduction_axis_errors(device, op):
    a = arange((2, 3), device)
    with pytest.raises(ValueError, match="axis 2 is out of range for an array with 2 dimensions"):
        getattr(a, op)(axis=2)
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        getattr(a, op)(axis=-3)
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        getattr(a, op)(axis=(0, 5))
    with pytest.raises(ValueError, match=r"duplicate axis in \(1, -1\)"):
        getattr(a, op)(axis=(1, -1))
    with pytest.raises(TypeError, match="axis must be an int, got 1.0"):
        getattr(a, op)(axis=1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_max_of_empty_axis(device):
    with pytest.raises(ValueError, match="max of an empty axis"):
        nd.empty((2, 0), device=device).max(axis=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "data,pattern",
    [
        (["a", "b"], "dtype <U1"),
        (np.array(["1.0", "2.0"]), "dtype <U3"),
        ([{"x": 1}, 2], "dtype object"),
        (np.array([None, 1.0], dtype=object), "dtype object"),
        ([[1.0, 2.0], [3.0]], "cannot convert list"),
        ([1 + 2j], "dtype complex128"),
    ],
    ids=["str-list", "str-array", "dict", "object-array", "ragged", "complex"],
)
def test_data_that_is_not_float32(device, data, pattern):
    with pytest.raises(TypeError, match=pattern):
        nd.array(data, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_integers_float32_would_round_are_refused(device):
    """Labels or ids above 2**24 used to be rounded to a neighbour without a word."""
    exact = nd.array(np.array([2**24, -(2**24), 7]), device=device)
    np.testing.assert_array_equal(exact.numpy(), [2**24, -(2**24), 7])
    for bad in (
        np.array([3, 2**24 + 1]),
        np.array([-(2**24) - 1], dtype=np.int64),
        np.array([2**32], dtype=np.uint64),
    ):
        with pytest.raises(ValueError, match=r"integer data up to \d+ cannot be held exactly"):
            nd.array(bad, device=device)
    with pytest.raises(ValueError, match="2\\*\\*24"):
        ndl.Tensor(np.array([16777217]), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_other_than_float32(device):
    with pytest.raises(TypeError, match="only float32, got dtype 'float64'"):
        nd.array([1.0], dtype="float64", device=device)
    with pytest.raises(TypeError, match="only float32, got dtype 'int32'"):
        nd.empty((2,), dtype="int32", device=device)
    with pytest.raises(TypeError, match="only float32"):
        device.full((2,), 1.0, dtype="float16")
    with pytest.raises(ValueError, match=r"negative dimension in shape \(2, -1\)"):
        nd.empty((2, -1), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_results_get_int_row_major_strides_whatever_ints_the_shape_has(device):
    from needle.backend_ndarray.ndarray import _new

    cases = [((np.int64(2), 3), (3, 1)), ((2, 3), (3, 1)), ((), ()), ((0, 5), (5, 1))]
    for shape, strides in cases:
        a = _new(shape, device)
        assert a.strides == strides and all(type(s) is int for s in a.strides)
        assert a.size == int(np.prod(shape)) and a.is_compact()


@pytest.mark.parametrize("device", DEVICES)
def test_shapes_too_large_to_hold(device):
    for shape in [(2**40, 2**40), (2**31, 2**31, 4), (2**63,)]:
        with pytest.raises(ValueError, match=r"elements, more than an array may hold"):
            nd.empty(shape, device=device)
    huge = nd.array([1.0], device=device).broadcast_to((2**40, 2**40))  # a view: no memory
    for _ in range(2):  # a refused shape is refused again (results' layouts are remembered)
        with pytest.raises(ValueError, match=r"more than an array may hold"):
            huge + 1.0
    with pytest.raises(MemoryError):
        nd.empty((2**25, 2**25), device=device)  # 4 PiB: representable, not allocatable


def _device_pairs():
    """Distinct enabled devices, plus a device with the numpy module under another name."""
    enabled = [p.values[0] for p in DEVICES if not p.marks]
    other = nd.BackendDevice("other_numpy", nd.ndarray_backend_numpy)
    pairs = [(a, b) for a in enabled for b in enabled if a != b]
    pairs += [(a, other) for a in enabled]
    return [pytest.param(a, b, id=f"{a.name}-{b.name}") for a, b in pairs]


@pytest.mark.parametrize("dev_a,dev_b", _device_pairs())
def test_mixing_devices(dev_a, dev_b):
    a, b = arange((2, 2), dev_a), arange((2, 2), dev_b)
    pattern = rf"different devices: {dev_a.name}\(\) and {dev_b.name}\(\)"
    for op in (lambda: a + b, lambda: a * b, lambda: a.maximum(b), lambda: a == b, lambda: a @ b):
        with pytest.raises(ValueError, match=pattern):
            op()
    with pytest.raises(ValueError, match=pattern):
        a[0] = b[0]
    np.testing.assert_array_equal(a.numpy(), [[0, 1], [2, 3]])  # nothing was written


@pytest.mark.skipif(not ndl.cpu().enabled(), reason="cpu() is not enabled here")
def test_mixing_cpu_and_cpu_numpy():
    a = nd.array([1.0, 2.0], device=ndl.cpu())
    b = nd.array([1.0, 2.0], device=ndl.cpu_numpy())
    with pytest.raises(ValueError, match=r"different devices: cpu\(\) and cpu_numpy\(\)"):
        a + b


@pytest.mark.parametrize("device", DEVICES)
def test_as_strided_errors(device):
    a = arange((12,), device)
    with pytest.raises(ValueError, match=r"reaches element 12, beyond the buffer of 12"):
        a.as_strided((4, 4), (3, 1))
    with pytest.raises(ValueError, match=r"offset 5 reaches element 12"):
        a[5:].as_strided((2, 4), (4, 1))
    with pytest.raises(ValueError, match="negative strides"):
        a.as_strided((3,), (-1,))
    with pytest.raises(ValueError, match="differ in length"):
        a.as_strided((3, 4), (4,))
    assert a.as_strided((0, 100), (100, 1)).shape == (0, 100)  # empty views touch nothing


@pytest.mark.parametrize("device", DEVICES)
def test_pad_errors(device):
    a = arange((2, 3), device)
    with pytest.raises(ValueError, match="one non-negative .* pair per dimension"):
        a.pad(((1, 1),))
    with pytest.raises(ValueError, match="non-negative"):
        a.pad(((1, 1), (-1, 0)))


@pytest.mark.parametrize("device", DEVICES)
def test_flip_axis_errors(device):
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        arange((2, 3), device).flip((2,))


# ---- the device modules themselves ----------------------------------------------------------
# NDArray validates before calling a kernel; the modules check again at the Python/C++ border,
# so a direct call with inconsistent sizes raises instead of reading or writing out of bounds.
# The patterns accept each module's wording; each names the function and the sizes involved.
# A view outside its buffer is a ValueError on every device (one error policy).
OUTSIDE_BUFFER = ValueError


@pytest.mark.parametrize("device", DEVICES)
def test_module_rejects_inconsistent_sizes(device):
    mod = device.mod
    a, b, out = mod.Array(12), mod.Array(2), mod.Array(12)
    mod.fill(a, 1.0)
    with pytest.raises(ValueError, match=r"ewise_add: .*\b2 elements"):
        mod.ewise_add(a, b, out)
    with pytest.raises(ValueError, match=r"scalar_mul: .*12 elements.*\b2\b"):
        mod.scalar_mul(a, 2.0, b)
    with pytest.raises(ValueError, match=r"ewise_exp: .*\b2 elements.*12"):
        mod.ewise_exp(b, out)
    with pytest.raises(ValueError, match=r"matmul: a .*\b15\b"):
        mod.matmul(a, a, out, 5, 3, 4)
    with pytest.raises(ValueError, match=r"matmul: out .*\b16\b"):
        mod.matmul(a, a, out, 4, 3, 4)
    with pytest.raises(ValueError, match=r"reduce_sum: .*need.? 15.* 12"):
        mod.reduce_sum(a, mod.Array(5), 3)
    with pytest.raises(ValueError, match=r"reduce_max: .*reduce_size.* 0"):
        mod.reduce_max(a, b, 0)
    with pytest.raises(ValueError, match=r"from_numpy: .*numpy array has 3 elements.*\b2\b"):
        mod.from_numpy(np.ones(3, np.float32), b)
    with pytest.raises(ValueError, match=r"compact: .*(6 elements.*12|12 elements.*6)"):
        mod.compact(a, out, (2, 3), (3, 1), 0)
    with pytest.raises(ValueError, match=r"ewise_setitem: .*(2 elements.*12|12 elements.*2)"):
        mod.ewise_setitem(a, out, (2,), (1,), 0)
    np.testing.assert_array_equal(mod.to_numpy(a, (12,), (1,), 0), np.ones(12))  # a intact


@pytest.mark.parametrize("device", DEVICES)
def test_module_rejects_views_outside_the_buffer(device):
    mod = device.mod
    a, out = mod.Array(4), mod.Array(6)
    with pytest.raises(
        OUTSIDE_BUFFER, match=r"compact.*view with shape \(2, 3\).*outside the buffer of 4"
    ):
        mod.compact(a, out, (2, 3), (3, 1), 0)
    with pytest.raises(OUTSIDE_BUFFER, match=r"to_numpy: .*offset 2.*outside the buffer of 4"):
        mod.to_numpy(a, (3,), (1,), 2)
    with pytest.raises(OUTSIDE_BUFFER, match=r"to_numpy: .*outside the buffer"):
        mod.to_numpy(a, (3,), (-1,), 1)  # a negative stride walking below element 0
    with pytest.raises(OUTSIDE_BUFFER, match=r"scalar_setitem.*outside the buffer of 4"):
        mod.scalar_setitem(5, 0.0, a, (5,), (1,), 0)
    with pytest.raises(OUTSIDE_BUFFER, match=r"ewise_setitem.*outside the buffer of 4"):
        mod.ewise_setitem(out, a, (2, 3), (2, 1), 0)
    with pytest.raises(ValueError, match="Array size must be non-negative, got -1"):
        mod.Array(-1)
    assert mod.to_numpy(a, (0, 9), (9, 1), 100).shape == (0, 9)  # empty views read nothing


@pytest.mark.parametrize("device", DEVICES)
def test_binary_into_checks_its_output(device):
    """fused.binary_into writes in place: it refuses an unknown op and a non-compact ``out``
    (which the kernel would write as if compact), and broadcasts a row as numpy does."""
    from needle.backend_ndarray.fused import binary_into

    out, row = arange((2, 3), device), arange((1, 3), device)
    binary_into("mul", out, row, out)
    np.testing.assert_array_equal(out.numpy(), np.arange(6).reshape(2, 3) * np.arange(3))
    with pytest.raises(ValueError, match="unknown op 'pow!'"):
        binary_into("pow!", out, row, out)
    with pytest.raises(ValueError, match="out must be a compact array"):
        binary_into("add", out.permute((1, 0)), row.reshape((3, 1)), out.permute((1, 0)))


# ---- the cached checks: reshape's and broadcast_to's shapes, device.empty/full's dtype -------
# Those checks are memoised per argument (the same shapes recur every step); a cached success
# must never let a different bad argument through, and a failure is never cached.
@pytest.mark.parametrize("device", DEVICES)
def test_cached_reshape_checks_every_call(device):
    a = arange((2, 3), device)
    assert a.reshape((3, 2)).shape == (3, 2)  # cached now
    for _ in range(2):  # the error is raised again, not remembered as a result
        with pytest.raises(ValueError, match=r"cannot reshape .*\(2, 4\).*8 elements.*\(3, 2\)"):
            arange((2, 4), device).reshape((3, 2))
        with pytest.raises(ValueError, match="non-compact"):
            a.permute((1, 0)).reshape((3, 2))  # same target, a view that is not compact
    assert a.reshape((np.int64(3), -1)).shape == (3, 2)  # numpy ints hash like ints
    with pytest.raises(TypeError):
        a.reshape(([3], 2))  # an unhashable entry takes the uncached checks
    with pytest.raises(ValueError, match="negative dimension"):
        a.reshape((-2, -3))


@pytest.mark.parametrize("device", DEVICES)
def test_cached_broadcast_checks_every_call(device):
    a = arange((2, 1), device)
    assert a.broadcast_to((2, 3)).strides == (1, 0)  # cached now
    b = arange((2, 3), device)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"cannot broadcast shape \(3, 1\) to \(2, 3\)"):
            arange((3, 1), device).broadcast_to((2, 3))
        with pytest.raises(ValueError, match="negative dimension"):
            a.broadcast_to((2, -3))
        with pytest.raises(ValueError, match="fewer dimensions"):
            b.broadcast_to((3,))
    view = b[:, 1:2].broadcast_to((2, 3))  # same source shape, other strides: its own entry
    np.testing.assert_array_equal(view.numpy(), np.repeat(b.numpy()[:, 1:2], 3, axis=1))
    with pytest.raises(TypeError):
        a.broadcast_to(([2], 3))


@pytest.mark.parametrize("device", DEVICES)
def test_device_empty_and_full_check_dtype_and_shape(device):
    assert device.full((2,), 3.0, dtype=np.float32).numpy().tolist() == [3.0, 3.0]
    assert device.empty((2, 2), dtype=np.dtype("float32")).shape == (2, 2)
    for dtype in ("float64", np.float64, np.int32, "f8"):
        with pytest.raises(TypeError, match="only float32"):
            device.full((2,), 1.0, dtype=dtype)
        with pytest.raises(TypeError, match="only float32"):
            device.empty((2,), dtype=dtype)
    with pytest.raises(ValueError, match="negative dimension"):
        device.full((2, -1), 1.0)
    with pytest.raises(ValueError, match="more than an array may hold"):
        device.empty((2**40, 2**40))
    fresh = nd.NDArray.make((2, 3), device=device)
    assert fresh.is_compact() and fresh.strides == (3, 1)
