"""The offline stand-in for MNIST: scikit-learn's 8x8 handwritten digits, MNIST-style.

scikit-learn ships the UCI 8x8 handwritten digits (1797 real scans, no download).
:func:`load_digits_mnist_like` gives them MNIST-style (flattened float32 images in [0, 1], uint8
labels), optionally resized to 28 x 28 with MNIST's layout (a 20 x 20 digit centred in a 4-pixel
margin); :func:`write_digits_idx` writes them as MNIST-named IDX ``.gz`` files (with
:func:`write_idx`), so ``needle.data.parse_mnist``, ``needle.data.MNISTDataset`` and
``mlp_resnet.train_mnist(data_dir=...)`` read them exactly as they read MNIST.
:class:`DigitsDataset` serves them as a ``needle.data.Dataset`` of whichever needle is imported.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from needle.data import Dataset

__all__ = [
    "MNIST_FILES",
    "write_idx",
    "load_digits_mnist_like",
    "write_digits_idx",
    "DigitsDataset",
]

# The four MNIST files, by split: (images, labels).
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# IDX type codes by numpy dtype (native byte order); the files store big-endian values.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_TYPES.items()}


def write_idx(filename: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file, gzipped when ``filename`` ends in ``.gz``; return its path.

    The gzip header carries no name or time, so equal arrays give byte-identical files.
    """
    array = np.asarray(array)
    code = _IDX_CODES.get(array.dtype.newbyteorder("="))
    if code is None or array.ndim == 0 or array.ndim > 255:
        raise ValueError(f"cannot write dtype {array.dtype} with {array.ndim} dimensions as IDX")
    header = bytes([0, 0, code, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape
    )
    payload = header + np.ascontiguousarray(array, dtype=_IDX_TYPES[code]).tobytes()
    path = Path(filename)
    if path.suffix == ".gz":
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f,
        ):
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


_DIGITS_TRAIN = 1500  # of 1797; the remaining 297 form the test split


@functools.lru_cache(maxsize=1)
def _digits_raw() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # imported lazily: it takes about a second

    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))  # fixed, global RNG untouched
    return (digits.images[order] / 16.0).astype(np.float32), digits.target[order].astype(np.uint8)


def _resize_matrix(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) bilinear interpolation weights mapping pixel centres onto pixel centres."""
    src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    w = np.zeros((n_out, n_in))
    np.add.at(w, (np.arange(n_out), lo), 1 - (src - lo))
    np.add.at(w, (np.arange(n_out), hi), src - lo)
    return w


def load_digits_mnist_like(
    image_size: int = 8, train: Optional[bool] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """scikit-learn's handwritten digits as MNIST-style arrays, offline.

    Returns ``X`` float32 (N, image_size**2) in [0, 1] and ``y`` uint8 (N,). ``image_size=8``
    gives the raw 8 x 8 scans (values /16); a larger size resizes each digit bilinearly into a
    centred box of ``image_size - 2*round(image_size/7)`` pixels (20 x 20 inside 28 x 28, like
    MNIST). The 1797 samples are in a fixed shuffled order; ``train=True`` gives the first 1500,
    ``train=False`` the last 297, ``None`` all of them.
    """
    if (
        isinstance(image_size, bool)
        or not isinstance(image_size, (int, np.integer))
        or image_size < 8
    ):
        raise ValueError(f"image_size must be an integer >= 8, got {image_size!r}")
    images, labels = _digits_raw()
    if train is not None:
        sl = slice(None, _DIGITS_TRAIN) if train else slice(_DIGITS_TRAIN, None)
        images, labels = images[sl], labels[sl]
    if image_size > 8:
        margin = round(image_size / 7)
        r = _resize_matrix(image_size - 2 * margin, 8)
        box = np.einsum("ij,njk,lk->nil", r, images, r)
        out = np.zeros((len(images), image_size, image_size))
        out[:, margin : image_size - margin, margin : image_size - margin] = box
        images = np.clip(out, 0.0, 1.0)
    return images.reshape(len(labels), -1).astype(np.float32), labels.copy()


def write_digits_idx(root: str | Path, image_size: int = 28) -> dict:
    """Write the offline digits as MNIST-named IDX ``.gz`` files in ``root``.

    Writes ``train-images-idx3-ubyte.gz``/``train-labels-idx1-ubyte.gz`` (1500 samples) and the
    ``t10k-*`` pair (297), pixels stored as uint8 ``round(255 x)``. Returns
    ``{"train": (images_path, labels_path), "test": (...)}``. Reading them back with
    ``needle.data.parse_mnist`` gives :func:`load_digits_mnist_like` to within 1/510.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, train in (("train", True), ("test", False)):
        X, y = load_digits_mnist_like(image_size, train=train)
        pixels = np.round(X * 255).astype(np.uint8).reshape(-1, image_size, image_size)
        img_name, lbl_name = MNIST_FILES[split]
        paths[split] = (write_idx(root / img_name, pixels), write_idx(root / lbl_name, y))
    return paths


class DigitsDataset(Dataset):
    """The offline digits as an in-memory Dataset: items like ``needle.data.MNISTDataset``.

    ``DigitsDataset(train=True, image_size=8, transforms=None)``: x (image_size**2,) float32 in
    [0, 1], y uint8; transforms see image_size x image_size x 1 images.
    """

    def __init__(self, train: bool = True, image_size: int = 8, transforms: Optional[List] = None):
        super().__init__(transforms)
        self.images, self.labels = load_digits_mnist_like(image_size, train=train)
        self.image_shape = (image_size, image_size, 1)

    # Indexing as needle's MNISTDataset does, written out rather than borrowed from it: a
    # student's MNISTDataset (NEEDLE_IMPL) keeps its images its own way.
    def _transform(self, x: np.ndarray) -> np.ndarray:
        return self.apply_transforms(x.reshape(self.image_shape)).reshape(-1)

    def __getitem__(self, index) -> Tuple[np.ndarray, np.ndarray]:
        X, y = self.images[index], self.labels[index]
        if self.transforms:
            X = self._transform(X) if X.ndim == 1 else np.stack([self._transform(x) for x in X])
        return X, y

    def __len__(self) -> int:
        return self.images.shape[0]
