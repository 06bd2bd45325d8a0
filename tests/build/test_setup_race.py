"""Two first-time `make` runs at once create the venv and upgrade pip once, not twice: the
set-up steps run under one lock and re-check their marker inside it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A stand-in interpreter: logs `-m venv` and `-m pip` calls (slowly, to widen the race window),
# hands `-c` (the Makefile's lock) to the real Python.
STUB = f"""#!/bin/sh
if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi
echo "$*" >> "$STUB_LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  sleep 1; mkdir -p "$3/bin"; cp "$0" "$3/bin/python"
fi
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_two_first_time_runs_set_up_once(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    env = {**os.environ, "STUB_LOG": str(log)}
    cmd = ["make", "-s", f"PYTHON={stub}", ".venv/.needle-venv"]
    runs = [subprocess.Popen(cmd, cwd=tmp_path, env=env) for _ in range(2)]
    assert [run.wait(timeout=60) for run in runs] == [0, 0]
    calls = log.read_text().splitlines()
    assert sum(c.startswith("-m venv") for c in calls) == 1, calls
    assert sum(c.startswith("-m pip install") for c in calls) == 1, calls
