"""The four training steps of :mod:`companion.steps` against PyTorch as a PyTorch user builds
them, and the check that both sides compute the same model.

PyTorch's side uses its standard modules, not a twin written to match needle's code:
``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(E, heads, hidden, dropout=0,
batch_first=True, norm_first=True)`` with a causal mask (its attention calls
``scaled_dot_product_attention``), ``nn.LSTM``, ``nn.Conv2d`` + ``nn.BatchNorm2d``,
``nn.BatchNorm1d`` and ``nn.Dropout``, and ``nn.CrossEntropyLoss``. needle's side is the
course's modules (``LanguageModel``, ``ResNet9``, ``MLPResNet``, ``nn.SoftmaxLoss``).

The Transformer runs 4 heads of 32 here (needle's default is 8 heads of 32, which the twin
tables time): PyTorch's layer splits the model width E = 128 into its heads, so 4 heads of 32
is the split at which needle's layer and PyTorch's have the same projections and head size.
With the weights copied (:func:`copy_weights`) the two compute the same function: needle's
three pre-norms of q, k, v are one ``norm1`` while they are equal (as initialised), and
PyTorch's projection biases are zero where needle's projections have none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from companion import steps
from companion.steps import Step, batch, check_case, needle_model

TITLES = {
    "mlp_resnet": "MLP-ResNet step (nn.Linear, nn.BatchNorm1d, batch 100, Adam)",
    "resnet9": "ResNet-9 step (nn.Conv2d + nn.BatchNorm2d, batch 32, SGD)",
    "lstm_lm": "LSTM LM step (nn.LSTM, 2 layers, T=32, B=16, E=H=128, V=1000, SGD)",
    "transformer_lm": "Transformer LM step (nn.TransformerEncoderLayer, 4 heads of 32, SGD)",
}


@dataclass(frozen=True)
class Sizes(steps.Sizes):
    """:mod:`companion.steps`' sizes, with the Transformer's 4 heads of 32 (see the module's
    docstring)."""

    heads: int = 4
    dim_head: int = 32


# ---- needle's side: the course's modules -------------------------------------------------------


def needle_step(case: str, device, fast: bool = False, sizes: Sizes = Sizes()) -> Step:
    """needle's training step of ``case`` (:func:`companion.steps.needle_step`) at these sizes:
    ``backward(create_graph=False)``, as PyTorch's backward records no graph either."""
    return steps.needle_step(case, device, fast, sizes)


# ---- PyTorch's side: its standard modules ------------------------------------------------------


def torch_model(case: str, sizes: Sizes) -> Any:
    """The model of ``case`` as a PyTorch user writes it, seeded, in training mode."""
    import torch

    check_case(case)
    torch.manual_seed(0)
    builders = {
        "mlp_resnet": _torch_mlp_resnet,
        "resnet9": lambda s: steps._torch_resnet9(),  # nn.Conv2d + nn.BatchNorm2d already
        "lstm_lm": _torch_lstm_lm,
        "transformer_lm": _torch_transformer_lm,
    }
    return builders[case](sizes).train()


def _torch_mlp_resnet(s: Sizes) -> Any:
    import torch
    from torch import nn

    class ResidualBlock(nn.Module):
        def __init__(self):
            super().__init__()
            half = s.mlp_hidden // 2
            self.fn = nn.Sequential(
                nn.Linear(s.mlp_hidden, half),
                nn.BatchNorm1d(half),
                nn.ReLU(),
                nn.Dropout(s.drop),
                nn.Linear(half, s.mlp_hidden),
                nn.BatchNorm1d(s.mlp_hidden),
            )

        def forward(self, x):
            return torch.relu(self.fn(x) + x)

    return nn.Sequential(
        nn.Linear(s.mlp_dim, s.mlp_hidden),
        nn.ReLU(),
        *(ResidualBlock() for _ in range(s.mlp_blocks)),
        nn.Linear(s.mlp_hidden, s.classes),
    )


def _torch_lstm_lm(s: Sizes) -> Any:
    from torch import nn

    class LSTMLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(s.vocab, s.embed)
            self.lstm = nn.LSTM(s.embed, s.hidden, s.layers)
            self.out = nn.Linear(s.hidden, s.vocab)

        def forward(self, ids):  # (T, B), time-major as needle's
            h, _ = self.lstm(self.emb(ids))
            return self.out(h.reshape(-1, s.hidden))

    return LSTMLM()


