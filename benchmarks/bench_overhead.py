"""Per-op overhead on tiny arrays: microseconds per call of needle against PyTorch.

On an 8×8 array the arithmetic is a few hundred flops, so the time per call is the fixed cost
of getting to the kernel: Python dispatch, building the result, autograd bookkeeping.
``Tensor`` cases use tensors that require gradients in both libraries (the graph is recorded);
``NDArray`` cases compare needle's array layer with plain PyTorch tensors. Every case is timed
in blocks of calls (median of repeats), needle's blocks before PyTorch's. The ratio is PyTorch's
time over needle's (higher is better; the target is ≥ 0.5, i.e. at most 2× PyTorch's cost).
Run ``python -m benchmarks.bench_overhead``; ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import needle as ndl
import needle.backend_ndarray as nd
from benchmarks.common import Table
from companion.timing import measure

try:  # optional oracle
    import torch
except ImportError:
    torch = None


def cases(device):
    """[(name, needle callable, PyTorch callable or None)], after checking both agree."""
    rng = np.random.default_rng(0)
    a8, b8 = (rng.standard_normal((8, 8), dtype=np.float32) for _ in range(2))
    a64, b64 = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
    TA, TB = (ndl.Tensor(v, device=device, requires_grad=True) for v in (a8, b8))
    A8, B8, A64, B64 = (nd.NDArray(v, device=device) for v in (a8, b8, a64, b64))
    needle_fns = {
        "Tensor + Tensor (8x8)": lambda: TA + TB,
        "Tensor @ Tensor (8x8)": lambda: TA @ TB,
        "relu(Tensor) (8x8)": lambda: ndl.ops.relu(TA),
        "Tensor * 2.0 (8x8)": lambda: TA * 2.0,
        "NDArray @ NDArray (8x8)": lambda: A8 @ B8,
        "NDArray @ NDArray (64x64)": lambda: A64 @ B64,
        "NDArray.sum(axis=1) (8x8)": lambda: A8.sum(axis=1),
        "NDArray.max(axis=1) (8x8)": lambda: A8.max(axis=1),
    }
    expected = {
        "Tensor + Tensor (8x8)": a8 + b8,
        "Tensor @ Tensor (8x8)": a8 @ b8,
        "relu(Tensor) (8x8)": np.maximum(a8, 0),
        "Tensor * 2.0 (8x8)": a8 * 2,
        "NDArray @ NDArray (8x8)": a8 @ b8,
        "NDArray @ NDArray (64x64)": a64 @ b64,
        "NDArray.sum(axis=1) (8x8)": a8.sum(axis=1, keepdims=True),
        "NDArray.max(axis=1) (8x8)": a8.max(axis=1, keepdims=True),
    }
    for name, fn in needle_fns.items():
        got = fn().numpy()
        np.testing.assert_allclose(
            got.reshape(-1), expected[name].reshape(-1), rtol=1e-4, atol=1e-4, err_msg=name
        )
    torch_fns = dict.fromkeys(needle_fns)
    if torch is not None:
        ta, tb = (torch.from_numpy(v.copy()).requires_grad_() for v in (a8, b8))
        p8, q8, p64, q64 = (torch.from_numpy(v) for v in (a8, b8, a64, b64))
        torch_fns = {
            "Tensor + Tensor (8x8)": lambda: ta + tb,
            "Tensor @ Tensor (8x8)": lambda: ta @ tb,
            "relu(Tensor) (8x8)": lambda: torch.relu(ta),
            "Tensor * 2.0 (8x8)": lambda: ta * 2.0,
            "NDArray @ NDArray (8x8)": lambda: p8 @ q8,
            "NDArray @ NDArray (64x64)": lambda: p64 @ q64,
            "NDArray.sum(axis=1) (8x8)": lambda: p8.sum(dim=1, keepdim=True),
            "NDArray.max(axis=1) (8x8)": lambda: p8.amax(dim=1, keepdim=True),
        }
    return [(name, fn, torch_fns[name]) for name, fn in needle_fns.items()]


def main(argv=None) -> dict:
    """Print µs per call for each case; return {case: PyTorch time / needle time}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args([] if argv is None else argv)
    device = ndl.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return {}
    rows = []
    for name, f_needle, f_torch in cases(device):
        t_n = 1e6 * measure(f_needle, repeats=args.repeats, min_sample_s=0.02, settle_s=0.05)
        t_t = (
            1e6 * measure(f_torch, repeats=args.repeats, min_sample_s=0.02, settle_s=0.05)
            if f_torch
            else None
        )
        rows.append((name, t_n, t_t))
    if torch is None:
        print("per-op cost on cpu(), µs per call (PyTorch: not installed, no comparison)")
        for name, t_n, _ in rows:
            print(f"  {name:<28}{t_n:8.2f}")
        return {}
    table = Table(
        "per-op cost, µs per call; ratio = PyTorch time / needle time",
        "µs",
        reference="PyTorch",
        higher_is_better=False,
    )
    for name, t_n, t_t in rows:
        table.add(name, t_n, t_t)
    table.print()
    return {name: table.ratio(t_n, t_t) for name, t_n, t_t in rows}


if __name__ == "__main__":
    main(sys.argv[1:])
