"""A student's own kernels measured: ``make bench NEEDLE_IMPL=path/to/hwN/python``.

The student's NDArray matmul, element-wise ops, ``compact`` and reductions are timed beside this
project's and numpy's (GFLOP/s for matmul, GB/s moved for the rest), placed on a roofline
(:mod:`companion.roofline`: this CPU's limits as numpy reaches them), and one training step of
the student's needle (a two-layer MLP with SGD) is split into kernel time and framework overhead
(:func:`companion.step_profile.profile_step`). Each finding gets one line of advice naming the
lecture section to read.

Both implementations are packages named ``needle``, so each is measured in its own child
process (``python -m benchmarks.student --child``, with or without ``NEEDLE_IMPL``) that writes
JSON; this parent process imports numpy only. ``--quick`` (or ``NEEDLE_BENCH_QUICK=1``) uses
tiny sizes and one repeat: a smoke run whose figures mean little. ``--step-only`` (``make
profile``) skips the kernel tables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import reexec_without_blas_overrides
from companion.check.sections import section_ref

CHECKOUT = Path(__file__).resolve().parents[1]
QUICK_ENV = "NEEDLE_BENCH_QUICK"
SIZES = {
    "full": {
        "matmul": [(256, 256, 256), (512, 512, 512)],
        "side": 1024,
        "mlp": (128, 784, 256, 10),
        "repeats": 5,
    },
    "quick": {"matmul": [(24, 24, 24)], "side": 32, "mlp": (8, 16, 16, 4), "repeats": 1},
}
# (name, bytes moved per element, flops per element): reads + writes of float32
EWISE = [
    ("add", 12, 1),
    ("mul", 12, 1),
    ("scalar mul", 8, 1),
    ("exp", 8, 1),
    ("compact of a transpose", 8, 0),
    ("sum (axis=1)", 4, 1),
    ("max (axis=1)", 4, 1),
]
SLOW = 10.0  # a kernel this many times slower than this project's is a finding

HINTS = {
    "add": ("06_hardware_acceleration", "Element-wise kernels"),
    "mul": ("06_hardware_acceleration", "Element-wise kernels"),
    "scalar mul": ("06_hardware_acceleration", "Element-wise kernels"),
    "exp": ("06_hardware_acceleration", "Element-wise kernels"),
    "compact of a transpose": ("05_ndarray", "Why `compact` exists"),
    "sum (axis=1)": ("05_ndarray", "From a Python call to a C++ loop"),
    "max (axis=1)": ("05_ndarray", "From a Python call to a C++ loop"),
    "matmul naive": ("05_ndarray", "Three matmul kernels"),
    "matmul blocked": ("06_hardware_acceleration", "Cache blocking"),
    "overhead": ("06_hardware_acceleration", "Where a training step's time goes"),
}


def numpy_cases(np, x, y) -> dict:
    """numpy's version of each EWISE case on the float32 matrices ``x`` and ``y``: the oracle
    of the children's results and the parent's numpy column."""
    return {
        "add": lambda: x + y,
        "mul": lambda: x * y,
        "scalar mul": lambda: x * np.float32(1.5),
        "exp": lambda: np.exp(x),
        "compact of a transpose": lambda: np.ascontiguousarray(x.T),
        "sum (axis=1)": lambda: x.sum(axis=1),
        "max (axis=1)": lambda: x.max(axis=1),
    }


def _timing(mode: str) -> dict:
    """Keyword arguments of companion.timing.measure for ``mode``."""
    return {
        "repeats": SIZES[mode]["repeats"],
        "warmup": 1,
        "min_sample_s": 2e-3,
        "settle_s": 0 if mode == "quick" else 0.05,
    }


# ---- the child: runs with whichever needle NEEDLE_IMPL selects -----------------------------------
def _device(nd):
    """The student's compiled cpu() device when it works, else their numpy device."""
    try:
        device = nd.cpu()
        if getattr(device, "enabled", lambda: True)():
            return device
    except Exception:  # not built: the course's ndarray.py imports it lazily or not at all
        pass
    return nd.cpu_numpy()


