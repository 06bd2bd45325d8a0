"""Colab, simulated (`make test-colab`): the set-up cell installs needle, every notebook runs on it.

What Colab has, made here: a fresh Python 3.13 environment (Colab's Python since August 2026)
with numpy, matplotlib and ipykernel preinstalled (plus nbclient/nbformat to drive the kernel),
no checkout beside the notebooks, and no `make` (a `make` on PATH that fails). The repository
is a git clone of this checkout's HEAD (commit first: uncommitted changes are not in it), given
to the set-up cell by NEEDLE_COLAB_REPO; NEEDLE_COLAB_SIMULATE=1 makes the cell act as in Colab and
NEEDLE_COLAB_GPU_CAP=7.5 stands for a T4, so where nvcc exists the CUDA module is compiled for
sm_75 (and never run: there is no GPU here). The install is held to the clone's lock for that
Python (locks/py3.13.txt): the set-up cell must say so.

Each notebook is executed from a folder outside any checkout; the first one's set-up cell does the
install (its time is reported), the later ones find needle installed. Notebooks 05 and 06 are
the ones that read what a checkout has beside needle (the kernel sources of src/, the machine
description, the step profiler and its saved profile): they run from the wheel's copies. Then
the installed files are checked: every file of needle/ and companion/ in the clone, every file
of src/ as companion/src/, the compiled modules, the NEEDLE_IMPL .pth; and the student commands
run from the notebooks' folder, outside any checkout, on a course-layout copy of the installed
needle: ``python -m companion check``, ``progress`` and ``lecture-report``. Exits non-zero,
naming the problem, on any failure.

    python tests/build/colab_simulation.py [--python PATH] [--notebooks 01_x 02_y]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[2]
#: Every lecture notebook, in order (01 installs; 12 then adds the lectures extra).
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PREINSTALLED = ["numpy>=2", "matplotlib", "ipykernel", "nbclient", "nbformat"]
T4 = "7.5"

EXECUTE = r"""
import json, pathlib, sys, time
import nbclient, nbformat
path, out = sys.argv[1], sys.argv[2]
nb = nbformat.read(path, as_version=4)
start = time.time()
folder = str(pathlib.Path(path).parent)
nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3",
                        resources={"metadata": {"path": folder}}).execute()
code = [c for c in nb.cells if c.cell_type == "code"]
setup = code[0]
times = setup.metadata.get("execution", {})
text = "".join(o.get("text", "") for o in setup.outputs if o.get("output_type") == "stream")
json.dump({"seconds": time.time() - start, "setup_output": text, "setup_timing": times,
           "cells": len(code)}, open(out, "w"))
