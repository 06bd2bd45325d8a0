"""Helpers shared by the ``bench_*.py`` modules (timing itself is ``companion.timing.measure``).

``Table`` prints needle's figure beside a reference's with their ratio; what describes the run
(``machine_info``, ``cpu_flags``, the BLAS overrides) is :mod:`companion.machine`. This module
imports neither numpy nor needle, so ``python -m benchmarks`` can re-execute itself first.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from companion.machine import OPENBLAS_OVERRIDES, REEXEC_MARKER


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


@dataclass
class Table:
    """Rows of (case, needle value, reference value) in one unit, printed with needle/ref.

    ``higher_is_better`` says how to read the unit (GFLOP/s: True; ms: False); the ratio is
    always needle's throughput over the reference's (above 1: needle is faster).
    """

    title: str
    unit: str
    reference: str = "numpy"
    higher_is_better: bool = True
    rows: list[tuple[str, float, float]] = field(default_factory=list)

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
        return "\n".join([self.title, rule, line(head), rule, *map(line, body), rule])

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
