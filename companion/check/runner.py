"""Run a homework's questions against a student's folder and write the report.

The folder has the course's skeleton layout: ``hw0/src/simple_ml.py`` (+ ``simple_ml_ext.cpp``)
for hw0, ``hwN/python/needle/...``, ``hwN/apps/...`` and ``hwN/src/*.cc|*.cu`` (with the course's
``CMakeLists.txt``) for the others. Compiled sources are built the way the course's Makefile
does (with a time limit; the CPU module alone when only CUDA fails); then a worker process
(``worker.py``) imports the student's package once -- a hang, an exit or an error there is one
diagnosis for every question -- and runs the questions in order. A worker that dies (segfault,
abort, exit) or overruns the time limit costs only the question it was running: a fresh worker
continues with the rest.

Each worker runs in a box (``sandbox.py``, started through ``boxed.py``): memory, CPU-time and
process-count limits that the report names when hit; every process it starts, ``setsid`` or
not, ended with it; on Linux with Landlock, no file changed outside the homework folder and a
scratch folder, and no signal sent outside the box. Its answers come over a pipe (no results
file it could append to), and it is blind: it computes no expected value and sends only the
student's values. A pass is only a claim: the judge (``judge.py``) decides it here, from the
values the worker sent, against expected values computed by the same checks run on this
project's own needle in a worker that never imports the student's code; for a question that
failed, the values sent before the failure are judged too, and the first wrong one is the cause.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .boxed import GIB, Boxed, Limits, describe_box
from .judge import Malformed, judge, references
from .nothing import named_stubs
from .questions import HOMEWORKS, Question, questions_for

IMPORT_PROBE = "__import__"  # the worker's first step (worker.IMPORT_PROBE)
BUILD_TIMEOUT = 600.0
EXIT_GRACE = 5.0  # seconds a worker may take to exit after its last answer


@dataclass
class Result:
    """One question's outcome: ``status`` is pass, fail, not implemented, crashed or timeout."""

    question: Question
    status: str
    detail: str = ""
    warnings: list[str] = field(default_factory=list)
    # the values its worker sent; judge.py decides a claimed pass, and finds a failure's cause
    claims: list = field(default_factory=list, repr=False, compare=False)
    # empty-bodied student functions that returned None while it ran (a claimed pass)
    stubs: list = field(default_factory=list, repr=False, compare=False)


@dataclass
class Report:
    """Everything ``make check`` prints: the build log, one result per question."""

    hw: str
    root: Path
    build: list[str] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    needle: str | None = None
    sandbox: str = ""

    @property
    def ok(self) -> bool:
        """True when every question passed."""
        return all(r.status == "pass" for r in self.results)

    def format(self) -> str:
        """The report: a header, one line per question, then a diagnosis for each failure."""
        lines = [f"companion check: {self.hw} in {self.root}"]
        if self.needle:
            lines.append(f"needle imported from {self.needle}")
        lines += [f"build: {b}" for b in self.build]
        if self.sandbox:
            lines.append(f"sandbox: {self.sandbox}")
        width = max((len(r.question.id) for r in self.results), default=10)
        for r in self.results:
            tag = (
                "pass"
                if r.status == "pass"
                else r.status.upper()
                if r.status in ("fail", "crashed", "timeout")
                else r.status
            )
            if r.status == "pass" and r.warnings:
                tag = "pass, WARNING"
            lines.append(f"  {tag:<16} {r.question.id:<{width}}  {r.question.title}")
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        order = ("pass", "fail", "not implemented", "crashed", "timeout", "error")
        lines.append(", ".join(f"{counts[s]} {s}" for s in order if s in counts))
        first_with: dict[str, str] = {}
        for r in self.results:
            if r.status == "pass" and r.warnings:
                lines += ["", f"== {r.question.id} (pass, with a warning): {r.question.title}"]
                lines += ["  warning: " + w.replace("\n", "\n  ") for w in r.warnings]
            if r.status != "pass" and r.detail:
                lines += ["", f"== {r.question.id} ({r.status}): {r.question.title}"]
                if r.detail in first_with:  # one cause (an import error): printed once
                    lines.append(f"  the same problem as {first_with[r.detail]}, above")
                    continue
                first_with[r.detail] = r.question.id
                lines.append("  " + r.detail.replace("\n", "\n  "))
                if r.question.help:
                    lines.append("  about this check: " + r.question.help)
        return "\n".join(lines)