"""


COLAB_PYTHON = "3.13"


def find_python() -> str:
    """A Python 3.13 interpreter (Colab's): pyenv's, else python3.13 on PATH."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        root = os.path.expanduser("~/.pyenv")
    pattern = os.path.join(root, "versions", f"{COLAB_PYTHON}.*", "bin", "python3")
    found = sorted(glob.glob(pattern))
    if found:
        return found[-1]
    path = shutil.which(f"python{COLAB_PYTHON}")
    if path:
        return path
    raise SystemExit(
        f"colab simulation: no Python {COLAB_PYTHON} found (pyenv versions/{COLAB_PYTHON}.*, "
        f"python{COLAB_PYTHON}); pass --python"
    )


def run(cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` (printed first); raise with its output when it fails."""
    print("+", " ".join(str(c) for c in cmd), flush=True)
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if done.returncode:
        raise SystemExit(
            f"colab simulation: {cmd[0]} failed ({done.returncode}):\n"
            f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done


def clean_env(venv: Path, nomake: Path) -> dict:
    """The environment of the simulated Colab: no variables of this checkout's venv, the new
    venv's bin and a failing `make` first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("NEEDLE_", "PYTHON", "VIRTUAL_ENV", "MAKE", "MFLAGS", "JUPYTER", "PIP_CONSTRAINT")
        )
    }
    path = [
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ROOT)
    ]
    env["PATH"] = os.pathsep.join([str(nomake), str(venv / "bin")] + path)
    env["MPLBACKEND"] = "agg"
    return env


def installed_problems(venv_python: Path, clone: Path, env: dict, nvcc: bool) -> List[str]:
    """What the installed needle lacks: a file of the clone's needle/ or companion/ (tracked,
    compiled modules aside), a file of its src/ as companion/src/ (the kernel sources notebooks
    print), a compiled module, the .pth; or needle imported from elsewhere."""
    probe = (
        "import json, sysconfig, needle, companion; "
        "print(json.dumps([sysconfig.get_paths()['purelib'], needle.__file__, "
        "needle.cuda().mod is not None]))"
    )
    purelib, needle_file, cuda_built = json.loads(
        run([venv_python, "-c", probe], env=env, cwd=clone.parent).stdout
    )
    site = Path(purelib)
    problems = []
    if not Path(needle_file).is_relative_to(site):
        problems.append(f"needle imported from {needle_file}, not from {site}")
    tracked = run(["git", "-C", clone, "ls-files", "needle", "companion"]).stdout.split()
    missing = [f for f in tracked if not (site / f).is_file()]
    if missing:
        problems.append(
            f"{len(missing)} files of the repository missing from the install: {missing[:8]}"
        )
    sources = run(["git", "-C", clone, "ls-files", "src"]).stdout.split()
    unshipped = [f for f in sources if not (site / "companion" / f).is_file()]
    if not sources or unshipped:
        problems.append(f"src/ files not shipped as companion/src/: {unshipped[:8] or 'none'}")
    wanted = {
        "needle/backend_ndarray/ndarray_backend_cpu": True,
        "companion/apps/simple_ml_ext": True,
        "needle/backend_ndarray/ndarray_backend_cuda": nvcc,
    }
    for stem, required in wanted.items():
        have = glob.glob(str(site / (stem + "*.so")))
        if required and not have:
            problems.append(f"compiled module {stem} not installed")
    if nvcc and not cuda_built:
        problems.append("nvcc exists but needle.cuda() has no compiled module")
    if not (site / "companion_needle_impl.pth").is_file():
        problems.append("companion_needle_impl.pth (NEEDLE_IMPL) not installed")
    return problems


def student_command_problems(vpy: Path, work: Path, env: dict) -> List[str]:
    """Run ``python -m companion check|progress|lecture-report`` from ``work`` (outside any
    checkout) on ``work/hw1``, a course-layout copy of the installed needle; what went wrong."""
    probe = "import needle, os; print(os.path.dirname(needle.__file__))"
    package = Path(run([vpy, "-c", probe], env=env, cwd=work.parent).stdout.strip())
    shutil.copytree(package, work / "hw1" / "python" / "needle")
    problems = []
    commands = {
        "check": ["check", "HW=hw1", "Q=divide"],
        "progress": ["progress", "HW=hw1"],
        "lecture-report": [
            "lecture-report",
            "NEEDLE_IMPL=hw1/python",
            "NB=01_softmax_regression.ipynb",
        ],
    }
    wanted = {"check": "pass", "progress": "hw1", "lecture-report": "01_softmax_regression"}
    for name, args in commands.items():
        print("+ python -m companion", " ".join(args), flush=True)
        done = subprocess.run(
            [str(vpy), "-m", "companion", *args], cwd=work, env=env, capture_output=True, text=True
        )
        print(done.stdout[-1500:], flush=True)
        if done.returncode or wanted[name] not in done.stdout:
            problems.append(
                f"python -m companion {name} failed outside the checkout ({done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    """The command line (see the module docstring); 0 when the simulation passes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="the Python 3.13 interpreter (default: pyenv's)")
    parser.add_argument("--notebooks", nargs="+", default=NOTEBOOKS)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary folder (clone, venv, executed notebooks)",
    )
    args = parser.parse_args(argv)
    python = args.python or find_python()
    nvcc = shutil.which("nvcc") is not None
    head = run(["git", "-C", ROOT, "rev-parse", "HEAD"]).stdout.strip()
    if args.keep:
        tmp = tempfile.mkdtemp(prefix="needle-colab-")
        print(f"keeping {tmp}")
        return simulate(Path(tmp), python, args.notebooks, nvcc, head)
    with tempfile.TemporaryDirectory(prefix="needle-colab-") as tmp:
        return simulate(Path(tmp), python, args.notebooks, nvcc, head)


def run_notebooks(vpy: Path, clone: Path, work: Path, notebooks: List[str], env: dict) -> list:
    """[(name, result)] of each notebook executed in the simulated Colab, in order."""
    (work / "execute.py").write_text(EXECUTE)
    report = []
    for name in notebooks:
        shutil.copy(clone / "notebooks" / f"{name}.ipynb", work / f"{name}.ipynb")
        out = work / f"{name}.json"
        run([vpy, work / "execute.py", work / f"{name}.ipynb", out], env=env, cwd=work)
        result = json.loads(out.read_text())
        report.append((name, result))
        print(
            f"{name}: {result['cells']} code cells ran without error in "
            f"{result['seconds']:.0f} s; set-up cell said: {result['setup_output'].strip()!r}",
            flush=True,
        )
    return report


def simulate(tmp: Path, python: str, notebooks: List[str], nvcc: bool, head: str) -> int:
    """Clone, make the venv, run the notebooks (the first installs needle), check the install."""
    clone, venv, work, nomake = tmp / "repo", tmp / "venv", tmp / "content", tmp / "nomake"
    (tmp / "tmp").mkdir()
    run(["git", "clone", "-q", "--no-checkout", ROOT, clone])
    run(["git", "-C", clone, "checkout", "-q", "-B", "colab-simulation", head])
    work.mkdir()
    nomake.mkdir()
    (nomake / "make").write_text(
        "#!/bin/sh\necho 'make: not in this simulated Colab' >&2\nexit 127\n"
    )
    (nomake / "make").chmod(0o755)
    env = clean_env(venv, nomake)
    run([python, "-m", "venv", venv], env=env)
    vpy = venv / "bin" / "python"
    run([vpy, "-m", "pip", "install", "-q"] + PREINSTALLED, env=env)
    sim = dict(
        env,
        NEEDLE_COLAB_SIMULATE="1",
        NEEDLE_COLAB_REPO=str(clone),
        NEEDLE_COLAB_GPU_CAP=T4,
        CMAKE_BUILD_PARALLEL_LEVEL="2",
        TMPDIR=str(tmp / "tmp"),  # the set-up cell clones into $TMPDIR/needle-companion
    )
    report = run_notebooks(vpy, clone, work, notebooks, sim)
    first = report[0][1]["setup_output"]
    problems = []
    if "needle installed:" not in first:
        problems.append(f"the first notebook's set-up cell did not install needle: {first!r}")
    version = run([vpy, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()
    if f"versions of locks/py{version}.txt" not in first:
        problems.append(f"the set-up cell did not install with the lock of Python {version}")
    for name, result in report[1:]:
        if not result["setup_output"].startswith("needle is installed"):
            problems.append(f"{name}'s set-up cell installed again: {result['setup_output']!r}")
    problems += installed_problems(vpy, clone, env, nvcc)
    problems += student_command_problems(vpy, work, env)
    timing = report[0][1]["setup_timing"]
    if "shell.execute_reply" in timing and "iopub.execute_input" in timing:
        t0 = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
        print(
            f"set-up cell (pip install, {'CPU + CUDA sm_75' if nvcc else 'CPU only'} build, "
            f"{os.cpu_count()} cores): {(t1 - t0).total_seconds():.0f} s"
        )
    if problems:
        print("colab simulation FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"colab simulation passed: {', '.join(notebooks)} ran in a fresh Python {COLAB_PYTHON} "
        f"environment installed by the set-up cell from {head[:10]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
