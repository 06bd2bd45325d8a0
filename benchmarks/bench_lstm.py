"""LSTM language-model speed: one truncated-BPTT training step in needle, beside a hand-written
numpy LSTM (measured in this process) and PyTorch when installed (each library in processes of
its own: ``CHILD_RUNS`` alternating children per library, each timing blocks of steps).

The step: ids (seq 20, batch 20) → Embedding(1000 → 200) → 1-layer LSTM(200 → 200) →
Linear(200 → 1000) → mean softmax cross-entropy → backward → SGD update (lr 0.1), float32.
The numpy reference computes the same forward and the same gradients by hand (its loss and a
gradient are first checked against needle's on identical weights, so the timed work is the
same arithmetic). Run ``python -m benchmarks.bench_lstm``; ``make bench`` runs it with the
others.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import needle as ndl
from benchmarks.common import (
    CHILD_RUNS,
    Table,
    enabled_devices,
    libraries,
    time_libraries_in_children,
    time_step_here,
)
from companion.apps.language_model import LanguageModel
from companion.timing import measure

SEQ, BATCH, EMBED, HIDDEN, VOCAB, LR = 20, 20, 200, 200, 1000, 0.1


def data(seed: int = 0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, (SEQ, BATCH))
    target = rng.randint(0, VOCAB, SEQ * BATCH)
    return ids, target


def needle_step(device):
    """(step closure, model) for one BPTT step of the LSTM LM on ``device``."""
    np.random.seed(0)
    model = LanguageModel(
        EMBED, VOCAB, HIDDEN, num_layers=1, seq_model="lstm", seq_len=SEQ, device=device
    )
    model.train()
    opt = ndl.optim.SGD(model.parameters(), lr=LR)
    loss_fn = ndl.nn.SoftmaxLoss()
    ids, target = data()
    x = ndl.Tensor(ids.astype(np.float32), device=device, requires_grad=False)
    y = ndl.Tensor(target.astype(np.float32), device=device, requires_grad=False)

    def step():
        opt.reset_grad()
        out, _ = model(x)
        loss = loss_fn(out, y)
        loss.backward(create_graph=False)  # as PyTorch: no gradient graph
        opt.step()
        return float(loss.numpy())  # a host copy: waits for the device

    return step, model


class NumpyLSTMLM:
    """The same model in float32 numpy with a hand-written backward pass."""

    def __init__(self, model: LanguageModel):
        cell = model.seq_model.lstm_cells[0]
        self.p = {
            "E": model.embedding.weight.numpy(),
            "W_ih": cell.W_ih.numpy(),
            "W_hh": cell.W_hh.numpy(),
            "b": (cell.bias_ih.numpy() + cell.bias_hh.numpy()),
            "W": model.linear.weight.numpy(),
            "c": model.linear.bias.numpy().reshape(-1),
        }

    def loss_and_grads(self, ids, target):
        p, H = self.p, HIDDEN
        S, B = ids.shape
        x = p["E"][ids]  # (S, B, E)
        h, c = np.zeros((B, H), np.float32), np.zeros((B, H), np.float32)
        cache, hs = [], []
        xw = (x.reshape(S * B, -1) @ p["W_ih"] + p["b"]).reshape(S, B, 4 * H)
        for t in range(S):
            z = xw[t] + h @ p["W_hh"]
            i, f = 1 / (1 + np.exp(-z[:, :H])), 1 / (1 + np.exp(-z[:, H : 2 * H]))
            g, o = np.tanh(z[:, 2 * H : 3 * H]), 1 / (1 + np.exp(-z[:, 3 * H :]))
            c_prev, h_prev = c, h
            c = f * c + i * g
            tc = np.tanh(c)
            h = o * tc
            cache.append((i, f, g, o, c_prev, h_prev, tc))
            hs.append(h)
        hs = np.stack(hs).reshape(S * B, H)
        logits = hs @ p["W"] + p["c"]
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        n = S * B
        loss = -logp[np.arange(n), target].mean()
        d = np.exp(logp)
        d[np.arange(n), target] -= 1
        d /= n
        grads = {"W": hs.T @ d, "c": d.sum(axis=0)}
        dhs = (d @ p["W"].T).reshape(S, B, H)
        dz_all = np.empty((S, B, 4 * H), np.float32)
        dh_next, dc_next = np.zeros((B, H), np.float32), np.zeros((B, H), np.float32)
        dW_hh = np.zeros_like(p["W_hh"])
        for t in reversed(range(S)):
            i, f, g, o, c_prev, h_prev, tc = cache[t]
            dh = dhs[t] + dh_next
            dc = dh * o * (1 - tc * tc) + dc_next
            dz = dz_all[t]
            dz[:, :H] = dc * g * i * (1 - i)
            dz[:, H : 2 * H] = dc * c_prev * f * (1 - f)
            dz[:, 2 * H : 3 * H] = dc * i * (1 - g * g)
            dz[:, 3 * H :] = dh * tc * o * (1 - o)
            dW_hh += h_prev.T @ dz
            dh_next, dc_next = dz @ p["W_hh"].T, dc * f
        dz2 = dz_all.reshape(S * B, 4 * H)
        grads.update(W_hh=dW_hh, W_ih=x.reshape(S * B, -1).T @ dz2, b=dz2.sum(axis=0))
        dE = np.zeros_like(p["E"])
        np.add.at(dE, ids.reshape(-1), dz2 @ p["W_ih"].T)
        grads["E"] = dE
        return loss, grads

    def step(self, ids, target):
        loss, grads = self.loss_and_grads(ids, target)
        for k, g in grads.items():
            self.p[k] -= LR * g
        return loss


def check_reference(model: LanguageModel, device) -> None:
    """The numpy reference computes needle's loss and W_hh gradient on identical weights."""
    ref = NumpyLSTMLM(model)
    ids, target = data()
    loss_ref, grads = ref.loss_and_grads(ids, target)
    x = ndl.Tensor(ids.astype(np.float32), device=device, requires_grad=False)
    y = ndl.Tensor(target.astype(np.float32), device=device, requires_grad=False)
    out, _ = model(x)
    loss = ndl.nn.SoftmaxLoss()(out, y)
    loss.backward()
    g = model.seq_model.lstm_cells[0].W_hh.grad.numpy()
    assert abs(float(loss.numpy()) - loss_ref) < 1e-4, (float(loss.numpy()), loss_ref)
    scale = np.abs(grads["W_hh"]).max()
    assert np.abs(g - grads["W_hh"]).max() < 1e-3 * scale, "numpy reference disagrees with needle"


