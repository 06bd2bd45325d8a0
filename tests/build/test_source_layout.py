"""The compiled modules' sources keep their grouping: ``src/common/`` is what both device modules
share, ``src/cpu/`` and ``src/cuda/`` are each module's own, and a file includes only its own
folder and ``common/`` (so the CPU module never depends on CUDA code, nor the reverse, and
``common/`` depends on neither).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
FOLDERS = ("common", "cpu", "cuda")
#: What each folder may include from src/.
ALLOWED = {"common": {"common"}, "cpu": {"common", "cpu"}, "cuda": {"common", "cuda"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCES = sorted(p for p in SRC.rglob("*") if p.suffix in {".h", ".cc", ".cu", ".cuh"})


def _local_includes(path: Path) -> list[str]:
    """The quoted includes of a source file (its includes of other files under src/)."""
    return INCLUDE.findall(path.read_text())


def test_every_source_sits_in_a_folder_that_says_who_uses_it() -> None:
    stray = [
        str(p.relative_to(SRC))
        for p in SOURCES
        if p.parent.name not in FOLDERS
        and p.name != "simple_ml_ext.cc"  # hw0's, where the course keeps it
    ]
    assert not stray, f"sources outside src/common, src/cpu, src/cuda: {stray}"
    assert {p.parent.name for p in SOURCES} >= set(FOLDERS)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SRC)))
def test_includes_resolve_and_stay_within_the_allowed_folders(path: Path) -> None:
    for target in _local_includes(path):
        assert (SRC / target).is_file(), f"{path.name} includes {target!r}, not a file under src/"
        folder = target.split("/")[0]
        if path.parent.name in ALLOWED:
            assert folder in ALLOWED[path.parent.name], (
                f"{path.relative_to(SRC)} includes {target}: {path.parent.name}/ may include only "
                f"{sorted(ALLOWED[path.parent.name])}"
            )
