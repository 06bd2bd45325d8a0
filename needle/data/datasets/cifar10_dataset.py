"""CIFAR-10 (python-pickle batches) and an offline stand-in of procedurally drawn images.

``CIFAR10Dataset`` is the course's (hw4): it reads the ``cifar-10-batches-py`` folder that
``make data`` downloads. ``ShapesDataset`` is an extension for working offline: ten classes of
coloured shapes and textures drawn deterministically from a seed, in CIFAR-10's format
(float32 images of shape (3, 32, 32) in [0, 1], integer labels 0..9).

The offline classes (``SHAPES_CLASSES``) are

====  ==========  ==========================================================
 0    disc        a filled disc
 1    square      a filled axis-aligned square
 2    triangle    a filled upward-pointing triangle
 3    ring        an annulus (a disc with a hole)
 4    cross       a plus sign
 5    hstripes    horizontal stripes over the whole image
 6    vstripes    vertical stripes over the whole image
 7    diagonal    stripes at +-45 degrees
 8    checker     a checkerboard
 9    dots        a regular grid of small dots
====  ==========  ==========================================================

Every image draws its own colours — a dark background and a bright foreground, each channel
uniform in [0, 0.45) and [0.55, 1) —, the position and size of a shape or the period and phase
of a texture, a faint background gradient, and Gaussian pixel noise (std 0.06). The hue says
nothing about the class: a model has to see shape and texture, which a small CNN learns in a
few epochs on a thousand or two images (ResNet-9 reaches about 80 % test accuracy in four
epochs on 1500; with foreground and background colours drawn independently, so that the
contrast can have either sign, it stays under 50 %). Generation uses its own
``numpy.random.default_rng``, so it never disturbs numpy's global RNG (which the course's code
seeds).
"""
from __future__ import annotations

import os
import pickle
from typing import List, Optional, Sequence, Union

import numpy as np

from ..data_basic import Dataset

