"""Language-model training steps: needle's 2-layer LSTM and Transformer LMs against PyTorch.

Both at seq 32, batch 16, E = H = 128, vocabulary 1000 (the shapes of :mod:`companion.steps`):
ids → embedding → 2-layer LSTM or pre-norm Transformer → Linear → mean softmax loss →
backward → SGD. needle runs on ``cpu()``; PyTorch (CPU, float32) runs the same architecture.
Each library is timed in processes of its own (``CHILD_RUNS`` alternating children per library,
each timing blocks of steps; the table shows the medians), so neither meets the other's
threads, objects or allocator state. The ratio is PyTorch's time over needle's: needle's speed
relative to PyTorch (higher is better, 1.0 = parity).
Run ``python -m benchmarks.bench_lm [--runs N]``; ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import sys

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
from companion.steps import TITLES, needle_step, torch_step

LM_CASES = ("lstm_lm", "transformer_lm")


def time_lm_steps(library: str, cases: list[str]) -> dict[str, float]:
    """{case: seconds per training step} for ``cases`` (of ``LM_CASES``) by ``library``
    ("needle": the course's modules on cpu(); "needle-fast": ``needle.fast``'s path; "torch"),
    timed in this process in blocks of steps."""
    unknown = [case for case in cases if case not in LM_CASES]
    if unknown:
        raise ValueError(f"cases must be among {', '.join(LM_CASES)}, got {unknown}")
    return {
        case: time_step_here(
            library,
            {
                "needle": lambda: needle_step(case, ndl.cpu()),
                "needle-fast": lambda: needle_step(case, ndl.cpu(), fast=True),
                "torch": lambda: torch_step(case),
            },
        )
        for case in cases
    }


def main(argv=None) -> dict:
    """Print ms per step for each LM case; return {case title: needle/PyTorch speed ratio}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    args = parser.parse_args([] if argv is None else argv)
    if not ndl.cpu().enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return {}
    libs = with_fast_path(libraries())
    table = Table(
        "language-model training step (forward + backward + SGD), each library in its own "
        f"processes, median of {args.runs}; ratio = PyTorch time / needle time",
        "ms",
        reference="PyTorch",
        higher_is_better=False,
    )
    # one child per library and run times every case: PyTorch's import alone takes seconds
    t = time_libraries_in_children(
        "benchmarks.bench_lm:time_lm_steps",
        list(LM_CASES),
        what="language-model steps",
        libraries=libs,
        runs=args.runs,
    )
    ratios = {}
    for case in LM_CASES:
        for path, label in PATHS:
            t_needle = t[path][case]
            title = f"{TITLES[case]} [{label}]"
            if "torch" not in t:
                print(f"{title}: needle {1e3 * t_needle:.2f} ms; PyTorch: not installed")
                continue
            table.add(title, 1e3 * t_needle, 1e3 * t["torch"][case])
            ratios[title] = table.ratio(t_needle, t["torch"][case])
    if table.rows:
        table.print()
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
