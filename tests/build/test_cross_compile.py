"""Every C++ source compiles for 64-bit ARM (Linux aarch64, the architecture of Apple silicon and
of ARM servers), with the portable kernels and -Wall -Wextra -Werror, using the cross compiler
``aarch64-linux-gnu-g++`` (Debian/Ubuntu package g++-aarch64-linux-gnu; .ci/run installs it).

Only compilation is checked: linking and running need an arm64 system. The Python headers are
this interpreter's (the same on aarch64 Linux for what the modules use), pybind11's are the
installed package's, and the flags are those CMake uses (C++17, hidden visibility).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CROSS = "aarch64-linux-gnu-g++"
SOURCES = sorted(p for p in (ROOT / "src").rglob("*.cc"))

pytestmark = pytest.mark.skipif(
    shutil.which(CROSS) is None,
    reason=f"{CROSS} is not installed (apt-get install g++-aarch64-linux-gnu)",
)


def _include_dirs() -> list[Path]:
    """src/ and its subfolders, pybind11's headers and Python's."""
    import pybind11

    return [ROOT / "src", *sorted(p for p in (ROOT / "src").rglob("*") if p.is_dir())] + [
        Path(pybind11.get_include()),
        Path(sysconfig.get_paths()["include"]),
    ]


def test_there_are_sources_to_compile():
    assert any(p.name == "ndarray_backend_cpu_kernels.cc" for p in SOURCES), SOURCES


def test_every_source_cross_compiles_for_aarch64(tmp_path):
    flags = [
        "-std=c++17",
        "-O0",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-DNEEDLE_ISA_PORTABLE",
        *(f"-I{d}" for d in _include_dirs()),
    ]

    def compile_one(src: Path) -> tuple[Path, subprocess.CompletedProcess]:
        obj = tmp_path / (src.stem + ".o")
        return src, subprocess.run(
            [CROSS, *flags, "-c", str(src), "-o", str(obj)],
            capture_output=True,
            text=True,
            timeout=600,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, SOURCES))
    failures = [
        f"{src.relative_to(ROOT)}:\n{res.stderr[-3000:]}"
        for src, res in results
        if res.returncode != 0
    ]
    assert not failures, "aarch64 cross-compile failed:\n" + "\n".join(failures)
    # The objects really are aarch64 code (ELF machine 183 = EM_AARCH64, little-endian).
    for src, _ in results:
        header = (tmp_path / (src.stem + ".o")).read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183, src
