"""Per-op overhead on tiny arrays: microseconds per call of needle against PyTorch.

On an 8×8 array the arithmetic is a few hundred flops, so the time per call is the fixed cost
of getting to the kernel: Python dispatch, building the result, autograd bookkeeping.

* The first table times each library in processes of its own (``CHILD_RUNS`` alternating
  children per library; each child takes the median of repeated samples, each sample a block
  of calls; the table shows the medians of the children): ``a + b`` with and without gradients,
  ``a @ b``, ``a.sum()``, ``(a @ b).sum().backward()`` and a whole small graph (``@``, sum,
  reshape, broadcast, multiply, sum, backward), needle's backward both with
  ``create_graph=False`` (what PyTorch's ``backward()`` does) and with the course's default
  (it records the gradients' graph). The gradients are checked against hand-derived ones first.
* The second times both libraries in this process, needle's blocks before PyTorch's, with
  ``NDArray`` cases (needle's array layer against plain PyTorch tensors).

The ratio is PyTorch's time over needle's (higher is better; 1.0 = parity).
Run ``python -m benchmarks.bench_overhead [--runs N] [--repeats R] [--clock cpu]``; ``make
bench`` runs it with the others (``--clock cpu`` times the first table by each process's CPU
time, which a machine shared with other work does not inflate the way it does elapsed time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import numpy as np

import needle as ndl
import needle.backend_ndarray as nd
from benchmarks.common import CHILD_RUNS, Table, libraries, time_libraries_in_children
from companion.timing import measure

N = 8  # the tensors' side
OPS = (
    "a + b (requires grad)",
    "a + b (no grad)",
    "a @ b",
    "a.sum()",
    "(a @ b).sum().backward() [needle: create_graph=False]",
    "(a @ b).sum().backward() [needle: default, records the graph]",
    "small graph + backward [needle: create_graph=False]",
    "small graph + backward [needle: default, records the graph]",
)


def operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two 8×8 float32 arrays."""
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((N, N), dtype=np.float32) for _ in range(2))
    return a, b


