"""Reference answers to the exercises of notebooks/06_hardware_acceleration (try them first)."""
import itertools

import numpy as np


def strided_positions(shape, strides, offset):
    """Buffer positions of the view's elements, in row-major order of the view."""
    return [offset + sum(i * s for i, s in zip(index, strides))
            for index in itertools.product(*(range(n) for n in shape))]


def to_tiles(a, T):
    """(m, n) -> (m/T, n/T, T, T), tile [i, j] = a[iT:(i+1)T, jT:(j+1)T]."""
    m, n = a.shape
    return a.reshape(m // T, T, n // T, T).transpose(0, 2, 1, 3)


def tiled_matmul(a_tiles, b_tiles):
    """(m/T, n/T, T, T) x (n/T, p/T, T, T) -> (m/T, p/T, T, T)."""
    mt, nt, T, _ = a_tiles.shape
    pt = b_tiles.shape[1]
    c = np.zeros((mt, pt, T, T), dtype=np.float32)
    for i in range(mt):
        for j in range(pt):
            for k in range(nt):
                c[i, j] += a_tiles[i, k] @ b_tiles[k, j]
    return c
