"""Peak memory of one training step: needle on ``cpu()`` beside PyTorch, the same four steps as
the speed benchmarks (``companion/steps.py``: MLP-ResNet, ResNet-9, LSTM LM, Transformer LM).

Both sides count the bytes of live tensor buffers, not the process's resident memory (which
depends on the C allocator's habits): needle with its device module's counter
(``cpu().memory_stats()``, reset at the step's start, the garbage collector off), PyTorch with
its profiler's memory timeline of the CPU allocations (``profile_memory=True``; a private
PyTorch API, so a PyTorch without it gets no column rather than a wrong one). Two steps run
first, so the optimizer's state exists; then one step is measured. Two figures per library:

* peak: the most bytes live at any moment of the step (parameters, optimizer state, the batch,
  activations, gradients);
* step: that peak minus the bytes live when the step started (what the step itself needs).

needle runs twice: the course's path (its modules, ``backward(create_graph=False)``, the work
PyTorch's ``backward()`` does) and the fast path (``needle.fast.fuse`` and ``fast.backward``).
Run ``python -m benchmarks.bench_memory``; ``make bench`` runs it with the others. Lower is
better; the ratio is PyTorch's bytes over needle's (above 1: needle needs less).
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

import needle as ndl
from benchmarks.common import Table
from companion.steps import CASES, TITLES, needle_step, peak_bytes, torch_step

try:  # optional oracle; the benchmark never needs it
    import torch
except ImportError:
    torch = None

WARMUP_STEPS = 2
MB = 1e6


def needle_peak(case: str, device, fast: bool = False) -> tuple[float, float]:
    """(peak bytes live during one step, bytes live when it started) for needle's ``case``,
    on the course's path or (``fast``) on ``needle.fast``'s."""
    step = needle_step(case, device, fast=fast)
    for _ in range(WARMUP_STEPS):
        step()
    peak, start = peak_bytes(device, step)
    return float(peak), float(start)


def torch_peak(case: str) -> Optional[tuple[float, float]]:
    """(peak bytes, bytes at the start) of PyTorch's ``case`` from the profiler's memory
    timeline of CPU allocations, or None without torch or without that profiler API."""
    if torch is None:
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline
    except ImportError:
        return None
    step = torch_step(case)
    assert step is not None
    for _ in range(WARMUP_STEPS):
        step()
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        step()
    try:
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    except Exception:  # a PyTorch whose private timeline changed: no column
        return None
    live = np.asarray(sizes, dtype=np.float64).sum(axis=1)
    return float(live.max()), float(live[0])


def _row(table: Table, label: str, needle: float, reference: Optional[float]) -> None:
    table.add(label, needle / MB, (reference if reference is not None else float("nan")) / MB)


def main(argv: Optional[list] = None) -> dict:
    """Print needle's and PyTorch's peak step memory per case (MB); return {} (not a speed)."""
    device = ndl.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to measure (run `make build`)")
        return {}
    table = Table(
        "peak memory of one training step, MB (lower is better); ratio = PyTorch / needle",
        "MB",
        reference="PyTorch",
        higher_is_better=False,
    )
    for case in CASES:
        ref = torch_peak(case)
        for fast, label in ((False, "course path"), (True, "fast path")):
            peak, start = needle_peak(case, device, fast)
            _row(table, f"{case} peak [{label}]", peak, ref[0] if ref else None)
            _row(table, f"{case} step [{label}]", peak - start, ref[0] - ref[1] if ref else None)
    if torch is None:
        print("(PyTorch is not installed: its column is nan)")
    print("cases: " + "; ".join(f"{c}: {TITLES[c]}" for c in CASES))
    table.print()
    return {}


if __name__ == "__main__":
    main(sys.argv[1:])