def graph_gradients(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d/da and d/db of the small graph L = sum_ij s_i a_ij, s_i = sum_k (a @ b)_ik, derived by
    hand: dL/d(a @ b)_ik = r_i (the row sums of a), so dL/da = s + r ⊗ (row sums of b) and
    dL/db = aᵀ r ⊗ 1."""
    s, r = (a @ b).sum(axis=1), a.sum(axis=1)
    return s[:, None] + r[:, None] * b.sum(axis=1)[None, :], np.repeat((a.T @ r)[:, None], N, 1)


def _needle_graph(a, b, create_graph: bool):
    s = (a @ b).sum(axes=(1,)).reshape((N, 1)).broadcast_to((N, N))
    (s * a).sum().backward(create_graph=create_graph)


def needle_ops() -> dict[str, Callable[[], object]]:
    """{case: a call of ``OPS``' case in needle on cpu()}, after checking values and
    gradients."""
    a_np, b_np = operands()
    a, b = (ndl.Tensor(v, device=ndl.cpu(), requires_grad=True) for v in (a_np, b_np))
    p, q = (ndl.Tensor(v, device=ndl.cpu(), requires_grad=False) for v in (a_np, b_np))
    ops = dict(
        zip(
            OPS,
            (
                lambda: a + b,
                lambda: p + q,
                lambda: a @ b,
                lambda: a.sum(),
                lambda: (a @ b).sum().backward(create_graph=False),
                lambda: (a @ b).sum().backward(),
                lambda: _needle_graph(a, b, False),
                lambda: _needle_graph(a, b, True),
            ),
        )
    )
    check_values(ops[OPS[0]]().numpy(), ops[OPS[2]]().numpy(), float(ops[OPS[3]]().numpy()))
    for case in OPS[6:]:
        ops[case]()
        check_gradients(a.grad.numpy(), b.grad.numpy(), case)
    return ops


def _torch_graph(torch, a, b) -> None:
    a.grad = b.grad = None  # as zero_grad() does: PyTorch adds into .grad, needle replaces it
    s = (a @ b).sum(dim=1).reshape(N, 1).broadcast_to(N, N)
    (s * a).sum().backward()


def torch_ops() -> dict[str, Callable[[], object]]:
    """{case: a call of ``OPS``' case in PyTorch}, after checking values and gradients."""
    import torch

    a_np, b_np = operands()
    a, b = (torch.from_numpy(v.copy()).requires_grad_() for v in (a_np, b_np))
    p, q = (torch.from_numpy(v.copy()) for v in (a_np, b_np))

    def matmul_backward():
        a.grad = b.grad = None
        (a @ b).sum().backward()

    calls = (lambda: a + b, lambda: p + q, lambda: a @ b, lambda: a.sum())
    calls += (matmul_backward,) * 2 + (lambda: _torch_graph(torch, a, b),) * 2
    ops = dict(zip(OPS, calls))
    with torch.no_grad():
        check_values(a_np + b_np, (a @ b).numpy(), float(a.sum()))
    ops[OPS[6]]()
    check_gradients(a.grad.numpy(), b.grad.numpy(), OPS[6])
    return ops


def check_values(total: np.ndarray, product: np.ndarray, summed: float) -> None:
    """``a + b``, ``a @ b`` and ``a.sum()`` as numpy computes them."""
    a, b = operands()
    np.testing.assert_allclose(total, a + b, rtol=1e-6, err_msg="a + b")
    np.testing.assert_allclose(product, a @ b, rtol=1e-4, atol=1e-5, err_msg="a @ b")
    np.testing.assert_allclose(summed, a.sum(), rtol=1e-4, atol=1e-5, err_msg="a.sum()")


def check_gradients(grad_a: np.ndarray, grad_b: np.ndarray, case: str) -> None:
    """The small graph's gradients as :func:`graph_gradients` derives them."""
    want_a, want_b = graph_gradients(*operands())
    np.testing.assert_allclose(grad_a, want_a, rtol=1e-4, atol=1e-4, err_msg=f"{case}: d/da")
    np.testing.assert_allclose(grad_b, want_b, rtol=1e-4, atol=1e-4, err_msg=f"{case}: d/db")


def time_ops_here(library: str, repeats: int, clock: str = "wall") -> dict[str, float]:
    """{case: seconds per call} of ``OPS`` by ``library`` ("needle" or "torch"), timed in
    this process: the median of ``repeats`` samples, each a block of calls of at least 20 ms
    (``clock`` "wall", elapsed time), or of ``CPU_BLOCK`` calls timed by the process's CPU
    time (``clock`` "cpu")."""
    builders = {"needle": needle_ops, "torch": torch_ops}
    if library not in builders:
        raise ValueError(f"library must be 'needle' or 'torch', got {library!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    ops = builders[library]()
    if clock == "cpu":
        return {case: cpu_seconds_per_call(fn, repeats) for case, fn in ops.items()}
    return {
        case: measure(fn, repeats=repeats, min_sample_s=0.02, settle_s=0.05)
        for case, fn in ops.items()
    }


CLOCKS = ("wall", "cpu")
CPU_BLOCK = 2000  # calls per sample with --clock cpu (at least ~4 ms of CPU time each)


def cpu_seconds_per_call(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU seconds per call of ``fn`` (all threads of this process, ``process_time``)
    over ``repeats`` blocks of ``CPU_BLOCK`` calls, after a warm-up block. On a shared machine
    the time a process waits for a CPU is not counted, which wall time would add."""
    for _ in range(CPU_BLOCK // 10):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(CPU_BLOCK):
            fn()
        samples.append((time.process_time() - t0) / CPU_BLOCK)
    return statistics.median(samples)


def ops_table(times: dict[str, dict[str, float]], runs: int, clock: str = "wall") -> Table:
    """The µs per call of each library and case (``times``: {library: {case: seconds}})."""
    what = "CPU µs" if clock == "cpu" else "µs"
    table = Table(
        f"per-op cost on {N}x{N} float32 tensors, {what} per call, each library in its own "
        f"processes, median of {runs}; ratio = PyTorch time / needle time",
        "µs",
        reference="PyTorch",
        higher_is_better=False,
    )
    for case in OPS:
        table.add(case, 1e6 * times["needle"][case], 1e6 * times["torch"][case])
    return table


def bench_ops_in_children(repeats: int, runs: int, clock: str = "wall") -> dict:
    """Print the per-op table timed in children; return {case: ratio} ({} without PyTorch)."""
    libs = libraries()
    times = time_libraries_in_children(
        "benchmarks.bench_overhead:time_ops_here",
        repeats,
        clock,
        what="per-op overhead",
        libraries=libs,
        runs=runs,
    )
    if "torch" not in times:
        print(f"per-op cost on cpu(), µs per call, median of {runs} processes (no PyTorch)")
        for case in OPS:
            print(f"  {case:<64}{1e6 * times['needle'][case]:8.2f}")
        return {}
    table = ops_table(times, runs, clock)
    table.print()
    return {f"per op: {case}": table.ratio(n, r) for case, n, r in table.rows}


def cases(device):
    """[(name, needle callable, PyTorch callable or None)], after checking both agree."""
    rng = np.random.default_rng(0)
    a8, b8 = (rng.standard_normal((8, 8), dtype=np.float32) for _ in range(2))
    a64, b64 = (rng.standard_normal((64, 64), dtype=np.float32) for _ in range(2))
    TA, TB = (ndl.Tensor(v, device=device, requires_grad=True) for v in (a8, b8))
    A8, B8, A64, B64 = (nd.NDArray(v, device=device) for v in (a8, b8, a64, b64))
    needle_fns = {
        "Tensor + Tensor (8x8)": lambda: TA + TB,
        "Tensor @ Tensor (8x8)": lambda: TA @ TB,
        "relu(Tensor) (8x8)": lambda: ndl.ops.relu(TA),
        "Tensor * 2.0 (8x8)": lambda: TA * 2.0,
        "NDArray @ NDArray (8x8)": lambda: A8 @ B8,
        "NDArray @ NDArray (64x64)": lambda: A64 @ B64,
        "NDArray.sum(axis=1) (8x8)": lambda: A8.sum(axis=1),
        "NDArray.max(axis=1) (8x8)": lambda: A8.max(axis=1),
    }
    expected = {
        "Tensor + Tensor (8x8)": a8 + b8,
        "Tensor @ Tensor (8x8)": a8 @ b8,
        "relu(Tensor) (8x8)": np.maximum(a8, 0),
        "Tensor * 2.0 (8x8)": a8 * 2,
        "NDArray @ NDArray (8x8)": a8 @ b8,
        "NDArray @ NDArray (64x64)": a64 @ b64,
        "NDArray.sum(axis=1) (8x8)": a8.sum(axis=1, keepdims=True),
        "NDArray.max(axis=1) (8x8)": a8.max(axis=1, keepdims=True),
    }
    for name, fn in needle_fns.items():
        got = fn().numpy()
        np.testing.assert_allclose(
            got.reshape(-1), expected[name].reshape(-1), rtol=1e-4, atol=1e-4, err_msg=name
        )
    torch_fns = dict.fromkeys(needle_fns)
    try:  # optional oracle, imported here: the needle children of this module must not load it
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        ta, tb = (torch.from_numpy(v.copy()).requires_grad_() for v in (a8, b8))
        p8, q8, p64, q64 = (torch.from_numpy(v) for v in (a8, b8, a64, b64))
        torch_fns = {
            "Tensor + Tensor (8x8)": lambda: ta + tb,
            "Tensor @ Tensor (8x8)": lambda: ta @ tb,
            "relu(Tensor) (8x8)": lambda: torch.relu(ta),
            "Tensor * 2.0 (8x8)": lambda: ta * 2.0,
            "NDArray @ NDArray (8x8)": lambda: p8 @ q8,
            "NDArray @ NDArray (64x64)": lambda: p64 @ q64,
            "NDArray.sum(axis=1) (8x8)": lambda: p8.sum(dim=1, keepdim=True),
            "NDArray.max(axis=1) (8x8)": lambda: p8.amax(dim=1, keepdim=True),
        }
    return [(name, fn, torch_fns[name]) for name, fn in needle_fns.items()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="samples per case (median)")
    parser.add_argument("--runs", type=int, default=CHILD_RUNS, help="children per library")
    parser.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="the first table's clock: elapsed time, or the process's CPU time (steadier on "
        "a shared machine)",
    )
    args = parser.parse_args([] if argv is None else argv)
    for name in ("repeats", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Print both tables; return {case: PyTorch time / needle time} of the first."""
    args = parse_args(argv)
    device = ndl.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to benchmark (run `make build`)")
        return {}
    ratios = bench_ops_in_children(args.repeats, args.runs, args.clock)
    print()
    bench_same_process(device, args.repeats)
    return ratios


def bench_same_process(device, repeats: int) -> None:
    """Print the second table: both libraries in this process."""
    rows = []
    for name, f_needle, f_torch in cases(device):
        t_n = 1e6 * measure(f_needle, repeats=repeats, min_sample_s=0.02, settle_s=0.05)
        t_t = (
            1e6 * measure(f_torch, repeats=repeats, min_sample_s=0.02, settle_s=0.05)
            if f_torch
            else None
        )
        rows.append((name, t_n, t_t))
    if any(t_t is None for _, _, t_t in rows):
        print("per-op cost on cpu(), µs per call (PyTorch: not installed, no comparison)")
        for name, t_n, _ in rows:
            print(f"  {name:<28}{t_n:8.2f}")
        return
    table = Table(
        "per-op cost, µs per call, both libraries in this process (needle's blocks first); "
        "ratio = PyTorch time / needle time",
        "µs",
        reference="PyTorch",
        higher_is_better=False,
    )
    for name, t_n, t_t in rows:
        table.add(name, t_n, t_t)
    table.print()


if __name__ == "__main__":
    main(sys.argv[1:])
