"""The runner's side of one worker in its box (``sandbox.py``): start, read events, stop.

The worker's events come through a pipe the runner created (no file the worker could append
to, none named in its config); the launcher's final status through a second pipe that the
worker never holds. Resource limits are ``Limits``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

WORKER = "companion.check.worker"
SANDBOX = Path(__file__).resolve().with_name("sandbox.py")  # a script: it imports no companion
HOME = Path(__file__).resolve().parents[2]  # the folder holding this checker's companion/
GIB = 1 << 30
# The worker runs this checker (the runner's), not whatever ``companion`` the interpreter would
# find first (an editable install of another checkout, say).
_BOOT = """
import importlib.util, runpy, sys
home = sys.argv[1]
for name in [m for m in sys.modules if m == "companion" or m.startswith("companion.")]:
    del sys.modules[name]
spec = importlib.util.spec_from_file_location(
    "companion", home + "/companion/__init__.py", submodule_search_locations=[home + "/companion"])
module = importlib.util.module_from_spec(spec)
sys.modules["companion"] = module
spec.loader.exec_module(module)
sys.argv = [home + "/companion/check/worker.py"] + sys.argv[2:]
runpy.run_module("companion.check.worker", run_name="__main__", alter_sys=True)
"""


@dataclass
class Limits:
    """Per-worker limits: ``memory`` bytes (RLIMIT_DATA), ``cpu`` seconds (RLIMIT_CPU; default:
    the question time limit per question, plus one for the import), ``processes`` (descendants
    at once)."""

    memory: int = 4 * GIB
    cpu: float | None = None
    processes: int = 64

    def __post_init__(self) -> None:
        if (
            not self.memory > 0
            or not self.processes > 0
            or (self.cpu is not None and not self.cpu > 0)
        ):
            raise ValueError(f"limits must be positive, got {self}")

    def describe(self, what: str, cpu: float) -> str:
        """What hitting limit ``what`` (memory, cpu, processes) means, in one sentence."""
        if what == "cpu":
            return (
                f"the worker used its CPU-time limit of {cpu:g} s (RLIMIT_CPU) and was "
                "stopped: an endless loop, or threads burning CPU?"
            )
        if what == "processes":
            return (
                f"the worker started more than {self.processes} processes at once (a fork "
                "bomb?) and was stopped with all of them"
            )
        return f"the worker reached its memory limit of {self.memory / GIB:g} GiB (RLIMIT_DATA)"


def describe_box(limits: Limits, timeout: float) -> str:
    """One line saying what the box enforces here (for the report)."""
    from .sandbox import landlock_abi

    abi = landlock_abi()
    cpu = f"{limits.cpu:g} s" if limits.cpu is not None else f"{timeout:g} s a question"
    files = (
        "files may be changed only under the homework and scratch folders (Landlock ABI "
        f"{abi}{', no signals out of the box' if abi >= 6 else ''})"
        if abi
        else "writes outside the homework folder are NOT blocked (this kernel has no Landlock)"
    )
    return (
        f"each worker: memory {limits.memory / GIB:g} GiB (RLIMIT_DATA), CPU {cpu} "
        f"(RLIMIT_CPU), at most {limits.processes} processes, all ended with it; {files}. "
        "Verdicts are the judge's: the process beside your code computes no expected value "
        "(it only sends the values your code produced); the judge compares them with expected "
        "values computed in a process that never runs your code, so patching numpy or the "
        "checker, writing forged results, or reading the checker's memory does not pass."
    )


class Boxed:
    """One worker under ``sandbox.py``: ``events(wait)`` gives its decoded JSON lines,
    ``stop()`` ends it and everything it started, ``status`` is the launcher's report."""

    def __init__(
        self,
        tmp: Path,
        tag: str,
        root: Path,
        config: dict,
        env: dict,
        limits: Limits,
        cpu: float,
        log,
    ) -> None:
        config_path = tmp / f"config{tag}.json"
        config_path.write_text(json.dumps(config))
        events_r, events_w = os.pipe()
        status_r, status_w = os.pipe()
        spec = {
            "argv": [sys.executable, "-c", _BOOT, str(HOME), str(config_path), str(events_w)],
            "env": env,
            "writable": [str(root), config["scratch"]],
            "limits": {"memory": limits.memory, "cpu": cpu, "processes": limits.processes},
            "worker_fd": events_w,
        }
        spec_path = tmp / f"sandbox{tag}.json"
        spec_path.write_text(json.dumps(spec))
        self.proc = subprocess.Popen(
            [sys.executable, str(SANDBOX), str(spec_path), str(status_w)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(events_w, status_w),
            start_new_session=True,
        )
        os.close(events_w)
        os.close(status_w)
        self._events, self._status_fd = events_r, status_r
        self._buffer = b""
        self._eof = False
        self.status: dict = {}

    def events(self, wait: float) -> list[dict]:
        """The complete event lines that arrived within ``wait`` seconds (lines that are not
        JSON objects are dropped: they are not the checker's)."""
        if self._eof:
            return []
        ready, _, _ = select.select([self._events], [], [], wait)
        if not ready:
            return []
        chunk = os.read(self._events, 1 << 20)
        if not chunk:
            self._eof = True
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def drain(self) -> list[dict]:
        """Every event still in the pipe (after the worker ended)."""
        out: list[dict] = []
        while not self._eof:
            got = self.events(0.5)
            if not got and not self._eof:
                ready, _, _ = select.select([self._events], [], [], 0)
                if not ready:
                    break
            out += got
        return out

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        """End the worker and everything it started (the launcher kills the whole tree), then
        read the launcher's status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.proc.wait()
        text = b""
        while select.select([self._status_fd], [], [], 0)[0]:
            chunk = os.read(self._status_fd, 1 << 16)
            if not chunk:
                break
            text += chunk
        for line in text.splitlines():
            try:
                self.status.update(json.loads(line))
            except (ValueError, TypeError):
                continue
        if "returncode" not in self.status and "worker" in self.status:
            try:  # the launcher died before cleaning up: end the worker's session at least
                os.killpg(int(self.status["worker"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass

    def close(self) -> None:
        for fd in (self._events, self._status_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def returncode(self) -> int | None:
        """The worker's exit status (negative: killed by that signal), None if unknown."""
        return self.status.get("returncode")
