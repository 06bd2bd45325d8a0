"""The offline stand-in for CIFAR-10: procedurally drawn images.

``ShapesDataset`` is for working offline (``needle.data.CIFAR10Dataset`` reads the real set
after ``make data``): ten classes of
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

from typing import List, Optional, Sequence, Union

import numpy as np

from needle.data import Dataset

__all__ = ["ShapesDataset", "make_shapes_images", "SHAPES_CLASSES", "CIFAR10_CLASSES"]

# The real CIFAR-10's class names, for a notebook that switches to it after `make data`.
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
SHAPES_CLASSES = (
    "disc",
    "square",
    "triangle",
    "ring",
    "cross",
    "hstripes",
    "vstripes",
    "diagonal",
    "checker",
    "dots",
)


def _apply_to_chw(dataset: Dataset, x: np.ndarray) -> np.ndarray:
    """Apply ``dataset``'s transforms (written for H x W x C arrays) to C x H x W image(s).

    The same as needle's CIFAR-10 loader does; repeated here because a student's needle (the
    course's, under NEEDLE_IMPL) keeps no such helper for this module to import.
    """
    if not dataset.transforms:
        return x
    if x.ndim == 4:
        return np.stack([_apply_to_chw(dataset, img) for img in x])
    out = dataset.apply_transforms(x.transpose(1, 2, 0))
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


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
        m = dx**2 + dy**2 <= r**2
    elif label == 1:
        m = np.maximum(np.abs(dx), np.abs(dy)) <= 0.8 * r
    elif label == 2:  # apex at (cy - r, cx), base at cy + 0.7 r
        m = (dy <= 0.7 * r) & (np.abs(dx) <= 0.6 * (dy + r))
    elif label == 3:
        d2 = dx**2 + dy**2
        m = (d2 <= r**2) & (d2 >= (0.55 * r) ** 2)
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
        m = ddx**2 + ddy**2 <= (0.27 * step) ** 2
    return m.astype(np.float32)


def make_shapes_images(
    n: int, seed: Union[int, Sequence[int]] = 0
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
    """The offline stand-in for CIFAR-10: ``n`` procedurally drawn images.

    Items are (image float32 (3, 32, 32), label int) exactly like ``needle.data.CIFAR10Dataset``,
    with the same ``X``/``y`` attributes. The training and test sets come from different streams of
    the same ``seed`` (so they never share an image); defaults: 2000 train, 500 test images.
    """

    def __init__(
        self,
        train: bool = True,
        n: Optional[int] = None,
        seed: int = 0,
        transforms: Optional[List] = None,
    ):
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
