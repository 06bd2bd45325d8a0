"""needle.data: transforms, DataLoader, NDArrayDataset, the IDX/MNIST reader, the offline digits."""

import gzip
import struct

import numpy as np
import pytest
from conftest import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st

import companion.data
import companion.data.digits
import needle as ndl
from needle.data.datasets import mnist_dataset as md

pytestmark = [pytest.mark.data, pytest.mark.both_backends]

MNIST_DIR = SHARED_DATA / "mnist"
# The MNIST test set's label counts, as published with the data set.
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# ---- transforms --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.hw2_flip_horizontal
def test_flip_follows_the_course_draw(seed):
    img = np.random.rand(4, 5, 3)
    np.random.seed(seed)
    flips = np.random.rand() < 0.5  # the course's draw
    np.random.seed(seed)
    out = ndl.data.RandomFlipHorizontal(0.5)(img)
    expected = np.stack([img[:, 4 - j, :] for j in range(5)], axis=1) if flips else img
    np.testing.assert_array_equal(out, expected)


@pytest.mark.hw2_flip_horizontal
def test_flip_extremes():
    img = np.arange(24.0).reshape(2, 4, 3)
    np.testing.assert_array_equal(ndl.data.RandomFlipHorizontal(1.0)(img), img[:, ::-1, :])
    np.testing.assert_array_equal(ndl.data.RandomFlipHorizontal(0.0)(img), img)


@settings(max_examples=30, deadline=None)
@given(
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    c=st.integers(1, 3),
    pad=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.hw2_random_crop
def test_crop_matches_a_shift_loop(h, w, c, pad, seed):
    img = np.random.RandomState(seed).rand(h, w, c)
    np.random.seed(seed)
    sx, sy = np.random.randint(low=-pad, high=pad + 1, size=2)  # the course's draw
    np.random.seed(seed)
    out = ndl.data.RandomCrop(pad)(img)
    expected = np.zeros_like(img)
    for i in range(h):
        for j in range(w):
            if 0 <= i + sx < h and 0 <= j + sy < w:
                expected[i, j] = img[i + sx, j + sy]
    np.testing.assert_array_equal(out, expected)


def test_transforms_reject_bad_input():
    with pytest.raises(ValueError, match="padding"):
        ndl.data.RandomCrop(-1)
    with pytest.raises(ValueError, match="probability"):
        ndl.data.RandomFlipHorizontal(1.5)
    with pytest.raises(ValueError, match="H x W x C"):
        ndl.data.RandomCrop(1)(np.zeros((4, 4)))
    with pytest.raises(TypeError, match="callable"):
        ndl.data.Dataset(transforms=[3])


# ---- NDArrayDataset and DataLoader -------------------------------------------------------------


def test_ndarray_dataset_indexing_and_validation():
    a, b = np.arange(10.0).reshape(5, 2), np.arange(5)
    ds = ndl.data.NDArrayDataset(a, b)
    assert len(ds) == 5
    x, y = ds[3]
    np.testing.assert_array_equal(x, [6.0, 7.0])
    assert y == 3
    xs, ys = ds[np.array([4, 0])]
    np.testing.assert_array_equal(xs, a[[4, 0]])
    np.testing.assert_array_equal(ys, [4, 0])
    with pytest.raises(ValueError, match="first dimension"):
        ndl.data.NDArrayDataset(a, np.arange(4))
    with pytest.raises(ValueError, match="at least one"):
        ndl.data.NDArrayDataset()


@pytest.mark.parametrize("n,batch", [(10, 3), (9, 3), (5, 7), (1, 1)])
@pytest.mark.hw2_dataloader
def test_loader_batches_in_order(n, batch):
    X = np.random.rand(n, 4).astype(np.float32)
    y = np.arange(n)
    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), batch_size=batch)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-n // batch)
    start = 0
    for Xb, yb in batches:
        assert isinstance(Xb, ndl.Tensor) and isinstance(yb, ndl.Tensor)
        stop = min(start + batch, n)
        np.testing.assert_allclose(Xb.numpy(), X[start:stop])
        np.testing.assert_array_equal(yb.numpy(), y[start:stop])
        start = stop
    assert start == n


