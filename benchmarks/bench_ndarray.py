"""NDArray on the compiled ``cpu()`` device against numpy: matmul, element-wise ops, compact
and reductions, each timed through the NDArray API (so NDArray's own Python work and copies
count), as the median of repeats.

Matmul is reported in GFLOP/s (2·m·n·p per product), through ``A @ B`` timed per call (each call
alone, its output allocated and freed inside the timed span; the median of many calls, less the
timer's own cost; each library in processes of its own, so neither meets the other's spinning
BLAS threads) and, separately, as the device kernel called on prepared buffers (one process, in
blocks); the rest in billions of elements per second. The last column is needle's throughput
over numpy's. On a machine with AVX-512 the matmul table is printed a second time from a
subprocess that plays a machine without AVX-512: needle runs its AVX2 kernels
(``NEEDLE_CPU_ISA=avx2``) and numpy's OpenBLAS its Haswell (AVX2) kernels
(``OPENBLAS_CORETYPE=Haswell``), so both libraries use the same instruction set. Then, unless
the portable kernels are already in use, every table is printed again from a subprocess on the
portable kernels (``NEEDLE_CPU_ISA=portable``: what ARM machines run) beside numpy's OpenBLAS on
its SSE kernels (``OPENBLAS_CORETYPE=Nehalem``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import numpy as np

import needle.backend_ndarray as nd
from benchmarks.common import CHILD_RUNS, ROOT, Table, time_libraries_in_children
from companion.machine import cpu_flags
from companion.timing import SETTLE_S, measure

MATMUL_SIZES = [
    (64, 64, 64),
    (128, 128, 128),
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (72, 73, 74),
    (1000, 1023, 997),
]
# Per-call timing of a product: at least PER_CALL_MIN calls (at most PER_CALL_MAX), as many
# as fill about PER_CALL_S seconds.
PER_CALL_MIN, PER_CALL_MAX, PER_CALL_S = 15, 20000, 0.3
ELEMENTS = 1 << 22  # 4M float32: 16 MiB per array
REPEATS = 7


def kernel_isa(device) -> str:
    """The instruction set of ``device``'s matmul kernels, as its module reports it."""
    gemm = getattr(device.mod, "__gemm__", None)
    if isinstance(gemm, dict) and "isa" in gemm:
        return str(gemm["isa"])
    return str(getattr(device.mod, "__matmul_kernel__", "unknown"))


def _call_times(fn: Callable[[], object], calls: int) -> list[int]:
    """Nanoseconds of each of ``calls`` calls of ``fn``, each timed alone (its result is
    dropped inside the timed span, so freeing it counts)."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(calls):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def median_per_call(fn: Callable[[], object]) -> float:
    """Median seconds of one call of ``fn``, each call timed alone, less the median time of
    timing a call of a function that does nothing (the clock's and the call's own cost, about
    0.1 us: a few percent of a 64^3 product).

    Per call rather than in blocks: a block's mean takes in every call that a preemption or a
    page fault slowed (on a shared 2-core machine, most blocks hold one), where the median of
    single calls is the time a product takes when nothing else intervenes."""
    time.sleep(SETTLE_S)  # other libraries' spinning threads go idle first
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    calls = int(min(PER_CALL_MAX, max(PER_CALL_MIN, PER_CALL_S / max(once, 1e-9))))
    baseline = statistics.median(_call_times(lambda: None, min(calls, 1000)))
    return max(statistics.median(_call_times(fn, calls)) - baseline, 1.0) * 1e-9


def time_matmul_here(library: str, sizes: list) -> dict[str, float]:
    """{"MxNxP": median seconds of one (m, n) @ (n, p) float32 product, output allocated each
    call} by ``library`` ("needle": NDArrays on cpu(), "numpy") for each (m, n, p) in
    ``sizes``, timed per call in this process (``median_per_call``; ``bench_matmul`` calls it
    with one size per child process; children inherit the environment, so NEEDLE_CPU_ISA and
    OPENBLAS_CORETYPE apply)."""
    if library not in ("needle", "numpy"):
        raise ValueError(f"library must be 'needle' or 'numpy', got {library!r}")
    rng = np.random.default_rng(0)
    seconds = {}
    for m, n, p in sizes:
        a = rng.standard_normal((m, n), dtype=np.float32)
        b = rng.standard_normal((n, p), dtype=np.float32)
        if library == "numpy":
            seconds[f"{m}x{n}x{p}"] = median_per_call(lambda: a @ b)
            continue
        A, B = nd.NDArray(a, device=nd.cpu()), nd.NDArray(b, device=nd.cpu())
        np.testing.assert_allclose((A @ B).numpy(), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        seconds[f"{m}x{n}x{p}"] = median_per_call(lambda: A @ B)
    return seconds


def bench_matmul(device) -> Table:
    """GFLOP/s of ``A @ B`` for NDArrays on ``device`` beside numpy's ``a @ b``, each library
    in its own processes (one size per child; the median of CHILD_RUNS alternating children
    each): in one process the BLAS threads of the library timed before slow the one after."""
    table = Table(
        f"matmul (float32) per call, output allocated each call, cpu() kernels: "
        f"{kernel_isa(device)}; each library in its own processes, median of {CHILD_RUNS}",
        "GFLOP/s",
    )
    for m, n, p in MATMUL_SIZES:
        t = time_libraries_in_children(
            "benchmarks.bench_ndarray:time_matmul_here",
            [[m, n, p]],
            what=f"{m}x{n}x{p} product",
            libraries=("needle", "numpy"),
        )
        flops, case = 2.0 * m * n * p, f"{m}x{n}x{p}"
        t_nd, t_np = t["needle"][case], t["numpy"][case]
        table.add(f"{m}x{n} @ {n}x{p}", flops / t_nd / 1e9, flops / t_np / 1e9)
    return table


def bench_matmul_kernel(device) -> Table:
    """GFLOP/s of the device's matmul called directly on compact buffers (no NDArray work)."""
    rng = np.random.default_rng(0)
    table = Table("matmul kernel alone: device.matmul on prepared buffers", "GFLOP/s")
    for m, n, p in MATMUL_SIZES:
        a = rng.standard_normal((m, n), dtype=np.float32)
        b = rng.standard_normal((n, p), dtype=np.float32)
        A, B = nd.NDArray(a, device=device), nd.NDArray(b, device=device)
        out = nd.NDArray.make((m, p), device=device)
        flops = 2.0 * m * n * p
        repeats = REPEATS if m * n * p < 2e9 else 5
        t_nd = measure(
            lambda: device.matmul(A._handle, B._handle, out._handle, m, n, p), repeats=repeats
        )
        t_np = measure(lambda: a @ b, repeats=repeats)
        table.add(f"{m}x{n} @ {n}x{p}", flops / t_nd / 1e9, flops / t_np / 1e9)
    return table


