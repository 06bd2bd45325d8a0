"""Run a homework's questions against a student's folder and write the report.

The folder has the course's skeleton layout: ``hw0/src/simple_ml.py`` (+ ``simple_ml_ext.cpp``)
for hw0, ``hwN/python/needle/...``, ``hwN/apps/...`` and ``hwN/src/*.cc|*.cu`` (with the course's
``CMakeLists.txt``) for the others. Compiled sources are built the way the course's Makefile
does; then a worker process (``worker.py``) runs the questions in order. A worker that dies
(segfault, abort) or overruns the time limit costs only the question it was running: a fresh
worker continues with the rest.
"""
from __future__ import annotations

import json
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

from .questions import HOMEWORKS, Question, questions_for

WORKER = "companion.check.worker"


@dataclass
class Result:
    """The outcome of one question: ``status`` is pass, fail, not implemented, crashed or timeout."""

    question: Question
    status: str
    detail: str = ""


@dataclass
class Report:
    """Everything ``make check`` prints: the build log, one result per question."""

    hw: str
    root: Path
    build: list[str] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    needle: str | None = None

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
        width = max((len(r.question.id) for r in self.results), default=10)
        for r in self.results:
            tag = "pass" if r.status == "pass" else r.status.upper() if r.status in (
                "fail", "crashed", "timeout") else r.status
            lines.append(f"  {tag:<16} {r.question.id:<{width}}  {r.question.title}")
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        order = ("pass", "fail", "not implemented", "crashed", "timeout", "error")
        lines.append(", ".join(f"{counts[s]} {s}" for s in order if s in counts))
        for r in self.results:
            if r.status != "pass" and r.detail:
                lines += ["", f"== {r.question.id} ({r.status}): {r.question.title}",
                          "  " + r.detail.replace("\n", "\n  ")]
        return "\n".join(lines)


def detect_homework(root: Path) -> str:
    """The homework a folder holds, from its name (``hw2``, ``hw4_extra``, ``.../hw3-main``)."""
    match = re.search(r"(hw4_extra|hw[0-4])", root.resolve().name)
    if not match:
        raise ValueError(f"cannot tell which homework {root} is from its name; pass --hw "
                         f"({', '.join(HOMEWORKS)})")
    return match.group(1)


