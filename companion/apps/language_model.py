"""The course's word-level language model (hw4, hw4_extra): Embedding → RNN/LSTM/Transformer →
Linear over the vocabulary."""

from __future__ import annotations

import needle.nn as nn
from needle.autograd import Tensor

from ._fast import fast_wing

# None on a student's needle (NEEDLE_IMPL), which has no fast wing: no twin then
fast = fast_wing()

__all__ = ["LanguageModel"]


# question: hw4_language_model
class LanguageModel(nn.Module):
    """Predicts the next word at every position of a (seq_len, bs) batch of word ids.

    ``embedding`` (output_size → embedding_size), ``seq_model`` (``nn.RNN`` or ``nn.LSTM`` with
    ``hidden_size`` and ``num_layers``, or ``nn.Transformer(embedding_size, hidden_size,
    num_layers, sequence_len=seq_len)`` whose output has embedding_size features) and ``linear``
    (features → output_size logits). ``output_size`` is the vocabulary size.

    Extension: extra keyword arguments (e.g. ``num_head=2, dim_head=16, dropout=0.1`` for the
    Transformer, ``nonlinearity='relu'`` for the RNN) are passed on to the sequence model.
    """

    def __init__(
        self,
        embedding_size: int,
        output_size: int,
        hidden_size: int,
        num_layers: int = 1,
        seq_model: str = "rnn",
        seq_len: int = 40,
        device=None,
        dtype: str = "float32",
        **seq_model_kwargs,
    ):
        super().__init__()
        self.embedding_size = embedding_size
        self.output_size = output_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.seq_model_name = seq_model
        self.seq_len = seq_len
        self.embedding = nn.Embedding(output_size, embedding_size, device=device, dtype=dtype)
        if seq_model in ("rnn", "lstm"):
            recurrent = nn.RNN if seq_model == "rnn" else nn.LSTM
            self.seq_model = recurrent(
                embedding_size,
                hidden_size,
                num_layers,
                device=device,
                dtype=dtype,
                **seq_model_kwargs,
            )
            features = hidden_size
        elif seq_model == "transformer":
            self.seq_model = nn.Transformer(
                embedding_size,
                hidden_size,
                num_layers,
                device=device,
                dtype=dtype,
                sequence_len=seq_len,
                **seq_model_kwargs,
            )
            features = embedding_size
        else:
            raise ValueError(f"seq_model must be 'rnn', 'lstm' or 'transformer', got {seq_model!r}")
        self.linear = nn.Linear(features, output_size, device=device, dtype=dtype)

    def forward(self, x: Tensor, h=None):
        """x (seq_len, bs) word ids; h the sequence model's state or None.

        Returns ``out`` (seq_len·bs, output_size) logits, rows in (t, b) row-major order so they
        line up with ``get_batch``'s targets, and the new state ``h``: (num_layers, bs,
        hidden_size) for the RNN, a tuple (h_n, c_n) for the LSTM, zeros for the Transformer.
        """
        if len(x.shape) != 2:
            raise ValueError(
                f"LanguageModel expects ids of shape (seq_len, bs), got {tuple(x.shape)}"
            )
        out, h = self.features(x, h)
        return self.linear(out), h

    def features(self, x: Tensor, h=None):
        """The sequence model's output for ids ``x`` as rows (seq_len·bs, features), and h."""
        seq_len, bs = x.shape
        out, h = self.seq_model(self.embedding(x), h)
        return out.reshape((seq_len * bs, out.shape[2])), h


class FastLanguageModel(LanguageModel):
    """:class:`LanguageModel`'s fused twin (``needle.fast.fuse`` swaps it in): the output
    layer is one node (``fast.ops.matmul_add_bias``), so the graph keeps the logits alone, not
    the (seq_len·bs, output_size) product beside them. The same values and gradients."""

    _course_class = LanguageModel

    def forward(self, x: Tensor, h=None):
        out, h = self.features(x, h)
        return fast.nn.linear(self.linear, out), h


if fast is not None:
    fast.register(LanguageModel, FastLanguageModel)
