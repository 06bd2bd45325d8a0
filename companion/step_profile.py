"""Where one training step's time goes: inside device kernels, or in the framework around them.

``KernelTimer(device)`` wraps every function of a device module (``ewise_add``, ``matmul``,
``compact``, ...) with a clock for the duration of a ``with`` block; the time spent inside
those calls is *kernel* time (it includes pybind11's argument conversion, a few hundred ns per
call), and the rest of a step's wall time is *framework overhead*: Python in ``Tensor``, the
ops, autograd, ``NDArray`` and the optimizer, plus allocating buffers.

``profile_case`` runs a step of one of :mod:`companion.steps`'s cases ``repeats`` times
without timers (the step time, median) and, alternating with those, ``repeats`` times with
them: per phase, kernel time and overhead = wall - kernel - the timers' own cost (medians). With
PyTorch installed it also times PyTorch's
step in blocks of steps, after needle's (its OpenMP workers spin after each call).

The timers clock the calls themselves, so the split is meaningful on a device whose kernels
finish before the call returns (``cpu()``, ``cpu_numpy()``); ``cuda()`` queues its kernels and
returns at once, so there the "kernel" time would be launch time only.

Run ``python -m companion.step_profile [CASE ...] [--repeats N] [--json PATH]`` (``make
profile``). :func:`before` returns the figures of the code before the array-layer rework, saved
beside this module in ``step_profile_before.json`` (its commit, date and machine inside), part
of the installed package like the rest (notebook 06 compares them with a live run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from companion.steps import CASES, TITLES, needle_step, torch_step

PHASES = ("forward", "backward", "update")
#: The saved profile of the code before the array-layer rework (see :func:`before`).
BEFORE = Path(__file__).with_name("step_profile_before.json")


def before() -> dict:
    """The saved "before" profile: {"commit", "date", "machine" (lines), "repeats", "note",
    "cases": {case: the dict :func:`profile_case` returns}}."""
    return json.loads(BEFORE.read_text())


class KernelTimer:
    """Clocks every call into ``device``'s module while the ``with`` block runs.

    ``seconds`` is the total time inside module functions, ``calls`` their number, and
    ``by_name`` maps a function name to [calls, seconds]. Classes (the ``Array`` buffer type)
    are left alone, so allocating a buffer counts as framework time.
    """

    def __init__(self, device):
        self.device = device
        self.mod = device.mod
        self.seconds = 0.0
        self.calls = 0
        self.by_name: dict[str, list] = {}
        self._saved: dict[str, object] = {}

    def reset(self) -> None:
        """Zero the counters (the wrappers stay in place)."""
        self.seconds, self.calls = 0.0, 0
        self.by_name = {}

    def _wrap(self, name: str, fn):
        clock = time.perf_counter

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                self.seconds += dt
                self.calls += 1
                entry = self.by_name.get(name)
                if entry is None:
                    self.by_name[name] = [1, dt]
                else:
                    entry[0] += 1
                    entry[1] += dt

        return timed

    def _forget_cached(self) -> None:
        # BackendDevice caches module attributes in its own __dict__ after the first look-up.
        for name in self._saved:
            self.device.__dict__.pop(name, None)

    def __enter__(self) -> "KernelTimer":
        for name in dir(self.mod):
            fn = getattr(self.mod, name)
            if name.startswith("_") or isinstance(fn, type) or not callable(fn):
                continue
            if not isinstance(fn, (types.BuiltinFunctionType, types.FunctionType)):
                continue
            self._saved[name] = fn
            setattr(self.mod, name, self._wrap(name, fn))
        self._forget_cached()
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(self.mod, name, fn)
        self._forget_cached()
        self._saved = {}


def _phase_times(step, timer=None) -> dict:
    """Seconds of each phase of one step: wall, and with ``timer`` also kernel and calls."""
    out = {"wall": {}, "kernel": {}, "calls": {}}
    loss = None
    for phase in PHASES:
        if timer is not None:
            timer.reset()
        t0 = time.perf_counter()
        if phase == "forward":
            loss = step.forward()
        elif phase == "backward":
            step.backward(loss)
        else:
            step.update()
        out["wall"][phase] = time.perf_counter() - t0
        if timer is not None:
            out["kernel"][phase] = timer.seconds
            out["calls"][phase] = timer.calls
    return out


def _wrapper_cost(samples: int = 20000) -> float:
    """Seconds a KernelTimer wrapper adds to one call (subtracted from measured overhead)."""
    timer = KernelTimer.__new__(KernelTimer)
    timer.seconds, timer.calls, timer.by_name = 0.0, 0, {}
    wrapped = timer._wrap("abs", abs)
    best = []
    for fn in (abs, wrapped):
        t0 = time.perf_counter()
        for _ in range(samples):
            fn(1.0)
        best.append(time.perf_counter() - t0)
    return max(0.0, (best[1] - best[0]) / samples)


def profile_case(
    case: str,
    device,
    repeats: int = 7,
    warmup: int = 2,
    with_torch: bool = True,
    fast: bool = False,
) -> dict:
    """Kernel and overhead milliseconds per phase of one ``case`` step on ``device``, on the
    course's path or (``fast``) on ``needle.fast``'s (:func:`companion.steps.needle_step`).

    Returns {"step_ms" (wall time of a step without timers), "kernel_ms", "overhead_ms",
    "kernel_calls", "phases": {phase: {"kernel_ms", "overhead_ms"}}, "top_kernels":
    [[name, calls, ms], ...], "torch_ms" (None without torch), "ratio" (PyTorch ms / needle
    step_ms: higher is better), "step_min_ms", "torch_min_ms", "ratio_min" (the same from the
    fastest steps, which other processes disturbed least), "load_average" (1 minute, at the
    end)}. Kernel and overhead come from the same timed steps (the
    wrappers' own cost is taken out of the overhead); every figure is a median over
    ``repeats`` steps.
    """
    result = profile_step(needle_step(case, device, fast=fast), device, repeats, warmup)
    result["title"] = TITLES[case]
    ref = torch_step(case) if with_torch else None
    if ref is not None:
        for _ in range(warmup):
            ref()
        time.sleep(0.3)
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ref()
            samples.append(time.perf_counter() - t0)
        result["torch_ms"] = 1e3 * statistics.median(samples)
        result["torch_min_ms"] = 1e3 * min(samples)
        result["ratio"] = result["torch_ms"] / result["step_ms"]
        # the fastest steps are the least disturbed by other processes: a second, robust ratio
        result["ratio_min"] = result["torch_min_ms"] / result["step_min_ms"]
    return result


def profile_step(step, device, repeats: int = 7, warmup: int = 2) -> dict:
    """Kernel and overhead milliseconds of ``step`` (a :class:`companion.steps.Step`) whose
    kernels run on ``device`` (anything with a ``mod``, this project's needle or a student's):
    the keys of :func:`profile_case` but "title", with the PyTorch figures None."""
    for _ in range(warmup):
        step()
    time.sleep(0.3)  # let threads left spinning by earlier work go idle
    cost = _wrapper_cost()
    plain, timed = [], []
    for _ in range(repeats):  # alternate, so load from other processes hits both alike
        plain.append(sum(_phase_times(step)["wall"].values()))
        with KernelTimer(device) as timer:
            timed.append(_phase_times(step, timer))
    # _phase_times resets the counters per phase: count one whole step for the call table.
    with KernelTimer(device) as timer:
        step()
        by_name, n_calls = timer.by_name, timer.calls

    def overhead(t, phase):
        return t["wall"][phase] - t["kernel"][phase] - cost * t["calls"][phase]

    phases = {
        phase: {
            "kernel_ms": 1e3 * statistics.median(t["kernel"][phase] for t in timed),
            "overhead_ms": 1e3 * statistics.median(overhead(t, phase) for t in timed),
        }
        for phase in PHASES
    }
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:8]
    return {
        "step_ms": 1e3 * statistics.median(plain),
        "kernel_ms": 1e3 * statistics.median(sum(t["kernel"].values()) for t in timed),
        "overhead_ms": 1e3 * statistics.median(sum(overhead(t, p) for p in PHASES) for t in timed),
        "kernel_calls": n_calls,
        "phases": phases,
        "top_kernels": [[name, c, 1e3 * s] for name, (c, s) in top],
        "step_min_ms": 1e3 * min(plain),
        "torch_ms": None,
        "torch_min_ms": None,
        "ratio": None,
        "ratio_min": None,
        "load_average": os.getloadavg()[0],
    }


def render(results: dict) -> str:
    """A text table of ``profile_case`` results keyed by case name."""
    head = (
        f"{'case':<16}{'step ms':>10}{'kernel ms':>11}{'overhead ms':>13}{'overhead':>10}"
        f"{'calls':>7}{'PyTorch ms':>12}{'needle/PyTorch':>16}{'(fastest)':>10}"
    )
    lines = [head, "-" * len(head)]
    for case, r in results.items():
        torch_ms = f"{r['torch_ms']:.2f}" if r["torch_ms"] else "n/a"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "n/a"
        fastest = f"{r['ratio_min']:.2f}" if r.get("ratio_min") else "n/a"
        share = r["overhead_ms"] / (r["kernel_ms"] + r["overhead_ms"])
        lines.append(
            f"{case:<16}{r['step_ms']:>10.2f}{r['kernel_ms']:>11.2f}"
            f"{r['overhead_ms']:>13.2f}{share:>10.0%}"
            f"{r['kernel_calls']:>7}{torch_ms:>12}{ratio:>16}{fastest:>10}"
        )
    lines.append(
        "needle/PyTorch = PyTorch time / needle time (higher is better, 1.0 = parity), "
        "from median steps and (fastest) from the fastest steps"
    )
    return "\n".join(lines)


def render_change(before_cases: dict, results: dict) -> str:
    """A text table of device calls, kernel ms and overhead ms per step, ``before_cases`` (the
    saved profile's cases) beside ``results`` (this run), for the cases in both."""
    head = f"{'case':<16}{'calls':>14}{'kernel ms':>18}{'overhead ms':>20}"
    lines = [head, "-" * len(head)]
    for case, r in results.items():
        b = before_cases.get(case)
        if b is None:
            continue
        calls = f"{b['kernel_calls']} -> {r['kernel_calls']}"
        kernel = f"{b['kernel_ms']:.2f} -> {r['kernel_ms']:.2f}"
        overhead = f"{b['overhead_ms']:.2f} -> {r['overhead_ms']:.2f}"
        lines.append(f"{case:<16}{calls:>14}{kernel:>18}{overhead:>20}")
    return "\n".join(lines)


def needle_commit() -> str:
    """The short commit id (with '+dirty' for local changes) of the needle package imported."""
    import needle

    root = Path(needle.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def main(argv=None) -> dict:
    """Profile the named cases (default all) on cpu(); print a table, optionally save JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"any of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write the results (with commit and machine)")
    args = parser.parse_args([] if argv is None else argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    import needle as ndl
    from companion.machine import machine_info

    device = ndl.cpu()
    if not device.enabled():
        print("cpu() is not built: nothing to profile (run `make build`)")
        return {}
    results = {}
    for case in args.cases or CASES:
        results[case] = profile_case(case, device, repeats=args.repeats)
        print(f"{case}: {results[case]['title']}: {results[case]['step_ms']:.1f} ms", flush=True)
    print(
        f"\none step, split into time inside cpu() kernels and framework overhead; "
        f"medians of {args.repeats} steps"
    )
    print(render(results))
    saved = before()
    print(
        f"\nbefore (commit {saved['commit']}, {saved['date'][:10]}, saved in {BEFORE.name}) -> now"
    )
    print(render_change(saved["cases"], results))
    if args.json:
        try:
            import torch

            torch_version = torch.__version__
        except ImportError:
            torch_version = None
        doc = {
            "commit": needle_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(),
            "torch": torch_version,
            "repeats": args.repeats,
            "note": "shared 2-core machine (other jobs running): medians of repeated steps",
            "cases": results,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