__all__ = ["CIFAR10Dataset", "ShapesDataset", "make_shapes_images", "SHAPES_CLASSES",
           "CIFAR10_CLASSES"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
SHAPES_CLASSES = ("disc", "square", "triangle", "ring", "cross", "hstripes", "vstripes",
                  "diagonal", "checker", "dots")

_IMAGE_SHAPE = (3, 32, 32)
_ROW = 3 * 32 * 32


def _apply_to_chw(dataset: Dataset, x: np.ndarray) -> np.ndarray:
    """Apply ``dataset``'s transforms (written for H x W x C arrays) to C x H x W image(s)."""
    if not dataset.transforms:
        return x
    if x.ndim == 4:
        return np.stack([_apply_to_chw(dataset, img) for img in x])
    out = dataset.apply_transforms(x.transpose(1, 2, 0))
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


class _Refused(pickle.UnpicklingError):
    """A pickle asked for something a CIFAR-10 batch never holds."""


def _latin1_encode(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as Python 3 pickles bytes at protocol 2, restricted to latin-1."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _Refused(f"refused _codecs.encode({type(text).__name__}, {encoding!r}): pickle "
                       f"stores bytes only as latin-1 text")
    return text.encode("latin1")


def _numpy_pickle_globals() -> dict:
    """(module, name) -> object for every global a pickled numpy array may refer to.

    numpy 1.x writes ``numpy.core.*`` and numpy 2.x ``numpy._core.*``; protocol 5 uses
    ``numeric._frombuffer`` for contiguous arrays, older protocols ``multiarray._reconstruct``;
    numpy scalars use ``multiarray.scalar``. The objects come from the installed numpy (found
    through its own reducers), so either spelling loads without touching the deprecated
    ``numpy.core`` alias.
    """
    reconstruct = np.zeros(1).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    scalar = np.uint8(0).__reduce__()[0]
    table = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
             ("_codecs", "encode"): _latin1_encode}
    for core in ("numpy.core", "numpy._core"):
        table[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        table[(f"{core}.multiarray", "scalar")] = scalar
        table[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return table


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what a CIFAR-10 batch holds.

    Dicts, lists, tuples, str/bytes and numbers need no globals; the only globals admitted are
    numpy's array, dtype and scalar reconstruction (and latin-1 ``_codecs.encode``, which
    Python 3 uses for bytes at protocol 2). Any other global (``os.system``, ``builtins.eval``,
    a class with a ``__reduce__``) raises ``pickle.UnpicklingError`` naming it, before anything
    could call it.
    """

    _ALLOWED = _numpy_pickle_globals()

    def find_class(self, module: str, name: str):
        """The admitted object for ``module.name``; UnpicklingError for anything else."""
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(
                f"refused global {module}.{name}: a CIFAR-10 batch holds only dicts, lists, "
                f"str/bytes, ints and numpy arrays") from None

    def persistent_load(self, pid):
        raise _Refused("refused a persistent id: a CIFAR-10 batch has none")


def _load_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 python batch: (X uint8 (n, 3072), y int64 (n,)), validated.

    The pickle is read with :class:`_CifarUnpickler`, so a batch that refers to anything but
    numpy's array reconstruction raises ValueError naming the file and the refused global,
    and nothing in it runs.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"CIFAR-10 batch file {path!r} does not exist")
    try:
        with open(path, "rb") as f:
            batch = _CifarUnpickler(f, encoding="bytes").load()
    except _Refused as e:
        raise ValueError(f"CIFAR-10 batch {path!r} is unsafe, not loaded: {e}") from e
    except Exception as e:  # truncated or not a pickle at all: say which file
        raise ValueError(f"CIFAR-10 batch {path!r} is not a readable python pickle "
                         f"({type(e).__name__}: {e})") from e
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR-10 batch {path!r} holds a {type(batch).__name__}, "
                         f"expected a dict with b'data' and b'labels'")
    missing = [k for k in (b"data", b"labels") if k not in batch and k.decode() not in batch]
    if missing:
        raise ValueError(f"CIFAR-10 batch {path!r} is missing the key(s) {missing}; "
                         f"found {sorted(map(repr, batch.keys()))}")
    data = np.asarray(batch.get(b"data", batch.get("data")))
    labels = np.asarray(batch.get(b"labels", batch.get("labels")))
    if data.ndim != 2 or data.shape[1] != _ROW:
        raise ValueError(f"CIFAR-10 batch {path!r}: b'data' has shape {data.shape}, "
                         f"expected (n, {_ROW}) (3 channels x 32 x 32 per row)")
    if data.dtype != np.uint8:
        raise ValueError(f"CIFAR-10 batch {path!r}: b'data' has dtype {data.dtype}, "
                         f"expected uint8 pixels")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(f"CIFAR-10 batch {path!r}: {labels.shape} labels for "
                         f"{data.shape[0]} images")
    if not np.issubdtype(labels.dtype, np.integer) or (
            labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise ValueError(f"CIFAR-10 batch {path!r}: labels must be integers in 0..9")
    return data, labels.astype(np.int64)


class CIFAR10Dataset(Dataset):
    """CIFAR-10 from the python-pickle batches in ``base_folder`` (``cifar-10-batches-py``).

    ``train=True`` reads ``data_batch_1`` .. ``data_batch_5``, otherwise ``test_batch``.
    Attributes: ``X`` float32 (N, 3, 32, 32) with pixels divided by 255, ``y`` int64 (N,).
    ``p`` is kept for the course's signature and not used. A malformed batch (missing file or
    key, wrong row size, label count mismatch, truncated or non-pickle file) raises
    ``FileNotFoundError``/``ValueError`` naming the file and the problem. Unlike the course's
    ``pickle.load``, batches are read with an unpickler that admits only dicts, lists,
    str/bytes, numbers and numpy arrays: a pickle referring to any other class or function
    (code that would run on load) raises ValueError naming the file and that global.
    """

    def __init__(self, base_folder: str, train: bool, p: Optional[float] = 0.5,
                 transforms: Optional[List] = None):
        super().__init__(transforms)
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        if not os.path.isdir(base_folder):
            raise FileNotFoundError(f"CIFAR-10 folder {base_folder!r} does not exist "
                                    f"(run `make data`, or use ShapesDataset offline)")
        parts = [_load_batch(os.path.join(base_folder, n)) for n in names]
        data = np.concatenate([d for d, _ in parts])
        self.X = (data.astype(np.float32) / 255.0).reshape((-1,) + _IMAGE_SHAPE)
        self.y = np.concatenate([l for _, l in parts])
        self.p = p

    def __getitem__(self, index) -> object:
        """(image(s) float32 (3, 32, 32) or (B, 3, 32, 32), label(s)), transforms applied."""
        return _apply_to_chw(self, self.X[index]), self.y[index]

    def __len__(self) -> int:
        return self.X.shape[0]


# ---- the offline image set ---------------------------------------------------------------------
def _colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A dark background and a bright foreground colour (RGB channels in [0, .45) and [.55, 1))."""
    return rng.random(3) * 0.45, 0.55 + rng.random(3) * 0.45


