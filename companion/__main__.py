"""The student commands without ``make``: ``python -m companion <command> [NAME=value ...]``.

Each command takes the arguments of the make target of the same name, written the same way
(``make check HW=~/hw2 Q=softmax`` is ``python -m companion check HW=~/hw2 Q=softmax``), and
also the underlying tool's own options after them (``python -m companion check ~/hw2 --list``).
It works wherever this package is installed: in a checkout's venv, in Colab
(``!python -m companion check /content/drive/MyDrive/10714/hw1``), on machines without GNU make.

    check           HW=path/to/hwN [Q=text] [HWNUM=hwN] [ARGS=...]   (companion.check)
    progress        [HW=path]                                          (companion.check --progress)
    where           [Q=hw2_sgd]                                        (companion.where)
    lecture-report  NEEDLE_IMPL=path/to/hwN/python [NB=notebook]      (companion.report_card)
    bench           [NEEDLE_IMPL=path/to/hwN/python]                  (benchmarks; a checkout's)
    profile         [NEEDLE_IMPL=path/to/hwN/python]                  (companion.step_profile)
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

#: Each command's make variables (``NAME=value`` words it accepts).
VARIABLES = {
    "check": ("HW", "Q", "HWNUM", "ARGS"),
    "progress": ("HW",),
    "where": ("Q",),
    "lecture-report": ("NEEDLE_IMPL", "NB"),
    "bench": ("NEEDLE_IMPL",),
    "profile": ("NEEDLE_IMPL",),
}


def split_variables(command: str, words: List[str]) -> Tuple[Dict[str, str], List[str]]:
    """(the ``NAME=value`` words that are ``command``'s make variables, the other words)."""
    known = VARIABLES[command]
    found: Dict[str, str] = {}
    rest: List[str] = []
    for word in words:
        name, eq, value = word.partition("=")
        if eq and name in known:
            found[name] = value
        elif eq and name.isupper() and name.replace("_", "").isalpha():
            raise SystemExit(
                f"python -m companion {command}: unknown variable {name} "
                f"(it takes {', '.join(known)})"
            )
        else:
            rest.append(word)
    return found, rest


def _path(text: str) -> str:
    """``text`` with ``~`` expanded and made absolute (as the Makefile does)."""
    return os.path.abspath(os.path.expanduser(text.strip()))


def plan(command: str, words: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """(the ``python -m ...`` arguments after the interpreter, environment additions) that
    ``command`` with ``words`` runs; SystemExit with a usage line when a required one is
    missing."""
    if command not in VARIABLES:
        raise SystemExit(
            f"python -m companion: unknown command {command!r} (commands: {', '.join(VARIABLES)})"
        )
    var, rest = split_variables(command, words)
    env: Dict[str, str] = {}
    if var.get("NEEDLE_IMPL", "").strip():
        env["NEEDLE_IMPL"] = _path(var["NEEDLE_IMPL"])
    if command == "check":
        hw = [var["HW"]] if var.get("HW") else []
        if not hw and not any(not w.startswith("-") for w in rest):
            raise SystemExit(
                "usage: python -m companion check HW=path/to/hwN [Q=text] [HWNUM=hwN] [ARGS=...]"
            )
        args = hw + (["-k", var["Q"]] if var.get("Q") else [])
        args += ["--hw", var["HWNUM"]] if var.get("HWNUM") else []
        return ["-m", "companion.check", *args, *shlex.split(var.get("ARGS", "")), *rest], env
    if command == "progress":
        return ["-m", "companion.check", "--progress", var.get("HW") or ".", *rest], env
    if command == "where":
        return ["-m", "companion.where", *([var["Q"]] if var.get("Q") else []), *rest], env
    if command == "lecture-report":
        if "NEEDLE_IMPL" not in env:
            raise SystemExit(
                "usage: python -m companion lecture-report NEEDLE_IMPL=path/to/hwN/python "
                "[NB=notebooks/NN_topic.py]"
            )
        nb = [var["NB"]] if var.get("NB") else []
        return ["-m", "companion.report_card", *nb, *rest], env
    student = "NEEDLE_IMPL" in env
    if command == "bench":
        return ["-m", "benchmarks.student" if student else "benchmarks", *rest], env
    if student:  # profile on a student's needle: the step part of the student benchmark
        return ["-m", "benchmarks.student", "--step-only", *rest], env
    return ["-m", "companion.step_profile", *rest], env


def main(argv: Optional[List[str]] = None) -> int:
    """Run one command in a child Python (so ``NEEDLE_IMPL`` takes effect at its start-up);
    its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    args, extra_env = plan(argv[0], argv[1:])
    if args[1].startswith("benchmarks"):
        import importlib.util

        if importlib.util.find_spec("benchmarks") is None:
            print(
                f"python -m companion {argv[0]}: needs this project's checkout (its benchmarks/ "
                "folder is not part of the installed package); run it from the checkout",
                file=sys.stderr,
            )
            return 2
    env = dict(os.environ, **extra_env)
    # The notebooks' kernels (lecture-report) are this interpreter's environment's.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if argv[0] == "lecture-report":  # the notebooks choose their own matplotlib backend
        env.pop("MPLBACKEND", None)
    return subprocess.call([sys.executable, *args], env=env)


if __name__ == "__main__":
    sys.exit(main())