@pytest.mark.hw2_dataloader
def test_loader_shuffle_draws_a_permutation_per_epoch():
    n, batch = 11, 4
    ds = ndl.data.NDArrayDataset(np.arange(n).reshape(n, 1).astype(np.float32))
    loader = ndl.data.DataLoader(ds, batch_size=batch, shuffle=True)
    np.random.seed(3)
    epoch1 = np.concatenate([b[0].numpy().ravel() for b in loader])
    epoch2 = np.concatenate([b[0].numpy().ravel() for b in loader])
    np.random.seed(3)
    expected1 = np.random.permutation(n)
    expected2 = np.random.permutation(n)
    np.testing.assert_array_equal(epoch1, expected1)
    np.testing.assert_array_equal(epoch2, expected2)
    assert not np.array_equal(epoch1, epoch2)


def test_loader_validation_and_empty_dataset():
    ds = ndl.data.NDArrayDataset(np.zeros((3, 2)))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            ndl.data.DataLoader(ds, batch_size=bad)
    with pytest.raises(TypeError, match="dataset"):
        ndl.data.DataLoader(object(), batch_size=1)
    assert list(ndl.data.DataLoader(ndl.data.NDArrayDataset(np.zeros((0, 2))), 4)) == []


def test_loader_over_a_dataset_that_takes_only_int_indices_says_why():
    class IntOnly(ndl.data.Dataset):
        def __init__(self):
            self.rows = [np.full(3, i, dtype=np.float32) for i in range(5)]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]  # a list: an index array is a TypeError

    with pytest.raises(
        TypeError,
        match=r"dataset\[indices\] with indices a 1-D int array "
        r"\(here \[0, 1\]\).*IntOnly.__getitem__ failed",
    ):
        next(iter(ndl.data.DataLoader(IntOnly(), batch_size=2)))


def test_loader_device_keyword():
    dev = ndl.cpu()
    ds = ndl.data.NDArrayDataset(np.ones((4, 2), dtype=np.float32))
    (Xb,) = next(iter(ndl.data.DataLoader(ds, 4, device=dev)))
    assert Xb.device == dev


# ---- IDX files and MNISTDataset ----------------------------------------------------------------


def _idx_bytes(magic, dims, payload: bytes) -> bytes:
    """An IDX file assembled by hand with struct (independent of write_idx)."""
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def _write_mnist(tmp_path, images: np.ndarray, labels: np.ndarray, gz=True):
    n, r, c = images.shape
    ib = _idx_bytes(2051, (n, r, c), images.astype(np.uint8).tobytes())
    lb = _idx_bytes(2049, (len(labels),), labels.astype(np.uint8).tobytes())
    suffix = ".gz" if gz else ""
    ip, lp = tmp_path / f"img{suffix}", tmp_path / f"lbl{suffix}"
    ip.write_bytes(gzip.compress(ib) if gz else ib)
    lp.write_bytes(gzip.compress(lb) if gz else lb)
    return ip, lp


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.hw0_parse_mnist
def test_parse_mnist_hand_built_file(tmp_path, gz):
    images = np.random.randint(0, 256, size=(7, 3, 4))
    labels = np.random.randint(0, 10, size=7)
    X, y = ndl.data.parse_mnist(*_write_mnist(tmp_path, images, labels, gz))
    assert X.dtype == np.float32 and X.shape == (7, 12)
    assert y.dtype == np.uint8
    np.testing.assert_allclose(X, images.reshape(7, 12) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, labels)


@pytest.mark.parametrize(
    "dtype,shape",
    [
        (np.uint8, (5, 2, 3)),
        (np.int32, (4,)),
        (np.float32, (2, 2)),
        (np.float64, (3, 1, 1, 2)),
        (np.int16, (6,)),
        (np.int8, (2, 3)),
    ],
)
def test_write_idx_read_idx_roundtrip(tmp_path, dtype, shape):
    a = (np.random.randn(*shape) * 50).astype(dtype)
    for name in ("a.idx", "a.idx.gz"):
        companion.data.write_idx(tmp_path / name, a)
        back = md.read_idx(tmp_path / name)
        assert back.dtype == np.dtype(dtype) and back.shape == shape
        np.testing.assert_array_equal(back, a)


def test_write_idx_header_matches_the_format(tmp_path):
    companion.data.write_idx(tmp_path / "x.idx", np.arange(6, dtype=np.uint8).reshape(1, 2, 3))
    assert (tmp_path / "x.idx").read_bytes() == _idx_bytes(2051, (1, 2, 3), bytes(range(6)))