def _kernels_called(device, fn) -> list[str]:
    """The device-module functions one call of ``fn`` reaches (names, in first-call order)."""
    from companion.step_profile import KernelTimer

    try:
        with KernelTimer(device) as timer:
            fn()
    except AttributeError:  # a device without a module (numpy arrays as buffers)
        return []
    return list(timer.by_name)


def _mlp_step(ndl, device, batch: int, dim: int, hidden: int, classes: int):
    """One SGD step of Linear-ReLU-Linear with softmax loss, built from the course's API."""
    import numpy as np

    from companion.steps import Step

    rng = np.random.RandomState(0)
    nn = ndl.nn
    model = nn.Sequential(
        nn.Linear(dim, hidden, device=device), nn.ReLU(), nn.Linear(hidden, classes, device=device)
    )
    opt = ndl.optim.SGD(model.parameters(), lr=0.01)
    x = ndl.Tensor(
        rng.standard_normal((batch, dim)).astype(np.float32), device=device, requires_grad=False
    )
    y = ndl.Tensor(
        rng.randint(0, classes, batch).astype(np.float32), device=device, requires_grad=False
    )
    loss_fn = nn.SoftmaxLoss()

    def forward():
        opt.reset_grad()
        return loss_fn(model(x), y)

    return Step(forward, lambda loss: loss.backward(), opt.step)


def _matmul_rows(np, nd, device, sizes: dict, rng, timing: dict) -> list:
    """One row per matmul shape: the kernels called, the error, the seconds when right."""
    from companion.timing import measure

    rows = []
    for m, n, p in sizes["matmul"]:
        a = rng.standard_normal((m, n), dtype=np.float32)
        b = rng.standard_normal((n, p), dtype=np.float32)
        A, B = nd.NDArray(a, device=device), nd.NDArray(b, device=device)
        row = {"shape": [m, n, p], "kernels": _kernels_called(device, lambda: A @ B)}
        error = float(np.max(np.abs((A @ B).numpy() - a @ b)))
        row["error"] = error
        if error <= 1e-3 * np.sqrt(n) * (1 + np.max(np.abs(a @ b))):
            row["seconds"] = measure(lambda: A @ B, **timing)
        rows.append(row)
    return rows


def _ewise_rows(np, nd, device, side: int, rng, timing: dict) -> list:
    """One row per element-wise case of EWISE: an error, or the seconds when right."""
    from companion.timing import measure

    x = rng.standard_normal((side, side), dtype=np.float32)
    y = rng.standard_normal((side, side), dtype=np.float32)
    X, Y = nd.NDArray(x, device=device), nd.NDArray(y, device=device)
    cases = {
        "add": lambda: X + Y,
        "mul": lambda: X * Y,
        "scalar mul": lambda: X * 1.5,
        "exp": lambda: X.exp(),
        "compact of a transpose": lambda: X.permute((1, 0)).compact(),
        "sum (axis=1)": lambda: X.sum(axis=1),
        "max (axis=1)": lambda: X.max(axis=1),
    }
    oracle = numpy_cases(np, x, y)
    rows = []
    for name, _, _ in EWISE:
        f_nd, f_np = cases[name], oracle[name]
        row = {"name": name, "elements": side * side}
        try:
            got = np.asarray(f_nd().numpy()).reshape(-1)
            ok = np.allclose(got, np.asarray(f_np()).reshape(-1), rtol=1e-4, atol=1e-3)
            row["error"] = None if ok else "wrong result"
            if ok:
                row["seconds"] = measure(f_nd, **timing)
        except Exception as exc:  # not implemented yet, or a different API
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows


