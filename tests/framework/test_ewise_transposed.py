"""Element-wise ops on large transposed views against numpy, exactly.

The CPU module copies a large transposed operand into a scratch buffer before an element-wise
op (docs/array_layer.md says when); small views and views that do not fold to a transposed
matrix are read in place. These cases sit on both sides of that rule: sizes around its
threshold, permutations of 3-d arrays, broadcast (stride-0) operands beside a transposed one,
flipped and sliced transposes, and scalar ops on transposed views. Element-wise ops are exact,
so results must equal numpy's bit for bit (NaN where numpy has NaN).
"""

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":
    pytest.skip("the NDArray suite runs with NEEDLE_BACKEND=nd", allow_module_level=True)

from needle import backend_ndarray as nd  # noqa: E402

THRESHOLD = 1 << 18  # elements: the CPU module's kScratchMin


def pair(device, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x, nd.NDArray(x, device=device)


def check(got: nd.NDArray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.numpy(), want)


# (rows, cols) of the matrix whose transpose is added: just below, at and above the
# threshold, a non-power-of-two side, and thin shapes (one side under the 16 of a block).
SHAPES = [(511, 512), (512, 512), (513, 512), (1000, 300), (8, 40000), (40000, 8), (17, 16000)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_binary_with_transposed_operand(device, shape):
    x, X = pair(device, shape, 1)
    y, Y = pair(device, shape[::-1], 2)
    XT = X.permute((1, 0))
    check(XT + Y, x.T + y)
    check(Y - XT, y - x.T)  # the transposed view as the second operand
    check(XT * X.permute((1, 0)), x.T * x.T)  # both operands transposed
    check(XT.maximum(Y), np.maximum(x.T, y))
    check(XT / Y, x.T / y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axes", [(0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
def test_permuted_3d(device, axes):
    x, X = pair(device, (24, 96, 130), 3)
    want_shape = tuple(x.shape[a] for a in axes)
    y, Y = pair(device, want_shape, 4)
    P = X.permute(axes)
    check(P + Y, x.transpose(axes) + y)
    check(Y * P, y * x.transpose(axes))


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_beside_transposed(device):
    x, X = pair(device, (700, 600), 5)
    row, ROW = pair(device, (1, 700), 6)
    col, COL = pair(device, (600, 1), 7)
    XT = X.permute((1, 0))
    check(XT + ROW.broadcast_to((600, 700)), x.T + row)
    check(COL.broadcast_to((600, 700)) - XT, col - x.T)
    check(XT * ROW, x.T * row)  # broadcast by the op itself
    batch, BATCH = pair(device, (3, 700, 600), 8)
    check(BATCH + XT.permute((1, 0)).broadcast_to((3, 700, 600)), batch + x)
    check(BATCH.permute((0, 2, 1)) + XT, batch.transpose(0, 2, 1) + x.T)


@pytest.mark.parametrize("device", DEVICES)
def test_flipped_and_sliced_transposes(device):
    x, X = pair(device, (900, 800), 9)
    y, Y = pair(device, (800, 900), 10)
    XT = X.permute((1, 0))
    check(XT.flip((0,)) + Y, x.T[::-1] + y)
    check(XT.flip((0, 1)) + Y, x.T[::-1, ::-1] + y)
    check(XT[10:700, 3:890] + Y[:690, :887], x.T[10:700, 3:890] + y[:690, :887])
    check(XT[::2, ::3] * Y[::2, ::3], x.T[::2, ::3] * y[::2, ::3])


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_on_transposed(device):
    x, X = pair(device, (640, 520), 11)
    pos = np.abs(x) + np.float32(0.5)
    P = nd.NDArray(pos, device=device).permute((1, 0))
    XT = X.permute((1, 0))
    check(XT + 1.5, x.T + np.float32(1.5))
    check(1.5 - XT, np.float32(1.5) - x.T)
    check(XT * -3.0, x.T * np.float32(-3.0))
    check(2.0 / P, np.float32(2.0) / pos.T)
    check(XT**2, x.T**2)
    check(XT >= 0.25, (x.T >= np.float32(0.25)).astype(np.float32))
    # A general power is not numpy's to the last bit on any layout: it must equal needle's own
    # result on the compact copy, and numpy's within rounding.
    check(P**1.5, (P.compact() ** 1.5).numpy())
    np.testing.assert_allclose((P**1.5).numpy(), pos.T ** np.float32(1.5), rtol=3e-7)


def test_scratch_copy_is_released():
    """The scratch copy of the plan is freed with the call: live bytes return to where they
    were, beside the one result the call keeps."""
    device = nd.cpu()
    if not device.enabled():
        pytest.skip("cpu() is not enabled here")
    mod = device.mod
    x, X = pair(device, (1024, 1024), 12)
    y, Y = pair(device, (1024, 1024), 13)
    XT = X.permute((1, 0))
    before = mod.memory_stats()["live_bytes"]
    mod.reset_peak()
    out = XT + Y
    stats = mod.memory_stats()
    assert stats["live_bytes"] - before == x.nbytes  # only the result stays
    assert stats["peak_bytes"] - before == 2 * x.nbytes  # result + scratch during the call
    np.testing.assert_array_equal(out.numpy(), x.T + y)
    small_x, small_y = X[:100, :100].permute((1, 0)), Y[:100, :100]  # views: no allocation
    before = mod.memory_stats()["live_bytes"]
    mod.reset_peak()
    small = small_x + small_y  # under the threshold: read in place, no scratch
    stats = mod.memory_stats()
    assert stats["peak_bytes"] == stats["live_bytes"] > before
    np.testing.assert_array_equal(small.numpy(), x[:100, :100].T + y[:100, :100])
