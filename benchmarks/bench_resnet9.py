"""ResNet-9 and convolution speed: needle beside numpy (in this process) and PyTorch (each
library in processes of its own) when installed.

* ResNet-9 training step: batch 32 of 3x32x32 images, forward + softmax loss + backward (train
  mode) on every enabled needle device, beside a hand-written numpy ResNet-9 (im2col
  convolutions, BatchNorm, ReLU, residuals, the head, all gradients by hand), timed in this
  process. The numpy loss and a gradient are first checked against needle's on identical
  weights, so both time the same arithmetic. PyTorch runs the same architecture on the same
  shapes when installed: needle's first device and PyTorch are then timed in blocks of steps in
  alternating child processes, ``CHILD_RUNS`` per library (medians), so neither meets the
  other's threads or allocator state.
* One convolution forward alone (``ops.conv``, NHWC) beside numpy's im2col: a strided view of
  the padded input, reshaped into an (N·H_out·W_out, K·K·C_in) matrix, times the weight matrix;
  and its two gradients alone (the input's by col2im, the weight's as im2col(x)ᵀ @ G).

Run ``python -m benchmarks.bench_resnet9`` (``--profile`` adds a cProfile summary of the needle
step); ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import numpy as np

import needle as ndl
from benchmarks.common import (
    CHILD_RUNS,
    PATHS,
    Table,
    enabled_devices,
    libraries,
    time_libraries_in_children,
    time_step_here,
    with_fast_path,
)
from companion.apps.models import ConvBN, ResNet9
from companion.timing import measure

BATCH = 32
# (N, H, W, C_in, C_out, K, stride, padding): ResNet-9's first layer, two later layers, and a
# larger 3x3 layer where the matmul dominates
CONV_CASES = [
    (32, 32, 32, 3, 16, 7, 4, 3),
    (32, 8, 8, 16, 32, 3, 2, 1),
    (32, 4, 4, 32, 32, 3, 1, 1),
    (32, 32, 32, 32, 32, 3, 1, 1),
]


# ---- numpy reference ---------------------------------------------------------------------------
def im2col(x: np.ndarray, k: int, stride: int, padding: int) -> np.ndarray:
    """Patches of NHWC ``x`` as an (N, H_out, W_out, k, k, C) strided view of the padded input."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    n, h, w, c = x.shape
    ho, wo = (h - k) // stride + 1, (w - k) // stride + 1
    sn, sh, sw, sc = x.strides
    return np.lib.stride_tricks.as_strided(
        x, shape=(n, ho, wo, k, k, c), strides=(sn, sh * stride, sw * stride, sh, sw, sc)
    )


