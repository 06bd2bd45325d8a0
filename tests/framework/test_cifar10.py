"""CIFAR10Dataset on pickle batches the tests write themselves, and the offline ShapesDataset."""

import pickle

import numpy as np
import pytest
from conftest import SHARED_DATA

import companion.data
import needle as ndl

pytestmark = pytest.mark.data


def pixel(n, c, h, w):
    """The byte the fake batches store for image n, channel c, row h, column w."""
    return (n * 7 + c * 31 + h * 3 + w * 5) % 256


def fake_batch(n_images, first, label_offset=0):
    """A dict like a real CIFAR-10 batch, images numbered from ``first``.

    Rows are laid out as CIFAR-10 documents: 1024 red, then green, then blue bytes, each 32x32
    row-major.
    """
    data = np.empty((n_images, 3072), dtype=np.uint8)
    for i in range(n_images):
        for c in range(3):
            for h in range(32):
                for w in range(32):
                    data[i, c * 1024 + h * 32 + w] = pixel(first + i, c, h, w)
    labels = [(first + i + label_offset) % 10 for i in range(n_images)]
    return {
        b"batch_label": b"fake",
        b"data": data,
        b"labels": labels,
        b"filenames": [b"img%d.png" % (first + i) for i in range(n_images)],
    }


def write(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


@pytest.fixture
def cifar_dir(tmp_path):
    sizes = [3, 2, 4, 1, 2]
    first = 0
    for i, n in enumerate(sizes, start=1):
        write(tmp_path / f"data_batch_{i}", fake_batch(n, first))
        first += n
    write(tmp_path / "test_batch", fake_batch(5, 100, label_offset=3))
    return tmp_path


@pytest.mark.hw4_cifar10_dataset
def test_reads_all_train_batches_in_order(cifar_dir):
    ds = ndl.data.CIFAR10Dataset(str(cifar_dir), train=True)
    assert len(ds) == 12
    assert ds.X.shape == (12, 3, 32, 32) and ds.X.dtype == np.float32
    for n in [0, 4, 11]:
        x, y = ds[n]
        assert x.shape == (3, 32, 32)
        assert y == n % 10
        for c, h, w in [(0, 0, 0), (1, 5, 31), (2, 31, 7), (0, 17, 3)]:
            assert x[c, h, w] == pytest.approx(pixel(n, c, h, w) / 255.0, abs=1e-7)


@pytest.mark.hw4_cifar10_dataset
def test_reads_test_batch(cifar_dir):
    ds = ndl.data.CIFAR10Dataset(str(cifar_dir), train=False)
    assert len(ds) == 5
    x, y = ds[2]
    assert y == (102 + 3) % 10
    assert x[2, 9, 4] == pytest.approx(pixel(102, 2, 9, 4) / 255.0, abs=1e-7)
    assert 0.0 <= ds.X.min() and ds.X.max() <= 1.0


def test_batch_indexing_and_dataloader(cifar_dir):
    ds = ndl.data.CIFAR10Dataset(str(cifar_dir), train=True)
    xb, yb = ds[np.array([1, 5, 9])]
    assert xb.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(yb, [1, 5, 9])
    batches = list(ndl.data.DataLoader(ds, batch_size=5, shuffle=False))
    assert [b[0].shape for b in batches] == [(5, 3, 32, 32), (5, 3, 32, 32), (2, 3, 32, 32)]
    np.testing.assert_allclose(batches[1][0].numpy(), ds.X[5:10])
    np.testing.assert_array_equal(batches[2][1].numpy(), [0, 1])


def test_transforms_act_on_image_width(cifar_dir):
    flip = ndl.data.CIFAR10Dataset(
        str(cifar_dir), train=True, transforms=[ndl.data.RandomFlipHorizontal(p=1.0)]
    )
    plain = ndl.data.CIFAR10Dataset(str(cifar_dir), train=True)
    np.testing.assert_array_equal(flip[3][0], plain[3][0][:, :, ::-1])
    xb, _ = flip[np.array([0, 1])]
    np.testing.assert_array_equal(xb, plain.X[:2, :, :, ::-1])


def _expect_error(folder, exc, match):
    with pytest.raises(exc, match=match):
        ndl.data.CIFAR10Dataset(str(folder), train=True)


def test_rejects_missing_key(cifar_dir):
    batch = fake_batch(2, 0)
    del batch[b"labels"]
    write(cifar_dir / "data_batch_2", batch)
    _expect_error(cifar_dir, ValueError, r"data_batch_2.*missing.*labels")


def test_rejects_wrong_row_size(cifar_dir):
    batch = fake_batch(2, 0)
    batch[b"data"] = batch[b"data"][:, :3000]
    write(cifar_dir / "data_batch_3", batch)
    _expect_error(cifar_dir, ValueError, r"data_batch_3.*\(2, 3000\).*3072")


def test_rejects_label_count_mismatch(cifar_dir):
    batch = fake_batch(3, 0)
    batch[b"labels"] = batch[b"labels"][:2]
    write(cifar_dir / "data_batch_1", batch)
    _expect_error(cifar_dir, ValueError, r"data_batch_1.*labels for 3 images")


def test_rejects_labels_out_of_range(cifar_dir):
    batch = fake_batch(2, 0)
    batch[b"labels"] = [3, 10]
    write(cifar_dir / "data_batch_1", batch)
    _expect_error(cifar_dir, ValueError, r"0\.\.9")


def test_rejects_truncated_and_non_pickle_files(cifar_dir):
    blob = pickle.dumps(fake_batch(2, 0))
    (cifar_dir / "data_batch_4").write_bytes(blob[: len(blob) // 2])
    _expect_error(cifar_dir, ValueError, r"data_batch_4.*not a readable python pickle")
    write(cifar_dir / "data_batch_4", fake_batch(1, 0))
    (cifar_dir / "data_batch_5").write_text("label,pixels\n3,0 0 0\n")
    _expect_error(cifar_dir, ValueError, r"data_batch_5.*not a readable python pickle")


def test_rejects_non_dict_and_missing_files(cifar_dir, tmp_path):
    write(cifar_dir / "data_batch_1", [1, 2, 3])
    _expect_error(cifar_dir, ValueError, r"holds a list")
    (cifar_dir / "data_batch_1").unlink()
    _expect_error(cifar_dir, FileNotFoundError, r"data_batch_1")
    _expect_error(tmp_path / "nowhere", FileNotFoundError, r"nowhere.*does not exist")


@pytest.mark.skipif(
    not (SHARED_DATA / "cifar-10-batches-py").is_dir(),
    reason="real CIFAR-10 is not in ../shared/data",
)
def test_real_cifar10():
    ds = ndl.data.CIFAR10Dataset(str(SHARED_DATA / "cifar-10-batches-py"), train=False)
    assert len(ds) == 10000 and ds[0][0].shape == (3, 32, 32)
    np.testing.assert_array_equal(np.bincount(ds.y), [1000] * 10)


# ---- the offline image set ---------------------------------------------------------------------
def test_shapes_dataset_format_and_determinism():
    state = np.random.get_state()
    a = companion.data.ShapesDataset(train=True, n=60, seed=3)
    assert np.array_equal(state[1], np.random.get_state()[1]), "global RNG was touched"
    b = companion.data.ShapesDataset(train=True, n=60, seed=3)
    assert len(a) == 60 and a.X.shape == (60, 3, 32, 32) and a.X.dtype == np.float32
    np.testing.assert_array_equal(a.X, b.X)
    np.testing.assert_array_equal(a.y, b.y)
    assert a.X.min() >= 0.0 and a.X.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(a.y, minlength=10), [6] * 10)
    x, y = a[4]
    assert x.shape == (3, 32, 32) and 0 <= y <= 9
    assert companion.data.ShapesDataset(train=False).X.shape == (500, 3, 32, 32)
    assert len(companion.data.ShapesDataset(train=True)) == 2000


def test_shapes_train_test_and_seeds_differ():
    train = companion.data.ShapesDataset(train=True, n=40, seed=0)
    test = companion.data.ShapesDataset(train=False, n=40, seed=0)
    other = companion.data.ShapesDataset(train=True, n=40, seed=1)
    flat = lambda d: d.X.reshape(len(d), -1)  # noqa: E731
    # no test image equals (or nearly equals) any training image
    dists = ((flat(test)[:, None, :] - flat(train)[None, :, :]) ** 2).mean(-1)
    assert dists.min() > 1e-3
    assert not np.allclose(train.X, other.X)


def test_shapes_textures_have_their_orientation():
    ds = companion.data.ShapesDataset(train=True, n=200, seed=5)
    # per channel, then the channel with the most contrast (grey levels of fg/bg may match)
    along_w = ds.X.std(axis=3).mean(axis=2).max(axis=1)  # variation within each row
    along_h = ds.X.std(axis=2).mean(axis=2).max(axis=1)  # variation within each column
    hs, vs = (
        ds.y == companion.data.SHAPES_CLASSES.index("hstripes"),
        ds.y == companion.data.SHAPES_CLASSES.index("vstripes"),
    )
    # horizontal stripes are constant along a row up to noise; vertical ones along a column
    assert np.all(along_h[hs] > 2 * along_w[hs])
    assert np.all(along_w[vs] > 2 * along_h[vs])


def test_shapes_objects_cover_part_of_a_plain_background():
    """An object image is mostly one background colour (up to the gradient and noise) with a
    visible foreground: 50-97 % of its pixels lie within 0.35 of the median colour."""
    ds = companion.data.ShapesDataset(train=True, n=300, seed=6)
    median = np.median(ds.X, axis=(2, 3))
    near = (np.linalg.norm(ds.X - median[:, :, None, None], axis=1) < 0.35).mean(axis=(1, 2))
    for name in ["disc", "square", "triangle", "ring", "cross"]:
        frac = near[ds.y == companion.data.SHAPES_CLASSES.index(name)]
        assert frac.min() > 0.5 and frac.max() < 0.97, (name, frac.min(), frac.max())


def test_make_shapes_images_rejects_bad_n():
    with pytest.raises(ValueError, match="non-negative int"):
        companion.data.make_shapes_images(-1)
