"""``python -m companion.extras``: the lectures extra installed package by package, so one
without a wheel for the platform stops neither ``make lab`` nor the Colab set-up cell."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from companion import extras

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> list[str]:
    """The lectures extra as pyproject.toml declares it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]["lectures"]


def _spec(req: str) -> tuple[str, set[str]]:
    """(name, set of version clauses): metadata may reorder a requirement's clauses."""
    name, rest = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", req).groups()
    return name.lower(), {c.strip() for c in rest.split(",") if c.strip()}


def test_the_installed_metadata_lists_the_declared_extra():
    assert [_spec(r) for r in extras.requirements()] == [_spec(r) for r in _declared()]
    assert extras.requirements("no-such-extra") == []


def test_each_package_is_installed_on_its_own_and_failures_are_returned():
    calls = []

    def pip(args):
        calls.append(list(args))
        return 1 if args[-1].startswith("apache-tvm") else 0

    reqs = ["mpi4py>=4", "apache-tvm<0.28,>=0.27", "onnx>=1.16"]
    assert extras.install(reqs, pip) == ["apache-tvm<0.28,>=0.27"]
    assert calls == [["install", "--quiet", r] for r in reqs]


def test_main_names_what_is_missing_in_one_line_and_never_fails(capsys, monkeypatch):
    monkeypatch.setattr(extras, "requirements", lambda: ["mpich>=4.3", "apache-tvm>=0.27"])
    assert extras.main([], pip=lambda args: 1) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "mpich, apache-tvm" in out and "lectures extra" in out
    assert extras.main([], pip=lambda args: 0) == 0
    assert capsys.readouterr().out == ""


def test_the_makefile_installs_the_extra_package_by_package():
    makefile = (ROOT / "Makefile").read_text()
    assert "-m companion.extras" in makefile
    assert not re.search(r"pip install[^\n]*lectures\]", makefile), "an all-or-nothing install"


def test_a_notebook_names_the_lecture_modules_it_lacks_in_one_line():
    import pytest

    from companion import lecture

    lecture.require_modules("json", "re", what="x")  # all present: nothing happens
    with pytest.raises(ModuleNotFoundError) as err:
        lecture.require_modules("json", "no_such_module_a", "no_such_module_b", what="Lecture 13")
    message = str(err.value)
    assert "\n" not in message and message.startswith("Lecture 13 needs no_such_module_a, ")
    assert "no_such_module_b" in message and "json" not in message
    assert "companion.extras" in message


def test_upgrade_installs_each_package_at_its_newest_release_and_bad_flags_are_refused(monkeypatch):
    monkeypatch.setattr(extras, "requirements", lambda: ["onnx>=1.16"])
    calls = []
    assert extras.main(["--upgrade"], pip=lambda args: calls.append(list(args)) or 0) == 0
    assert calls == [["install", "--quiet", "--upgrade", "onnx>=1.16"]]
    with pytest.raises(SystemExit, match="--upgrade"):
        extras.main(["--latest"], pip=lambda args: 0)


def test_main_without_needles_metadata_never_fails(capsys, monkeypatch, tmp_path):
    """Without needle's installed metadata main() raised PackageNotFoundError, although it
    never fails: it now reads the extra from the checkout's pyproject.toml, and says so in one
    line where that is missing too."""
    import importlib.metadata

    def no_metadata(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "requires", no_metadata)
    asked = []
    assert extras.main([], pip=lambda args: asked.append(args[-1]) or 0) == 0
    assert asked == extras.declared() and asked  # the extra, from pyproject.toml
    declared = extras.declared
    monkeypatch.setattr(extras, "declared", lambda: declared(pyproject=tmp_path / "none"))
    asked.clear()
    assert extras.main([], pip=lambda args: asked.append(args[-1]) or 0) == 0
    assert asked == []  # nothing to install
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "needle's package metadata is missing" in out[0]
