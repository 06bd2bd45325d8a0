"""One training step of four models, in needle and in PyTorch, split into three phases.

Each case builds the same architecture, shapes and optimizer in both libraries (float32, CPU):

* ``mlp_resnet``: MLPResNet(784, hidden 100, 3 blocks, BatchNorm1d, dropout 0.1), batch 100,
  softmax loss, Adam (lr 0.001, weight decay 0.001): one step of hw2's epoch.
* ``resnet9``: the course's ResNet-9 on a (32, 3, 32, 32) batch, softmax loss, SGD (lr 0.01).
* ``lstm_lm``: LanguageModel with a 2-layer LSTM, seq 32, batch 16, E = H = 128, vocabulary
  1000, softmax loss, SGD (lr 0.1).
* ``transformer_lm``: the same with needle's 2-layer pre-norm Transformer (8 heads of 32,
  feed-forward width 128, causal, learned positions); PyTorch runs a module-for-module twin
  (three LayerNorms, bias-free projections, explicit masked softmax attention).

A :class:`Step` has ``forward`` (clear the gradients, run the model and the loss, return the
loss), ``backward(loss)`` and ``update``; calling it runs all three. The module imports only
numpy, needle and (optionally, on the first PyTorch step built) torch, so the step profiler can
also run it against an older needle checkout, and a process that builds only needle's steps
never loads PyTorch (``make bench`` times each library in processes of its own).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np

SEQ, BATCH_LM, EMBED, HIDDEN, VOCAB, LAYERS = 32, 16, 128, 128, 1000, 2
HEADS, DIM_HEAD = 8, 32
MLP_BATCH, MLP_DIM, MLP_HIDDEN, MLP_BLOCKS, MLP_CLASSES, MLP_DROP = 100, 784, 100, 3, 10, 0.1
CIFAR_BATCH = 32

CASES = ("mlp_resnet", "resnet9", "lstm_lm", "transformer_lm")
TITLES = {
    "mlp_resnet": "MLP-ResNet step (batch 100, Adam)",
    "resnet9": "ResNet-9 step (batch 32, SGD)",
    "lstm_lm": "LSTM LM step (2 layers, T=32, B=16, E=H=128, V=1000, SGD)",
    "transformer_lm": "Transformer LM step (2 layers, T=32, B=16, E=H=128, V=1000, SGD)",
}


def _fast_backward(loss) -> None:
    """needle's backward without recording the gradient graph (``create_graph=False``): the work
    PyTorch's default ``backward()`` does, so the two libraries time the same step. The course's
    default records the graph (differentiable gradients); on this machine that cost 0-15 % of a
    step in A/B runs, most for ResNet-9, whose adjoints then stay alive until the next step."""
    loss.backward(create_graph=False)


@dataclass
class Step:
    """One training step as three phases; ``step()`` runs them in order."""

    forward: Callable[[], object]
    backward: Callable[[object], None]
    update: Callable[[], None]

    def __call__(self) -> None:
        self.backward(self.forward())
        self.update()


def peak_bytes(device, fn: Callable[[], object]) -> Tuple[int, int]:
    """(peak bytes live during one call of ``fn``, bytes live when it started) on ``device``'s
    allocator counter (``memory_stats``). The garbage collector is off during the call, after
    a collection: when a collection would run mid-step depends on the Python version, and it
    moves the peak."""
    gc.collect()
    gc.disable()
    try:
        start = device.memory_stats()["live_bytes"]
        device.reset_peak()
        fn()
        return int(device.memory_stats()["peak_bytes"]), int(start)
    finally:
        gc.enable()


@dataclass(frozen=True)
class Sizes:
    """The models' sizes (the defaults are the cases described above); ``heads`` and
    ``dim_head`` None keep the Transformer layer's own defaults."""

    mlp_batch: int = MLP_BATCH
    mlp_dim: int = MLP_DIM
    mlp_hidden: int = MLP_HIDDEN
    mlp_blocks: int = MLP_BLOCKS
    classes: int = MLP_CLASSES
    drop: float = MLP_DROP
    image_batch: int = CIFAR_BATCH
    seq: int = SEQ
    lm_batch: int = BATCH_LM
    embed: int = EMBED
    hidden: int = HIDDEN
    vocab: int = VOCAB
    layers: int = LAYERS
    heads: Optional[int] = None
    dim_head: Optional[int] = None