def conv_im2col_numpy(x: np.ndarray, w: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """NHWC convolution by im2col and one matmul: x (N, H, W, C_in), w (K, K, C_in, C_out)."""
    cols = im2col(x, w.shape[0], stride, padding)
    n, ho, wo = cols.shape[:3]
    return (cols.reshape(n * ho * wo, -1) @ w.reshape(-1, w.shape[3])).reshape(n, ho, wo, -1)


def col2im_numpy(dcols: np.ndarray, x_shape: tuple, stride: int, padding: int) -> np.ndarray:
    """The input adjoint (N, H, W, C) of im2col from the patches' adjoints ``dcols``
    (N, H_out, W_out, K, K, C): one strided add per kernel offset, the padding cropped."""
    n, ho, wo, k, _, _ = dcols.shape
    _, h, w, c = x_shape
    s, pad = stride, padding
    dxp = np.zeros((n, h + 2 * pad, w + 2 * pad, c), dtype=dcols.dtype)
    for a in range(k):
        for b in range(k):
            rows, cols = slice(a, a + s * (ho - 1) + 1, s), slice(b, b + s * (wo - 1) + 1, s)
            dxp[:, rows, cols, :] += dcols[:, :, :, a, b]
    return dxp[:, pad : pad + h, pad : pad + w, :]


def conv_grads_numpy(x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int, padding: int):
    """(input adjoint, weight adjoint) of the NHWC convolution for the output adjoint ``g``:
    col2im(g @ Wᵀ) and im2col(x)ᵀ @ g."""
    k, c_out = w.shape[0], w.shape[3]
    cols = im2col(x, k, stride, padding)
    n, ho, wo = cols.shape[:3]
    g2 = g.reshape(-1, c_out)
    dw = (cols.reshape(n * ho * wo, -1).T @ g2).reshape(w.shape)
    dcols = (g2 @ w.reshape(-1, c_out).T).reshape(n, ho, wo, k, k, -1)
    return col2im_numpy(dcols, x.shape, stride, padding), dw


class NumpyResNet9:
    """ResNet-9 forward and hand-written backward in numpy (NHWC inside), train-mode BatchNorm.

    Built from a needle ResNet9's weights so both compute the same function.
    """

    EPS = 1e-5

    def __init__(self, model: ResNet9):
        mods = model.model.modules
        blocks = []
        for m in mods[:6]:
            if isinstance(m, ConvBN):
                blocks.append(("convbn", self._convbn(m)))
            else:  # Residual(Sequential(ConvBN, ConvBN))
                blocks.append(("residual", [self._convbn(c) for c in m.fn.modules]))
        self.blocks = blocks
        self.fc1 = [mods[7].weight.numpy(), mods[7].bias.numpy().reshape(-1)]
        self.fc2 = [mods[9].weight.numpy(), mods[9].bias.numpy().reshape(-1)]

    @staticmethod
    def _convbn(m: ConvBN) -> dict:
        return {
            "w": m.conv.weight.numpy(),
            "b": m.conv.bias.numpy().reshape(-1),
            "g": m.bn.weight.numpy().reshape(-1),
            "beta": m.bn.bias.numpy().reshape(-1),
            "stride": m.conv.stride,
            "pad": m.conv.padding,
        }

    def _convbn_fwd(self, p: dict, x: np.ndarray):
        k, c_out = p["w"].shape[0], p["w"].shape[3]
        cols = im2col(x, k, p["stride"], p["pad"])
        n, ho, wo = cols.shape[:3]
        cols = cols.reshape(n * ho * wo, -1)
        z = cols @ p["w"].reshape(-1, c_out) + p["b"]
        mu, var = z.mean(axis=0), z.var(axis=0)
        inv = 1.0 / np.sqrt(var + self.EPS)
        xhat = (z - mu) * inv
        y = np.maximum(p["g"] * xhat + p["beta"], 0)
        return y.reshape(n, ho, wo, c_out), (cols, xhat, inv, y > 0, x.shape)

    def _convbn_bwd(self, p: dict, cache, dy: np.ndarray, grads: list) -> np.ndarray:
        cols, xhat, inv, mask, x_shape = cache
        k, s, pad = p["w"].shape[0], p["stride"], p["pad"]
        n, ho, wo, c_out = dy.shape
        dy = dy.reshape(-1, c_out) * mask
        dgamma, dbeta = (dy * xhat).sum(axis=0), dy.sum(axis=0)
        dxhat = dy * p["g"]
        dz = inv * (dxhat - dxhat.mean(axis=0) - xhat * (dxhat * xhat).mean(axis=0))
        dw = (cols.T @ dz).reshape(p["w"].shape)
        grads.append((dw, dz.sum(axis=0), dgamma, dbeta))
        dcols = (dz @ p["w"].reshape(-1, c_out).T).reshape(n, ho, wo, k, k, -1)
        return col2im_numpy(dcols, x_shape, s, pad)

    def step(self, x_nchw: np.ndarray, y: np.ndarray):
        """(loss, grads): softmax loss of the batch and [(dW, db, dgamma, dbeta) per ConvBN,
        in forward order] + [dW1, db1, dW2, db2] of the head."""
        x = x_nchw.transpose(0, 2, 3, 1)
        caches = []
        for kind, p in self.blocks:
            if kind == "convbn":
                x, c = self._convbn_fwd(p, x)
                caches.append(c)
            else:
                h1, c1 = self._convbn_fwd(p[0], x)
                h2, c2 = self._convbn_fwd(p[1], h1)
                caches.append((c1, c2))
                x = h2 + x
        flat = x.reshape(x.shape[0], -1)
        h = flat @ self.fc1[0] + self.fc1[1]
        r = np.maximum(h, 0)
        logits = r @ self.fc2[0] + self.fc2[1]
        z = logits - logits.max(axis=1, keepdims=True)
        p_soft = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        n = len(y)
        loss = float(np.mean(-np.log(p_soft[np.arange(n), y])))
        dlogits = p_soft
        dlogits[np.arange(n), y] -= 1
        dlogits /= n
        head = [None, None, r.T @ dlogits, dlogits.sum(axis=0)]
        dh = (dlogits @ self.fc2[0].T) * (h > 0)
        head[0], head[1] = flat.T @ dh, dh.sum(axis=0)
        dx = (dh @ self.fc1[0].T).reshape(x.shape)
        grads = []
        for (kind, p), c in zip(reversed(self.blocks), reversed(caches)):
            if kind == "convbn":
                dx = self._convbn_bwd(p, c, dx, grads)
            else:
                g2, g1 = [], []
                d1 = self._convbn_bwd(p[1], c[1], dx, g2)
                dx = self._convbn_bwd(p[0], c[0], d1, g1) + dx
                grads += g2 + g1
        return loss, grads[::-1] + head


# ---- the timed steps ---------------------------------------------------------------------------
def batch(seed: int = 0):
    rng = np.random.RandomState(seed)
    return rng.rand(BATCH, 3, 32, 32).astype(np.float32), rng.randint(0, 10, BATCH)


def needle_step(device, fast: bool = False):
    """(step closure, model): one forward + loss + backward of ResNet-9 on ``device``; with
    ``fast`` on ``needle.fast``'s path (fused model and loss, ``fast.backward``)."""
    np.random.seed(0)
    model = ResNet9(device=device)
    model.train()
    loss_fn = ndl.nn.SoftmaxLoss()
    backward = lambda loss: loss.backward(create_graph=False)  # noqa: E731 (as PyTorch)
    if fast:
        import needle.fast

        needle.fast.fuse(model)
        needle.fast.fuse(loss_fn)
        backward = needle.fast.backward
    xs, ys = batch()
    x = ndl.Tensor(xs, device=device, requires_grad=False)
    y = ndl.Tensor(ys.astype(np.float32), device=device, requires_grad=False)

    def step():
        loss = loss_fn(model(x), y)
        backward(loss)
        return float(np.asarray(loss.numpy()).reshape(-1)[0])

    return step, model


def check_numpy_reference(device) -> None:
    """The numpy ResNet-9 must compute needle's loss and first-layer weight gradient."""
    step, model = needle_step(device)
    loss = step()
    ref = NumpyResNet9(model)
    ref_loss, grads = ref.step(*batch())
    first = model.model.modules[0].conv.weight.grad.numpy()
    assert abs(ref_loss - loss) < 1e-4 * max(1.0, abs(loss)), (ref_loss, loss)
    err = np.abs(grads[0][0] - first).max() / max(np.abs(first).max(), 1e-12)
    assert err < 1e-3, f"numpy ResNet-9 gradient differs from needle's by {err:.2e} (relative)"


def torch_step():
    """The same architecture and shapes in PyTorch (CPU, float32), or None without torch."""
    try:  # optional oracle, imported only by the process that times it
        import torch
    except ImportError:
        return None
    tnn = torch.nn

    def convbn(a, b, k, s):
        return tnn.Sequential(tnn.Conv2d(a, b, k, s, k // 2), tnn.BatchNorm2d(b), tnn.ReLU())

    class Res(tnn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return self.fn(x) + x

    model = tnn.Sequential(
        convbn(3, 16, 7, 4),
        convbn(16, 32, 3, 2),
        Res(tnn.Sequential(convbn(32, 32, 3, 1), convbn(32, 32, 3, 1))),
        convbn(32, 64, 3, 2),
        convbn(64, 128, 3, 2),
        Res(tnn.Sequential(convbn(128, 128, 3, 1), convbn(128, 128, 3, 1))),
        tnn.Flatten(),
        tnn.Linear(128, 128),
        tnn.ReLU(),
        tnn.Linear(128, 10),
    )
    xs, ys = batch()
    x, y = torch.from_numpy(xs), torch.from_numpy(ys)

    def step():
        loss = tnn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.item()

    return step


def time_resnet9_step(library: str) -> dict[str, float]:
    """{"resnet9": seconds per ResNet-9 step} by ``library`` ("needle" on its first enabled
    device, "torch"), timed in this process in blocks of steps."""
    builders = {
        "needle": lambda: needle_step(enabled_devices()[0])[0],
        "needle-fast": lambda: needle_step(enabled_devices()[0], fast=True)[0],
        "torch": torch_step,
    }
    return {"resnet9": time_step_here(library, builders)}


def bench_resnet9(repeats: int, runs: int = CHILD_RUNS) -> dict:
    """Print the ResNet-9 step tables; return {"ResNet-9 step": PyTorch time / needle time}."""
    devices = enabled_devices()
    check_numpy_reference(devices[0])
    ref = NumpyResNet9(needle_step(devices[0])[1])
    xs, ys = batch()
    t_np = measure(lambda: ref.step(xs, ys), repeats=repeats, warmup=1)
    table = Table(
        f"ResNet-9 training step, batch {BATCH}, forward + backward (this process)",
        "ms",
        reference="numpy",
        higher_is_better=False,
    )
    for dev in devices:
        t_needle = measure(needle_step(dev)[0], repeats=repeats, warmup=1)
        table.add(f"needle {dev}", 1e3 * t_needle, 1e3 * t_np)
    table.print()
    libs = with_fast_path(libraries())
    if "torch" not in libs:
        print("PyTorch: not installed (no PyTorch column)")
        return {}
    t = time_libraries_in_children(
        "benchmarks.bench_resnet9:time_resnet9_step",
        what="ResNet-9 step",
        libraries=libs,
        runs=runs,
    )
    table = Table(
        f"ResNet-9 training step, batch {BATCH}, forward + backward; each library in its own "
        f"processes, median of {runs}",
        "ms",
        reference="torch",
        higher_is_better=False,
    )
    ratios = {}
    for path, label in PATHS:
        t_needle, t_torch = t[path]["resnet9"], t["torch"]["resnet9"]
        table.add(f"needle {devices[0]} [{label}]", 1e3 * t_needle, 1e3 * t_torch)
        ratios[f"ResNet-9 step [{label}]"] = table.ratio(t_needle, t_torch)
    table.print()
    return ratios


def bench_conv(repeats: int) -> None:
    table = Table("conv forward alone, NHWC", "ms", reference="numpy", higher_is_better=False)
    rng = np.random.RandomState(1)
    for n, h, w, c, co, k, s, p in CONV_CASES:
        x = rng.rand(n, h, w, c).astype(np.float32)
        wt = rng.rand(k, k, c, co).astype(np.float32)
        t_np = measure(lambda: conv_im2col_numpy(x, wt, s, p), repeats=repeats)
        expected = conv_im2col_numpy(x, wt, s, p)
        for dev in enabled_devices():
            xt, wtt = ndl.Tensor(x, device=dev), ndl.Tensor(wt, device=dev)
            out = ndl.ops.conv(xt, wtt, stride=s, padding=p).numpy()
            err = np.abs(out - expected).max() / np.abs(expected).max()
            assert err < 1e-5, f"needle conv on {dev} differs from numpy by {err:.1e}"

            def fwd():
                return ndl.ops.conv(xt, wtt, stride=s, padding=p).realize_cached_data()

            table.add(
                f"{(n, h, w, c)} k{k} s{s} ->{co} {dev}",
                1e3 * measure(fwd, repeats=repeats),
                1e3 * t_np,
            )
    table.print()


def bench_conv_grads(repeats: int) -> None:
    """Input and weight gradients of one convolution (as the backward pass runs them)."""
    table = Table(
        "conv input + weight gradients alone, NHWC", "ms", reference="numpy", higher_is_better=False
    )
    rng = np.random.RandomState(2)
    for n, h, w, c, co, k, s, p in CONV_CASES:
        x = rng.rand(n, h, w, c).astype(np.float32)
        wt = rng.rand(k, k, c, co).astype(np.float32)
        g = rng.rand(*conv_im2col_numpy(x, wt, s, p).shape).astype(np.float32)
        t_np = measure(lambda: conv_grads_numpy(x, wt, g, s, p), repeats=repeats)
        expected = conv_grads_numpy(x, wt, g, s, p)
        for dev in enabled_devices():
            xt, wtt = ndl.Tensor(x, device=dev), ndl.Tensor(wt, device=dev)
            gt = ndl.Tensor(g, device=dev, requires_grad=False)
            node = ndl.ops.conv(xt, wtt, stride=s, padding=p)

            def grads():
                return [t.realize_cached_data() for t in node.op.gradient(gt, node)]

            with ndl.no_grad():
                for got, want in zip(grads(), expected):
                    err = np.abs(got.numpy() - want).max() / np.abs(want).max()
                    assert err < 1e-5, f"needle conv gradient on {dev} differs by {err:.1e}"
                t = measure(grads, repeats=repeats)
            table.add(f"{(n, h, w, c)} k{k} s{s} ->{co} {dev}", 1e3 * t, 1e3 * t_np)
    table.print()


def profile_step(device, top: int = 15) -> None:
    """cProfile of five ResNet-9 steps on ``device``: where the time goes."""
    step, _ = needle_step(device)
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        step()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"cProfile of 5 ResNet-9 steps on {device} (sorted by own time)")
    print(buf.getvalue())


def main(argv=None) -> dict:
    """Print the ResNet-9 and conv tables; return the ResNet-9 needle/PyTorch speed ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples in this process")
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    parser.add_argument("--profile", action="store_true", help="add a cProfile table")
    args = parser.parse_args([] if argv is None else argv)
    ratios = bench_resnet9(args.repeats, args.runs)
    bench_conv(args.repeats)
    bench_conv_grads(args.repeats)
    if args.profile:
        profile_step(enabled_devices()[0])
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