def _torch_transformer_lm(s: Sizes) -> Any:
    import torch
    from torch import nn

    if s.heads * s.dim_head != s.embed:
        raise ValueError(
            "nn.TransformerEncoderLayer splits the width into its heads: heads * dim_head must "
            f"equal embed, got {s.heads} * {s.dim_head} != {s.embed}"
        )

    class TransformerLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(s.vocab, s.embed)
            self.pos = nn.Embedding(s.seq, s.embed)
            layer = nn.TransformerEncoderLayer(
                s.embed, s.heads, s.hidden, dropout=0.0, batch_first=True, norm_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, s.layers, enable_nested_tensor=False)
            self.out = nn.Linear(s.embed, s.vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(s.seq))

        def forward(self, ids):  # (T, B) as needle's; the layers run batch-first
            t = ids.shape[0]
            x = self.emb(ids.T) + self.pos(torch.arange(t))
            x = self.encoder(x, mask=self.mask[:t, :t], is_causal=True)
            return self.out(x.transpose(0, 1).reshape(-1, s.embed))

    return TransformerLM()


def torch_step(case: str, sizes: Sizes = Sizes()) -> Step | None:
    """PyTorch's training step of ``case`` with ``nn.CrossEntropyLoss``, or None without
    torch."""
    try:  # optional oracle, imported only by the process that times it
        import torch
    except ImportError:
        return None
    model = torch_model(case, sizes)
    if case == "mlp_resnet":
        opt = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.001)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01 if case == "resnet9" else 0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    x_np, y_np = batch(case, sizes)
    x = torch.from_numpy(x_np if case in ("mlp_resnet", "resnet9") else x_np.astype(np.int64))
    y = torch.from_numpy(y_np.astype(np.int64))

    def forward():
        opt.zero_grad()
        return loss_fn(model(x), y)

    return Step(forward, lambda loss: loss.backward(), opt.step)


# ---- the same model: parameter counts and outputs with copied weights --------------------------

# needle's layer class → the PyTorch module class that holds the same weights
LAYER_PAIRS = {
    "Linear": "Linear",
    "Conv": "Conv2d",
    "BatchNorm1d": "BatchNorm1d",
    "BatchNorm2d": "BatchNorm2d",
    "LayerNorm1d": "LayerNorm",
    "Embedding": "Embedding",
    "LSTM": "LSTM",
    "TransformerLayer": "TransformerEncoderLayer",
}
# composites whose inner modules are copied as one layer
_COMPOSITES = ("LSTM", "TransformerLayer")


def needle_layers(model) -> list:
    """needle's weight-holding layers of ``model`` in definition order (an LSTM or a
    TransformerLayer as one layer)."""
    layers, inside = [], set[int]()
    for m in model.submodules():
        if id(m) in inside or type(m).__name__ not in LAYER_PAIRS:
            continue
        layers.append(m)
        if type(m).__name__ in _COMPOSITES:
            inside.update(id(sub) for sub in m.submodules())
    return layers


def torch_layers(module) -> list:
    """PyTorch's weight-holding layers of ``module`` in definition order (an LSTM or a
    TransformerEncoderLayer as one layer)."""
    out = []
    for child in module.children():
        if type(child).__name__ in LAYER_PAIRS.values():
            out.append(child)
        else:
            out.extend(torch_layers(child))
    return out


def _np(t) -> np.ndarray:
    return np.asarray(t.numpy(), dtype=np.float32)


def _linear(layer, prefix: str = "") -> dict[str, np.ndarray]:
    arrays = {f"{prefix}weight": _np(layer.weight).T}
    if layer.bias is not None:
        arrays[f"{prefix}bias"] = _np(layer.bias).reshape(-1)
    return arrays


def _affine(layer, prefix: str = "") -> dict[str, np.ndarray]:
    return {f"{prefix}weight": _np(layer.weight), f"{prefix}bias": _np(layer.bias)}


def _transformer_layer(layer) -> dict[str, np.ndarray]:
    attn = layer.attn
    for norm in (attn.prenorm_k, attn.prenorm_v):
        for name in ("weight", "bias"):
            if not np.array_equal(_np(getattr(norm, name)), _np(getattr(attn.prenorm_q, name))):
                raise ValueError(
                    "needle's prenorm_q, prenorm_k and prenorm_v differ: PyTorch's layer has "
                    "one norm1 for the three, so the weights cannot be copied"
                )
    inner = attn.num_head * attn.dim_head
    projections = (attn.q_projection, attn.k_projection, attn.v_projection)
    return {
        "self_attn.in_proj_weight": np.concatenate([_np(p.weight).T for p in projections]),
        "self_attn.in_proj_bias": np.zeros(3 * inner, np.float32),
        "self_attn.out_proj.weight": _np(attn.out_projection.weight).T,
        "self_attn.out_proj.bias": np.zeros(attn.out_features, np.float32),
        **_linear(layer.linear1, "linear1."),
        **_linear(layer.linear2, "linear2."),
        **_affine(attn.prenorm_q, "norm1."),
        **_affine(layer.layernorm, "norm2."),
    }


