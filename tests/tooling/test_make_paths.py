"""The Makefile with user paths that hold spaces and quotes, and from a checkout whose path does.

Each test asks make for the commands a target would run (``make -n``, so nothing is built), then
runs those commands with ``sh`` where make would (the checkout; variables given on make's command
line are in the environment, as make exports them). So the commands are the Makefile's own, and
what they do is checked, not their text. ``make build`` alone runs for real (tiny stand-in C++
sources, so it takes seconds): its commands are CMake's and the compiler's, run by ninja.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import needle
from companion.viz import FIGURE_KEY

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(needle.__file__).resolve().parent
VENV = Path(sys.executable).parent.parent


def recipe(
    target: str, markers: tuple[str, ...], variables: dict[str, str], cwd: Path = ROOT
) -> list[str]:
    """The commands ``make -n target`` prints that contain one of ``markers`` (the target's
    own; a prerequisite that is out of date would add its own lines, which are left out). A
    command continued with backslash-newline is one command."""
    args = [f"{k}={v}" for k, v in variables.items()]
    done = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", target, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    commands = done.stdout.replace("\\\n", "\x00").splitlines()
    lines = [c.replace("\x00", "\\\n") for c in commands if any(m in c for m in markers)]
    assert lines, f"make -n {target} printed no command with {markers!r}:\n{done.stdout}"
    return lines


def run_recipe(
    target: str,
    markers: tuple[str, ...],
    variables: dict[str, str],
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    replace: tuple[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run :func:`recipe`'s lines with sh in ``cwd``, the variables in the environment (as make
    exports them); ``replace`` = (old, new) edits the commands first (a stand-in program)."""
    lines = recipe(target, markers, variables, cwd)
    script = "set -e\n" + "\n".join(lines)
    if replace:
        assert replace[0] in script, (replace[0], script)
        script = script.replace(*replace)
    full = {
        k: v
        for k, v in (env or os.environ).items()
        if k not in ("NEEDLE_IMPL", "PYTHONPATH", "HW", "NB", "Q")
    }
    full.update(variables)
    return subprocess.run(
        ["sh", "-c", script], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout
    )


def student_copy(folder: Path) -> Path:
    """``folder/python``: a course-layout copy of this project's needle."""
    python = folder / "python"
    shutil.copytree(PACKAGE, python / "needle", ignore=shutil.ignore_patterns("__pycache__"))
    return python


# ---- user paths: NEEDLE_IMPL and HW with spaces and quotes ---------------------------------------


def test_make_lab_passes_a_needle_impl_with_spaces(tmp_path):
    home = tmp_path / "home"
    student = student_copy(home / "CMU 10-714" / "hw2")
    env = {**os.environ, "HOME": str(home)}
    # as typed: NEEDLE_IMPL="~/CMU 10-714/hw2/python" make lab
    done = run_recipe(
        "lab",
        ("jupyter lab",),
        {"NEEDLE_IMPL": "~/CMU 10-714/hw2/python", "PY": sys.executable},
        env=env,
        replace=(
            ".venv/bin/jupyter lab",
            f"{sys.executable} -c "
            '\'import os, needle; print(os.environ["NEEDLE_IMPL"]); '
            "print(needle.__file__)' #",
        ),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"Starting JupyterLab on notebooks/ (Ctrl-C to stop), with NEEDLE_IMPL={student}"
    )
    assert lines[1:] == [str(student), str(student / "needle" / "__init__.py")]


def test_a_relative_needle_impl_with_spaces_imports_from_any_folder(tmp_path):
    student = student_copy(tmp_path / "my hw" / "hw2")
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    env["NEEDLE_IMPL"] = "my hw/hw2/python"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, needle; print(needle.__file__); print(os.environ['NEEDLE_IMPL'])",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(student / "needle" / "__init__.py"), str(student)]


def test_make_check_takes_a_homework_path_with_a_quote_and_spaces(tmp_path):
    root = tmp_path / 'my "hw" folder' / "hw1"
    root.mkdir(parents=True)
    done = run_recipe(
        "check",
        ("usage: make check", "companion check"),
        {"HW": str(root), "Q": "add", "PY": sys.executable},
    )
    # the checker itself ran and got the path whole: it reports the missing layout of that path
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{root / 'python' / 'needle' / '__init__.py'} is missing" in done.stderr


def test_make_check_without_hw_says_how():
    done = run_recipe("check", ("usage: make check", "companion check"), {"PY": sys.executable})
    assert done.returncode == 2 and done.stdout.startswith("usage: make check HW=path/to/hwN")