def detect_homework(root: Path) -> str:
    """The homework a folder holds, from its name (``hw2``, ``hw4_extra``, ``.../hw3-main``)."""
    match = re.search(r"(hw4_extra|hw[0-4])", root.resolve().name)
    if not match:
        raise ValueError(
            f"cannot tell which homework {root} is from its name; pass --hw "
            f"({', '.join(HOMEWORKS)}), e.g. python -m companion.check {root} "
            f"--hw hw2, or with make: make check HW={root} HWNUM=hw2"
        )
    return match.group(1)


def search_paths(root: Path, hw: str) -> list[str]:
    """The folders the course's tests put on sys.path for this homework."""
    if hw == "hw0":
        return [str(root / "src")]
    return [str(root / "python"), str(root / "apps")]


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the process session ``proc`` leads (it and everything it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[bool, str]:
    """Run a build step; (ok, the end of its output). Killed, with all it started, after
    ``timeout`` seconds."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return False, (
            f"{' '.join(cmd[:2])} did not finish within {timeout:g} s (stopped); "
            f"its last output:\n{(out or '')[-2000:]}"
        )
    finally:
        _kill_group(proc)
    return proc.returncode == 0, out[-3000:]


def _build_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def build(root: Path, hw: str, timeout: float = BUILD_TIMEOUT) -> list[str]:
    """Compile the student's C++/CUDA as the course's Makefile does, each step stopped after
    ``timeout`` seconds; a line per step."""
    env = _build_env()
    if hw == "hw0":
        src = root / "src" / "simple_ml_ext.cpp"
        if not src.exists():
            return ["no src/simple_ml_ext.cpp: nothing to build"]
        target = root / "src" / "simple_ml_ext.so"
        if target.exists() and target.stat().st_mtime >= src.stat().st_mtime:
            return ["src/simple_ml_ext.so is up to date"]
        compiler = shutil.which("c++") or shutil.which("g++")
        if compiler is None:
            return ["no C++ compiler (c++) found: src/simple_ml_ext.cpp not built"]
        import pybind11

        includes = [
            "-I" + pybind11.get_include(),
            "-I" + __import__("sysconfig").get_paths()["include"],
        ]
        ok, log = _run(
            [
                compiler,
                "-O3",
                "-Wall",
                "-shared",
                "-std=c++11",
                "-fPIC",
                *includes,
                "src/simple_ml_ext.cpp",
                "-o",
                "src/simple_ml_ext.so",
            ],
            root,
            env,
            timeout,
        )
        return [
            "built src/simple_ml_ext.so" if ok else "FAILED to build src/simple_ml_ext.cpp:\n" + log
        ]
    return _build_cmake(root, env, timeout)


# CMake 4 refuses the course's cmake_minimum_required(VERSION 3.2) unless told to try anyway.
_CONFIGURE_EXTRA = ["-DCMAKE_POLICY_VERSION_MINIMUM=3.5"]
_WITHOUT_CUDA = [
    "-DCMAKE_DISABLE_FIND_PACKAGE_CUDA=TRUE",
    "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE",
]


def _cmake_steps(
    cmake: str, source: str, folder: Path, env: dict, timeout: float, extra: list[str]
) -> tuple[bool, str]:
    """Configure (``source`` relative to ``folder``) and build; (ok, the end of the output)."""
    import pybind11

    ok, log = _run(
        [
            cmake,
            source,
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DPYTHON_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            *_CONFIGURE_EXTRA,
            *extra,
        ],
        folder,
        env,
        timeout,
    )
    if ok:
        ok, log = _run([cmake, "--build", ".", "-j", "2"], folder, env, timeout)
    return ok, log


def _cuda_error(log: str) -> str | None:
    """The first line of a CUDA build failure (nvcc's complaint), or None if it is not one."""
    if "nvcc" not in log and "cuda" not in log.lower():
        return None
    lines = [ln.strip() for ln in log.splitlines()]
    for key in ("nvcc fatal", "nvcc error", "error:", "CUDA", "cuda"):
        found = next((ln for ln in lines if key in ln), None)
        if found:
            return found[:200]
    return None


def _build_cmake(root: Path, env: dict, timeout: float) -> list[str]:
    """The course's CMake build (hw1 on); when only CUDA fails (nvcc 12+ refuses the course's
    compute_37 on a machine without a GPU), the CPU module alone, said in one line."""
    if not (root / "CMakeLists.txt").exists():
        return ["no CMakeLists.txt: nothing to build"]
    if shutil.which("cmake") is None and not (Path(sys.executable).parent / "cmake").exists():
        return ["cmake not found: C++/CUDA sources not built"]
    cmake = shutil.which("cmake", path=env["PATH"])
    if (root / "build").exists() and not (root / "build").is_dir():
        return [
            f"FAILED: {root / 'build'} is a file, but CMake builds in a folder of that "
            "name: rename or remove the file"
        ]
    (root / "build").mkdir(exist_ok=True)
    ok, log = _cmake_steps(cmake, "..", root / "build", env, timeout, [])
    if ok:
        return ["built with CMake (build/)"]
    cuda = _cuda_error(log)
    if cuda is not None and "did not finish within" not in log:
        cpu_only = root / "build" / "cpu-only"
        cpu_only.mkdir(exist_ok=True)
        ok, cpu_log = _cmake_steps(cmake, "../..", cpu_only, env, timeout, _WITHOUT_CUDA)
        if ok:
            return [
                f"built the CPU module only (build/cpu-only): the CUDA module did not build "
                f"({cuda}), so cuda() stays disabled"
            ]
        log = cpu_log
    return ["FAILED to build with CMake:\n" + log]


def _worker_env(
    root: Path, hw: str, scratch: Path, limits: Limits, reference: bool = False
) -> dict:
    """The worker's environment: no outside paths or backend choice; ``NEEDLE_IMPL`` names the
    homework's ``python/`` folder (hw1 on), so ``import needle`` is the student's package
    (this project's needle for the judge's ``reference`` run); temporary files go to the
    scratch folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NEEDLE_BACKEND", "NEEDLE_IMPL")
    }
    env["PYTHONNOUSERSITE"] = "1"
    env["TMPDIR"] = str(scratch)
    env["COMPANION_CHECK_MEMORY"] = f"{limits.memory / GIB:g} GiB"
    if hw != "hw0" and not reference:
        env["NEEDLE_IMPL"] = str(root / "python")
    return env


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


_CHECKER_FRAMES = (f"{os.sep}companion{os.sep}check{os.sep}", "<frozen runpy>", 'File "<string>"')


def _tail(log_file: Path, lines: int = 15) -> str:
    """The end of a worker's output, without the checker's own frames (faulthandler's)."""
    kept = [
        line
        for line in log_file.read_text(errors="replace").splitlines()
        if not line.startswith("Extension modules:")
        and not any(frame in line for frame in _CHECKER_FRAMES)
    ]
    return "\n".join(kept[-lines:])


def _died(code: int | None, call: str, tail: str) -> str:
    """What a worker that ended in the middle of a step did."""
    if code is None:
        return f"the process ended{call} (its exit status is unknown); its last output:\n{tail}"
    if code < 0:
        return (
            f"the process {_signal_name(code)}{call} (a crash in compiled code: look for "
            f"an index or pointer out of bounds); its last output:\n{tail}"
        )
    return (
        f"the process exited with status {code}{call} without raising an exception: "
        "os._exit() or exit() in your code or in compiled code ends the whole program; "
        f"raise an exception instead. Its last output:\n{tail}"
    )


def _limit_text(box: Boxed, limits: Limits) -> str:
    """A sentence naming the limit the worker hit, or ''."""
    hit = box.status.get("limit")
    if hit is None and box.returncode == -signal.SIGXCPU:
        hit = "cpu"
    return limits.describe(hit, box.status.get("cpu_limit", 0.0)) + ". " if hit else ""


def _apply(event: dict, state: dict, ctx: dict) -> None:
    """One worker event into the round's state (current question, results, import problem)."""
    by_id, results = ctx["by_id"], ctx["results"]
    if "start" in event:
        if event["start"] == IMPORT_PROBE or event["start"] in by_id:
            state.update(current=event["start"], started=time.monotonic(), note="")
    elif "note" in event:
        state["note"] = str(event["note"])
    elif "imported" in event:
        state["current"] = None
    elif "import_error" in event:
        state.update(import_problem=("error", str(event["import_error"])), current=None)
    elif event.get("id") in by_id and event["id"] not in results:
        results[event["id"]] = _result(
            by_id[event["id"]],
            event,
            ctx["hw"],
            ctx["paths"],
            None if ctx["reference"] else ctx["allowed"],
        )
        if ctx["hw"] != "hw0" and isinstance(event.get("needle"), str):
            ctx["needle"] = ctx["needle"] or event["needle"]
        state["current"] = None


def _watch(box: Boxed, batch: list[str], state: dict, ctx: dict, timeout: float) -> None:
    """Follow one worker until it ends, all its answers are in, or a step overruns."""
    results = ctx["results"]
    while True:
        finished = box.finished()
        for event in box.events(0.02) + (box.drain() if finished else []):
            _apply(event, state, ctx)
        if finished:
            return
        if state["current"] is None and (
            state["import_problem"] or all(q in results for q in batch)
        ):
            # every answer is in: the worker ends now; give it a moment, then stop it
            state["done_at"] = state["done_at"] or time.monotonic()
            if time.monotonic() - state["done_at"] > EXIT_GRACE:
                return
        if state["current"] and time.monotonic() - state["started"] > timeout:
            state["timed_out"] = True
            return


def _round(tmp: Path, round_: int, batch: list[str], ctx: dict, opts: dict) -> None:
    """Run ``batch`` in one boxed worker; record what became of each question."""
    root, hw, limits, timeout = ctx["root"], ctx["hw"], opts["limits"], opts["timeout"]
    results, by_id = ctx["results"], ctx["by_id"]
    log_file = tmp / f"stderr{round_}.txt"
    scratch = tmp / f"scratch{round_}"
    scratch.mkdir()
    config = {
        "paths": ctx["paths"],
        "root": str(root),
        "hw": hw,
        "questions": batch,
        "scratch": str(scratch),
        "probe": True,
        "reference": ctx["reference"],  # else blind: the worker computes no expected value
    }
    cpu = limits.cpu if limits.cpu is not None else timeout * (len(batch) + 1)
    env = _worker_env(root, hw, scratch, limits, ctx["reference"])
    state = dict(current=None, started=0.0, note="", done_at=0.0)
    state.update(import_problem=None, timed_out=False)
    with open(log_file, "w") as log:
        box = Boxed(tmp, str(round_), root, config, env, limits, cpu, log)
        try:
            _watch(box, batch, state, ctx, timeout)
        finally:
            box.stop()  # the worker and whatever it started, setsid or not
            for event in box.drain():
                _apply(event, state, ctx)
            box.close()
    box.status["cpu_limit"] = cpu
    current, limit = state["current"], _limit_text(box, limits)
    if state["timed_out"] and current == IMPORT_PROBE:
        state["import_problem"] = (
            "timeout",
            (
                f"importing your package did not finish within {timeout:g} s (an endless loop "
                "or a long computation at import time?), so no question could run; its last "
                f"output:\n{_tail(log_file)}"
            ),
        )
    elif state["timed_out"]:
        results[current] = Result(
            by_id[current], "timeout", limit + f"still running after {timeout:g} s"
        )
    elif current == IMPORT_PROBE:
        state["import_problem"] = (
            "crashed",
            limit + "while importing your package, " + _died(box.returncode, "", _tail(log_file)),
        )
    elif current is not None and current not in results:
        call = f" during the call {state['note']}" if state["note"] else f" during {current}"
        results[current] = _crash_result(by_id[current], box, limit, call, log_file)
    ctx["import_problem"] = state["import_problem"]
    ctx["current"] = None if state["timed_out"] else current
    ctx["returncode"] = box.returncode


def _crash_result(question: Question, box: Boxed, limit: str, call: str, log_file: Path) -> Result:
    """A question whose worker died: a C++ stub's failed assertion is "not implemented"."""
    if box.returncode == -signal.SIGABRT:
        text = log_file.read_text(errors="replace")
        stub = [ln for ln in text.splitlines() if "Not Implemented" in ln and "ssert" in ln]
        if stub:
            return Result(
                question,
                "not implemented",
                (
                    f"a C++ function is still the course's stub: its `assert(false && \"Not "
                    f'Implemented")` failed{call}, which aborts the process:\n  {stub[-1].strip()}'
                ),
            )
    return Result(question, "crashed", limit + _died(box.returncode, call, _tail(log_file)))


def run_questions(
    root: Path,
    hw: str,
    questions: list[Question],
    *,
    timeout: float = 120.0,
    isolate: bool = False,
    limits: Limits | None = None,
    reference: bool = False,
) -> tuple[list[Result], str | None]:
    """Run ``questions`` in boxed worker processes; returns the results and the needle file.

    Each worker first imports the student's package (the import probe, with the same time
    limit as a question): if that hangs, exits or raises, every question gets that one
    diagnosis and nothing more runs. ``isolate`` starts one worker per question (slower; the
    default restarts a worker only after a crash or a timeout). A question the worker passed
    is judged here (``judge.py``) from the values it sent, against the reference run's expected
    values; ``reference`` is that run (this project's needle in ``root``: no judging).
    """
    paths = search_paths(root, hw)
    ctx = {
        "root": root,
        "hw": hw,
        "paths": paths,
        "by_id": {q.id: q for q in questions},
        "allowed": [os.path.abspath(p) for p in paths],
        "results": {},
        "needle": None,
        "reference": reference,
    }
    opts = {"limits": limits or Limits(), "timeout": timeout}
    with tempfile.TemporaryDirectory(prefix="companion-check-") as tmp:
        remaining = [q.id for q in questions]
        round_ = 0
        while remaining:
            round_ += 1
            _round(Path(tmp), round_, remaining[:1] if isolate else remaining, ctx, opts)
            remaining = _after_round(Path(tmp), round_, remaining, ctx)
    results = [ctx["results"][q.id] for q in questions]
    if not reference:
        _judge_passes(results, hw, timeout)
    return results, ctx["needle"]


def _after_round(tmp: Path, round_: int, remaining: list[str], ctx: dict) -> list[str]:
    """The questions still to run after a round (none after an import problem, which every
    question left gets, or when the checker itself could not start)."""
    results, by_id = ctx["results"], ctx["by_id"]
    left = [q for q in remaining if q not in results]
    if ctx["import_problem"] is not None:
        status, detail = ctx["import_problem"]
        for qid in left:
            results[qid] = Result(by_id[qid], status, detail)
        return []
    if left and left[0] == remaining[0] and ctx["current"] is None and ctx["returncode"]:
        # The worker died before starting anything (the checker itself is broken).
        for qid in left:
            results[qid] = Result(
                by_id[qid],
                "error",
                "the checker could not start:\n" + _tail(tmp / f"stderr{round_}.txt"),
            )
        return []
    return left


_JUDGED = ("pass", "fail", "error")  # a "not implemented" stays one (blank skeletons)


def _judge_passes(results: list[Result], hw: str, timeout: float) -> None:
    """Decide every claimed pass, and find the cause of every failure, from the values its
    worker sent (``judge.judge``): a blind worker cannot notice a wrong value, so a question
    that failed after one reports that value, not what followed from it."""
    judged = [r for r in results if r.status in _JUDGED and (r.status == "pass" or r.claims)]
    if not judged:
        return
    expected = references(hw, [r.question.id for r in judged], timeout)
    for r in judged:
        reference = expected[r.question.id]
        complete = r.status == "pass"
        if isinstance(reference, str):
            if complete:
                r.status, r.warnings = "error", []
                r.detail = (
                    "the checker's judge could not compute this question's expected values "
                    f"with this project's own needle, so it cannot pass here "
                    f"({reference.splitlines()[0]})"
                )
            r.claims = []
            continue
        try:
            problem, warnings = judge(r.claims, reference, complete=complete)
        except Malformed as exc:
            problem = f"what your process sent is not well-formed values ({exc})"
            problem, warnings = (problem if complete else None), []
        if problem is not None and r.stubs:  # wrong because a blank function ran
            first = problem.strip().splitlines()[0]
            r.status, r.detail, r.warnings = "not implemented", named_stubs(r.stubs, first), []
        elif problem is not None:
            r.status, r.detail, r.warnings = "fail", problem, []
        elif complete:
            r.warnings = r.warnings + warnings
        r.claims = []


def _result(
    question: Question, event: dict, hw: str, paths: list[str], allowed: list[str] | None
) -> Result:
    """A worker's verdict: the needle came from the homework folder (``allowed``: None for the
    reference run), and a pass carries the values to judge (``claims``)."""
    status, detail = str(event.get("status")), str(event.get("detail", ""))
    if status not in ("pass", "fail", "not implemented", "error"):
        status, detail = "error", f"the worker sent an unknown status {status!r}"
    warnings = event.get("warnings") if status == "pass" else []
    if not isinstance(warnings, list):
        warnings = []
    result = Result(question, status, detail, [str(w) for w in warnings])
    where = event.get("needle") if hw != "hw0" else None  # hw0 has no needle of its own
    if (
        allowed is not None
        and where
        and not any(os.path.abspath(str(where)).startswith(a) for a in allowed)
    ):
        result.status, result.detail = (
            "error",
            (f"imported needle from {where}, not from {' or '.join(paths)}: fix the layout"),
        )
    elif result.status == "pass" and not event.get("comparisons"):
        result.status, result.detail, result.warnings = (
            "error",
            (
                "the worker claimed a pass without a single comparison to judge (every "
                "question compares values): something other than the checker wrote this verdict"
            ),
            [],
        )
    elif result.status in _JUDGED:
        comparisons = event.get("comparisons") or []
        result.claims = comparisons if isinstance(comparisons, list) else [comparisons]
        stubs = event.get("stubs")
        result.stubs = [str(n) for n in stubs] if isinstance(stubs, list) else []
    return result


def check(
    root: str | Path,
    hw: str | None = None,
    *,
    only: list[str] | None = None,
    timeout: float = 120.0,
    isolate: bool = False,
    do_build: bool = True,
    build_timeout: float = BUILD_TIMEOUT,
    limits: Limits | None = None,
) -> Report:
    """Build and check the homework folder ``root``; ``only`` keeps questions whose id contains
    one of its strings; ``timeout`` (seconds, > 0) limits each question and the import,
    ``build_timeout`` each build step; ``limits`` bound each worker's memory, CPU time and
    processes (``boxed.Limits``)."""
    if not timeout > 0 or not build_timeout > 0:
        raise ValueError(
            f"timeouts must be positive numbers of seconds, got timeout={timeout}, "
            f"build_timeout={build_timeout}"
        )
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    hw = hw or detect_homework(root)
    questions = questions_for(hw)
    if only:
        questions = [q for q in questions if any(s in q.id for s in only)]
        if not questions:
            raise ValueError(f"no {hw} question matches {only}")
    expected = root / ("src/simple_ml.py" if hw == "hw0" else "python/needle/__init__.py")
    if not expected.exists():
        raise FileNotFoundError(
            f"{expected} is missing: {root} does not have the course's {hw} layout"
        )
    report = Report(hw, root, sandbox=describe_box(limits or Limits(), timeout))
    if do_build:
        report.build = build(root, hw, build_timeout)
    report.results, report.needle = run_questions(
        root, hw, questions, timeout=timeout, isolate=isolate, limits=limits
    )
    return report
