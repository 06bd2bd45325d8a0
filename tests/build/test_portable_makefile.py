"""The set-up path (the Makefile and .ci/run) uses no GNU-only tool, so `make lab` and `make test`
work on macOS (BSD userland) as on Linux.

Each pattern is a command or flag that exists only in GNU coreutils/util-linux/findutils/sed (or
behaves differently in the BSD tools macOS ships); the test greps the set-up files for them,
comment lines excepted. The checker itself is tested on lines that must and must not match.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP_FILES = [ROOT / "Makefile", ROOT / ".ci" / "run"]

# A command word: at the start of a line or after a shell separator, $( or a make $(shell.
_CMD = r"(?:^|[\s;&|(`]|\$\(shell\s)"
GNU_ONLY = {
    "flock (util-linux; macOS has none)": _CMD + r"flock\s",
    "nproc (coreutils; older macOS has none)": _CMD + r"nproc\b",
    "timeout (coreutils; macOS has none)": _CMD + r"timeout\s",
    "readlink -f (GNU; older macOS rejects -f)": r"\breadlink\s+-[a-z]*f",
    "realpath (coreutils; older macOS has none)": _CMD + r"realpath\s",
    "sed -i without a suffix (BSD sed takes the next word as the suffix)": (
        r"\bsed\s(?:.*\s)?-i(?:\s|$)|\bsed\s.*--in-place"
    ),
    "find -printf (GNU findutils)": r"\bfind\s.*-printf\b",
    "cp --parents (GNU)": r"\bcp\s.*--parents\b",
    "date -d / --date / -I (GNU date flags)": r"\bdate\s+(?:-d\b|--date|-I\b|--iso)",
    "xargs -r (GNU)": r"\bxargs\s+(?:-[a-zA-Z]*\s+)*-r\b",
    "grep -P (GNU grep)": r"\bgrep\s+(?:-[a-zA-Z]*\s+)*-[a-zA-Z]*P",
    "stat -c (GNU stat; BSD uses -f)": r"\bstat\s+-c\b",
    "md5sum / sha256sum (coreutils; macOS has md5 / shasum)": _CMD + r"(?:md5sum|sha\d+sum)\b",
    "install -D (GNU)": r"\binstall\s+-[a-zA-Z]*D",
    "tac (coreutils)": _CMD + r"tac\b",
}


def gnu_only_uses(text: str) -> list[tuple[int, str, str]]:
    """(line number, tool, line) for each GNU-only use in ``text``, comment lines skipped."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("#"):
            continue
        for tool, pattern in GNU_ONLY.items():
            if re.search(pattern, line):
                found.append((number, tool, line.strip()))
    return found


@pytest.mark.parametrize("path", SETUP_FILES, ids=lambda p: p.name)
def test_setup_files_use_no_gnu_only_tools(path):
    uses = gnu_only_uses(path.read_text())
    assert not uses, f"{path.relative_to(ROOT)} uses GNU-only tools:\n" + "\n".join(
        f"  line {n}: {tool}: {line}" for n, tool, line in uses
    )


@pytest.mark.parametrize(
    "line",
    [
        "\tflock .build.lock $(PY) -m pip install -e .",
        "JOBS := $(shell nproc)",
        "\ttimeout 60 $(PY) -m pytest",
        "ROOT=$(readlink -f .)",
        "\tsed -i 's/a/b/' file",
        "\tsed -e 's/a/b/' -i file.txt",
        "\tfind . -name '*.so' -printf '%p\\n'",
        "\tcp --parents src/a.h out/",
        "\tdate -d yesterday",
        "\tls | xargs -r rm",
        "\tgrep -P '\\d+' file",
        "\tstat -c %s file",
        "\tsha256sum data.bin",
    ],
)
def test_checker_flags_gnu_only_lines(line):
    assert gnu_only_uses(line), line


@pytest.mark.parametrize(
    "line",
    [
        "# no flock here: the lock is fcntl in Python",
        "LOCKED = $(PYTHON) -c 'import fcntl; fcntl.flock(lock, fcntl.LOCK_EX)'",
        "\tsed -i.bak 's/a/b/' file",
        "NBEXEC := jupyter nbconvert --ExecutePreprocessor.timeout=1200",
        "\tfind . -name __pycache__ -prune -exec rm -rf {} +",
        "\tout=$$(mktemp -d)",
        "\tdate +%s",
    ],
)
def test_checker_passes_portable_lines(line):
    assert not gnu_only_uses(line), line
