"""Helpers shared by the ``bench_*.py`` modules (timing itself is ``companion.timing.measure``).

``Table`` prints needle's figure beside a reference's with their ratio; what describes the run
(``machine_info``, ``cpu_flags``, the BLAS overrides) is :mod:`companion.machine`.
``time_in_child`` times one library in a fresh process and ``medians_of_children`` alternates
such children between libraries; ``python -m benchmarks.common MODULE:FUNCTION ARGS_JSON`` is
the child's side. This module imports neither numpy nor needle, so ``python -m benchmarks`` can
re-execute itself first and a child loads only what the timed function imports.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from companion.machine import OPENBLAS_OVERRIDES, REEXEC_MARKER, machine_line
from companion.timing import measure


def reexec_without_blas_overrides(argv: list[str]) -> None:
    """Restart this process once with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed.

    Must run before numpy is imported. The restarted process finds the removed names in
    ``NEEDLE_BENCH_REEXEC`` and reports them (see :func:`blas_override_note`).
    """
    present = [name for name in OPENBLAS_OVERRIDES if name in os.environ]
    if not present or REEXEC_MARKER in os.environ:
        return
    env = {k: v for k, v in os.environ.items() if k not in present}
    env[REEXEC_MARKER] = ",".join(f"{name}={os.environ[name]}" for name in present)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *argv], env)


# Children per library (alternating) behind every needle-vs-reference comparison made in
# processes of their own: in one process the threads, objects and allocator state of the
# library timed before slow the one timed after, by up to a factor of several on 2 cores.
CHILD_RUNS = 3
# The line a child prints last: this prefix, then {case: seconds} as JSON.
CHILD_MARKER = "child seconds:"
ROOT = Path(__file__).resolve().parents[1]


def time_in_child(
    target: str,
    *args: object,
    what: str,
    forbid: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """{case: seconds} as returned by ``target(*args)``, called in a fresh Python process.

    ``target`` is ``"package.module:function"``; ``args`` travel as JSON (numbers, strings,
    lists). The child inherits this process's environment unless ``env`` is given (so
    NEEDLE_CPU_ISA and OPENBLAS_CORETYPE apply). ``forbid`` names modules the child must not
    have imported once the function returned (``("torch",)`` for a needle child). A child that
    fails, loads a forbidden module or prints no seconds raises RuntimeError naming ``what``,
    with the end of its stderr.
    """
    command = [sys.executable, "-m", "benchmarks.common", target, json.dumps(list(args))]
    for name in forbid:
        command += ["--forbid", name]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(
            f"timing {what} failed (exit status {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return parse_child_seconds(done.stdout, what)


def parse_child_seconds(stdout: str, what: str) -> dict[str, float]:
    """{case: seconds} from the last ``CHILD_MARKER`` line of a child's stdout: a JSON object
    of positive, finite numbers."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(CHILD_MARKER):
            text = line[len(CHILD_MARKER) :].strip()
            try:
                result = json.loads(text)
            except ValueError:
                result = None
            if not isinstance(result, dict) or not result:
                raise RuntimeError(
                    f"timing {what}: the child printed {text!r}, not {{case: seconds}}"
                )
            for case, seconds in result.items():
                number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                if not (number and math.isfinite(seconds) and seconds > 0):
                    raise RuntimeError(
                        f"timing {what}: the child measured {seconds!r} s for {case}"
                    )
            return {case: float(seconds) for case, seconds in result.items()}
    raise RuntimeError(
        f"timing {what}: the child printed no {CHILD_MARKER!r} line; its output ended:\n"
        f"{stdout[-2000:]}"
    )


def medians_of_children(
    time_one: Callable[[str], dict[str, float]], libraries: Sequence[str], runs: int = CHILD_RUNS
) -> dict[str, dict[str, float]]:
    """{library: {case: median seconds}} over ``runs`` calls of ``time_one(library)`` per
    library, in alternation (``runs`` rounds, each calling every library once, in the order
    given), so that drifts in the machine's load fall on all libraries alike. Every call for a
    library must time the same cases."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if not libraries:
        raise ValueError("no libraries to time")
    times: dict[str, list[dict[str, float]]] = {library: [] for library in libraries}
    for _ in range(runs):
        for library in libraries:
            times[library].append(time_one(library))
    medians = {}
    for library, results in times.items():
        cases = list(results[0])
        if any(list(r) != cases for r in results):
            raise RuntimeError(f"{library}'s children timed different cases: {results}")
        medians[library] = {c: statistics.median(r[c] for r in results) for c in cases}
    return medians


def libraries() -> tuple[str, ...]:
    """The libraries a model benchmark compares: ("needle", "torch"), or ("needle",) when
    PyTorch is not installed (found without importing it)."""
    return ("needle", "torch") if importlib.util.find_spec("torch") else ("needle",)


# needle's two paths as the benchmarks label them: the course's modules and backward (the
# default), and the opt-in fast path (needle.fast.fuse + needle.fast.backward).
PATHS = (("needle", "course path"), ("needle-fast", "fast path"))


def with_fast_path(libs: Sequence[str]) -> tuple[str, ...]:
    """``libs`` with "needle-fast" after "needle": both of needle's paths are timed."""
    out: list[str] = []
    for lib in libs:
        out.append(lib)
        if lib == "needle":
            out.append("needle-fast")
    return tuple(out)


