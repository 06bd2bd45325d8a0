"""The course's files hold the course's answer: speed lives in ``needle.fast`` alone.

The files a student diffs against their homework (autograd, ops, nn, optim, init, data) import
nothing from the fast wing, name no fused op, wrap no element-wise compute in a layout helper
and count no references; ``Sequential.forward`` is the course's loop.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import needle
import needle.nn as nn

ROOT = pathlib.Path(needle.__file__).parent
COURSE_FILES = sorted(
    [ROOT / "autograd.py", ROOT / "optim.py"]
    + [p for d in ("ops", "nn", "init", "data") for p in (ROOT / d).rglob("*.py")]
)
# identifiers (names, attributes) that mark the speed work: the fused-op module, the fast wing,
# reference counting, the old layout wrapper of element-wise computes
FORBIDDEN = {"ops_fused", "fast", "getrefcount", "_keep_layout"}


def test_the_course_files_exist():
    assert len(COURSE_FILES) >= 12
    assert not (ROOT / "ops" / "ops_fused.py").exists()


@pytest.mark.parametrize("path", COURSE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_course_file_does_not_reach_into_the_fast_wing(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            assert "fast" not in module.split("."), f"{path.name} imports {module}"
            assert not any("fast" in a.name for a in node.names), f"{path.name}: {module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert "fast" not in alias.name.split("."), f"{path.name} imports {alias.name}"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & FORBIDDEN, f"{path.name} names {sorted(used & FORBIDDEN)}"


def test_sequential_forward_is_the_course_loop():
    body = inspect.getsource(nn.Sequential.forward)
    assert "for module in self.modules:" in body
    assert "x = module(x)" in body
    assert len(body.strip().splitlines()) <= 4