def torch_step():
    """The same model in PyTorch (CPU, float32), or None without torch."""
    try:  # optional oracle, imported only by the process that times it
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    emb = torch.nn.Embedding(VOCAB, EMBED)
    lstm = torch.nn.LSTM(EMBED, HIDDEN, 1)
    lin = torch.nn.Linear(HIDDEN, VOCAB)
    params = [*emb.parameters(), *lstm.parameters(), *lin.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    ids, target = data()
    x, y = torch.from_numpy(ids), torch.from_numpy(target)

    def step():
        opt.zero_grad()
        out, _ = lstm(emb(x))
        loss = torch.nn.functional.cross_entropy(lin(out.reshape(SEQ * BATCH, HIDDEN)), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def time_lstm_step(library: str) -> dict[str, float]:
    """{"lstm": seconds per BPTT step} by ``library`` ("needle" on its first enabled device,
    "torch"), timed in this process in blocks of steps."""
    builders = {"needle": lambda: needle_step(enabled_devices()[0])[0], "torch": torch_step}
    return {"lstm": time_step_here(library, builders)}


def main(argv=None) -> None:
    """Print ms per BPTT step for needle on each enabled device beside numpy (this process), and
    needle's first device beside PyTorch if installed (each in its own processes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="samples in this process")
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    args = parser.parse_args([] if argv is None else argv)
    print(
        f"LSTM language model, one truncated-BPTT step (forward + backward + SGD): seq {SEQ}, "
        f"batch {BATCH}, embedding {EMBED}, hidden {HIDDEN}, vocabulary {VOCAB}, float32"
    )
    ids, target = data()
    np_model = NumpyLSTMLM(needle_step(enabled_devices()[0])[1])
    t_np = measure(lambda: np_model.step(ids, target), repeats=args.repeat, warmup=1) * 1e3
    vs_numpy = Table(
        "ms per step (this process); ratio = numpy time / needle time (above 1: needle faster)",
        "ms",
        reference="numpy",
        higher_is_better=False,
    )
    for dev in enabled_devices():
        step, model = needle_step(dev)
        check_reference(model, dev)
        vs_numpy.add(f"needle {dev}", measure(step, repeats=args.repeat, warmup=1) * 1e3, t_np)
    vs_numpy.print()
    libs = libraries()
    if "torch" not in libs:
        print("PyTorch: not installed (pip install torch to add it as a reference)")
        return
    t = time_libraries_in_children(
        "benchmarks.bench_lstm:time_lstm_step", what="LSTM LM step", libraries=libs, runs=args.runs
    )
    vs_torch = Table(
        f"ms per step, each library in its own processes, median of {args.runs}; "
        "ratio = PyTorch time / needle time",
        "ms",
        reference="PyTorch",
        higher_is_better=False,
    )
    vs_torch.add(
        f"needle {enabled_devices()[0]}", 1e3 * t["needle"]["lstm"], 1e3 * t["torch"]["lstm"]
    )
    vs_torch.print()


if __name__ == "__main__":
    main(sys.argv[1:])
