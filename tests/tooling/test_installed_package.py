"""What a notebook reads at run time comes from the installed package, not from a checkout.

A wheel install (Colab) has no ``src/``, ``benchmarks/`` or ``data/`` beside it: the kernel
sources notebook 06 prints come from ``companion.lecture.kernel_source`` (the checkout's ``src/``,
else the copy pyproject.toml's ``wheel.packages`` ships as ``companion/src``), the machine
description and the step profiler from ``companion.machine`` and ``companion.step_profile``,
the data folder from ``companion.lecture.data_dir``, and MPI cells ask
``companion.lecture.mpiexec``. The wheel itself is built and installed by ``make test-colab``.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from companion import lecture, step_profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
# What only a checkout has: needle's parent folder, the benchmarks package, a script run in the
# checkout, companion's parent folder.
CHECKOUT_ONLY = {
    "needle's parent folder": re.compile(r"Path\(ndl\.__file__\)"),
    "the checkout folder": re.compile(r"lecture\.CHECKOUT\b"),
    "the benchmarks package": re.compile(r"^\s*(from|import)\s+benchmarks\b", re.M),
    "a subprocess run in the checkout": re.compile(r"cwd\s*=\s*ROOT\b"),
    "a folder beside the notebooks": re.compile(r"Path\(\s*[\"']\.\.[\"']\s*\)"),
}


def fake_checkout(tmp_path: Path, with_src: bool) -> Path:
    """A folder laid out like this project's checkout (pyproject.toml, notebooks/, src/)."""
    root = tmp_path / "checkout"
    (root / "notebooks").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'needle'\n")
    if with_src:
        (root / "src" / "cuda").mkdir(parents=True)
        (root / "src" / "cuda" / "k.cu").write_text("// the checkout's kernel\n")
    return root


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """companion/src as a wheel ships it, with one file, and companion in site-packages."""
    site = tmp_path / "site-packages"
    (site / "companion" / "src" / "cuda").mkdir(parents=True)
    (site / "companion" / "src" / "cuda" / "k.cu").write_text("// the shipped kernel\n")
    monkeypatch.setattr(lecture, "SHIPPED_SRC", site / "companion" / "src")
    monkeypatch.setattr(lecture, "CHECKOUT", site)
    return site


def test_kernel_source_reads_the_shipped_copy_without_a_checkout(shipped):
    assert not lecture.in_checkout()
    assert lecture.kernel_source_dir() == shipped / "companion" / "src"
    assert lecture.kernel_source("cuda/k.cu") == "// the shipped kernel\n"


def test_kernel_source_prefers_the_checkout(shipped, tmp_path, monkeypatch):
    monkeypatch.setattr(lecture, "CHECKOUT", fake_checkout(tmp_path, with_src=True))
    assert lecture.in_checkout()
    assert lecture.kernel_source("cuda/k.cu") == "// the checkout's kernel\n"


def test_kernel_source_errors_name_the_problem(shipped):
    with pytest.raises(FileNotFoundError, match=r"no cuda/missing\.cu in .*companion/src/cuda"):
        lecture.kernel_source("cuda/missing.cu")
    for bad in ("../pyproject.toml", "/etc/passwd", ""):
        with pytest.raises(ValueError, match="not a relative path inside src/"):
            lecture.kernel_source(bad)


def test_kernel_source_in_this_checkout_is_the_file_in_src():
    assert lecture.in_checkout() and lecture.kernel_source_dir() == ROOT / "src"
    relpath = "cuda/ndarray_backend_cuda.cu"
    assert lecture.kernel_source(relpath) == (ROOT / "src" / relpath).read_text()


def test_data_dir_is_the_checkouts_or_the_current_folders(shipped, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert lecture.data_dir() == tmp_path / "data"  # a wheel install: ./data
    checkout = fake_checkout(tmp_path, with_src=False)
    monkeypatch.setattr(lecture, "CHECKOUT", checkout)
    assert lecture.data_dir() == checkout / "data"


def test_the_wheel_ships_src_as_companion_src():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]
    packages = config["wheel"]["packages"]
    assert packages == {"needle": "needle", "companion": "companion", "companion/src": "src"}
    assert lecture.SHIPPED_SRC == ROOT / "companion" / "src"


def test_every_kernel_source_a_notebook_reads_exists():
    read = {
        (nb.name, name)
        for nb in NOTEBOOKS
        for name in re.findall(r"\b(?:source|kernel_source)\(\"([^\"]+)\"\)", nb.read_text())
    }
    assert ("06_hardware_acceleration.py", "cuda/ndarray_backend_cuda.cu") in read
    missing = [(nb, name) for nb, name in read if not (ROOT / "src" / name).is_file()]
    assert not missing, f"notebooks read kernel sources that src/ does not have: {missing}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_reads_from_the_checkout(notebook):
    text = notebook.read_text()
    found = [what for what, pattern in CHECKOUT_ONLY.items() if pattern.search(text)]
    assert not found, f"{notebook.name} reads {', '.join(found)}: a wheel install has none"


def test_the_step_profile_and_its_saved_before_are_in_the_package():
    before = step_profile.before()
    assert step_profile.BEFORE.parent == ROOT / "companion"
    assert set(before["cases"]) == set(step_profile.CASES)
    for case in before["cases"].values():
        assert tuple(case["phases"]) == step_profile.PHASES and case["kernel_ms"] > 0
    assert not (ROOT / "benchmarks" / "step_profile.py").exists()


def test_companion_machine_imports_neither_numpy_nor_needle():
    # benchmarks/ re-executes itself before numpy is imported, after importing this module
    code = (
        "import sys, companion.machine as m; "
        "print(sorted({'numpy', 'needle'} & set(sys.modules)), callable(m.machine_info))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]
    import benchmarks.common

    assert not hasattr(benchmarks.common, "machine_info")  # one place: companion.machine


def test_mpiexec_is_none_without_mpi4py(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a)
    )
    assert lecture.mpiexec() is None
    line = lecture.NO_MPI.format(what="the data-parallel run")
    assert "\n" not in line and "mpi4py" in line and "the data-parallel run" in line


def test_mpiexec_finds_the_lectures_extras_mpiexec():
    pytest.importorskip("mpi4py", reason="the lectures extra (mpi4py) is not installed")
    found = lecture.mpiexec()
    assert found is not None and Path(found).name == "mpiexec" and Path(found).is_file()