def bench_elementwise(device) -> Table:
    """Billions of elements per second for element-wise, scalar, compact and reduction ops."""
    rng = np.random.default_rng(1)
    side = int(np.sqrt(ELEMENTS))
    x = rng.standard_normal((side, side), dtype=np.float32)
    y = rng.standard_normal((side, side), dtype=np.float32)
    pos = np.abs(x) + np.float32(0.5)
    X, Y, P = (nd.NDArray(v, device=device) for v in (x, y, pos))
    XT = X.permute((1, 0))
    cases = [
        ("add", lambda: X + Y, lambda: x + y),
        ("mul", lambda: X * Y, lambda: x * y),
        ("div", lambda: X / Y, lambda: x / y),
        ("maximum", lambda: X.maximum(Y), lambda: np.maximum(x, y)),
        ("scalar add", lambda: X + 1.5, lambda: x + np.float32(1.5)),
        ("scalar mul", lambda: X * 1.5, lambda: x * np.float32(1.5)),
        ("scalar power 2", lambda: X**2, lambda: x**2),
        ("scalar power 1.5", lambda: P**1.5, lambda: pos ** np.float32(1.5)),
        ("exp", lambda: X.exp(), lambda: np.exp(x)),
        ("log", lambda: P.log(), lambda: np.log(pos)),
        ("tanh", lambda: X.tanh(), lambda: np.tanh(x)),
        ("compact of a transpose", lambda: XT.compact(), lambda: np.ascontiguousarray(x.T)),
        ("compact of a flip", lambda: X.flip((0, 1)), lambda: np.ascontiguousarray(x[::-1, ::-1])),
        ("sum (all)", lambda: X.sum(), lambda: x.sum()),
        ("max (all)", lambda: X.max(), lambda: x.max()),
        ("sum (axis=1)", lambda: X.sum(axis=1), lambda: x.sum(axis=1)),
        ("max (axis=1)", lambda: X.max(axis=1), lambda: x.max(axis=1)),
    ]
    table = Table(f"element-wise, compact, reductions ({side}x{side} float32)", "Gelem/s")
    for name, f_nd, f_np in cases:
        with np.errstate(all="ignore"):
            np.testing.assert_allclose(
                np.asarray(f_nd().numpy()).reshape(-1),
                np.asarray(f_np()).reshape(-1),
                rtol=1e-4,
                atol=1e-2,
                err_msg=name,
            )
        t_nd = measure(f_nd, repeats=REPEATS)
        t_np = measure(f_np, repeats=REPEATS)
        table.add(name, ELEMENTS / t_nd / 1e9, ELEMENTS / t_np / 1e9)
    return table


