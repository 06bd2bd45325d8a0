"""Penn Treebank language-modelling data (hw4).

The course part: :class:`Dictionary`, :class:`Corpus` (reads ``train.txt`` and ``test.txt``,
one sentence per line, ``line.split() + ['<eos>']``), :func:`batchify` and :func:`get_batch`.

The offline corpus with a known entropy rate lives with this project's tools, in
``companion.data``.
"""

from __future__ import annotations

import itertools
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from needle.autograd import Tensor

__all__ = ["Dictionary", "Corpus", "batchify", "get_batch"]


# question: hw4_ptb_corpus
class Dictionary:
    """Word ↔ id maps: ``word2idx`` (dict) and ``idx2word`` (list, in order of first sight)."""

    def __init__(self) -> None:
        self.word2idx: Dict[str, int] = {}
        self.idx2word: List[str] = []

    def add_word(self, word: str) -> int:
        """Adds ``word`` if it is new; returns its id either way."""
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


# question: hw4_ptb_corpus
class Corpus:
    """``base_dir/train.txt`` and ``base_dir/test.txt`` as lists of ids (``train``, ``test``).

    Each line becomes ``line.split() + ['<eos>']``; ``max_lines`` reads at most that many
    lines of each file. Both files share one ``dictionary``, filled train first. A missing
    file raises FileNotFoundError, a file that is not UTF-8 ValueError naming it and the line.
    """

    def __init__(self, base_dir: str, max_lines: Optional[int] = None):
        if not os.path.isdir(base_dir):
            raise FileNotFoundError(
                f"Corpus: no such directory {base_dir!r} (it must hold train.txt and test.txt)"
            )
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(base_dir, "train.txt"), max_lines)
        self.test = self.tokenize(os.path.join(base_dir, "test.txt"), max_lines)

    def tokenize(self, path: str, max_lines: Optional[int] = None) -> List[int]:
        """Ids of the words of the first ``max_lines`` lines of ``path`` (all if None), with
        '<eos>' after each line; new words are added to the dictionary."""
        if max_lines is not None and (
            isinstance(max_lines, bool)
            or not isinstance(max_lines, (int, np.integer))
            or max_lines < 0
        ):
            raise ValueError(f"max_lines must be None or a non-negative integer, got {max_lines!r}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Corpus: missing file {path!r}")
        ids = []
        for line in itertools.islice(_text_lines(path), max_lines):
            for word in line.split() + ["<eos>"]:
                ids.append(self.dictionary.add_word(word))
        return ids


def _text_lines(path: str) -> Iterator[str]:
    """The lines of UTF-8 file ``path`` as ``open(path)`` gives them (universal newlines).

    Decodes line by line, so a bad byte after the lines a caller reads is never reached; a
    line that is not UTF-8 raises ValueError naming the file, the line and the byte.
    """
    lineno = 0
    with open(path, "rb") as f:
        for raw in f:  # binary lines end at b"\n", so "\r\n" never straddles two of them
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                line = lineno + raw[: e.start].replace(b"\r\n", b"\n").count(b"\r") + 1
                raise ValueError(
                    f"Corpus: {path!r} is not UTF-8 text: line {line} holds "
                    f"{raw[e.start : e.end]!r} ({e.reason})"
                ) from e
            pieces = text.replace("\r\n", "\n").split("\r")
            for k, piece in enumerate(pieces):
                if k < len(pieces) - 1:
                    piece += "\n"
                elif not piece:
                    continue
                lineno += 1
                yield piece


# question: hw4_batchify
def batchify(data: Sequence[int], batch_size: int, device=None, dtype="float32") -> np.ndarray:
    """Cuts a token stream into ``batch_size`` contiguous columns: numpy (nbatch, batch_size).

    Column j holds tokens [j·nbatch, (j+1)·nbatch); the len(data) mod batch_size leftover tokens
    are dropped. E.g. the alphabet with batch_size 4 gives columns a–f, g–l, m–r, s–x.
    ``device`` is accepted for the course's signature; the result stays in numpy.
    """
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    nbatch = len(data) // batch_size
    if nbatch == 0:
        raise ValueError(f"batchify: {len(data)} tokens are fewer than batch_size={batch_size}")
    arr = np.asarray(data[: nbatch * batch_size], dtype=dtype or "float32")
    return np.ascontiguousarray(arr.reshape(batch_size, nbatch).T)


# question: hw4_batchify
def get_batch(
    batches: np.ndarray, i: int, bptt: int, device=None, dtype=None
) -> Tuple[Tensor, Tensor]:
    """Rows i … i+L-1 of ``batches`` and, shifted by one, their next tokens.

    L = min(bptt, nbatch - 1 - i). Returns ``data`` Tensor (L, bs) and ``target`` Tensor
    (L·bs,) (row-major flatten of rows i+1 … i+L), neither requiring grad.
    """
    batches = np.asarray(batches)
    if batches.ndim != 2:
        raise ValueError(
            f"get_batch expects batchify's (nbatch, bs) array, got shape {batches.shape}"
        )
    if isinstance(bptt, bool) or not isinstance(bptt, (int, np.integer)) or bptt < 1:
        raise ValueError(f"bptt must be a positive integer, got {bptt!r}")
    if not 0 <= i < len(batches) - 1:
        raise IndexError(
            f"get_batch index i={i} out of range: need 0 <= i < {len(batches) - 1} "
            f"(the last row has no next token)"
        )
    seq_len = min(bptt, len(batches) - 1 - i)
    data = batches[i : i + seq_len]
    target = batches[i + 1 : i + 1 + seq_len].reshape(-1)
    return (
        Tensor(data, device=device, dtype=dtype, requires_grad=False),
        Tensor(target, device=device, dtype=dtype, requires_grad=False),
    )