# ---- a checkout whose path holds a space ---------------------------------------------------------
TINY = """# %%
import os
print("tiny ran with PATH", os.environ["PATH"].split(os.pathsep)[0])
"""


def spaced_checkout(tmp_path: Path) -> Path:
    """``tmp_path/"my course"/companion``: the Makefile and what its rules read, a notebooks/
    folder with one tiny notebook, and .venv linked to the environment running the tests."""
    root = tmp_path / "my course" / "companion"
    root.mkdir(parents=True)
    for name in (
        "Makefile",
        "pyproject.toml",
        "environment.yml",
        "CMakeLists.txt",
        "jupytext.toml",
    ):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "src", root / "src", copy_function=shutil.copy2)
    (root / ".venv").symlink_to(VENV)
    (root / "notebooks").mkdir()
    shutil.copy2(ROOT / "notebooks" / "sanitize.cfg", root / "notebooks" / "sanitize.cfg")
    (root / "notebooks" / "00_tiny.py").write_text(TINY)
    return root


def _ran(root: Path) -> str:
    import nbformat

    nb = nbformat.read(root / "notebooks" / "00_tiny.ipynb", as_version=4)
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_make_notebook_and_notebooks_from_a_path_with_a_space(tmp_path):
    root = spaced_checkout(tmp_path)
    done = run_recipe(
        "notebook", ("jupytext", "nbconvert"), {"NB": "notebooks/00_tiny.py"}, cwd=root
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the environment's bin/ comes first on PATH, as the Makefile arranges
    ran = f"tiny ran with PATH {root / '.venv' / 'bin'}\n"
    assert _ran(root) == ran
    (root / "notebooks" / "00_tiny.ipynb").unlink()
    done = run_recipe("notebooks", ("for py in",), {}, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ran(root) == ran


def test_make_figures_from_a_path_with_a_space(tmp_path):
    """make figures writes figures/ from the notebooks' tagged outputs in a spaced checkout."""
    root = spaced_checkout(tmp_path)
    png = b"\x89PNG stand-in"
    output = {
        "output_type": "display_data",
        "data": {"image/png": base64.b64encode(png).decode()},
        "metadata": {FIGURE_KEY: "tiny"},
    }
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [output]}
    (root / "notebooks" / "00_tiny.ipynb").write_text(json.dumps({"cells": [cell]}))
    done = run_recipe("figures", ("companion.viz",), {}, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "figures" / "tiny.png").read_bytes() == png


# ---- make build itself, from a checkout whose path holds a space, a parenthesis, non-ASCII -------
STAND_IN_MODULE = """#include <pybind11/pybind11.h>
PYBIND11_MODULE(ndarray_backend_cpu, m) { m.attr("stand_in") = 7; }
"""


def test_make_build_from_a_path_with_spaces_and_parentheses(tmp_path):
    """``make build`` for real (no ``make -n``): the Makefile's rule and this CMakeLists.txt
    configure, compile, strip and place a module from ``odd dir/ünï cødé (2)/repo``. It used to
    fail there, as soon as the path held a space (CMake got the split path of Python) or a
    parenthesis (a shell syntax error). The C++ sources are tiny stand-ins at the real sources'
    paths (the real ones take minutes to compile), CUDA is off, and the environment is this
    one, linked in as a fresh VENV whose build has not run yet (about 20 s in all)."""
    root = tmp_path / "odd dir" / "ünï cødé (2)" / "repo"
    (root / "src" / "cpu").mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "environment.yml", "CMakeLists.txt"):
        shutil.copy2(ROOT / name, root / name)
    (root / "src" / "cpu" / "ndarray_backend_cpu.cc").write_text(STAND_IN_MODULE)
    (root / "src" / "cpu" / "ndarray_backend_cpu_kernels.cc").write_text(
        "static int stand_in = 0;\n"
    )
    venv = root / ".venv-t"  # this environment, with markers saying it is set up but not built
    venv.mkdir()
    for name in ("bin", "lib", "pyvenv.cfg"):
        (venv / name).symlink_to(VENV / name)
    for marker in (".needle-venv", ".needle-installed"):
        (venv / marker).touch()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NEEDLE_IMPL")}
    done = subprocess.run(
        ["make", "build", "VENV=.venv-t", "CMAKE_EXTRA=-DNEEDLE_CUDA=OFF -DNEEDLE_NATIVE=OFF"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (venv / ".needle-built").exists()
    placed = root / "needle" / "backend_ndarray"
    loaded = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ndarray_backend_cpu as m; print(m.stand_in)"],
        cwd=placed,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.stdout == "7\n", loaded.stderr
