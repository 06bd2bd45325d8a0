"""Write the lock (constraints) files: ``locks/pyX.Y.txt``, one per supported Python.

``make lock`` runs this. For each interpreter it makes a fresh virtual environment in
``build/lock/X.Y``, installs the newest releases that ``pyproject.toml``'s ranges allow (the
build requirements, the package's dependencies and its ``dev`` and ``book`` extras in one
resolution; then each package of the ``lectures`` extra on its own, held to what is already
installed, so one without a wheel for that Python is left out and named in the file's header),
and writes ``pip freeze`` of that environment. Nothing of needle is compiled.

``make lab``/``make test`` install with ``pip install -c locks/pyX.Y.txt`` (``UNLOCKED=1``:
without it, the newest releases); the Colab set-up installs with the file of Colab's Python.

    python locks/generate.py [PYTHON ...]      (default: every supported Python found)
    python locks/generate.py --find 3.10       (print the interpreter make lock would use)
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Sequence

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
#: The Pythons this project supports and locks.
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def find_python(version: str) -> str:
    """An interpreter of ``version`` (``"3.10"``): pyenv's newest of that minor version, else
    ``python3.10`` on PATH; ``""`` when there is none."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        root = _run(["pyenv", "root"], check=False).stdout.strip() or root
    found = glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", "python3"))
    found.sort(key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("versions")[-1])])
    return found[-1] if found else (shutil.which(f"python{version}") or "")


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> tuple[List[str], List[str]]:
    """(what is resolved together, the lectures extra): from ``pyproject``'s build requirements,
    dependencies and extras, plus cmake and ninja (the Makefile's build tools)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the tomli package (in the dev extra for 3.10)
        import tomli as tomllib
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    extras = project["optional-dependencies"]
    together = list(data["build-system"]["requires"]) + ["cmake", "ninja"]
    together += list(project["dependencies"]) + list(extras["dev"]) + list(extras["book"])
    return together, list(extras["lectures"])


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` quietly; raise with its output when ``check`` and it fails."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and done.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}")
    return done


def lock(python: str) -> Path:
    """Resolve, install and freeze for one interpreter; return the lock file written."""
    version = _run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    version_text = version.stdout.strip()
    full = _run([python, "-c", "import platform; print(platform.python_version())"]).stdout
    venv = ROOT / "build" / "lock" / version_text
    _run([python, "-m", "venv", "--clear", venv])
    vpy = venv / "bin" / "python"
    _run([vpy, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    together, lectures = requirements()
    _run([vpy, "-m", "pip", "install", "-q", *together])
    frozen = venv / "frozen.txt"
    missing = []
    for req in lectures:
        frozen.write_text(_run([vpy, "-m", "pip", "freeze"]).stdout)
        if _run([vpy, "-m", "pip", "install", "-q", "-c", frozen, req], check=False).returncode:
            missing.append(re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0])
    pins = _run([vpy, "-m", "pip", "freeze", "--exclude-editable"]).stdout
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    header = [
        f"# Python {version_text} lock: written by `make lock` on {stamp} with Python "
        f"{full.strip()} on {platform.system()} {platform.machine()}; do not edit by hand.",
        "# Used as pip constraints (pip install -c) by make lab/test/build and the Colab set-up.",
    ]
    if missing:
        header.append(f"# Not installable with this Python then: {', '.join(missing)}.")
    out = LOCKS / f"py{version_text}.txt"
    out.write_text("\n".join(header) + "\n" + pins)
    return out


def main(argv: List[str]) -> int:
    """Lock every interpreter named in ``argv``; print each file written."""
    if argv[:1] == ["--find"] and len(argv) == 2:
        path = find_python(argv[1])
        print(path)
        return 0 if path else 1
    if not argv:
        argv = [p for p in map(find_python, SUPPORTED) if p]
        missing = [v for v in SUPPORTED if not find_python(v)]
        if missing:
            print(f"no interpreter found for Python {', '.join(missing)}: not locked", flush=True)
    for python in argv:
        print(f"locked {lock(python).relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
