"""MNIST: a validating IDX reader, ``parse_mnist`` and ``MNISTDataset``.

IDX is MNIST's file format: a 4-byte magic number ``0x00 0x00 <type> <ndim>``, ``ndim``
big-endian uint32 sizes, then the row-major data. MNIST's images are magic 2051 (uint8, 3-D:
N x 28 x 28), its labels magic 2049 (uint8, 1-D: N). Files may be gzipped (detected by content).

The offline stand-in (scikit-learn's 8x8 digits, written as MNIST-named IDX files) is not part of
the framework: it lives with this project's tools, in ``companion.data``.
"""

from __future__ import annotations

import gzip
import math
import zlib
from io import BufferedIOBase
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from ..data_basic import Dataset

__all__ = ["read_idx", "parse_mnist", "MNISTDataset"]

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049


# Deflate expands one compressed byte into at most about 1032 bytes; a gzip file of n bytes can
# therefore hold at most this many times n bytes of data (headers only make it less).
_GZIP_MAX_RATIO = 1032
_CHUNK = 1 << 20


def _idx_error(path: Path, problem: str) -> ValueError:
    return ValueError(f"IDX file {str(path)!r}: {problem}")


def _read_up_to(f: BufferedIOBase, n: int) -> bytes:
    """Up to ``n`` bytes from ``f`` (fewer only at the end of the stream)."""
    parts, got = [], 0
    while got < n:
        part = f.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _read_idx_header(
    f: BufferedIOBase, path: Path, expected_magic: Optional[int]
) -> Tuple[Tuple[int, ...], np.dtype]:
    """The shape and dtype an IDX header declares, after checking its magic number."""
    head = _read_up_to(f, 4)
    if len(head) < 4:
        what = "is empty" if not head else f"holds only {len(head)} byte(s)"
        raise _idx_error(path, f"{what}; an IDX file starts with a 4-byte magic number")
    magic = int.from_bytes(head, "big")
    code, ndim = head[2], head[3]
    if head[:2] != b"\0\0" or code not in _IDX_TYPES or ndim == 0:
        raise _idx_error(
            path,
            f"bad IDX magic number {magic} (0x{magic:08x}); expected 0x0000 "
            "followed by a type code and a dimension count",
        )
    if expected_magic is not None and magic != expected_magic:
        raise _idx_error(
            path,
            f"magic number {magic}, expected {expected_magic} "
            f"({'images' if expected_magic == IMAGES_MAGIC else 'labels'})",
        )
    dims = _read_up_to(f, 4 * ndim)
    if len(dims) < 4 * ndim:
        raise _idx_error(
            path,
            f"truncated header: {ndim} dimension sizes need {4 * ndim} bytes, found {len(dims)}",
        )
    shape = tuple(int.from_bytes(dims[4 * i : 4 * i + 4], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[code])
    return shape, dtype


def _read_idx_stream(
    f: BufferedIOBase, path: Path, expected_magic: Optional[int], file_size: int, gzipped: bool
) -> np.ndarray:
    """Parse an IDX stream: header first, then exactly the data the header declares.

    A raw file's data must fill the rest of its ``file_size`` bytes exactly; a gzipped file of
    ``file_size`` bytes cannot hold more than ``_GZIP_MAX_RATIO`` times that. Sizes are Python
    ints, so no product wraps, and nothing is allocated before the header passes these bounds.
    """
    shape, dtype = _read_idx_header(f, path, expected_magic)
    ndim = len(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    capacity = _GZIP_MAX_RATIO * file_size if gzipped else file_size - 4 - 4 * ndim
    if not gzipped and nbytes != capacity:
        what = "truncated" if nbytes > capacity else "longer than its header says"
        raise _idx_error(
            path, f"{what}: shape {shape} needs {nbytes} bytes of data, found {capacity}"
        )
    if nbytes > capacity:
        raise _idx_error(
            path,
            f"header declares shape {shape}, {nbytes} bytes of data, more "
            f"than the file can hold ({capacity} bytes at most)",
        )
    return _read_idx_data(f, path, shape, dtype, nbytes)


def _read_idx_data(
    f: BufferedIOBase, path: Path, shape: Tuple[int, ...], dtype: np.dtype, nbytes: int
) -> np.ndarray:
    """Exactly ``nbytes`` of data, in chunks, as an array of ``shape``; nothing may follow."""
    buf = np.empty(nbytes, dtype=np.uint8)
    view, got = buf.data, 0  # a writable memoryview of buf
    while got < nbytes:
        n = f.readinto(view[got : got + _CHUNK])
        if not n:
            raise _idx_error(
                path, f"truncated: shape {shape} needs {nbytes} bytes of data, found {got}"
            )
        got += n
    if f.read(1):  # also makes gzip check the stream's CRC and length
        raise _idx_error(
            path,
            f"longer than its header says: data continues past the {nbytes} bytes of shape {shape}",
        )
    return buf.view(dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=False)


def read_idx(filename: str | Path, expected_magic: Optional[int] = None) -> np.ndarray:
    """Read an IDX file (raw or gzipped) into a numpy array of its stored dtype and shape.

    Streams the file: the header is checked before any data is read or decompressed, sizes are
    bounded by what the file can hold, and at most the declared data is decompressed. Raises
    FileNotFoundError for a missing file and ValueError naming the file for an empty file, a
    malformed magic number or one differing from ``expected_magic``, a truncated header, data
    shorter or longer than the header's sizes, and a truncated or corrupt gzip stream.
    """
    path = Path(filename)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not gzipped:
            return _read_idx_stream(raw, path, expected_magic, size, gzipped=False)
        try:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                return _read_idx_stream(f, path, expected_magic, size, gzipped=True)
        except (EOFError, OSError, zlib.error) as exc:  # truncated or corrupt gzip stream
            raise _idx_error(path, f"not a valid gzip file (truncated or corrupt): {exc}") from exc


# question: hw0_parse_mnist
def parse_mnist(
    image_filename: str | Path, label_filename: str | Path
) -> Tuple[np.ndarray, np.ndarray]:
    """Read MNIST-format image and label files (hw0's ``parse_mnist``).

    Returns ``X`` float32 (N, rows*cols) scaled by 1/255 into [0, 1], and ``y`` uint8 (N,).
    Raises ValueError for a wrong magic number, a truncated file, a non-uint8 file, or image and
    label files holding different counts.
    """
    images, labels = _read_mnist(image_filename, label_filename)
    X = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    return X, labels


def _read_mnist(
    image_filename: str | Path, label_filename: str | Path
) -> Tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, rows, cols) and uint8 labels (N,), validated as MNIST files."""
    images = read_idx(image_filename, expected_magic=IMAGES_MAGIC)
    labels = read_idx(label_filename, expected_magic=LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{image_filename} holds {images.shape[0]} images but {label_filename} "
            f"holds {labels.shape[0]} labels"
        )
    return images, labels


# question: hw2_mnist_dataset
class MNISTDataset(Dataset):
    """MNIST from gzipped IDX files (hw2): items are (image (rows*cols,) float32 in [0, 1], label).

    Indexing accepts an int (one sample: x (784,), y scalar uint8), a slice or an integer array
    (a batch: X (B, 784), y (B,)). Transforms see each image as rows x cols x 1 and the result
    is flattened back.
    """

    def __init__(
        self,
        image_filename: str | Path,
        label_filename: str | Path,
        transforms: Optional[List] = None,
    ):
        super().__init__(transforms)
        images, self.labels = _read_mnist(image_filename, label_filename)
        self.image_shape = images.shape[1:] + (1,)
        self.images = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)

    def _transform(self, x: np.ndarray) -> np.ndarray:
        return self.apply_transforms(x.reshape(self.image_shape)).reshape(-1)

    def __getitem__(self, index) -> Tuple[np.ndarray, np.ndarray]:
        X, y = self.images[index], self.labels[index]
        if self.transforms:
            X = self._transform(X) if X.ndim == 1 else np.stack([self._transform(x) for x in X])
        return X, y

    def __len__(self) -> int:
        return self.images.shape[0]
