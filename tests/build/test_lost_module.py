"""A checkout whose build lost the compiled CPU module says so at import (one stderr line)
instead of running everything on the numpy device without a word."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import needle

PACKAGE = Path(needle.__file__).resolve().parent


def _import_needle(folder: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NEEDLE_IMPL"] = str(folder)
    code = "import needle as ndl; print(ndl.default_tensor_device())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def _checkout_without_modules(tmp_path: Path, with_build: bool) -> Path:
    folder = tmp_path / "checkout"
    shutil.copytree(
        PACKAGE, folder / "needle", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    (folder / "CMakeLists.txt").write_text("# stands for this project's build file\n")
    if with_build:
        (folder / "build").mkdir()
    return folder


def test_a_build_without_its_module_says_so(tmp_path):
    done = _import_needle(_checkout_without_modules(tmp_path, with_build=True))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cpu_numpy()"
    lines = [line for line in done.stderr.splitlines() if "compiled CPU module" in line]
    assert len(lines) == 1 and "make build" in lines[0], done.stderr


def test_a_checkout_never_built_stays_quiet(tmp_path):
    done = _import_needle(_checkout_without_modules(tmp_path, with_build=False))
    assert done.returncode == 0, done.stderr
    assert "compiled CPU module" not in done.stderr
