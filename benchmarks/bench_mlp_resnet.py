"""MLP-ResNet training speed (hw2's model): one epoch in needle beside a hand-written numpy
version (measured in this process) and PyTorch when installed (each library in processes of its
own: ``CHILD_RUNS`` alternating children per library, medians).

The epoch: 10,000 MNIST-shaped samples (784 inputs: the offline digits resized to 28 x 28 and
repeated), shuffled batches of 100, MLPResNet(784, hidden 100, 3 blocks, BatchNorm1d, dropout
0.1) in train mode, mean softmax loss, backward, Adam (lr 0.001, weight decay 0.001). needle runs
``mlp_resnet.epoch`` (its DataLoader included) on every enabled device; PyTorch's epoch does the
same bookkeeping (each batch's errors and loss read back, as the course's ``epoch`` returns the
error rate and the mean loss). The numpy reference
does the same forward, hand-derived backward and Adam update; before timing, its loss and
gradients are checked against needle's on identical weights and dropout masks, so the timed
work is the same arithmetic. Times are medians of a few epochs; the ratio column is needle's
speed over the reference's (above 1: needle is faster).

Run ``python -m benchmarks.bench_mlp_resnet [--samples N] [--repeats R]``; ``make bench`` runs
it with the others.
"""

from __future__ import annotations

import argparse

import numpy as np

import companion.data
import needle as ndl
from benchmarks.common import (
    CHILD_RUNS,
    PATHS,
    Table,
    libraries,
    time_libraries_in_children,
    time_step_here,
    with_fast_path,
)
from companion.apps import mlp_resnet
from companion.steps import torch_mlp_resnet
from companion.timing import measure

DIM, HIDDEN, BLOCKS, CLASSES, BATCH, DROP = 784, 100, 3, 10, 100, 0.1
LR, WD, EPS_BN = 0.001, 0.001, 1e-5


def data(samples: int):
    """(X (samples, 784) float32, y (samples,) uint8): the 28x28 digits, repeated and shuffled."""
    X, y = companion.data.load_digits_mnist_like(28)
    idx = np.random.RandomState(0).randint(0, len(y), size=samples)
    return X[idx], y[idx]


# ---- the numpy reference ----------------------------------------------------------------------


def weights_from_needle(model) -> dict:
    """The needle model's parameters as float32 numpy arrays, by layer name."""
    mods = model.modules
    w = {
        "Wi": mods[0].weight.numpy(),
        "bi": mods[0].bias.numpy().ravel(),
        "Wo": mods[-1].weight.numpy(),
        "bo": mods[-1].bias.numpy().ravel(),
    }
    for b, block in enumerate(mods[2 : 2 + BLOCKS]):
        l1, n1, _, _, l2, n2 = block.modules[0].fn.modules
        w.update(
            {
                f"W1_{b}": l1.weight.numpy(),
                f"b1_{b}": l1.bias.numpy().ravel(),
                f"g1_{b}": n1.weight.numpy(),
                f"e1_{b}": n1.bias.numpy(),
                f"W2_{b}": l2.weight.numpy(),
                f"b2_{b}": l2.bias.numpy().ravel(),
                f"g2_{b}": n2.weight.numpy(),
                f"e2_{b}": n2.bias.numpy(),
            }
        )
    return {k: np.array(v, dtype=np.float32) for k, v in w.items()}


def _bn_forward(a, g, e):
    mu = a.mean(axis=0)
    var = a.var(axis=0)
    inv = 1.0 / np.sqrt(var + EPS_BN)
    xhat = (a - mu) * inv
    return g * xhat + e, (xhat, inv, g), mu, var


def _bn_backward(dy, cache):
    xhat, inv, g = cache
    n = dy.shape[0]
    dxhat = dy * g
    da = inv / n * (n * dxhat - dxhat.sum(axis=0) - xhat * (dxhat * xhat).sum(axis=0))
    return da, (dy * xhat).sum(axis=0), dy.sum(axis=0)