def _mask(label: int, rng: np.random.Generator, yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
    """The (32, 32) foreground mask in {0, 1} of one image of class ``label``."""
    cy, cx = rng.uniform(11, 21, size=2)
    r = rng.uniform(7, 11)
    dy, dx = yy - cy, xx - cx
    period = rng.uniform(5, 9)
    phase = rng.uniform(0, 2 * np.pi)
    wave = lambda t: np.sin(2 * np.pi * t / period + phase) > 0  # noqa: E731
    if label == 0:
        m = dx ** 2 + dy ** 2 <= r ** 2
    elif label == 1:
        m = np.maximum(np.abs(dx), np.abs(dy)) <= 0.8 * r
    elif label == 2:  # apex at (cy - r, cx), base at cy + 0.7 r
        m = (dy <= 0.7 * r) & (np.abs(dx) <= 0.6 * (dy + r))
    elif label == 3:
        d2 = dx ** 2 + dy ** 2
        m = (d2 <= r ** 2) & (d2 >= (0.55 * r) ** 2)
    elif label == 4:
        arm = 0.3 * r
        m = ((np.abs(dx) <= arm) & (np.abs(dy) <= r)) | ((np.abs(dy) <= arm) & (np.abs(dx) <= r))
    elif label == 5:
        m = wave(yy)
    elif label == 6:
        m = wave(xx)
    elif label == 7:
        m = wave((xx + yy) / np.sqrt(2)) if rng.random() < 0.5 else wave((xx - yy) / np.sqrt(2))
    elif label == 8:
        m = wave(xx) ^ wave(yy)
    else:
        step = rng.uniform(6, 9)
        ox, oy = rng.uniform(0, step, size=2)
        ddx = (xx - ox) % step - step / 2
        ddy = (yy - oy) % step - step / 2
        m = ddx ** 2 + ddy ** 2 <= (0.27 * step) ** 2
    return m.astype(np.float32)


def make_shapes_images(n: int, seed: Union[int, Sequence[int]] = 0
                       ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` offline images: (X float32 (n, 3, 32, 32) in [0, 1], y int64 (n,) in 0..9).

    Labels cycle 0..9 in a shuffled order (so every class has n//10 or n//10 + 1 images); the
    same ``(n, seed)`` always gives the same arrays (``seed``: anything
    ``numpy.random.default_rng`` accepts). See the module docstring for the classes.
    """
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"make_shapes_images needs a non-negative int n, got {n!r}")
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 10).astype(np.int64)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    X = np.empty((n, 3, 32, 32), dtype=np.float32)
    for i, label in enumerate(y):
        bg, fg = _colours(rng)
        m = _mask(int(label), rng, yy, xx)
        g = rng.uniform(-0.1, 0.1, size=2)  # faint background gradient
        shade = (g[0] * (yy - 16) + g[1] * (xx - 16)) / 16
        img = bg[:, None, None] * (1 - m) + fg[:, None, None] * m + shade * (1 - m)
        img += rng.normal(0.0, 0.06, size=img.shape)
        X[i] = np.clip(img, 0.0, 1.0)
    return X, y


class ShapesDataset(Dataset):
    """The offline stand-in for CIFAR-10 (an extension): ``n`` procedurally drawn images.

    Items are (image float32 (3, 32, 32), label int) exactly like :class:`CIFAR10Dataset`, with
    the same ``X``/``y`` attributes. The training and test sets come from different streams of
    the same ``seed`` (so they never share an image); defaults: 2000 train, 500 test images.
    """

    def __init__(self, train: bool = True, n: Optional[int] = None, seed: int = 0,
                 transforms: Optional[List] = None):
        super().__init__(transforms)
        if n is None:
            n = 2000 if train else 500
        self.X, self.y = make_shapes_images(n, seed=[seed, 0 if train else 1])
        self.classes = SHAPES_CLASSES

    def __getitem__(self, index) -> object:
        """(image(s) float32 (3, 32, 32) or (B, 3, 32, 32), label(s)), transforms applied."""
        return _apply_to_chw(self, self.X[index]), self.y[index]

    def __len__(self) -> int:
        return self.X.shape[0]
