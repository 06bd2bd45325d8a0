"""Language-model training steps: needle's 2-layer LSTM and Transformer LMs against PyTorch.

Both at seq 32, batch 16, E = H = 128, vocabulary 1000 (the shapes of :mod:`companion.steps`):
ids → embedding → 2-layer LSTM or pre-norm Transformer → Linear → mean softmax loss →
backward → SGD. needle runs on ``cpu()``; PyTorch (CPU, float32) runs the same architecture
after it. Each library is timed in blocks of steps (medians of repeats). The ratio is PyTorch's
time over needle's: needle's speed relative to PyTorch (higher is better, 1.0 = parity).
Run ``python -m benchmarks.bench_lm``; ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import sys

import needle as ndl
from benchmarks.common import Table
from companion.steps import TITLES, needle_step, torch_step
from companion.timing import measure

LM_CASES = ("lstm_lm", "transformer_lm")


def main(argv=None) -> dict:
    """Print ms per step for each LM case; return {case title: needle/PyTorch speed ratio}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args([] if argv is None else argv)
    device = ndl.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return {}
    table = Table(
        "language-model training step (forward + backward + SGD), ms; ratio = "
        "PyTorch time / needle time",
        "ms",
        reference="PyTorch",
        higher_is_better=False,
    )
    ratios = {}
    for case in LM_CASES:
        t_needle = 1e3 * measure(needle_step(case, device), repeats=args.repeats, warmup=1)
        ref = torch_step(case)
        if ref is None:
            print(f"{TITLES[case]}: needle {t_needle:.2f} ms; PyTorch: not installed")
            continue
        # PyTorch after needle: its idle OpenMP workers spin and would slow what runs next.
        t_torch = 1e3 * measure(ref, repeats=args.repeats, warmup=1)
        table.add(TITLES[case], t_needle, t_torch)
        ratios[TITLES[case]] = table.ratio(t_needle, t_torch)
    if table.rows:
        table.print()
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
