"""Training steps against what a PyTorch user picks: needle's course models (its course path
and fast path) beside PyTorch's standard modules (:mod:`benchmarks.idiomatic`:
``nn.TransformerEncoderLayer`` with a causal mask, ``nn.LSTM``, ``nn.Conv2d`` +
``nn.BatchNorm2d``, ``nn.CrossEntropyLoss``), one training step each (forward, loss, backward,
optimizer), the same sizes.

The other model tables (``bench_lm``, ``bench_resnet9``, ``bench_mlp_resnet``) build PyTorch's
side to match needle's module for module (for the Transformer a hand-written twin with an
explicit masked softmax: a fair kernel comparison); this one times the model a PyTorch user
writes. First a child process checks that both sides compute the same
model: equal parameter counts, and equal logits and loss once needle's weights are copied into
PyTorch's modules. Then each library is timed in processes of its own (``CHILD_RUNS``
alternating children per library, each timing blocks of steps; medians). The ratio is
PyTorch's time over needle's (higher is better, 1.0 = parity).
Run ``python -m benchmarks.bench_idiomatic [--runs N] [--cases C ...]``; ``make bench`` runs it
with the others.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.common import (
    CHILD_RUNS,
    PATHS,
    ROOT,
    Table,
    libraries,
    time_libraries_in_children,
    time_step_here,
    with_fast_path,
)
from benchmarks.idiomatic import TITLES
from companion.steps import CASES

# largest relative difference of the logits (and absolute of the loss) between the two models
# with the same weights: float32 sums in another order differ by ~1e-6
SAME_MODEL_TOLERANCE = 1e-4


def time_idiomatic_steps(library: str, cases: list[str]) -> dict[str, float]:
    """{case: seconds per training step} by ``library`` ("needle": the course's modules on
    cpu(); "needle-fast": ``needle.fast``'s path; "torch": PyTorch's standard modules), timed
    in this process in blocks of steps."""
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        raise ValueError(f"cases must be among {', '.join(CASES)}, got {unknown}")
    import needle as ndl
    from benchmarks import idiomatic

    return {
        case: time_step_here(
            library,
            {
                "needle": lambda: idiomatic.needle_step(case, ndl.cpu()),
                "needle-fast": lambda: idiomatic.needle_step(case, ndl.cpu(), fast=True),
                "torch": lambda: idiomatic.torch_step(case),
            },
        )
        for case in cases
    }


def same_model_report(cases: list[str]) -> dict[str, dict[str, float]]:
    """{case: idiomatic.compare(case)}; raises RuntimeError when a model pair's parameter
    counts differ or its logits or loss differ by more than ``SAME_MODEL_TOLERANCE``."""
    from benchmarks import idiomatic

    report = {case: idiomatic.compare(case) for case in cases}
    for case, r in report.items():
        if r["needle params"] != r["torch params"]:
            raise RuntimeError(
                f"{case}: needle's model has {r['needle params']} parameters, PyTorch's "
                f"{r['torch params']}"
            )
        if not (r["logits gap"] <= SAME_MODEL_TOLERANCE and r["loss gap"] <= SAME_MODEL_TOLERANCE):
            raise RuntimeError(
                f"{case}: with needle's weights PyTorch's model differs: logits by "
                f"{r['logits gap']:.1e} (relative), loss by {r['loss gap']:.1e}"
            )
    return report


def check_in_child(cases: list[str]) -> dict[str, dict[str, float]]:
    """:func:`same_model_report` run in a fresh process (so this one never loads PyTorch)."""
    code = (
        "import json, sys; from benchmarks.bench_idiomatic import same_model_report; "
        "print(json.dumps(same_model_report(json.loads(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases)], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"checking the models failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def same_model_lines(report: dict[str, dict[str, float]]) -> list[str]:
    """One line per case saying what the check found."""
    return [
        f"{case}: {r['needle params']:,} parameters on both sides; with needle's weights "
        f"copied, logits within {r['logits gap']:.1e} (relative), loss within {r['loss gap']:.1e}"
        for case, r in report.items()
    ]


def steps_table(times: dict[str, dict[str, float]], cases: list[str], runs: int):
    """(the Table of needle's two paths against PyTorch per case, {row: ratio})."""
    table = Table(
        "training step against PyTorch's standard modules and nn.CrossEntropyLoss, each "
        f"library in its own processes, median of {runs}; ratio = PyTorch time / needle time",
        "ms",
        reference="PyTorch",
        higher_is_better=False,
    )
    ratios = {}
    for case in cases:
        for path, label in PATHS:
            title = f"{TITLES[case]} [{label}]"
            table.add(title, 1e3 * times[path][case], 1e3 * times["torch"][case])
            ratios[title] = table.ratio(times[path][case], times["torch"][case])
    return table, ratios


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    parser.add_argument(
        "--cases", nargs="+", default=list(CASES), choices=CASES, help="models to time"
    )
    args = parser.parse_args([] if argv is None else argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Print the check and the table; return {row: needle/PyTorch speed ratio}."""
    args = parse_args(argv)
    import needle as ndl

    if not ndl.cpu().enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return {}
    if "torch" not in libraries():
        print("PyTorch: not installed (pip install torch to compare against its modules)")
        return {}
    for line in same_model_lines(check_in_child(args.cases)):
        print(line)
    times = time_libraries_in_children(
        "benchmarks.bench_idiomatic:time_idiomatic_steps",
        args.cases,
        what="training steps against PyTorch's modules",
        libraries=with_fast_path(libraries()),
        runs=args.runs,
    )
    table, ratios = steps_table(times, args.cases, args.runs)
    table.print()
    return ratios


if __name__ == "__main__":
    main(sys.argv[1:])
