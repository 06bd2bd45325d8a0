"""Data-augmentation transforms on H x W x C numpy images (hw2).

Randomness comes from numpy's global RNG, drawn exactly as the course does, so seeded runs
reproduce the course's augmentations.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Transform", "RandomFlipHorizontal", "RandomCrop"]


def _check_image(img) -> np.ndarray:
    if not isinstance(img, np.ndarray) or img.ndim != 3:
        shape = getattr(img, "shape", None)
        raise ValueError(
            f"expected an H x W x C numpy image, got {type(img).__name__} with shape {shape}"
        )
    return img


class Transform:
    """Base class: a callable mapping one image to another."""

    def __call__(self, x):
        raise NotImplementedError


# question: hw2_flip_horizontal
class RandomFlipHorizontal(Transform):
    """Mirror the image left-right (along W) with probability ``p``.

    Draws ``np.random.rand() < p`` once per call. Input and output are H x W x C.
    """

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"flip probability p must be in [0, 1], got {p!r}")
        self.p = p

    def __call__(self, img: np.ndarray) -> np.ndarray:
        img = _check_image(img)
        flip_img = np.random.rand() < self.p
        return img[:, ::-1, :] if flip_img else img


# question: hw2_random_crop
class RandomCrop(Transform):
    """Zero-pad by ``padding`` on each side of H and W, then crop back to H x W at a random shift.

    Draws ``shift_x, shift_y = np.random.randint(-padding, padding + 1, size=2)`` once per call;
    output pixel (i, j) is input pixel (i + shift_x, j + shift_y), or 0 where that falls outside.
    Input and output are H x W x C.
    """

    def __init__(self, padding: int = 3):
        if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)) or padding < 0:
            raise ValueError(f"padding must be a non-negative integer, got {padding!r}")
        self.padding = int(padding)

    def __call__(self, img: np.ndarray) -> np.ndarray:
        img = _check_image(img)
        p = self.padding
        shift_x, shift_y = np.random.randint(low=-p, high=p + 1, size=2)
        h, w, _ = img.shape
        padded = np.pad(img, ((p, p), (p, p), (0, 0)))
        return padded[p + shift_x : p + shift_x + h, p + shift_y : p + shift_y + w, :]