def check_case(case: str) -> None:
    """ValueError naming the cases when ``case`` is not one of them."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")


def batch(case: str, sizes: Sizes = Sizes()) -> Tuple[np.ndarray, np.ndarray]:
    """(inputs, integer targets) of ``case`` as numpy arrays, fixed by the case and sizes."""
    check_case(case)
    rng = np.random.RandomState(0)
    if case == "mlp_resnet":
        x = rng.standard_normal((sizes.mlp_batch, sizes.mlp_dim)).astype(np.float32)
        return x, rng.randint(0, sizes.classes, sizes.mlp_batch)
    if case == "resnet9":
        x = rng.standard_normal((sizes.image_batch, 3, 32, 32)).astype(np.float32)
        return x, rng.randint(0, 10, sizes.image_batch)
    ids = rng.randint(0, sizes.vocab, (sizes.seq, sizes.lm_batch))
    return ids, rng.randint(0, sizes.vocab, sizes.seq * sizes.lm_batch)


def needle_model(case: str, sizes: Sizes, device):
    """The course's model of ``case`` on ``device`` (MLPResNet on the default device: the
    course's takes none), seeded, in training mode."""
    check_case(case)
    np.random.seed(0)
    if case == "mlp_resnet":
        from companion.apps import mlp_resnet

        model = mlp_resnet.MLPResNet(
            sizes.mlp_dim, sizes.mlp_hidden, sizes.mlp_blocks, sizes.classes, drop_prob=sizes.drop
        )
    elif case == "resnet9":
        from companion.apps.models import ResNet9

        model = ResNet9(device=device)
    else:
        from companion.apps.models import LanguageModel

        heads = {}  # the Transformer's; None keeps its layer's defaults
        if case == "transformer_lm" and sizes.heads is not None:
            heads["num_head"] = sizes.heads
        if case == "transformer_lm" and sizes.dim_head is not None:
            heads["dim_head"] = sizes.dim_head
        model = LanguageModel(
            sizes.embed,
            sizes.vocab,
            sizes.hidden,
            num_layers=sizes.layers,
            seq_model="lstm" if case == "lstm_lm" else "transformer",
            seq_len=sizes.seq,
            device=device,
            **heads,
        )
    model.train()
    return model


def needle_step(case: str, device, fast: bool = False, sizes: Sizes = Sizes()) -> Step:
    """The needle step of ``case`` on ``device`` (a needle device such as ``ndl.cpu()``): the
    course's modules and backward, or with ``fast`` the opt-in fast path
    (``needle.fast.fuse`` on the model and the loss, ``needle.fast.backward``)."""
    import needle as ndl

    x_np, y_np = batch(case, sizes)
    model = needle_model(case, sizes, device)
    if case == "mlp_resnet":
        opt = ndl.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.001)
    else:
        opt = ndl.optim.SGD(model.parameters(), lr=0.01 if case == "resnet9" else 0.1)
    param_device = model.parameters()[0].device
    if param_device != device:
        raise RuntimeError(f"{case}: the model's parameters are on {param_device}, not {device}")
    return training_step(model, opt, x_np, y_np, device, fast)


def training_step(
    model, opt, x_np: np.ndarray, y_np: np.ndarray, device, fast: bool = False
) -> Step:
    """A needle training step of ``model`` on the batch (x_np, y_np) with ``opt``:
    ``nn.SoftmaxLoss`` (on the logits when the model returns (logits, state)),
    ``backward(create_graph=False)``, the optimizer; with ``fast`` the opt-in fast path
    (``needle.fast.fuse`` on the model and the loss, ``needle.fast.backward``)."""
    import needle as ndl

    x = ndl.Tensor(x_np.astype(np.float32), device=device, requires_grad=False)
    y = ndl.Tensor(y_np.astype(np.float32), device=device, requires_grad=False)
    loss_fn = ndl.nn.SoftmaxLoss()
    backward = _fast_backward
    if fast:
        import needle.fast

        needle.fast.fuse(model)
        needle.fast.fuse(loss_fn)
        backward = needle.fast.backward

    def forward():
        opt.reset_grad()
        out = model(x)
        if isinstance(out, tuple):  # the language models return (logits, state)
            out = out[0]
        return loss_fn(out, y)

    return Step(forward, backward, opt.step)


def torch_step(case: str) -> Optional[Step]:
    """The PyTorch twin of ``case`` (CPU, float32), or None when torch is not installed."""
    try:  # optional oracle, imported here: needle's steps never need it
        import torch
    except ImportError:
        return None
    nn = torch.nn
    torch.manual_seed(0)
    x_np, y_np = batch(case)
    if case == "mlp_resnet":
        model = torch_mlp_resnet()
        opt = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=0.001)
    elif case == "resnet9":
        model = _torch_resnet9()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    elif case == "lstm_lm":
        model = _torch_lstm_lm()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    elif case == "transformer_lm":
        model = _torch_transformer_lm()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    else:
        raise ValueError(f"unknown case {case!r}; cases: {', '.join(CASES)}")
    model.train()
    x = torch.from_numpy(x_np if x_np.dtype == np.float32 else x_np.astype(np.int64))
    y = torch.from_numpy(y_np.astype(np.int64))

    def forward():
        opt.zero_grad()
        return nn.functional.cross_entropy(model(x), y)

    return Step(forward, _fast_backward, opt.step)


