"""The locked environment: one lock per supported Python, within pyproject's ranges, used by make.

``locks/pyX.Y.txt`` (written by ``make lock``) pins every package that make lab/test install for
that Python; pyproject.toml keeps ranges. Each pin must satisfy its range (a lock written from an
older pyproject.toml fails here), and make must install with the lock unless ``UNLOCKED=1``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]


def pins(lock: Path) -> tuple[dict[str, str], set[str]]:
    """({normalised name: pinned version}, the names the header says were not installable)."""
    found, missing = {}, set()
    for line in lock.read_text().splitlines():
        if line.startswith("# Not installable"):
            names = line.split(":", 1)[1].strip().rstrip(".").split(",")
            missing = {canonicalize_name(n.strip()) for n in names}
        elif line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{lock.name}: not a pin: {line!r}"
            found[canonicalize_name(name)] = version
    return found, missing


def requirements() -> list[Requirement]:
    """Every requirement pyproject.toml names: build, dependencies, every extra."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["build-system"]["requires"]) + list(data["project"]["dependencies"])
    for extra in data["project"]["optional-dependencies"].values():
        reqs += extra
    return [Requirement(r) for r in reqs]


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_supported_python_has_a_lock_within_pyprojects_ranges(version):
    lock = ROOT / "locks" / f"py{version}.txt"
    assert lock.is_file(), f"{lock.name} is missing: run make lock"
    pinned, missing = pins(lock)
    env = {"python_version": version, "python_full_version": version + ".0", "extra": ""}
    for req in requirements():
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        if name in missing:
            continue
        assert name in pinned, f"{lock.name} does not pin {req.name}: run make lock"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock.name} pins {req.name}=={pinned[name]}, outside pyproject's {req}: run make lock"
        )


def test_the_lock_rejects_a_pin_outside_the_range(tmp_path):
    """The check above can fail: a pin outside numpy's range is caught."""
    req = next(r for r in requirements() if r.name == "numpy")
    assert not req.specifier.contains("1.0.0")
    lock = tmp_path / "py3.99.txt"
    lock.write_text("# Not installable with this Python then: mpich, onnx.\nnumpy==1.0.0\n")
    assert pins(lock) == ({"numpy": "1.0.0"}, {"mpich", "onnx"})


def _make_n(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", "build", f"VENV={tmp_path / 'venv'}",
         f"PYTHON={sys.executable}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_make_installs_with_the_lock_of_its_python_unless_unlocked(tmp_path):
    version = "{}.{}".format(*sys.version_info[:2])
    locked = _make_n(tmp_path)
    assert f"export PIP_CONSTRAINT=locks/py{version}.txt" in locked
    assert "--upgrade-strategy" not in locked
    unlocked = _make_n(tmp_path, "UNLOCKED=1")
    assert "export PIP_CONSTRAINT= " in unlocked and "locks/py" not in unlocked
    assert unlocked.count("--upgrade --upgrade-strategy eager") == 2
    assert "-m companion.extras --upgrade" in unlocked
