"""The Colab badges and set-up cells (companion/colab.py) and what the cell runs
(companion/colab_setup.py).

Every notebook's badge and first code cell must be what ``python -m companion.colab --write``
produces from pyproject.toml's repository URL, collapsed and at most five lines; the set-up cell
must do nothing outside Colab and, when it acts (NEEDLE_COLAB_SIMULATE=1), install only when
this project's needle and companion are not what the notebook imports. The real install, with
the notebooks executed on it, is ``make test-colab`` (tests/build/colab_simulation.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
    import tomli as tomllib

from companion import colab, colab_setup, lecture

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
    assert lines[first_code] == colab.CELL_MARKER  # the website leaves it out; collapsed
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
    edited = old.replace("--depth=1", "--depth=2")
    assert edited != old
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


def test_every_setup_cell_is_collapsed_and_at_most_five_lines():
    """Colab shows only the title (``#@title`` + ``cellView: form``), JupyterLab collapses the
    cell (``source_hidden``), the website leaves it out; opened, it is five lines at most."""
    import jupytext
    import nbformat

    for path in colab.sources():
        for nb in (nbformat.read(path.with_suffix(".ipynb"), as_version=4), jupytext.read(path)):
            cell = next(c for c in nb.cells if c.cell_type == "code")
            lines = cell.source.strip().split("\n")
            assert lines[0].startswith("#@title "), (path.name, lines[0])
            assert len(lines) <= colab.MAX_LINES, (path.name, len(lines))
            assert cell.metadata.get("cellView") == "form", path.name
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, path.name
            assert "remove-cell" in cell.metadata.get("tags", []), path.name


def test_generate_ipynb_rewrites_only_the_badge_and_the_setup_cell():
    path = colab.sources()[0]
    text = path.with_suffix(".ipynb").read_text()
    nb = json.loads(text)
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["source"], code["metadata"] = ["# Colab set-up (old)\n", "print(1)"], {"tags": ["x"]}
    out = json.loads(colab.generate_ipynb(json.dumps(nb), path.stem, REPO, ""))
    new = next(c for c in out["cells"] if c["cell_type"] == "code")
    assert "".join(new["source"]) == colab.setup_cell(REPO)
    assert new["metadata"] == {**colab.CELL_METADATA, "tags": ["remove-cell"]}
    assert new["execution_count"] == code["execution_count"]
    assert "example-owner/example-repo" in "".join(out["cells"][0]["source"])
    assert out["cells"][1:] != nb["cells"][1:] and out["cells"][2:] == nb["cells"][2:]
    with pytest.raises(ValueError, match="no set-up cell"):
        code["source"] = ["print(1)"]
        colab.generate_ipynb(json.dumps(nb), path.stem, REPO, "")


# ---- the cell, run: a fake interpreter stands in for pip's part (the install) -------------------
def _git_repo(folder: Path) -> Path:
    """A one-commit git repository (what the cell clones)."""
    folder.mkdir()
    (folder / "README").write_text("a stand-in for the repository\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(folder)]
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    return folder


def _installed_python(tmp_path: Path, before: str = "") -> Path:
    """An interpreter as Colab's would be once this project is installed: needle and companion
    side by side in one folder on its path (links to this checkout's), no start-up files (-S: an
    editable install's import hook would find the checkout from any folder). ``before``: shell
    lines run first."""
    site = tmp_path / "site"
    site.mkdir()
    for package in ("needle", "companion"):
        (site / package).symlink_to(ROOT / package)
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\n{before}PYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    fake.chmod(0o755)
    return fake


def _run_cell(tmp_path, env_extra, student_needle=False, install_rc=0, simulate=True):
    """Execute the generated set-up cell (lectures variant) in ``tmp_path/content`` with
    ``sys.executable`` a stand-in: ``--install`` is recorded (folder and arguments) and prints
    ``install-ran``; everything else (``--status``) runs the real interpreter, so whether this
    project is what the folder imports is really checked. ``student_needle``: a folder named
    needle (a student's package) in the notebook's folder. Returns (process, record or None,
    the temporary folder the cell clones into)."""
    content, tmp = tmp_path / "content", tmp_path / "tmp"
    content.mkdir()
    tmp.mkdir(exist_ok=True)
    if student_needle:
        (content / "needle").mkdir()
        (content / "needle" / "__init__.py").write_text("STUDENT = True\n")
    record = tmp_path / "record.txt"
    fake = _installed_python(tmp_path, f'case "$*" in *--install*) echo "$PWD $*" >> {record}; '
                             f"echo install-ran; exit {install_rc};; esac\n")  # fmt: skip
    code = f"import sys; sys.executable = {str(fake)!r}\n" + colab.setup_cell(REPO, "[lectures]")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEEDLE_", "TMPDIR"))}
    env.update(env_extra, TMPDIR=str(tmp))
    if simulate:
        env["NEEDLE_COLAB_SIMULATE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=content
    )
    return done, (record.read_text() if record.exists() else None), tmp / "needle-companion"


def test_the_cell_does_nothing_outside_colab(tmp_path):
    done, record, clone = _run_cell(tmp_path, {}, student_needle=True, simulate=False)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr, record, clone.exists()) == ("", "", None, False)


def test_with_this_project_importable_the_cell_installs_nothing(tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "needle-companion-lectures-extra").touch()  # an earlier notebook did it
    done, record, clone = _run_cell(tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("needle is installed (this project's, in ")
    assert record is None and not clone.exists()


def test_a_lectures_notebook_after_another_one_still_gets_the_extra(tmp_path):
    """needle installed by an earlier notebook without the lectures extra: notebook 12 or 13
    runs the install step, which adds the extra (the install itself is skipped, below)."""
    repo = _git_repo(tmp_path / "repo")
    done, record, clone = _run_cell(tmp_path, {"NEEDLE_COLAB_REPO": str(repo)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert record is not None and record.strip().endswith("--lectures")


def test_a_students_needle_folder_is_not_this_project_the_cell_clones_and_installs(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    done, record, clone = _run_cell(tmp_path, {"NEEDLE_COLAB_REPO": str(repo)}, True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needle is installed" not in done.stdout and "install-ran" in done.stdout
    assert (clone / "README").is_file()  # the clone the install runs from
    folder, args = record.strip().split(" ", 1)
    assert folder == str(clone)
    content = tmp_path / "content"
    assert args == f"-m companion.colab_setup --install {repo} --cwd {content} --lectures"


def test_a_failed_set_up_names_the_repository_it_tried(tmp_path):
    missing = tmp_path / "no-such-repository"
    done, record, _ = _run_cell(tmp_path, {"NEEDLE_COLAB_REPO": str(missing)}, True)
    assert done.returncode != 0 and record is None
    assert f"the set-up could not install this project from {missing}" in done.stderr
    assert "does not exist" in done.stdout  # git's own message, shown in the cell


def test_a_failed_install_names_the_repository_it_tried(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    done, record, _ = _run_cell(tmp_path, {"NEEDLE_COLAB_REPO": str(repo)}, True, install_rc=1)
    assert done.returncode != 0 and record is not None and "install-ran" in done.stdout
    assert f"the set-up could not install this project from {repo}" in done.stderr


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


# ---- companion.colab_setup: is this project installed, and the install ---------------------------
OURS = {"needle": "/site/needle", "companion": "/site/companion", "setup": True}


def test_the_verdict_names_what_it_found():
    assert colab_setup.verdict(OURS) == (True, "needle is installed (this project's, in /site)")
    student = dict(OURS, needle="/content/needle")
    ours, line = colab_setup.verdict(student)
    assert not ours and "/content/needle, which is not this project's needle" in line
    assert colab_setup.verdict(student, impl=True)[0]  # NEEDLE_IMPL: the student's, on purpose
    ours, line = colab_setup.verdict({"needle": "/content/needle", "companion": None})
    assert not ours and "no companion package, and a needle at /content/needle" in line
    ours, line = colab_setup.verdict(dict(OURS, setup=False))
    assert not ours and "a companion at /site/companion that is not this project's" in line


def test_found_sees_a_students_folder_in_the_notebooks_folder(tmp_path):
    python = str(_installed_python(tmp_path))
    content = tmp_path / "content"
    (content / "needle").mkdir(parents=True)
    (content / "needle" / "__init__.py").write_text("")
    where = colab_setup.found(str(content), python)
    assert where["needle"] == str(content / "needle") and where["setup"] is True
    assert not colab_setup.verdict(where)[0]
    here = colab_setup.found(str(tmp_path), python)
    assert here["needle"] == str(tmp_path / "site" / "needle"), here
    assert colab_setup.verdict(here)[0], here  # the installed two, side by side


def test_the_build_targets_the_gpu_found_or_none():
    assert colab_setup.gpu_capability({"NEEDLE_COLAB_GPU_CAP": "7.5", "PATH": ""}) == "7.5"
    assert colab_setup.gpu_capability({"NEEDLE_COLAB_GPU_CAP": "none", "PATH": ""}) == ""
    env = colab_setup.build_env({"PATH": ""}, "8.9")
    assert env["CUDAARCHS"] == "89-real" and "CMAKE_ARGS" not in env
    env = colab_setup.build_env({"PATH": "", "CMAKE_ARGS": "-DX=1"}, "")
    assert env["CMAKE_ARGS"] == "-DX=1 -DNEEDLE_CUDA=OFF" and "CUDAARCHS" not in env


class FakeRun:
    """Stands in for the commands the install runs: answers the probe with ``probes`` in turn,
    pip with ``pip_rc``; records (arguments, PIP_CONSTRAINT, CUDAARCHS, CMAKE_ARGS)."""

    def __init__(self, probes, pip_rc=0):
        self.probes, self.pip_rc, self.calls = list(probes), pip_rc, []

    def __call__(self, cmd, env, cwd):
        self.calls.append((list(cmd[1:]), env.get("PIP_CONSTRAINT"), env.get("CUDAARCHS")))
        if cmd[1:2] == ["-c"] and "find_spec" in cmd[2]:
            return 0, json.dumps(self.probes.pop(0)) + "\n"
        if cmd[1:3] == ["-m", "pip"]:
            return self.pip_rc, "pip-said-no" if self.pip_rc else ""
        if cmd[1:3] == ["-m", "companion.extras"]:
            return 0, ""
        return 0, "False\n"  # needle.cuda().enabled()


def _clone(tmp_path):
    src = tmp_path / "clone"
    (src / "locks").mkdir(parents=True)
    lock = src / "locks" / "py{}.{}.txt".format(*sys.version_info[:2])
    lock.write_text("numpy==2.0.0\n")
    return src, lock


def test_install_uses_the_lock_and_reports_the_result(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NEEDLE_COLAB_GPU_CAP", "7.5")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(colab_setup.tempfile, "tempdir", None)
    monkeypatch.delenv("NEEDLE_IMPL", raising=False)
    src, lock = _clone(tmp_path)
    absent = {"needle": None, "companion": None, "setup": False}
    run = FakeRun([absent, OURS])
    assert colab_setup.install("REPO", src, "/content", lectures=True, run=run) == 0
    pip = next(c for c in run.calls if c[0][:2] == ["-m", "pip"])
    assert pip == (["-m", "pip", "install", "-q", str(src)], str(lock), "75-real")
    assert any(c[0] == ["-m", "companion.extras"] and c[1] == str(lock) for c in run.calls)
    out = capsys.readouterr().out
    assert "installing needle from REPO (GPU: 7.5; versions of locks/py" in out
    assert out.endswith("needle installed: cpu() only\n")


def test_install_failures_name_the_repository_and_the_shadowing_folder(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("NEEDLE_IMPL", raising=False)
    src, _ = _clone(tmp_path)
    absent = {"needle": "/content/needle", "companion": None, "setup": False}
    assert colab_setup.install("REPO", src, "/c", run=FakeRun([absent], pip_rc=1)) == 1
    assert "pip-said-no" in capsys.readouterr().out
    # installed, but the student's folder still comes first: said, not silently used
    shadowed = dict(OURS, needle="/content/needle")
    assert colab_setup.install("REPO", src, "/c", run=FakeRun([absent, shadowed])) == 1
    assert "installed from REPO, but `import needle` here finds /content/needle" in (
        capsys.readouterr().out
    )
    # this project installed and shadowed from the start: no reinstall, the folder named
    run = FakeRun([shadowed])
    assert colab_setup.install("REPO", src, "/c", run=run) == 1
    assert not any(c[0][:2] == ["-m", "pip"] for c in run.calls)
    assert "rename or move the folder /content/needle" in capsys.readouterr().out


def test_the_extra_is_added_once_to_an_installed_project(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(colab_setup.tempfile, "tempdir", None)
    monkeypatch.delenv("NEEDLE_IMPL", raising=False)
    src, lock = _clone(tmp_path)
    run = FakeRun([OURS])
    assert colab_setup.install("REPO", src, "/c", lectures=True, run=run) == 0
    assert [c[:2] for c in run.calls[1:]] == [(["-m", "companion.extras"], str(lock))]
    assert colab_setup.lectures_marker() == tmp_path / "needle-companion-lectures-extra"
    assert colab_setup.lectures_marker().exists()
    run = FakeRun([OURS])  # the next notebook: nothing to do
    assert colab_setup.install("REPO", src, "/c", lectures=True, run=run) == 0
    assert len(run.calls) == 1


def test_every_supported_python_has_a_lock():
    for version in ((3, 10), (3, 11), (3, 12), (3, 13)):
        assert colab_setup.lock_file(ROOT, version) is not None, version
    assert colab_setup.lock_file(ROOT, (3, 9)) is None