class NumpyMLPResNet:
    """MLPResNet forward, backward and Adam in numpy, with needle's conventions (float32)."""

    def __init__(self, weights: dict):
        self.w = weights
        self.m = {k: np.zeros_like(v) for k, v in weights.items()}
        self.v = {k: np.zeros_like(v) for k, v in weights.items()}
        self.running = {
            f"{s}{i}_{b}": (np.zeros(d, np.float32) if s == "mean" else np.ones(d, np.float32))
            for b in range(BLOCKS)
            for i, d in ((1, HIDDEN // 2), (2, HIDDEN))
            for s in ("mean", "var")
        }
        self.t = 0

    def loss_and_grads(self, X, y):
        """(mean softmax loss, logits, grads by name) for one batch in train mode."""
        w, n = self.w, X.shape[0]
        caches = []
        h = np.maximum(X @ w["Wi"] + w["bi"], 0)
        h_in = h
        for b in range(BLOCKS):
            a1 = h @ w[f"W1_{b}"] + w[f"b1_{b}"]
            n1, c1, mu1, var1 = _bn_forward(a1, w[f"g1_{b}"], w[f"e1_{b}"])
            r1 = np.maximum(n1, 0)
            mask = (np.random.rand(n, HIDDEN // 2) <= 1 - DROP).astype(np.float32) / np.float32(
                1 - DROP
            )
            d1 = r1 * mask
            a2 = d1 @ w[f"W2_{b}"] + w[f"b2_{b}"]
            n2, c2, mu2, var2 = _bn_forward(a2, w[f"g2_{b}"], w[f"e2_{b}"])
            s = n2 + h
            caches.append((h, c1, n1, mask, d1, c2, s))
            for key, stat in (("mean1", mu1), ("var1", var1), ("mean2", mu2), ("var2", var2)):
                r = f"{key}_{b}"
                self.running[r] = 0.9 * self.running[r] + 0.1 * stat
            h = np.maximum(s, 0)
        logits = h @ w["Wo"] + w["bo"]
        zmax = logits.max(axis=1, keepdims=True)
        ez = np.exp(logits - zmax)
        lse = np.log(ez.sum(axis=1)) + zmax[:, 0]
        loss = float(np.mean(lse - logits[np.arange(n), y]))
        g = {}
        dz = ez / ez.sum(axis=1, keepdims=True)
        dz[np.arange(n), y] -= 1
        dz /= n
        g["Wo"], g["bo"] = h.T @ dz, dz.sum(axis=0)
        dh = dz @ w["Wo"].T
        for b in reversed(range(BLOCKS)):
            h_prev, c1, n1, mask, d1, c2, s = caches[b]
            ds = dh * (s > 0)
            da2, g[f"g2_{b}"], g[f"e2_{b}"] = _bn_backward(ds, c2)
            g[f"W2_{b}"], g[f"b2_{b}"] = d1.T @ da2, da2.sum(axis=0)
            dn1 = (da2 @ w[f"W2_{b}"].T) * mask * (n1 > 0)
            da1, g[f"g1_{b}"], g[f"e1_{b}"] = _bn_backward(dn1, c1)
            g[f"W1_{b}"], g[f"b1_{b}"] = h_prev.T @ da1, da1.sum(axis=0)
            dh = da1 @ w[f"W1_{b}"].T + ds
        dpre = dh * (h_in > 0)
        g["Wi"], g["bi"] = X.T @ dpre, dpre.sum(axis=0)
        return loss, logits, g

    def adam_step(self, grads: dict, b1=0.9, b2=0.999, eps=1e-8) -> None:
        self.t += 1
        for k, p in self.w.items():
            gk = grads[k] + WD * p
            self.m[k] = b1 * self.m[k] + (1 - b1) * gk
            self.v[k] = b2 * self.v[k] + (1 - b2) * gk * gk
            mhat = self.m[k] / (1 - b1**self.t)
            vhat = self.v[k] / (1 - b2**self.t)
            p -= (LR * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)

    def epoch(self, X, y):
        """One shuffled training epoch; returns (error rate, mean batch loss)."""
        np.random.seed(4)
        order = np.random.permutation(len(y))
        losses, wrong = [], 0
        for idx in np.array_split(order, range(BATCH, len(y), BATCH)):
            loss, logits, grads = self.loss_and_grads(X[idx], y[idx])
            self.adam_step(grads)
            losses.append(loss)
            wrong += int((logits.argmax(axis=1) != y[idx]).sum())
        return wrong / len(y), float(np.mean(losses))


def check_numpy_against_needle(device) -> float:
    """Largest relative gradient difference between the numpy reference and needle, one batch."""
    X, y = data(BATCH)
    np.random.seed(0)
    model = mlp_resnet.MLPResNet(DIM, HIDDEN, BLOCKS, CLASSES, drop_prob=DROP)
    model.train()
    ref = NumpyMLPResNet(weights_from_needle(model))
    np.random.seed(7)  # the same dropout masks: both draw np.random.rand per block, in order
    loss_ref, _, g_ref = ref.loss_and_grads(X, y.astype(np.int64))
    np.random.seed(7)
    xt = ndl.Tensor(X, device=device, requires_grad=False)
    yt = ndl.Tensor(y.astype(np.float32), device=device, requires_grad=False)
    loss = ndl.nn.SoftmaxLoss()(model(xt), yt)
    loss.backward()
    assert abs(float(loss.numpy()) - loss_ref) < 1e-4, (float(loss.numpy()), loss_ref)
    mods = model.modules
    pairs = [(mods[0].weight, "Wi"), (mods[-1].weight, "Wo")]
    for b, block in enumerate(mods[2 : 2 + BLOCKS]):
        l1, n1, _, _, l2, n2 = block.modules[0].fn.modules
        pairs += [
            (l1.weight, f"W1_{b}"),
            (n1.weight, f"g1_{b}"),
            (l2.weight, f"W2_{b}"),
            (n2.bias, f"e2_{b}"),
        ]
    worst = 0.0
    for param, name in pairs:
        a, r = param.grad.numpy().reshape(g_ref[name].shape), g_ref[name]
        worst = max(worst, float(np.abs(a - r).max() / (np.abs(r).max() + 1e-12)))
    assert worst < 1e-3, f"numpy reference disagrees with needle: relative gradient gap {worst:.2e}"
    return worst


# ---- PyTorch (optional) -----------------------------------------------------------------------


def torch_epoch_fn(X, y):
    """A closure running one PyTorch epoch of the same model, or None without PyTorch."""
    try:  # optional oracle, imported only by the process that times it
        import torch
    except ImportError:
        return None
    nn = torch.nn
    torch.manual_seed(0)
    net = torch_mlp_resnet().train()
    opt = torch.optim.Adam(net.parameters(), lr=LR, weight_decay=WD)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))

    def run():
        # the work of the course's epoch(), which needle runs: per batch a step, the batch's
        # errors and its loss read back; the error rate and the mean loss returned
        order = torch.from_numpy(np.random.RandomState(4).permutation(len(y)))
        losses, errors = [], 0
        for idx in torch.split(order, BATCH):
            labels = yt[idx]
            logits = net(Xt[idx])
            loss = nn.functional.cross_entropy(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            errors += int((logits.detach().argmax(dim=1) != labels).sum())
            losses.append(float(loss.detach()))
        return errors / len(y), float(np.mean(losses))

    return run


def needle_epoch_fn(X, y, device, fast: bool = False):
    """(a closure running one needle epoch of ``mlp_resnet.epoch``, DataLoader included, the
    model): MLPResNet seeded as the numpy reference's weights are; with ``fast`` its modules
    are swapped for ``needle.fast``'s twins."""
    np.random.seed(0)
    model = mlp_resnet.MLPResNet(DIM, HIDDEN, BLOCKS, CLASSES, drop_prob=DROP)
    if fast:
        import needle.fast

        needle.fast.fuse(model)
    opt = ndl.optim.Adam(model.parameters(), lr=LR, weight_decay=WD)
    loader = ndl.data.DataLoader(ndl.data.NDArrayDataset(X, y), BATCH, shuffle=True, device=device)
    return (lambda: mlp_resnet.epoch(loader, model, opt, progress=False)), model


def time_epoch(library: str, samples: int, repeats: int) -> dict[str, float]:
    """{"epoch": median seconds of one epoch over ``samples``} by ``library`` ("needle" on
    cpu(), "torch"), timed in this process (``repeats`` epochs after one warm-up epoch)."""
    X, y = data(samples)
    builders = {
        "needle": lambda: needle_epoch_fn(X, y, ndl.cpu())[0],
        "needle-fast": lambda: needle_epoch_fn(X, y, ndl.cpu(), fast=True)[0],
        "torch": lambda: torch_epoch_fn(X, y),
    }
    return {"epoch": time_step_here(library, builders, repeats=repeats, warmup=1, min_sample_s=0)}


def main(argv=None) -> dict:
    """Print the epoch tables; return {"MLP-ResNet epoch": PyTorch time / needle time}."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000, help="samples per epoch")
    parser.add_argument("--repeats", type=int, default=3, help="epochs timed (median)")
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    args = parser.parse_args(argv if argv is not None else [])
    X, y = data(args.samples)
    device = ndl.cpu()  # the course's MLPResNet takes no device: its layers live on cpu()
    gap = check_numpy_against_needle(device)
    print(
        f"numpy reference checked against needle: loss equal, gradients within {gap:.1e} (relative)"
    )
    print(
        f"one epoch: {args.samples} samples, batch {BATCH}, MLPResNet({DIM}, {HIDDEN}, "
        f"{BLOCKS} blocks), Adam; median of {args.repeats} epochs"
    )

    run_needle, model = needle_epoch_fn(X, y, device)
    ref = NumpyMLPResNet(weights_from_needle(model))
    t_needle = measure(run_needle, repeats=args.repeats, warmup=1, min_sample_s=0)
    t_numpy = measure(lambda: ref.epoch(X, y), repeats=args.repeats, warmup=1, min_sample_s=0)

    table = Table(
        "MLP-ResNet training epoch (this process)", "s", reference="numpy", higher_is_better=False
    )
    table.add(str(device), t_needle, t_numpy)
    table.print()
    libs = with_fast_path(libraries())
    if "torch" not in libs:
        print("PyTorch is not installed: no PyTorch comparison")
        return {}
    t = time_libraries_in_children(
        "benchmarks.bench_mlp_resnet:time_epoch",
        args.samples,
        args.repeats,
        what="MLP-ResNet epoch",
        libraries=libs,
        runs=args.runs,
    )
    torch_table = Table(
        f"MLP-ResNet training epoch, each library in its own processes, median of {args.runs}",
        "s",
        reference="pytorch",
        higher_is_better=False,
    )
    ratios = {}
    for path, label in PATHS:
        t_needle, t_torch = t[path]["epoch"], t["torch"]["epoch"]
        torch_table.add(f"{device} [{label}]", t_needle, t_torch)
        ratios[f"MLP-ResNet epoch [{label}]"] = torch_table.ratio(t_needle, t_torch)
    torch_table.print()
    return ratios


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
