"""Dataset and DataLoader (hw2).

A :class:`Dataset` maps an index to a sample (a tuple of numpy arrays); a :class:`DataLoader`
cuts the index order into mini-batches, asks the dataset for each batch with an integer index
array and wraps every field of the batch in a :class:`~needle.Tensor`.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import numpy as np

from ..autograd import Tensor

__all__ = ["Dataset", "DataLoader"]


class Dataset:
    """An abstract dataset: subclasses implement ``__getitem__`` and ``__len__``.

    ``__getitem__`` must accept an ``int`` (one sample) and a 1-D integer index array (a batch:
    each field then gains a leading batch dimension), because :class:`DataLoader` fetches whole
    batches at once. ``transforms`` is an optional list of callables applied in order by
    :meth:`apply_transforms`.
    """

    def __init__(self, transforms: Optional[List] = None):
        if transforms is not None:
            if not isinstance(transforms, (list, tuple)):
                raise TypeError(
                    "transforms must be a list of callables or None, got "
                    f"{type(transforms).__name__}"
                )
            for t in transforms:
                if not callable(t):
                    raise TypeError(f"transform {t!r} is not callable")
        self.transforms = transforms

    def __getitem__(self, index) -> object:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def apply_transforms(self, x):
        """``x`` passed through each transform in order (``x`` itself when there are none)."""
        if self.transforms is not None:
            for tform in self.transforms:
                x = tform(x)
        return x


# question: hw2_dataloader
class DataLoader:
    """Iterates over ``dataset`` in mini-batches, yielding a tuple of Tensors per batch.

    The batches are ``np.array_split`` of the index order at multiples of ``batch_size`` (so the
    last one may be smaller). With ``shuffle=True`` the order is
    ``np.random.permutation(len(dataset))``, drawn once at the start of every epoch (every
    ``iter``); otherwise it is ``0..n-1``. Each batch is ``dataset[indices]`` with ``indices`` a
    1-D int array, and each field becomes ``Tensor(field, device=device, dtype=dtype)``.

    Extension (not in the course's hw2 signature): the keyword-only ``device`` and ``dtype`` are
    passed to ``Tensor``; ``None`` keeps ``Tensor``'s defaults, as in the course.
    """

    dataset: Dataset
    batch_size: int

    def __init__(
        self,
        dataset: Dataset,
        batch_size: Optional[int] = 1,
        shuffle: bool = False,
        *,
        device=None,
        dtype: Optional[str] = None,
    ):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"dataset must define __getitem__ and __len__, got {type(dataset).__name__}"
            )
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.device = device
        self.dtype = dtype
        if not self.shuffle:
            self.ordering = self._split(np.arange(len(dataset)))

    def _split(self, order: np.ndarray) -> List[np.ndarray]:
        return np.array_split(order, range(self.batch_size, len(order), self.batch_size))

    def __len__(self) -> int:
        """Number of batches per epoch: ceil(len(dataset) / batch_size)."""
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator:
        if self.shuffle:
            self.ordering = self._split(np.random.permutation(len(self.dataset)))
        self._batch = 0
        return self

    def __next__(self) -> tuple:
        if self._batch >= len(self.ordering) or len(self.ordering[self._batch]) == 0:
            raise StopIteration
        indices = self.ordering[self._batch]
        self._batch += 1
        try:
            sample = self.dataset[indices]
        except (TypeError, IndexError, ValueError) as exc:
            raise type(exc)(
                f"DataLoader reads a batch as dataset[indices] with indices a 1-D int array (here "
                f"{indices[:4].tolist()}{'...' if len(indices) > 4 else ''}), as the course's "
                f"loader does, and {type(self.dataset).__name__}.__getitem__ failed on it: "
                f"{type(exc).__name__}: {exc}. Make __getitem__ accept an index array (e.g. "
                f"return self.X[index], self.y[index])."
            ) from exc
        if not isinstance(sample, (tuple, list)):
            sample = (sample,)
        # Data needs no adjoint (requires_grad=False, unlike the course's default): ops can then
        # skip gradients nobody reads, e.g. the input gradient of a network's first conv.
        return tuple(
            Tensor(np.asarray(field), device=self.device, dtype=self.dtype, requires_grad=False)
            for field in sample
        )
