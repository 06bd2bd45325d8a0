"""book/toc.py: the lectures' table read from the notebook headers, and the README's copy of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from book import toc

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

HEADER = """# 07 · Convolutions

**Lecture:** 10, "Convolutional Networks", and 14, "Implementing
Convolutions"

**Homework:** hw4 Q3 (`pad` | `flip`)

**Run time:** about 50 s on a 2-core x86-64 machine
**Student mode:** with NEEDLE_IMPL, some cells
are skipped.

Text that belongs to no field.
"""


def _notebook(tmp_path: Path, name: str, *markdown: str) -> Path:
    cells = [
        {
            "cell_type": "code",
            "source": "x = 1",
            "outputs": [],
            "metadata": {},
            "execution_count": None,
        }
    ]
    cells += [{"cell_type": "markdown", "source": m, "metadata": {}} for m in markdown]
    path = tmp_path / name
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    return path


def test_header_fields_reads_title_and_multi_line_fields():
    number, title, fields = toc.header_fields(HEADER)
    assert (number, title) == ("07", "Convolutions")
    assert fields["Lecture"] == (
        '10, "Convolutional Networks", and 14, "Implementing Convolutions"'
    )
    assert fields["Run time"] == "about 50 s on a 2-core x86-64 machine"
    assert fields["Student mode"] == "with NEEDLE_IMPL, some cells are skipped."
    assert "Text" not in " ".join(fields.values())


def test_header_without_a_title_line_is_rejected():
    with pytest.raises(ValueError, match="not '# NN · Title'"):
        toc.header_fields("**Lecture:** 1\n")
    with pytest.raises(ValueError, match="not '# NN · Title'"):
        toc.header_fields("# Convolutions\n")


def test_read_lecture_uses_the_first_markdown_cell(tmp_path):
    lecture = toc.read_lecture(
        _notebook(tmp_path, "07_convolutions.ipynb", HEADER, "# 99 · Not the header")
    )
    assert (lecture.number, lecture.title, lecture.stem) == (
        "07",
        "Convolutions",
        "07_convolutions",
    )
    assert lecture.course_lectures == "10, 14"
    assert lecture.run_time == "about 50 s"


@pytest.mark.parametrize(
    "name, markdown, message",
    [
        ("07_x.ipynb", None, "07_x.ipynb: no markdown cell"),
        ("08_x.ipynb", HEADER, "08_x.ipynb: the header's number 07 is not the file's"),
        (
            "07_x.ipynb",
            HEADER.replace("**Homework:**", "**Homework**"),
            "07_x.ipynb: the header has no Homework field",
        ),
        ("07_x.ipynb", HEADER.replace("# 07 · ", "# "), "07_x.ipynb: the header's first line"),
    ],
)
def test_read_lecture_names_what_is_wrong(tmp_path, name, markdown, message):
    path = _notebook(tmp_path, name, *([markdown] if markdown else []))
    with pytest.raises(ValueError, match=re.escape(message)):
        toc.read_lecture(path)


def test_course_lectures_are_every_numbered_lecture_in_order():
    lecture = toc.Lecture(
        Path("03_x.ipynb"),
        "03",
        "x",
        {
            "Lecture": '8, "NN Library" (with part of lecture 6, "Fully Connected", and of '
            'lecture 7, "Abstractions"), and 23-24, "Compilation", 11, "Hardware"'
        },
    )
    assert lecture.course_lectures == "6, 7, 8, 11, 23-24"


def test_urls_derive_from_the_repository_url(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nRepository = "https://github.com/Some-Owner/'
        'course-repo/"\n',
        encoding="utf-8",
    )
    repo = toc.repository(tmp_path)
    lecture = toc.Lecture(Path("/r/notebooks/05_ndarray.ipynb"), "05", "The NDArray", {})
    assert repo == "https://github.com/Some-Owner/course-repo"
    assert toc.site_url(repo) == "https://some-owner.github.io/course-repo/"
    assert toc.colab_url(repo, lecture) == (
        "https://colab.research.google.com/github/"
        "Some-Owner/course-repo/blob/main/notebooks/"
        "05_ndarray.ipynb"
    )
    assert toc.source_url(repo, lecture) == (
        "https://github.com/Some-Owner/course-repo/blob/main/notebooks/05_ndarray.py"
    )


def test_a_repository_url_that_is_not_github_is_rejected(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nRepository = "https://example.org/x"\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="not https://github.com/OWNER/REPO"):
        toc.repository(tmp_path)


def test_every_lecture_notebook_is_listed_in_order():
    assert NOTEBOOKS
    assert [lec.path for lec in toc.lectures(ROOT)] == NOTEBOOKS
    for lecture in toc.lectures(ROOT):
        assert lecture.course_lectures, f"{lecture.stem}: no course lecture number found"


def test_table_cells_escape_the_column_separator():
    _, title, fields = toc.header_fields(HEADER)
    row = toc.table(
        [toc.Lecture(Path("07_convolutions.ipynb"), "07", title, fields)],
        "https://github.com/o/r",
        page_link=lambda lec: "p.html",
        colab=lambda url: "C",
    )[2]
    assert row.count(" | ") == 5 and "`pad` \\| `flip`" in row


# ---- the README's copy ----------------------------------------------------------------------


def test_readme_lectures_table_is_what_the_script_generates():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert toc.replace_block(readme, toc.readme_block()) == readme, (
        "README.md's lectures table is stale: run python -m book.toc --write"
    )


def test_readme_links_each_notebook_to_its_site_page_and_colab():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    repo = toc.repository(ROOT)
    owner_repo = repo.removeprefix("https://github.com/")
    for nb in NOTEBOOKS:
        assert f"{toc.site_url(repo)}notebooks/{nb.stem}.html" in readme, nb.name
        assert (
            f"https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/{nb.name}"
        ) in readme, nb.name


def test_replace_block_needs_the_markers():
    with pytest.raises(ValueError, match="no lectures block"):
        toc.replace_block("# README\n", "block")
    text = f"a\n{toc.START}\nold\n{toc.END}\nb\n"
    assert toc.replace_block(text, "NEW") == "a\nNEW\nb\n"


def _course_root(tmp_path: Path, *names: str) -> Path:
    """A root whose notebooks/ holds ``names`` (valid lecture headers), each ``.py`` given
    in ``names`` too."""
    (tmp_path / "notebooks").mkdir(parents=True)
    for name in names:
        if name.endswith(".ipynb"):
            _notebook(tmp_path / "notebooks", name, HEADER)
        else:
            (tmp_path / "notebooks" / name).write_text("# %%\n")
    return tmp_path


def test_a_jupyterlab_duplicate_is_not_a_lecture(tmp_path):
    """JupyterLab's "Duplicate" (07_convolutions-Copy1.ipynb) matched the notebook pattern and
    was published as a page; a lecture is a notebook paired with its Jupytext source."""
    root = _course_root(
        tmp_path, "07_convolutions.ipynb", "07_convolutions.py", "07_convolutions-Copy1.ipynb"
    )
    assert [lec.stem for lec in toc.lectures(root)] == ["07_convolutions"]


def test_the_pages_of_notebooks_that_are_gone_are_removed(tmp_path):
    """The build is incremental: the page of a notebook deleted since the last build (the
    Duplicate above, once deleted) stayed in build/book. Oracle: the lectures of the root."""
    from book import build

    root = _course_root(tmp_path / "repo", "07_convolutions.ipynb", "07_convolutions.py")
    out = tmp_path / "site"
    pages = {
        "notebooks/07_convolutions.html",
        "notebooks/07_convolutions-Copy1.html",
        "_sources/notebooks/07_convolutions.ipynb.txt",
        "_sources/notebooks/07_convolutions-Copy1.ipynb.txt",
        "index.html",
    }
    for page in pages:
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text("page")
    removed = build.remove_stale_pages(out, root)
    assert sorted(p.relative_to(out).as_posix() for p in removed) == [
        "_sources/notebooks/07_convolutions-Copy1.ipynb.txt",
        "notebooks/07_convolutions-Copy1.html",
    ]
    left = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert left == pages - {"notebooks/07_convolutions-Copy1.html"} - {
        "_sources/notebooks/07_convolutions-Copy1.ipynb.txt"
    }


def test_two_builds_into_one_folder_take_turns(tmp_path, monkeypatch, capsys):
    """Two `make book` at once: the second failed ("search index couldn't be loaded"). Now it
    waits on the folder's lock file; here the lock is held by the test for 0.5 s and the build
    command (a stand-in for sphinx-build) must start only after that."""
    import fcntl
    import sys
    import threading
    import time

    from book import build

    out = tmp_path / "site"
    started = tmp_path / "started"
    stand_in = [sys.executable, "-c", f"open({str(started)!r}, 'w').write('x')"]
    monkeypatch.setattr(build, "sphinx_command", lambda o: stand_in)
    monkeypatch.setattr(build, "remove_stale_pages", lambda o: [])
    with open(tmp_path / ".site.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        codes = []
        thread = threading.Thread(target=lambda: codes.append(build.main([str(out)])))
        thread.start()
        time.sleep(0.5)
        assert not started.exists()
        fcntl.flock(lock, fcntl.LOCK_UN)
        thread.join(60)
    assert codes == [0] and started.exists()
    assert f"another build of {out} is running; waiting for it" in capsys.readouterr().out
