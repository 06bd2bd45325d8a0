"""The Colab badges and set-up cells (companion/colab.py).

Every notebook's badge and first code cell must be what ``python -m companion.colab --write``
produces from pyproject.toml's repository URL; the set-up cell must do nothing outside Colab and,
when it acts (NEEDLE_COLAB_SIMULATE=1), run one ``pip install`` with the GPU's architecture.
The real install, with the notebooks executed on it, is ``make test-colab``
(tests/build/colab_simulation.py).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
    import tomli as tomllib

from companion import colab, lecture

ROOT = Path(__file__).resolve().parents[2]
REPO = "https://github.com/example-owner/example-repo"

SAMPLE = """# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
# ---

# %% [markdown]
# # 99 · Example
#
# **Lecture:** 1
#
# Text.

# %%
import numpy as np
print(1)

# %% [markdown]
# More.
"""


def test_every_notebook_has_the_generated_badge_and_setup_cell():
    assert colab.stale() == [], "run `python -m companion.colab --write`, then jupytext --update"


def test_the_url_comes_from_pyproject():
    url = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert colab.repository_url() == url.rstrip("/").removesuffix(".git")
    for path in colab.sources():
        text = path.read_text()
        assert (
            f"colab.research.google.com/github/{url.split('github.com/')[1]}/blob/main/notebooks/{path.stem}.ipynb"
            in text
        )
        assert f'"NEEDLE_COLAB_REPO", "{url}")' in text


def test_generate_inserts_badge_and_cell_once_and_is_idempotent():
    once = colab.generate(SAMPLE, "99_example", REPO)
    lines = once.split("\n")
    title = lines.index("# # 99 · Example")
    assert lines[title + 1] == "#"
    assert lines[title + 2] == (
        "# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/example-owner/example-repo/blob/main/"
        "notebooks/99_example.ipynb)"
    )
    first_code = next(
        i for i, line in enumerate(lines) if line.startswith("# %%") and "[markdown]" not in line
    )
    assert lines[first_code] == '# %% tags=["remove-cell"]'  # the website leaves it out
    assert lines[first_code + 1].startswith(colab.SETUP_MARK)
    assert lines.index("import numpy as np") > first_code + len(colab.setup_cell(REPO).split("\n"))
    assert colab.generate(once, "99_example", REPO) == once
    # Only the badge (two lines) and the cell were added: the rest is untouched.
    cell = colab.setup_cell(REPO).split("\n")
    rest = [line for line in lines if line not in cell and "Open In Colab" not in line]
    assert len(lines) == len(SAMPLE.split("\n")) + 2 + len(cell) + 2
    assert "import numpy as np" in rest and "# More." in rest


def test_a_changed_url_or_edited_cell_is_rewritten():
    old = colab.generate(SAMPLE, "99_example", REPO)
    new = colab.generate(old, "99_example", "https://github.com/other/fork")
    assert "example-owner" not in new and new.count("Open In Colab") == 1
    assert new.count(colab.SETUP_MARK) == 1
    edited = old.replace('"-q",', '"-q", "--pre",')
    assert colab.generate(edited, "99_example", REPO) == old


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="not https://github.com"):
        colab.badge_line("01_x", "https://gitlab.com/a/b")
    with pytest.raises(ValueError, match="markdown header"):
        colab.generate("# %%\nprint(1)\n", "99_example", REPO)
    with pytest.raises(ValueError, match="no code cell"):
        colab.generate("# %% [markdown]\n# # 99 · T\n", "99_example", REPO)


def test_lecture_extras_only_where_imported():
    assert colab.extras("import numpy\nfrom tvm import te\n") == "[lectures]"
    assert colab.extras("args = [mpiexec, '-n', '2']\n") == "[lectures]"
    assert colab.extras("import numpy\n# the onnxruntime lecture\n") == ""
    wanted = {p.stem[:2]: colab.extras(p.read_text()) for p in colab.sources()}
    assert {k for k, v in wanted.items() if v} == {"12", "13"}


def _run_cell(tmp_path, env_extra, pip_rc=0, installed=False):
    """Execute the generated set-up cell in a fresh interpreter without site-packages (so no
    needle is importable) whose ``sys.executable`` is a fake pip: it records its arguments and
    build variables and, when it succeeds, leaves a stand-in ``needle`` package in the working
    folder, which the cell must then import. ``installed``: the stand-in is there from the start."""
    record = tmp_path / "record.txt"
    stand_in = (
        "mkdir -p needle && echo 'def cuda():\n    return cpu()\ndef cpu():\n"
        '    return type("D", (), {"enabled": lambda self: False})()\' > needle/__init__.py'
    )
    fake = tmp_path / "fake_python"
    fake.write_text(
        f'#!/bin/sh\n{{ echo "$@"; echo "CUDAARCHS=${{CUDAARCHS-}}"; '
        f'echo "CMAKE_ARGS=${{CMAKE_ARGS-}}"; }} >> {record}\necho pip-said-no\n'
        + (f"exit {pip_rc}\n" if pip_rc else f"{stand_in}\n")
    )
    fake.chmod(0o755)
    if installed:
        subprocess.run(["sh", "-c", stand_in], cwd=tmp_path, check=True)
    cell = colab.setup_cell(REPO, "[lectures]")
    code = (
        f"import sys; sys.executable = {str(fake)!r}\n"
        + cell
        + "\nprint('needle' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEEDLE_COLAB", "PYTHON"))}
    env.update(env_extra)
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    return done, (record.read_text() if record.exists() else None)


def test_the_cell_does_nothing_outside_colab(tmp_path):
    done, record = _run_cell(tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr, record) == ("False\n", "", None)


def test_the_cell_installs_for_the_gpu_it_finds_and_imports_the_result(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    done, record = _run_cell(
        tmp_path,
        {
            "NEEDLE_COLAB_SIMULATE": "1",
            "NEEDLE_COLAB_REPO": str(clone),
            "NEEDLE_COLAB_GPU_CAP": "7.5",
        },
    )
    assert done.returncode == 0, done.stderr
    args, arch, cmake, extras_args = record.splitlines()[:4]
    assert args == f"-m pip install -q needle @ git+file://localhost{clone}"
    assert (arch, cmake) == ("CUDAARCHS=75-real", "CMAKE_ARGS=")
    # then the lectures extra, package by package (a missing wheel stops nothing)
    assert extras_args == "-m companion.extras"
    assert "(GPU: 7.5)" in done.stdout
    assert done.stdout.endswith("needle installed: cpu() only\nTrue\n")


def test_without_a_gpu_the_cell_builds_no_cuda_module(tmp_path):
    done, record = _run_cell(
        tmp_path, {"NEEDLE_COLAB_SIMULATE": "1", "NEEDLE_COLAB_GPU_CAP": "none"}
    )
    assert done.returncode == 0, done.stderr
    args, arch, cmake = record.splitlines()[:3]
    assert args == f"-m pip install -q needle @ git+{REPO}"
    assert (arch, cmake) == ("CUDAARCHS=", "CMAKE_ARGS=-DNEEDLE_CUDA=OFF")
    assert "(GPU: none)" in done.stdout


def test_a_second_notebook_in_the_session_does_not_reinstall(tmp_path):
    done, record = _run_cell(tmp_path, {"NEEDLE_COLAB_SIMULATE": "1"}, installed=True)
    assert done.returncode == 0, done.stderr
    assert record is None and done.stdout.startswith("needle is installed")


def test_a_failed_install_raises_with_pips_output(tmp_path):
    done, _ = _run_cell(tmp_path, {"NEEDLE_COLAB_SIMULATE": "1"}, pip_rc=1)
    assert done.returncode != 0
    assert "RuntimeError: pip install failed:" in done.stderr and "pip-said-no" in done.stderr


def test_best_device_is_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    import needle as ndl

    cuda_on = ndl.cuda().enabled()
    assert lecture.best_device() == (ndl.cuda() if cuda_on else ndl.cpu())

    class Fake:
        def __init__(self, on):
            self.on = on

        def enabled(self):
            return self.on

    gpu = Fake(True)
    monkeypatch.setattr(ndl, "cuda", lambda: gpu)
    assert lecture.best_device() is gpu
    monkeypatch.setattr(ndl, "cuda", lambda: Fake(False))
    monkeypatch.setattr(ndl, "cpu", lambda: Fake(False))
    assert lecture.best_device() == ndl.cpu_numpy()