def time_libraries_in_children(
    target: str,
    *args: object,
    what: str,
    libraries: Sequence[str],
    runs: int = CHILD_RUNS,
) -> dict[str, dict[str, float]]:
    """{library: {case: median seconds}} of ``target(library, *args)`` (which returns {case:
    seconds}), each library timed in processes of its own (``runs`` alternating children per
    library, :func:`medians_of_children`). Only a "torch" child may load PyTorch."""

    def time_one(library: str) -> dict[str, float]:
        forbid = () if library == "torch" else ("torch",)
        return time_in_child(target, library, *args, what=f"{library}: {what}", forbid=forbid)

    return medians_of_children(time_one, libraries, runs)


def time_step_here(
    library: str,
    builders: dict[str, Callable[[], Callable[[], object] | None]],
    repeats: int = 7,
    warmup: int = 3,
    min_sample_s: float = 0.05,
) -> float:
    """Seconds per call of the step ``builders[library]()`` returns, measured in this process:
    the median of ``repeats`` blocks of calls, each at least ``min_sample_s`` long (several
    steps of a few milliseconds), after ``warmup`` calls. A builder returns None when its
    library is not installed, which is an error here."""
    if library not in builders:
        raise ValueError(f"library must be one of {', '.join(builders)}, got {library!r}")
    step = builders[library]()
    if step is None:
        raise RuntimeError(f"{library} is not installed: nothing to time")
    return measure(step, repeats=repeats, warmup=warmup, min_sample_s=min_sample_s)


def child_main(argv: Sequence[str]) -> int:
    """The child's side of :func:`time_in_child`: call the function, print its {case: seconds}
    as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.common")
    parser.add_argument("target", help="MODULE:FUNCTION returning {case: seconds}")
    parser.add_argument("args", help="the function's arguments, a JSON list")
    parser.add_argument("--forbid", action="append", default=[], help="a module not to load")
    opts = parser.parse_args(argv)
    module_name, _, function_name = opts.target.partition(":")
    if not module_name or not function_name:
        parser.error(f"target must be MODULE:FUNCTION, got {opts.target!r}")
    args = json.loads(opts.args)
    if not isinstance(args, list):
        parser.error(f"args must be a JSON list, got {opts.args!r}")
    result = getattr(importlib.import_module(module_name), function_name)(*args)
    loaded = [name for name in opts.forbid if name in sys.modules]
    if loaded:
        print(
            f"{opts.target} imported {', '.join(loaded)}, which this child must not load "
            "(its threads would compete with the library timed)",
            file=sys.stderr,
        )
        return 3
    print(f"{CHILD_MARKER} {json.dumps(result)}", flush=True)
    return 0


@dataclass
class Table:
    """Rows of (case, needle value, reference value) in one unit, printed with needle/ref.

    ``higher_is_better`` says how to read the unit (GFLOP/s: True; ms: False); the ratio is
    always needle's throughput over the reference's (above 1: needle is faster). ``machine``
    (by default :func:`companion.machine.machine_line` when the table is made: CPU, ISA,
    load) is printed under the title, so every table names the CPU it ran on.
    """

    title: str
    unit: str
    reference: str = "numpy"
    higher_is_better: bool = True
    rows: list[tuple[str, float, float]] = field(default_factory=list)
    machine: str = field(default_factory=machine_line)

    def add(self, case: str, needle: float, reference: float) -> None:
        self.rows.append((case, needle, reference))

    def ratio(self, needle: float, reference: float) -> float:
        if self.higher_is_better:
            return needle / reference if reference else float("nan")
        return reference / needle if needle else float("nan")

    def render(self) -> str:
        head = (
            "case",
            f"needle {self.unit}",
            f"{self.reference} {self.unit}",
            f"needle/{self.reference}",
        )
        body = [(c, f"{n:.2f}", f"{r:.2f}", f"{self.ratio(n, r):.2f}") for c, n, r in self.rows]
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(4)]

        def line(cells):
            return "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(cells, widths))
            )

        rule = "-" * len(line(head))
        return "\n".join([self.title, self.machine, rule, line(head), rule, *map(line, body), rule])

    def print(self) -> None:
        print(self.render(), flush=True)


def busy_note() -> str | None:
    """A warning when the last minute's load average exceeds the CPU count, else None.

    PyTorch's OpenMP workers and OpenBLAS's slow down by large factors when they do not get
    every core, so ratios measured on a busy machine are not a conclusion.
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cpus = os.cpu_count() or 1
    if load <= cpus:
        return None
    return (
        f"warning: load average {load:.1f} on {cpus} CPUs: other processes competed for the "
        "cores during this run, so these ratios are not reliable; rerun on a quiet machine"
    )


def enabled_devices() -> list:
    """needle's devices that can run here: cpu(), cuda() with a GPU, cpu_numpy()."""
    import needle as ndl

    return [d for d in (ndl.cpu(), ndl.cuda(), ndl.cpu_numpy()) if d.enabled()]


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