def _torch_resnet9():
    """needle's ResNet9 case in PyTorch: ConvBN blocks, two residuals, two Linear."""
    import torch

    nn = torch.nn

    def convbn(a, b, k, s):
        return nn.Sequential(nn.Conv2d(a, b, k, s, k // 2), nn.BatchNorm2d(b), nn.ReLU())

    class Res(nn.Module):
        def __init__(self, *layers):
            super().__init__()
            self.fn = nn.Sequential(*layers)

        def forward(self, x):
            return self.fn(x) + x

    return nn.Sequential(
        convbn(3, 16, 7, 4),
        convbn(16, 32, 3, 2),
        Res(convbn(32, 32, 3, 1), convbn(32, 32, 3, 1)),
        convbn(32, 64, 3, 2),
        convbn(64, 128, 3, 2),
        Res(convbn(128, 128, 3, 1), convbn(128, 128, 3, 1)),
        nn.Flatten(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def _torch_lstm_lm():
    """needle's LSTM language model case in PyTorch: Embedding, LSTM, Linear."""
    import torch

    nn = torch.nn

    class LSTMLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, EMBED)
            self.lstm = nn.LSTM(EMBED, HIDDEN, LAYERS)
            self.out = nn.Linear(HIDDEN, VOCAB)

        def forward(self, ids):
            h, _ = self.lstm(self.emb(ids))
            return self.out(h.reshape(-1, HIDDEN))

    return LSTMLM()


def torch_mlp_resnet():
    """needle's MLPResNet(784, 100, 3 blocks, 10 classes, dropout 0.1) in PyTorch."""
    import torch

    nn = torch.nn

    def block():
        return nn.Sequential(
            nn.Linear(MLP_HIDDEN, MLP_HIDDEN // 2),
            nn.BatchNorm1d(MLP_HIDDEN // 2),
            nn.ReLU(),
            nn.Dropout(MLP_DROP),
            nn.Linear(MLP_HIDDEN // 2, MLP_HIDDEN),
            nn.BatchNorm1d(MLP_HIDDEN),
        )

    class MLPResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(MLP_DIM, MLP_HIDDEN)
            self.blocks = nn.ModuleList(block() for _ in range(MLP_BLOCKS))
            self.out = nn.Linear(MLP_HIDDEN, MLP_CLASSES)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            for blk in self.blocks:
                h = torch.relu(blk(h) + h)
            return self.out(h)

    return MLPResNet()


def _torch_transformer_lm():
    """needle's LanguageModel(seq_model="transformer") rebuilt module for module in PyTorch."""
    import torch

    nn = torch.nn
    inner = HEADS * DIM_HEAD

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm_q, self.norm_k, self.norm_v = (nn.LayerNorm(EMBED) for _ in range(3))
            self.q, self.k, self.v = (nn.Linear(EMBED, inner, bias=False) for _ in range(3))
            self.proj = nn.Linear(inner, EMBED, bias=False)
            self.norm = nn.LayerNorm(EMBED)
            self.ff1, self.ff2 = nn.Linear(EMBED, HIDDEN), nn.Linear(HIDDEN, EMBED)
            mask = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)
            self.register_buffer("mask", mask)

        def heads(self, x, norm, proj):
            b, t, _ = x.shape
            return proj(norm(x)).reshape(b, t, HEADS, DIM_HEAD).transpose(1, 2)

        def forward(self, x):  # (B, T, E)
            b, t, _ = x.shape
            q, k, v = (
                self.heads(x, n, p)
                for n, p in ((self.norm_q, self.q), (self.norm_k, self.k), (self.norm_v, self.v))
            )
            logits = q @ k.transpose(-1, -2) / DIM_HEAD**0.5 + self.mask[:t, :t]
            att = (torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(b, t, inner)
            x = x + self.proj(att)
            return x + self.ff2(torch.relu(self.ff1(self.norm(x))))

    class TransformerLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, EMBED)
            self.pos = nn.Embedding(SEQ, EMBED)
            self.layers = nn.Sequential(Layer(), Layer())
            self.out = nn.Linear(EMBED, VOCAB)

        def forward(self, ids):  # (T, B)
            t = ids.shape[0]
            x = (self.emb(ids) + self.pos(torch.arange(t))[:, None, :]).transpose(0, 1)
            x = self.layers(x).transpose(0, 1)  # back to (T, B, E)
            return self.out(x.reshape(-1, EMBED))

    return TransformerLM()
