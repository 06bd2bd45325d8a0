"""Where a measurement ran: the machine, the Python stack, the load (benchmarks and notebook 05).

``machine_info()`` is the lines every benchmark and timed notebook cell prints first: date, CPU
model, logical CPUs and vector ISA, Python, numpy and its BLAS, PyTorch when installed, the load
average, and a note when OpenBLAS environment overrides are (or were) in force. Part of the
installed package, so a notebook run from a wheel (Colab) has it too; ``benchmarks/`` imports it
from here. Importing this module imports neither numpy nor needle.
"""

from __future__ import annotations

import datetime
import os
import platform

# OpenBLAS reads these when numpy is imported; set, they pin numpy to a slower configuration.
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REEXEC_MARKER = "NEEDLE_BENCH_REEXEC"


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


def machine_line() -> str:
    """The one line a timing cell prints first: CPU model, logical CPUs, vector ISA and the load
    average it ran under, e.g. ``machine: Intel Xeon ..., 2 logical CPUs, ISA AVX2, load 0.41``."""
    try:
        load = f"load {os.getloadavg()[0]:.2f}"
    except OSError:
        load = "load unknown"
    return f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs, {cpu_isa()}, {load}"


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
