"""Install the lectures' optional packages (the ``lectures`` extra: MPI, ONNX, TVM) one by one.

``pip install "needle[lectures]"`` is all or nothing: where one of them has no wheel for the
platform (a new Python, an uncommon OS or CPU), the whole install fails. ``make lab``/``make
test`` and the Colab set-up cell instead install needle alone and then run
``python -m companion.extras``, which installs each package of the extra separately and prints
one line naming those that could not be installed; it never fails. The notebooks that need a
missing package say so in one line where they would use it (``companion.lecture``).

The versions are locked the same way as the rest: pip reads the lock file from the
``PIP_CONSTRAINT`` variable, which the Makefile and the Colab set-up set to ``locks/pyX.Y.txt``;
``--upgrade`` (``make ... UNLOCKED=1``) installs the newest releases the extra's ranges allow.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence

EXTRA = "lectures"

#: Runs one pip command (the argument list after ``python -m pip``); returns its exit status.
Pip = Callable[[Sequence[str]], int]


def requirements(extra: str = EXTRA, distribution: str = "needle") -> List[str]:
    """The requirement strings (``"onnx>=1.16,<2"``) that ``distribution``'s ``extra`` adds, as
    installed metadata lists them (markers stripped), in their declared order."""
    # Metadata writes an extra's requirement as 'name<spec>; extra == "lectures"'.
    quoted = "['\"]" + re.escape(extra) + "['\"]"
    marker = re.compile(r"^\s*extra\s*==\s*" + quoted + r"\s*$")
    found = []
    for text in importlib.metadata.requires(distribution) or []:
        req, _, cond = text.partition(";")
        if marker.match(cond):
            found.append(req.strip())
    return found


def _pip(args: Sequence[str]) -> int:
    """``python -m pip ARGS`` in this interpreter, quiet; its exit status."""
    return subprocess.run([sys.executable, "-m", "pip", *args]).returncode


def install(reqs: Sequence[str], pip: Pip = _pip, upgrade: bool = False) -> List[str]:
    """Install each requirement in ``reqs`` on its own (``upgrade``: to its newest release);
    return those pip could not install."""
    flags = ["--upgrade"] if upgrade else []
    return [req for req in reqs if pip(["install", "--quiet", *flags, req]) != 0]


def missing_line(missing: Sequence[str]) -> str:
    """The one line that names the packages of the extra that could not be installed."""
    names = ", ".join(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0] for r in missing)
    return (
        f"needle: the lectures extra is incomplete here: no installable {names} for this "
        "platform; the notebooks that use them say so where they need them"
    )


def declared(extra: str = EXTRA, pyproject: Optional[Path] = None) -> List[str]:
    """The requirements of ``extra`` as the checkout's pyproject.toml declares them (where
    needle's installed metadata is missing)."""
    path = pyproject or Path(__file__).resolve().parents[1] / "pyproject.toml"
    toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    with open(path, "rb") as f:
        return list(toml.load(f)["project"]["optional-dependencies"][extra])


def main(argv: Optional[List[str]] = None, pip: Pip = _pip) -> int:
    """Install the lectures extra package by package; print one line for what is missing.
    Always returns 0: a missing lecture package never stops the set-up. ``argv``: ``[]`` or
    ``["--upgrade"]``."""
    args = list(argv or [])
    if args not in ([], ["--upgrade"]):
        raise SystemExit(f"usage: python -m companion.extras [--upgrade] (got {args})")
    try:
        reqs = requirements()
    except importlib.metadata.PackageNotFoundError:
        try:
            reqs = declared()
        except (OSError, ImportError, KeyError, ValueError) as error:
            print(
                f"needle: the lectures extra was not installed: needle's package metadata is "
                f"missing (install needle first: pip install -e .) and pyproject.toml could "
                f"not be read ({type(error).__name__}: {error})"
            )
            return 0
    missing = install(reqs, pip, upgrade=bool(args))
    if missing:
        print(missing_line(missing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
