"""The captured training step (``ndl.compile``) against the eager step, for each course model.

For each case of ``companion/steps.py`` (MLP-ResNet with Adam, ResNet-9, the LSTM LM and the
Transformer LM with SGD, on the fast path: `needle.fast.fuse`, `fast.backward`) two twins are
built: one stepped eagerly, one through
``ndl.compile`` (traced on its first calls, then replayed). The timing alternates blocks of
eager and replayed steps in one process and reports the medians of the per-step block means,
so a load change on a shared machine hits both alike (the load average is printed). Memory:
the allocator counter (``memory_stats``) gives the peak bytes above the live bytes during one
step, eager and replayed, and the program's plan gives its temporaries and the buffers they
share. The pool only reuses a buffer of exactly the size a temporary needs (the fused kernels
check exact buffer sizes), so a model whose temporaries come in many sizes (ResNet-9) can need
a pool larger than the eager step's peak. Run
``python -m benchmarks.bench_compiled_step [--blocks N] [--steps N] [CASE ...]``; ``make bench``
runs it with the others.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List

import needle as ndl
from benchmarks.common import busy_note
from companion.machine import machine_line
from companion.steps import CASES, TITLES, needle_step, peak_bytes


def _one_call(step) -> Callable[[], object]:
    """The case's step as one function returning the loss (what ``ndl.compile`` captures)."""

    def train_step():
        loss = step.forward()
        step.backward(loss)
        step.update()
        return loss

    return train_step


def _peak(device, fn: Callable[[], object]) -> int:
    """Bytes allocated above the live bytes at the peak of one call of ``fn``."""
    peak, start = peak_bytes(device, fn)
    return peak - start


def measure(case: str, blocks: int, steps: int, device=None) -> Dict[str, float]:
    """Median seconds per step (eager, replayed), peak bytes per step and the memory plan."""
    device = device or ndl.cpu()
    eager = _one_call(needle_step(case, device, fast=True))
    compiled = ndl.compile(_one_call(needle_step(case, device, fast=True)))
    for _ in range(4):  # traced calls, then the first replay (allocates the pool)
        eager()
        compiled()
    if compiled.stats["replays"] < 1:
        raise RuntimeError(f"{case}: the step was not captured: {compiled.stats['reasons']}")
    times: Dict[str, List[float]] = {"eager": [], "compiled": []}
    for _ in range(blocks):
        for name, fn in (("eager", eager), ("compiled", compiled)):
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - t0) / steps)
    plan = compiled.memory_plan()
    return {
        "eager_s": statistics.median(times["eager"]),
        "compiled_s": statistics.median(times["compiled"]),
        "eager_peak": _peak(device, eager),
        "compiled_peak": _peak(device, compiled),
        "kernels": plan["kernels"],
        "temporaries": plan["temporaries"],
        "pool_buffers": plan["pool_buffers"],
        "kept": plan["kept"],
        "pool_bytes": plan["pool_bytes"],
        "kept_bytes": plan["kept_bytes"],
        "retraces": compiled.stats["retraces"],
    }


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"cases (default all): {', '.join(CASES)}")
    parser.add_argument("--blocks", type=int, default=5, help="alternating blocks (default 5)")
    parser.add_argument("--steps", type=int, default=5, help="steps per block (default 5)")
    args = parser.parse_args([] if argv is None else argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    print(
        f"eager vs captured step on cpu(): median of {args.blocks} alternating blocks of "
        f"{args.steps} steps each; peak = bytes allocated above the live bytes in one step"
    )
    print(
        "the replay's buffers are allocated once: its pool (temporaries sharing buffers) and the "
        "kept temporaries (held by Python, e.g. p.grad) compare with the eager step's peak"
    )
    header = (
        f"{'case':<16}{'eager ms':>9}{'replay ms':>10}{'speed-up':>9}"
        f"{'eager peak':>11}{'replay peak':>12}{'pool':>9}{'kept':>9}"
        f"{'kernels':>8}{'temps':>6}{'buffers':>8}"
    )
    print(machine_line())
    print(header)
    for case in args.cases or CASES:
        r = measure(case, args.blocks, args.steps)
        mb = [r[k] / 2**20 for k in ("eager_peak", "compiled_peak", "pool_bytes", "kept_bytes")]
        print(
            f"{case:<16}{r['eager_s'] * 1e3:>9.2f}{r['compiled_s'] * 1e3:>10.2f}"
            f"{r['eager_s'] / r['compiled_s']:>8.2f}x"
            f"{mb[0]:>9.2f}MB{mb[1]:>10.2f}MB{mb[2]:>7.2f}MB{mb[3]:>7.2f}MB"
            f"{r['kernels']:>8}{r['temporaries']:>6}{r['pool_buffers']:>8}",
            flush=True,
        )
    print("cases: " + "; ".join(f"{c}: {TITLES[c]}" for c in args.cases or CASES))
    busy = busy_note()
    if busy:
        print(busy)


if __name__ == "__main__":
    main(sys.argv[1:])