def child(mode: str, step_only: bool) -> dict:
    """Measure the imported needle: its kernels (unless ``step_only``) and a training step."""
    import numpy as np

    import needle as ndl
    import needle.backend_ndarray as nd
    from companion.step_profile import profile_step

    sizes = SIZES[mode]
    repeats = sizes["repeats"]
    device = _device(nd)
    out = {
        "needle": str(Path(ndl.__file__).resolve().parent),
        "device": repr(device),
        "matmul": [],
        "ewise": [],
        "step": None,
    }
    rng = np.random.default_rng(0)
    timing = _timing(mode)
    if not step_only:
        out["matmul"] = _matmul_rows(np, nd, device, sizes, rng, timing)
        out["ewise"] = _ewise_rows(np, nd, device, sizes["side"], rng, timing)
    try:
        step = _mlp_step(ndl, device, *sizes["mlp"])
        result = profile_step(step, device, repeats=max(repeats, 1), warmup=1)
        result["shape"] = list(sizes["mlp"])
        out["step"] = result
    except Exception as exc:
        out["step"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


# ---- the parent: runs both children, numpy, and writes the advice --------------------------------
def run_child(impl: str | None, mode: str, step_only: bool) -> dict:
    """Run :func:`child` in a fresh process, with ``NEEDLE_IMPL=impl`` (or this project's
    needle when None); returns its JSON, or {"failed": message}."""
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    if impl:
        env["NEEDLE_IMPL"] = impl
    with tempfile.TemporaryDirectory(prefix="needle-student-bench-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.student", "--child", str(result), "--mode", mode]
        done = subprocess.run(
            cmd + (["--step-only"] if step_only else []),
            cwd=CHECKOUT,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode or not result.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
            return {"failed": f"exit status {done.returncode}:\n{tail}"}
        return json.loads(result.read_text())


def numpy_figures(mode: str) -> dict:
    """numpy's seconds for the same cases (the parent imports numpy, never needle)."""
    import numpy as np

    from companion.timing import measure

    sizes = SIZES[mode]
    timing = _timing(mode)
    rng = np.random.default_rng(0)
    out = {"matmul": [], "ewise": {}}
    for m, n, p in sizes["matmul"]:
        a = rng.standard_normal((m, n), dtype=np.float32)
        b = rng.standard_normal((n, p), dtype=np.float32)
        out["matmul"].append(measure(lambda: a @ b, **timing))
    side = sizes["side"]
    x = rng.standard_normal((side, side), dtype=np.float32)
    y = rng.standard_normal((side, side), dtype=np.float32)
    for name, f in numpy_cases(np, x, y).items():
        out["ewise"][name] = measure(f, **timing)
    return out


def _rate(seconds: float | None, amount: float) -> float | None:
    return amount / seconds / 1e9 if seconds else None


def _fmt(value: float | None, unit: str) -> str:
    return f"{value:.3g} {unit}" if value is not None else "-"


def _advise_matmul(student: dict, ours: dict) -> list[str]:
    """Findings on matmul: wrong at a shape, or far slower than this project's kernel."""
    lines = []
    for mine, theirs in zip(student.get("matmul", []), ours.get("matmul", [])):
        m, n, p = mine["shape"]
        flops = 2.0 * m * n * p
        shape = f"{m}x{n} @ {n}x{p}"
        if "seconds" not in mine:
            lines.append(
                f"matmul: your matmul is wrong at {shape} (max error {mine['error']:.3g})"
                f": run `make check` on your homework first"
            )
            continue
        rate, best = _rate(mine["seconds"], flops), _rate(theirs.get("seconds"), flops)
        if best and best / rate >= SLOW:
            kernels = [k for k in mine["kernels"] if "matmul" in k]
            if "matmul_tiled" in kernels:
                lines.append(
                    f"matmul: your tiled matmul runs at {rate:.3g} GFLOP/s at {shape}; "
                    f"this project's blocked kernel is {best / rate:.0f}x faster: see "
                    f"{section_ref(*HINTS['matmul blocked'])}"
                )
            else:
                via = (
                    f"device.{kernels[0]}"
                    if kernels
                    else "no device matmul kernel: Python or numpy does the work"
                )
                lines.append(
                    f"matmul: your matmul is the naive triple loop ({via}): {rate:.3g} "
                    f"GFLOP/s at {shape}; this project's tiled and blocked kernel is "
                    f"{best / rate:.0f}x faster: see {section_ref(*HINTS['matmul naive'])}"
                    f" and {section_ref(*HINTS['matmul blocked'])}"
                )
    return lines


def _advise_ewise(student: dict, ours: dict, roof) -> list[str]:
    """Findings on the element-wise cases: an error, or far slower than this project's."""
    lines = []
    ours_ewise = {r["name"]: r for r in ours.get("ewise", [])}
    bytes_per = {name: b for name, b, _ in EWISE}
    for row in student.get("ewise", []):
        name = row["name"]
        if row.get("error"):
            lines.append(f"{name}: {row['error']}: see {section_ref(*HINTS[name])}")
            continue
        amount = bytes_per[name] * row["elements"]
        rate = _rate(row.get("seconds"), amount)
        best = _rate(ours_ewise.get(name, {}).get("seconds"), amount)
        if rate and best and best / rate >= SLOW:
            lines.append(
                f"{name}: yours moves {rate:.3g} GB/s, this project's {best:.3g} GB/s "
                f"({best / rate:.0f}x faster; this CPU's bandwidth "
                f"{roof.bandwidth / 1e9:.3g} GB/s): see {section_ref(*HINTS[name])}"
            )
    return lines


def _advise_step(step: dict) -> list[str]:
    """The finding on the training step: it failed, overhead dominates, or its top kernel."""
    if "error" in step:
        return [f"training step: it failed ({step['error']})"]
    if not step:
        return []
    share = step["overhead_ms"] / max(step["kernel_ms"] + step["overhead_ms"], 1e-12)
    if share > 0.6:
        return [
            f"training step: {100 * share:.0f}% of your step's "
            f"{step['step_ms']:.3g} ms is framework overhead (Python in Tensor, "
            f"ops, autograd, NDArray), not kernels: see "
            f"{section_ref(*HINTS['overhead'])}"
        ]
    if step.get("top_kernels"):
        name, calls, ms = step["top_kernels"][0]
        return [
            f"training step: kernels take {100 * (1 - share):.0f}% of your step, "
            f"most in {name} ({calls} calls, {ms:.3g} ms): speed that kernel first"
        ]
    return []


def advise(student: dict, ours: dict, roof) -> list[str]:
    """One line per finding: a kernel far slower than this project's, a wrong or missing
    kernel, a step dominated by framework overhead."""
    return (
        _advise_matmul(student, ours)
        + _advise_ewise(student, ours, roof)
        + _advise_step(student.get("step") or {})
    )


def _kernel_table(student: dict, ours: dict, numpy: dict, roof) -> list[str]:
    """The kernel table: yours, this project's and numpy's rates, and the roofline."""
    from companion.roofline import matmul_intensity

    lines: list[str] = []
    head = f"{'case':<26}{'yours':>16}{'this project':>16}{'numpy':>16}  roofline (yours)"
    if not student.get("matmul"):
        return lines
    lines += ["", head, "-" * (len(head) + 40)]
    for i, mine in enumerate(student["matmul"]):
        m, n, p = mine["shape"]
        flops = 2.0 * m * n * p
        theirs = ours["matmul"][i] if i < len(ours.get("matmul", [])) else {}
        rate = _rate(mine.get("seconds"), flops)
        ai = matmul_intensity(m, n, p)
        place = roof.place(ai, rate * 1e9) if rate else "wrong result: not timed"
        lines.append(
            f"{f'matmul {m}x{n}x{p}':<26}{_fmt(rate, 'GFLOP/s'):>16}"
            f"{_fmt(_rate(theirs.get('seconds'), flops), 'GFLOP/s'):>16}"
            f"{_fmt(_rate(numpy['matmul'][i], flops), 'GFLOP/s'):>16}  {place}"
        )
    ours_ewise = {r["name"]: r for r in ours.get("ewise", [])}
    for name, nbytes, nflops in EWISE:
        mine = next((r for r in student["ewise"] if r["name"] == name), {})
        amount = nbytes * mine.get("elements", 0)
        rate = _rate(mine.get("seconds"), amount)
        if rate and nflops:
            place = roof.place(nflops / nbytes, rate * 1e9 * nflops / nbytes)
        elif rate:
            place = f"a copy: {100 * rate * 1e9 / roof.bandwidth:.3g}% of the bandwidth"
        else:
            place = mine.get("error") or "-"
        best = _rate(ours_ewise.get(name, {}).get("seconds"), amount)
        lines.append(
            f"{name:<26}{_fmt(rate, 'GB/s'):>16}{_fmt(best, 'GB/s'):>16}"
            f"{_fmt(_rate(numpy['ewise'][name], amount), 'GB/s'):>16}  {place}"
        )
    return lines


def report(student: dict, ours: dict, numpy: dict, roof, mode: str) -> str:
    """The tables (yours, this project's, numpy's, and the roofline) and the advice."""
    lines = [
        f"your needle: {student.get('needle')} on {student.get('device')}",
        f"this project's: {ours.get('needle')} on {ours.get('device')}",
    ]
    if student.get("matmul"):
        lines.append(
            f"roofline: {roof.source}: peak {roof.peak / 1e9:.3g} GFLOP/s, bandwidth "
            f"{roof.bandwidth / 1e9:.3g} GB/s, ridge {roof.ridge:.3g} flop/byte"
        )
    if mode == "quick":
        lines.append("(quick run: tiny sizes, one repeat; the figures mean little)")
    lines += _kernel_table(student, ours, numpy, roof)
    for who, data in (("yours", student), ("this project's", ours)):
        step = data.get("step") or {}
        if "step_ms" in step:
            b, d, h, c = step["shape"]
            lines.append(
                f"training step ({who}; MLP {d}-{h}-{c}, batch {b}, SGD): "
                f"{step['step_ms']:.3g} ms = kernels {step['kernel_ms']:.3g} ms + "
                f"framework {step['overhead_ms']:.3g} ms ({step['kernel_calls']} kernel "
                "calls)"
            )
    advice = advise(student, ours, roof)
    lines += ["", "advice:"] + [
        f"  {a}"
        for a in advice
        or [f"no slow kernel found: your kernels are within {SLOW:.0f}x of this project's"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure NEEDLE_IMPL's needle beside this project's and numpy's; print tables and advice."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.student", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--impl", help="the student's folder (default: $NEEDLE_IMPL)")
    parser.add_argument(
        "--quick", action="store_true", help=f"tiny sizes, one repeat (also {QUICK_ENV}=1)"
    )
    parser.add_argument("--step-only", action="store_true", help="only the training step")
    parser.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=SIZES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    mode = args.mode or ("quick" if args.quick or os.environ.get(QUICK_ENV) == "1" else "full")
    if args.child:
        Path(args.child).write_text(json.dumps(child(mode, args.step_only)))
        return 0
    # numpy in its normal configuration (the children inherit the cleaned environment)
    reexec_without_blas_overrides(
        ["-m", "benchmarks.student", *(sys.argv[1:] if argv is None else argv)]
    )
    impl = (args.impl or os.environ.get("NEEDLE_IMPL", "")).strip()
    if not impl:
        print("benchmarks.student: set NEEDLE_IMPL=path/to/hwN/python (or --impl)", file=sys.stderr)
        return 2
    from companion.roofline import measured_cpu

    impl = str(Path(impl).expanduser().resolve())
    print(
        f"measuring your needle ({impl}) and this project's, each in its own process ...",
        flush=True,
    )
    student = run_child(impl, mode, args.step_only)
    if "failed" in student:
        print(f"your needle could not be measured ({student['failed']})")
        return 1
    ours = run_child(None, mode, args.step_only)
    if "failed" in ours:
        print(f"this project's needle could not be measured ({ours['failed']})")
        return 1
    if args.step_only:
        numpy, roof = {}, None
    else:
        numpy = numpy_figures(mode)
        roof = measured_cpu(256, 1 << 22, 5) if mode == "quick" else measured_cpu()
    from companion.machine import machine_line

    print(machine_line())
    print(report(student, ours, numpy, roof, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
