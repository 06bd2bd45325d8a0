"""CIFAR-10 (hw4): ``CIFAR10Dataset`` reads the python-pickle batches of the
``cifar-10-batches-py`` folder (``make data`` downloads it). Items are float32 images of shape
(3, 32, 32) in [0, 1] with integer labels 0..9. The offline stand-in of procedurally drawn
images lives with this project's tools, in ``companion.data``.
"""

from __future__ import annotations

import os
import pickle
from typing import List, Optional

import numpy as np

from ..data_basic import Dataset

__all__ = ["CIFAR10Dataset"]


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
        raise _Refused(
            f"refused _codecs.encode({type(text).__name__}, {encoding!r}): pickle "
            f"stores bytes only as latin-1 text"
        )
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
    table = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
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
                f"str/bytes, ints and numpy arrays"
            ) from None

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
        raise ValueError(
            f"CIFAR-10 batch {path!r} is not a readable python pickle ({type(e).__name__}: {e})"
        ) from e
    if not isinstance(batch, dict):
        raise ValueError(
            f"CIFAR-10 batch {path!r} holds a {type(batch).__name__}, "
            f"expected a dict with b'data' and b'labels'"
        )
    missing = [k for k in (b"data", b"labels") if k not in batch and k.decode() not in batch]
    if missing:
        raise ValueError(
            f"CIFAR-10 batch {path!r} is missing the key(s) {missing}; "
            f"found {sorted(map(repr, batch.keys()))}"
        )
    data = np.asarray(batch.get(b"data", batch.get("data")))
    labels = np.asarray(batch.get(b"labels", batch.get("labels")))
    if data.ndim != 2 or data.shape[1] != _ROW:
        raise ValueError(
            f"CIFAR-10 batch {path!r}: b'data' has shape {data.shape}, "
            f"expected (n, {_ROW}) (3 channels x 32 x 32 per row)"
        )
    if data.dtype != np.uint8:
        raise ValueError(
            f"CIFAR-10 batch {path!r}: b'data' has dtype {data.dtype}, expected uint8 pixels"
        )
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise ValueError(
            f"CIFAR-10 batch {path!r}: {labels.shape} labels for {data.shape[0]} images"
        )
    if not np.issubdtype(labels.dtype, np.integer) or (
        labels.size and (labels.min() < 0 or labels.max() > 9)
    ):
        raise ValueError(f"CIFAR-10 batch {path!r}: labels must be integers in 0..9")
    return data, labels.astype(np.int64)


# question: hw4_cifar10_dataset
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

    def __init__(
        self,
        base_folder: str,
        train: bool,
        p: Optional[float] = 0.5,
        transforms: Optional[List] = None,
    ):
        super().__init__(transforms)
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        if not os.path.isdir(base_folder):
            raise FileNotFoundError(
                f"CIFAR-10 folder {base_folder!r} does not exist "
                f"(run `make data`, or use ShapesDataset offline)"
            )
        parts = [_load_batch(os.path.join(base_folder, n)) for n in names]
        data = np.concatenate([d for d, _ in parts])
        self.X = (data.astype(np.float32) / 255.0).reshape((-1,) + _IMAGE_SHAPE)
        self.y = np.concatenate([labels for _, labels in parts])
        self.p = p

    def __getitem__(self, index) -> object:
        """(image(s) float32 (3, 32, 32) or (B, 3, 32, 32), label(s)), transforms applied."""
        return _apply_to_chw(self, self.X[index]), self.y[index]

    def __len__(self) -> int:
        return self.X.shape[0]