def test_bad_magic_number(tmp_path):
    ip, lp = _write_mnist(tmp_path, np.zeros((2, 2, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        ndl.data.parse_mnist(lp, lp)  # labels given as images
    (tmp_path / "junk").write_bytes(b"\x12\x34\x56\x78" + bytes(20))
    with pytest.raises(ValueError, match="bad IDX magic number"):
        ndl.data.parse_mnist(tmp_path / "junk", lp)


def test_truncated_files(tmp_path):
    images = np.random.randint(0, 256, size=(4, 5, 5))
    raw = _idx_bytes(2051, (4, 5, 5), images.astype(np.uint8).tobytes())
    lp = _write_mnist(tmp_path, images, np.zeros(4))[1]
    (tmp_path / "short.gz").write_bytes(gzip.compress(raw[:-7]))
    with pytest.raises(
        ValueError, match="truncated: shape \\(4, 5, 5\\) needs 100 bytes of data, found 93"
    ):
        ndl.data.parse_mnist(tmp_path / "short.gz", lp)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(raw)[:-30])  # the gzip stream itself is cut
    with pytest.raises(ValueError, match="not a valid gzip file"):
        ndl.data.parse_mnist(tmp_path / "cut.gz", lp)
    (tmp_path / "hdr").write_bytes(raw[:9])
    with pytest.raises(ValueError, match="truncated"):
        ndl.data.parse_mnist(tmp_path / "hdr", lp)
    (tmp_path / "long").write_bytes(raw + b"\x00")
    with pytest.raises(ValueError, match="longer than its header"):
        ndl.data.parse_mnist(tmp_path / "long", lp)


def test_count_mismatch_and_missing_file(tmp_path):
    ip, _ = _write_mnist(tmp_path, np.zeros((3, 2, 2)), np.zeros(3))
    (tmp_path / "l2").write_bytes(_idx_bytes(2049, (2,), bytes(2)))
    with pytest.raises(ValueError, match="3 images but .* 2 labels"):
        ndl.data.parse_mnist(ip, tmp_path / "l2")
    with pytest.raises(FileNotFoundError, match="nope"):
        ndl.data.MNISTDataset(str(tmp_path / "nope"), str(ip))


@pytest.mark.hw2_mnist_dataset
def test_mnist_dataset_indexing_and_transforms(tmp_path):
    images = np.random.randint(0, 256, size=(6, 4, 5))
    labels = np.array([3, 1, 4, 1, 5, 9])
    ip, lp = _write_mnist(tmp_path, images, labels)
    ds = ndl.data.MNISTDataset(str(ip), str(lp))
    assert len(ds) == 6
    x, y = ds[2]
    assert x.shape == (20,) and y == 4
    np.testing.assert_allclose(x, images[2].ravel() / 255.0, rtol=1e-6)
    xs, ys = ds[1:4]
    assert xs.shape == (3, 20)
    np.testing.assert_array_equal(ys, [1, 4, 1])
    xs, ys = ds[np.array([5, 0])]
    np.testing.assert_allclose(xs, images[[5, 0]].reshape(2, 20) / 255.0, rtol=1e-6)
    flipped = ndl.data.MNISTDataset(
        str(ip), str(lp), transforms=[ndl.data.RandomFlipHorizontal(1.0)]
    )
    x, _ = flipped[0]
    np.testing.assert_allclose(x, images[0][:, ::-1].ravel() / 255.0, rtol=1e-6)
    xs, _ = flipped[np.array([1, 2])]
    np.testing.assert_allclose(xs, images[[1, 2]][:, :, ::-1].reshape(2, 20) / 255.0, rtol=1e-6)


@pytest.mark.hw2_mnist_dataset
@pytest.mark.hw2_dataloader
def test_loader_over_mnist_dataset(tmp_path):
    images = np.random.randint(0, 256, size=(5, 2, 2))
    ds = ndl.data.MNISTDataset(*map(str, _write_mnist(tmp_path, images, np.arange(5))))
    (Xb, yb), (Xc, yc) = list(ndl.data.DataLoader(ds, batch_size=3))
    assert Xb.shape == (3, 4) and Xc.shape == (2, 4)
    np.testing.assert_allclose(Xc.numpy(), images[3:].reshape(2, 4) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(yc.numpy(), [3, 4])


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason="no real MNIST beside the checkout")
def test_real_mnist_test_set():
    ds = ndl.data.MNISTDataset(
        str(MNIST_DIR / "t10k-images-idx3-ubyte.gz"), str(MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    )
    assert len(ds) == 10000
    X, y = ds[np.arange(10000)]
    assert X.shape == (10000, 784) and X.dtype == np.float32
    assert X.min() == 0.0 and X.max() == 1.0
    assert np.bincount(y).tolist() == MNIST_TEST_COUNTS


# ---- the offline digits ------------------------------------------------------------------------


def test_digits_match_scikit_learn():
    from sklearn.datasets import load_digits

    ref = load_digits()
    X, y = companion.data.load_digits_mnist_like()
    assert X.shape == (1797, 64) and X.dtype == np.float32 and y.dtype == np.uint8
    assert X.min() == 0.0 and X.max() == 1.0
    np.testing.assert_array_equal(np.bincount(y), np.bincount(ref.target))
    # the same scans, in another order: match the samples as (label, pixel bytes) multisets
    ours = sorted((int(t), row.tobytes()) for t, row in zip(y, (X * 16).round().astype(np.uint8)))
    theirs = sorted(
        (int(t), row.tobytes()) for t, row in zip(ref.target, ref.data.astype(np.uint8))
    )
    assert ours == theirs


def test_digits_split_partitions_the_set():
    X, y = companion.data.load_digits_mnist_like()
    Xtr, ytr = companion.data.load_digits_mnist_like(train=True)
    Xte, yte = companion.data.load_digits_mnist_like(train=False)
    assert len(ytr) == 1500 and len(yte) == 297
    np.testing.assert_array_equal(np.concatenate([Xtr, Xte]), X)
    np.testing.assert_array_equal(np.concatenate([ytr, yte]), y)


def test_resize_matrix_is_bilinear():
    np.testing.assert_allclose(companion.data.digits._resize_matrix(8, 8), np.eye(8))
    r = companion.data.digits._resize_matrix(20, 8)
    np.testing.assert_allclose(r.sum(axis=1), 1.0)
    ramp = np.arange(8.0)
    centres = (np.arange(20) + 0.5) * 8 / 20 - 0.5
    interior = (centres >= 0) & (centres <= 7)
    np.testing.assert_allclose((r @ ramp)[interior], centres[interior])


def test_digits_28_have_the_mnist_layout():
    X, y = companion.data.load_digits_mnist_like(28)
    assert X.shape == (1797, 784)
    imgs = X.reshape(-1, 28, 28)
    assert imgs[:, :4].max() == 0 and imgs[:, -4:].max() == 0
    assert imgs[:, :, :4].max() == 0 and imgs[:, :, -4:].max() == 0
    # a blank-bordered 8x8 scan stays centred: ink mass balances around the middle
    X8, _ = companion.data.load_digits_mnist_like(8)
    ink8 = X8.reshape(-1, 8, 8).sum(axis=(1, 2))
    ink28 = imgs.sum(axis=(1, 2))
    np.testing.assert_allclose(ink28 / ink8, (20 / 8) ** 2, rtol=0.05)
    with pytest.raises(ValueError, match="image_size"):
        companion.data.load_digits_mnist_like(4)


def test_write_digits_idx_reads_back(tmp_path):
    paths = companion.data.write_digits_idx(tmp_path, image_size=28)
    X, y = ndl.data.parse_mnist(*paths["test"])
    Xr, yr = companion.data.load_digits_mnist_like(28, train=False)
    assert X.shape == (297, 784)
    np.testing.assert_array_equal(y, yr)
    assert np.abs(X - Xr).max() <= 1 / 510 + 1e-7
    ds = ndl.data.MNISTDataset(*map(str, paths["train"]))
    assert len(ds) == 1500 and ds[0][0].shape == (784,)
    first = (tmp_path / "t10k-images-idx3-ubyte.gz").read_bytes()
    companion.data.write_digits_idx(tmp_path, image_size=28)
    assert (tmp_path / "t10k-images-idx3-ubyte.gz").read_bytes() == first  # reproducible bytes


def test_digits_dataset():
    ds = companion.data.DigitsDataset(train=False)
    X, y = companion.data.load_digits_mnist_like(train=False)
    assert len(ds) == 297
    np.testing.assert_array_equal(ds[np.arange(297)][0], X)
    crop = companion.data.DigitsDataset(train=False, transforms=[ndl.data.RandomCrop(0)])
    np.testing.assert_array_equal(crop[5][0], X[5])