def torch_arrays(layer) -> dict[str, np.ndarray]:
    """{PyTorch parameter name: array} of the PyTorch layer holding needle ``layer``'s
    weights (layouts converted: needle's Linear is (in, out), its Conv (K, K, C_in, C_out))."""
    kind = type(layer).__name__
    if kind == "Linear":
        return _linear(layer)
    if kind == "Conv":
        return {"weight": _np(layer.weight).transpose(3, 2, 0, 1), "bias": _np(layer.bias)}
    if kind in ("BatchNorm1d", "BatchNorm2d", "LayerNorm1d"):
        return _affine(layer)
    if kind == "Embedding":
        return {"weight": _np(layer.weight)}
    if kind == "LSTM":
        arrays = {}
        for i, cell in enumerate(layer.lstm_cells):
            arrays[f"weight_ih_l{i}"] = _np(cell.W_ih).T
            arrays[f"weight_hh_l{i}"] = _np(cell.W_hh).T
            arrays[f"bias_ih_l{i}"] = _np(cell.bias_ih)
            arrays[f"bias_hh_l{i}"] = _np(cell.bias_hh)
        return arrays
    if kind == "TransformerLayer":
        return _transformer_layer(layer)
    raise TypeError(f"no PyTorch counterpart for needle's {kind}")


def copy_weights(needle_net, torch_net) -> int:
    """Copy every weight of ``needle_net`` into ``torch_net`` layer by layer; returns the
    number of layers. A layer of another kind, a missing or extra parameter or another shape
    raises ValueError naming it."""
    import torch

    ours, theirs = needle_layers(needle_net), torch_layers(torch_net)
    kinds = [type(m).__name__ for m in ours], [type(m).__name__ for m in theirs]
    if [LAYER_PAIRS[k] for k in kinds[0]] != kinds[1]:
        raise ValueError(f"the layers differ: needle {kinds[0]}, PyTorch {kinds[1]}")
    with torch.no_grad():
        for ours_layer, theirs_layer in zip(ours, theirs):
            arrays = torch_arrays(ours_layer)
            params = dict(theirs_layer.named_parameters())
            if set(arrays) != set(params):
                raise ValueError(
                    f"{type(theirs_layer).__name__}: PyTorch has {sorted(params)}, needle's "
                    f"{type(ours_layer).__name__} gives {sorted(arrays)}"
                )
            for name, array in arrays.items():
                if tuple(params[name].shape) != array.shape:
                    raise ValueError(
                        f"{type(theirs_layer).__name__}.{name}: PyTorch's shape "
                        f"{tuple(params[name].shape)}, needle's {array.shape}"
                    )
                params[name].copy_(torch.from_numpy(np.ascontiguousarray(array)))
    return len(ours)


def parameter_counts(needle_net, torch_net) -> tuple[int, int]:
    """(needle's, PyTorch's) number of trainable scalars."""
    ours = sum(int(np.prod(p.shape)) for p in needle_net.parameters())
    return ours, sum(p.numel() for p in torch_net.parameters() if p.requires_grad)


def compare(case: str, sizes: Sizes = Sizes()) -> dict[str, float]:
    """Build both models of ``case``, copy needle's weights into PyTorch's and run both on the
    same batch: {"needle params", "torch params", "logits gap" (largest difference over the
    largest logit), "loss gap"}. MLP-ResNet compares in evaluation mode (dropout is random)."""
    import torch

    import needle as ndl

    ours, theirs = needle_model(case, sizes, ndl.cpu()), torch_model(case, sizes)
    copy_weights(ours, theirs)
    if case == "mlp_resnet":
        ours.eval(), theirs.eval()
    x_np, y_np = batch(case, sizes)
    out = ours(ndl.Tensor(x_np.astype(np.float32), device=ndl.cpu(), requires_grad=False))
    out = out[0] if isinstance(out, tuple) else out
    loss = ndl.nn.SoftmaxLoss()(out, ndl.Tensor(y_np.astype(np.float32), device=ndl.cpu()))
    x_t = torch.from_numpy(x_np if x_np.dtype == np.float32 else x_np.astype(np.int64))
    with torch.no_grad():
        logits = theirs(x_t)
        loss_t = torch.nn.CrossEntropyLoss()(logits, torch.from_numpy(y_np.astype(np.int64)))
    ref = logits.numpy()
    gap = float(np.abs(out.numpy() - ref).max() / max(float(np.abs(ref).max()), 1e-12))
    n_ours, n_theirs = parameter_counts(ours, theirs)
    return {
        "needle params": n_ours,
        "torch params": n_theirs,
        "logits gap": gap,
        "loss gap": abs(float(loss.numpy()) - float(loss_t)),
    }