def search_paths(root: Path, hw: str) -> list[str]:
    """The folders the course's tests put on sys.path for this homework."""
    if hw == "hw0":
        return [str(root / "src")]
    return [str(root / "python"), str(root / "apps")]


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[bool, str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def _build_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def build(root: Path, hw: str) -> list[str]:
    """Compile the student's C++/CUDA as the course's Makefile does; a line per step."""
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
        includes = ["-I" + pybind11.get_include(),
                    "-I" + __import__("sysconfig").get_paths()["include"]]
        ok, log = _run([compiler, "-O3", "-Wall", "-shared", "-std=c++11", "-fPIC", *includes,
                        "src/simple_ml_ext.cpp", "-o", "src/simple_ml_ext.so"], root, env)
        return ["built src/simple_ml_ext.so" if ok else "FAILED to build src/simple_ml_ext.cpp:\n"
                + log]
    if not (root / "CMakeLists.txt").exists():
        return ["no CMakeLists.txt: nothing to build"]
    if shutil.which("cmake") is None and not (Path(sys.executable).parent / "cmake").exists():
        return ["cmake not found: C++/CUDA sources not built"]
    import pybind11
    cmake = shutil.which("cmake", path=env["PATH"])
    (root / "build").mkdir(exist_ok=True)
    ok, log = _run([cmake, "..", f"-DPython_EXECUTABLE={sys.executable}",
                    f"-DPYTHON_EXECUTABLE={sys.executable}",
                    f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"], root / "build", env)
    if ok:
        ok, log = _run([cmake, "--build", ".", "-j", "2"], root / "build", env)
    return ["built with CMake (build/)" if ok else "FAILED to build with CMake:\n" + log]


def _worker_env(root: Path, hw: str) -> dict:
    """The worker's environment: no outside paths or backend choice; ``NEEDLE_IMPL`` names the
    homework's ``python/`` folder (hw1 on), so ``import needle`` is the student's package."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "NEEDLE_BACKEND",
                        "NEEDLE_IMPL")}
    env["PYTHONNOUSERSITE"] = "1"
    if hw != "hw0":
        env["NEEDLE_IMPL"] = str(root / "python")
    return env


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def run_questions(root: Path, hw: str, questions: list[Question], *, timeout: float = 120.0,
                  isolate: bool = False) -> tuple[list[Result], str | None]:
    """Run ``questions`` in worker processes; returns the results and the needle file imported.

    ``isolate`` starts one worker per question (slower; the default restarts a worker only
    after a crash or a timeout).
    """
    by_id = {q.id: q for q in questions}
    results: dict[str, Result] = {}
    needle_file = None
    paths = search_paths(root, hw)
    allowed = [os.path.abspath(p) for p in paths]
    with tempfile.TemporaryDirectory(prefix="companion-check-") as tmp:
        remaining = [q.id for q in questions]
        round_ = 0
        while remaining:
            round_ += 1
            batch = remaining[:1] if isolate else remaining
            result_file = Path(tmp) / f"results{round_}.jsonl"
            log_file = Path(tmp) / f"stderr{round_}.txt"
            config = Path(tmp) / f"config{round_}.json"
            scratch = Path(tmp) / f"scratch{round_}"
            scratch.mkdir()
            config.write_text(json.dumps({"paths": paths, "root": str(root), "hw": hw,
                                          "questions": batch, "results": str(result_file),
                                          "scratch": str(scratch)}))
            result_file.touch()
            with open(log_file, "w") as log:
                proc = subprocess.Popen([sys.executable, "-m", WORKER, str(config)], cwd=root,
                                        env=_worker_env(root, hw), stdout=log,
                                        stderr=subprocess.STDOUT)
                current, started, seen, note = None, 0.0, 0, ""
                while True:
                    finished = proc.poll() is not None
                    # Every event ends with a newline: the last fragment may be half written.
                    complete = result_file.read_text().split("\n")[:-1]
                    for line in complete[seen:]:
                        event = json.loads(line)
                        if "start" in event:
                            current, started = event["start"], time.monotonic()
                            note = ""
                        elif "note" in event:
                            note = event["note"]
                        else:
                            results[event["id"]] = Result(by_id[event["id"]], event["status"],
                                                          event["detail"])
                            # hw0 has no needle of its own: whichever one it imports is fine
                            where = event.get("needle") if hw != "hw0" else None
                            if where:
                                needle_file = needle_file or where
                                if not any(os.path.abspath(where).startswith(a) for a in allowed):
                                    r = results[event["id"]]
                                    r.status, r.detail = "error", (
                                        f"imported needle from {where}, not from "
                                        f"{' or '.join(paths)}: fix the layout")
                            current = None
                    seen = len(complete)
                    if finished:
                        break
                    if current and time.monotonic() - started > timeout:
                        proc.kill()
                        proc.wait()
                        results[current] = Result(by_id[current], "timeout",
                                                  f"still running after {timeout:.0f} s")
                        current = None
                        break
                    time.sleep(0.02)
            if current is not None and current not in results:
                tail = "\n".join(line for line in log_file.read_text(
                    errors="replace").splitlines()[-15:]
                    if not line.startswith("Extension modules:"))
                call = f" during the call {note}" if note else ""
                results[current] = Result(by_id[current], "crashed",
                                          f"the process {_signal_name(proc.returncode)}{call} "
                                          "(a crash in compiled code: look for an index or "
                                          f"pointer out of bounds); its last output:\n{tail}")
            left = [q for q in remaining if q not in results]
            if left and left[0] == remaining[0] and current is None and proc.returncode:
                # The worker died before starting anything (for example a broken import).
                tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
                for qid in left:
                    results[qid] = Result(by_id[qid], "error", f"the checker could not start:\n"
                                          f"{tail}")
                left = []
            remaining = left
    return [results[q.id] for q in questions], needle_file


def check(root: str | Path, hw: str | None = None, *, only: list[str] | None = None,
          timeout: float = 120.0, isolate: bool = False, do_build: bool = True) -> Report:
    """Build and check the homework folder ``root``; ``only`` keeps questions whose id contains
    one of its strings."""
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
        raise FileNotFoundError(f"{expected} is missing: {root} does not have the course's "
                                f"{hw} layout")
    report = Report(hw, root)
    if do_build:
        report.build = build(root, hw)
    report.results, report.needle = run_questions(root, hw, questions, timeout=timeout,
                                                  isolate=isolate)
    return report
