"""Helpers shared by the ``bench_*.py`` modules (timing itself is ``companion.timing.measure``).

``Table`` prints needle's figure beside a reference's with their ratio; ``machine_info``
describes the run; ``numpy_blas_summary`` says which BLAS numpy uses. This module imports
neither numpy nor needle, so ``python -m benchmarks`` can re-execute itself first.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from dataclasses import dataclass, field

# OpenBLAS reads these when numpy is imported; set, they pin numpy to a slower configuration.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REEXEC_MARKER = "NEEDLE_BENCH_REEXEC"


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


def blas_override_note() -> str | None:
    """A line about BLAS environment overrides: removed by a re-exec, or still in force."""
    removed = os.environ.get(REEXEC_MARKER)
    if removed:
        return (
            f"note: the environment set {removed}; the benchmark re-executed itself without "
            "them so numpy runs in its normal configuration"
        )
    present = [f"{name}={os.environ[name]}" for name in OPENBLAS_OVERRIDES if name in os.environ]
    if present:
        return f"note: {', '.join(present)} is set: numpy's BLAS runs in that configuration"
    return None


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


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (empty where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(
                next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
            )
    except OSError:
        return set()


def cpu_isa() -> str:
    """The widest x86 vector extension the CPU reports (AVX-512, AVX2, ...)."""
    flags = cpu_flags()
    for flag, name in (
        ("avx512f", "AVX-512"),
        ("avx2", "AVX2"),
        ("avx", "AVX"),
        ("sse4_2", "SSE4.2"),
    ):
        if flag in flags:
            return f"ISA {name}" + (" (and AVX2)" if flag == "avx512f" and "avx2" in flags else "")
    return f"ISA {platform.machine()}"


def numpy_blas_summary() -> str:
    """numpy's BLAS library, version, threads and kernel (threadpoolctl when installed)."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            return "; ".join(
                f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads, "
                f"{i.get('architecture', '?')} kernels)"
                for i in infos
            )
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older numpy: no dict mode
        return "unknown (threadpoolctl not installed)"


def machine_info() -> list[str]:
    """Lines describing when and where the benchmarks ran."""
    import numpy as np

    try:
        import torch

        torch_line = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        torch_line = "PyTorch: not installed (no PyTorch columns)"
    lines = [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {platform.node()} {platform.machine()}, {cpu_model()}, "
        f"{os.cpu_count()} logical CPUs, {cpu_isa()}",
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"numpy BLAS: {numpy_blas_summary()}; {torch_line}",
    ]
    try:
        load = os.getloadavg()
        lines.append(
            f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
            "(other processes share the CPUs; ratios are the robust figures)"
        )
    except OSError:
        pass
    note = blas_override_note()
    if note:
        lines.append(note)
    return lines


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