TRANSPOSED_SIDE = 2048
TRANSPOSED_ROUNDS = 5


def bench_transposed_add(device) -> Table:
    """Milliseconds of ``X.T + Y`` (2048² float32, X.T a transposed view) read in place, and
    compacting X.T first then adding compact arrays, beside numpy's ``x.T + y``: the three are
    measured in turn (each a median over blocks of calls), ``TRANSPOSED_ROUNDS`` times; the
    table shows the median of the rounds and their spread (max - min)."""
    rng = np.random.default_rng(2)
    n = TRANSPOSED_SIDE
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    X, Y = nd.NDArray(x, device=device), nd.NDArray(y, device=device)
    XT = X.permute((1, 0))
    plans = {"in place": lambda: XT + Y, "compact first": lambda: XT.compact() + Y}
    for name, f in plans.items():
        assert np.array_equal(f().numpy(), x.T + y), name  # element-wise ops are exact
    rounds: dict[str, list[float]] = {name: [] for name in [*plans, "numpy"]}
    for _ in range(TRANSPOSED_ROUNDS):
        for name, f in [*plans.items(), ("numpy", lambda: x.T + y)]:
            rounds[name].append(measure(f, repeats=REPEATS) * 1e3)
    med = {name: float(np.median(ts)) for name, ts in rounds.items()}
    spread = ", ".join(f"{name} {max(ts) - min(ts):.2f}" for name, ts in rounds.items())
    table = Table(
        f"add, transposed {n}² operand (median of {TRANSPOSED_ROUNDS} rounds; spread ms: {spread})",
        "ms",
        higher_is_better=False,
    )
    for name in plans:
        table.add(f"add, transposed {n}² operand: needle {name}", med[name], med["numpy"])
    return table


# Runs in a subprocess with another kernel set: name -> (environment, what the run plays).
OTHER_ISA_RUNS = {
    "avx2": (
        {"NEEDLE_CPU_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell"},
        "as on an AVX2 machine (NEEDLE_CPU_ISA=avx2, OPENBLAS_CORETYPE=Haswell)",
    ),
    # The portable kernels are what ARM (Apple silicon, ARM servers) runs; compiled here for
    # x86-64 with no instruction-set flags they use 128-bit SSE vectors, NEON's width, and
    # numpy's OpenBLAS is pinned to its SSE kernels (Nehalem) likewise.
    "portable": (
        {"NEEDLE_CPU_ISA": "portable", "OPENBLAS_CORETYPE": "Nehalem"},
        "with the portable kernels (NEEDLE_CPU_ISA=portable, OPENBLAS_CORETYPE=Nehalem)",
    ),
}


def bench_other_isa(isa: str, matmul_only: bool) -> None:
    """The tables again from a subprocess that runs another kernel set (``OTHER_ISA_RUNS``):
    needle's ``isa`` kernels beside numpy's OpenBLAS pinned to a matching instruction set."""
    extra, what = OTHER_ISA_RUNS[isa]
    env = {**os.environ, **extra}
    print(f"{'matmul' if matmul_only else 'all tables'} {what}, in a subprocess:", flush=True)
    args = ["--matmul-only"] if matmul_only else []
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_ndarray", *args], env=env, cwd=ROOT
    )
    if done.returncode:
        print(f"(the {isa} run failed with exit status {done.returncode})")


def main(argv=None) -> None:
    """Print the matmul (and, unless ``--matmul-only``, kernel and element-wise) tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matmul-only", action="store_true", help="only the A @ B table")
    args = parser.parse_args([] if argv is None else argv)
    device = nd.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return
    mod = device.mod
    requested = os.environ.get("NEEDLE_CPU_ISA")
    if requested and kernel_isa(device) != requested:
        print(
            f"note: NEEDLE_CPU_ISA={requested} but the module reports {kernel_isa(device)!r} "
            "(this build does not honour the override, or the CPU lacks the instructions)"
        )
    print(
        f"needle cpu(): matmul kernels {kernel_isa(device)}, "
        f"{getattr(mod, '__gemm__', None) or 'tile ' + str(getattr(mod, '__tile_size__', '?'))}"
        f", {mod.num_threads() if hasattr(mod, 'num_threads') else '?'} threads; "
        f"medians of {REPEATS} repeats\n"
    )
    bench_matmul(device).print()
    print()
    if args.matmul_only:
        return
    if "avx512f" in cpu_flags() and not requested:
        bench_other_isa("avx2", matmul_only=True)
        print()
    bench_matmul_kernel(device).print()
    print()
    bench_elementwise(device).print()
    print()
    bench_transposed_add(device).print()
    if not requested and kernel_isa(device) != "portable":
        print()
        bench_other_isa("portable", matmul_only=False)


if __name__ == "__main__":
    main(sys.argv[1:])
