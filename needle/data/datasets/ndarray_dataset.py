"""NDArrayDataset: a dataset over in-memory arrays that share their first dimension (hw4)."""

from __future__ import annotations

import numpy as np

from ..data_basic import Dataset

__all__ = ["NDArrayDataset"]


class NDArrayDataset(Dataset):
    """``NDArrayDataset(*arrays)``: item ``i`` is ``tuple(a[i] for a in arrays)``.

    Every array must have the same length N along axis 0; ``i`` may be an int, a slice or an
    integer index array (then each field keeps a leading batch dimension).
    """

    def __init__(self, *arrays):
        super().__init__()
        if not arrays:
            raise ValueError("NDArrayDataset needs at least one array")
        self.arrays = tuple(a if hasattr(a, "shape") else np.asarray(a) for a in arrays)
        lengths = [a.shape[0] if len(a.shape) else None for a in self.arrays]
        if None in lengths:
            raise ValueError(
                "NDArrayDataset arrays must have at least one dimension; got a 0-d array"
            )
        if len(set(lengths)) != 1:
            raise ValueError(
                f"NDArrayDataset arrays must share their first dimension, got lengths {lengths}"
            )

    def __len__(self) -> int:
        return self.arrays[0].shape[0]

    def __getitem__(self, i) -> tuple:
        return tuple(a[i] for a in self.arrays)
