"""``python -m benchmarks [NAME ...]``: run every ``benchmarks/bench_*.py`` (or the named ones).

Each module's ``main()`` runs in name order and may return {case: needle/PyTorch speed ratio};
the ratios are printed together at the end. ``python -m benchmarks ndarray`` runs only
``bench_ndarray``. If OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set, the process first
re-executes itself without them (and says so), so numpy runs in its normal configuration.
"""

from __future__ import annotations

import sys

from benchmarks.common import reexec_without_blas_overrides

# Before anything imports numpy: OpenBLAS reads its environment when it is loaded.
reexec_without_blas_overrides(["-m", "benchmarks", *sys.argv[1:]])

import importlib  # noqa: E402
import pkgutil  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import benchmarks  # noqa: E402
from benchmarks.common import busy_note  # noqa: E402
from companion.machine import machine_info  # noqa: E402


def available() -> list[str]:
    """The benchmark names (``bench_X.py`` gives ``X``), sorted."""
    return sorted(
        m.name[len("bench_") :]
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if m.name.startswith("bench_")
    )


def main(argv: list[str]) -> int:
    names = available()
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        print("available:", ", ".join(names))
        return 0
    wanted = [a[len("bench_") :] if a.startswith("bench_") else a for a in argv] or names
    unknown = [w for w in wanted if w not in names]
    if unknown:
        print(
            f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    for line in machine_info():
        print(line)
    failed, ratios = [], {}
    for name in wanted:
        print(f"\n==== bench_{name} ====", flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.bench_{name}")
            ratios.update(module.main() or {})
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"(bench_{name}: {time.perf_counter() - t0:.1f} s)", flush=True)
    if ratios:
        print("\n==== summary: needle speed / PyTorch speed (higher is better, 1.0 = parity) ====")
        width = max(map(len, ratios))
        for case, ratio in ratios.items():
            print(f"{case:<{width}}  {ratio:6.2f}")
        busy = busy_note()
        if busy:
            print(busy)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
