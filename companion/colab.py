"""Open a lecture in Colab: each notebook's badge and first (set-up) code cell, generated.

The repository's address is written once, in ``pyproject.toml``'s ``[project.urls] Repository``.
From it this module derives, for every ``notebooks/NN_topic.py``:

* the "Open in Colab" badge line, right under the title of the header (first markdown) cell;
* the set-up cell, the first code cell: collapsed to its title in Colab (``#@title`` and
  ``cellView: form``) and in JupyterLab (``source_hidden``), left out of the website
  (``remove-cell``), at most five lines. In Colab (``"google.colab" in sys.modules``) it asks
  :mod:`companion.colab_setup` whether this project's ``needle`` and ``companion`` are what the
  notebook imports; when they are not, it clones the repository and runs that module's install
  from the clone (pip, held to the lock of Colab's Python; the CUDA module for the runtime's GPU;
  the lectures extra for the notebooks that use it). Its failure message names the repository it
  tried. Anywhere else it does nothing and prints nothing, so the committed outputs and nbval
  are unaffected.

Two environment variables let the cell be tested outside Colab: ``NEEDLE_COLAB_SIMULATE=1``
makes it act as in Colab, ``NEEDLE_COLAB_REPO`` (a local clone's folder or any ``git clone``
address) replaces the repository; the clone goes to ``$TMPDIR/needle-companion``.

``python -m companion.colab --write`` rewrites every notebook's badge and set-up cell, in the
``.py`` source and in the executed ``.ipynb`` (that cell's source and metadata, and the badge
line; nothing is re-executed: outside Colab the cell has no output).
``python -m companion.colab --check`` lists the notebooks that differ from what it would write.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: The branch Colab opens the notebooks from.
BRANCH = "main"
#: The set-up cell's marker line: the website (book/) leaves the cell out (``remove-cell``);
#: Colab shows only its title (``cellView: form``), JupyterLab collapses it (``source_hidden``).
CELL_MARKER = '# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}'
#: The set-up cell's metadata in the .ipynb (what CELL_MARKER says).
CELL_METADATA = {"tags": ["remove-cell"], "cellView": "form", "jupyter": {"source_hidden": True}}
#: The first line of the set-up cell: how the generator finds the cell it wrote (and the first
#: line of the earlier, longer cell, which it replaces).
SETUP_MARK = "#@title Colab set-up"
LEGACY_MARKS = ("# Colab set-up",)
#: A notebook that imports one of these modules (or runs mpiexec) installs the lectures extra.
LECTURES_MODULES = ("mpi4py", "mpiexec", "onnx", "onnxruntime", "tvm")
#: At most this many lines of source, so the collapsed cell stays a few lines when opened.
MAX_LINES = 5

#: The cell's five lines (a format string: {repo}, {lectures}), each written in pieces here.
SETUP_TEMPLATE = "\n".join(
    [
        "#@title Colab set-up: in Colab this installs needle (2-3 minutes); "
        "elsewhere it does nothing",
        "import os, shlex, subprocess, sys, tempfile; "
        'repo = os.environ.get("NEEDLE_COLAB_REPO", "{repo}")',
        'if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":'
        "  # companion/colab_setup.py",
        "    py, src, q = sys.executable, "
        'os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote',
        '    done = subprocess.run(f"{{q(py)}} -m companion.colab_setup --status{lectures} '
        "2>/dev/null || "
        "{{{{ {{{{ test -d {{q(src)}} || git clone -q --depth=1 {{q(repo)}} {{q(src)}}; }}}} && "
        "cd {{q(src)}} && {{q(py)}} -m companion.colab_setup --install {{q(repo)}} "
        '--cwd {{q(os.getcwd())}}{lectures}; }}}}", shell=True, capture_output=True, text=True); '
        'print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, '
        'f"the set-up could not install this project from {{repo}} (what failed is above)"',
    ]
)


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The repository's address: ``[project.urls] Repository`` of ``pyproject``, no trailing
    slash or ``.git``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser as the tomli package (in the dev extra for 3.10)
        import tomli as tomllib
    urls = tomllib.loads(pyproject.read_text())["project"].get("urls", {})
    if "Repository" not in urls:
        raise KeyError(f"{pyproject} has no [project.urls] Repository entry")
    url = urls["Repository"].rstrip("/")
    return url[:-4] if url.endswith(".git") else url


def colab_url(repo: str, notebook: str) -> str:
    """The Colab address that opens ``notebooks/<notebook>.ipynb`` of ``repo`` (a GitHub URL)
    from its ``main`` branch."""
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)", repo)
    if match is None:
        raise ValueError(
            f"Colab opens notebooks from GitHub: {repo!r} is not https://github.com/<owner>/<repo>"
        )
    return (
        f"https://colab.research.google.com/github/{match.group(1)}/blob/{BRANCH}/"
        f"notebooks/{notebook}.ipynb"
    )


def badge_line(notebook: str, repo: str) -> str:
    """The markdown badge that opens ``notebooks/<notebook>.ipynb`` of ``repo`` in Colab."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repo, notebook)})"


def extras(source: str) -> str:
    """``"[lectures]"`` when the notebook's source uses a module of the lectures extra, else
    ``""``."""
    pattern = r"\b(import|from)\s+(" + "|".join(LECTURES_MODULES) + r")\b|\bmpiexec\b"
    return "[lectures]" if re.search(pattern, source) else ""


def setup_cell(repo: str, extra: str = "") -> str:
    """The set-up cell's Python source (no trailing newline) for ``repo``; ``extra`` is
    ``"[lectures]"`` for a notebook that needs the lectures extra (see :func:`extras`)."""
    if extra not in ("", "[lectures]"):
        raise ValueError(f"unknown extra {extra!r}: the set-up cell knows '' and '[lectures]'")
    if any(c in repo for c in '"\\\n'):
        raise ValueError(f"a repository address with a quote or a backslash: {repo!r}")
    lectures = " --lectures" if extra == "[lectures]" else ""
    return SETUP_TEMPLATE.format(repo=repo, lectures=lectures).rstrip("\n")


def _cells(lines: List[str]) -> List[int]:
    """Indices of the ``# %%`` cell markers of a percent-format script."""
    return [i for i, line in enumerate(lines) if line.startswith("# %%")]


def generate(text: str, notebook: str, repo: str) -> str:
    """``text`` (a percent-format notebook source named ``notebook``) with its badge line under
    the header's title and its set-up cell first among the code cells, both as generated from
    ``repo``; anything the generator wrote before is replaced, nothing else changes."""
    lines = text.split("\n")
    markers = _cells(lines)
    if not markers or not lines[markers[0]].startswith("# %% [markdown]"):
        raise ValueError(f"{notebook}: the first cell is not the markdown header")
    # The badge: the line after the title (a blank comment line between them).
    title = markers[0] + 1
    if not lines[title].startswith("# # "):
        raise ValueError(f"{notebook}: the header does not start with a '# # title' line")
    badge = "# " + badge_line(notebook, repo)
    after = lines[title + 1 : title + 3]
    if len(after) == 2 and after[0] == "#" and after[1].startswith("# [![Open In Colab]"):
        lines[title + 2] = badge
    else:
        lines[title + 1 : title + 1] = ["#", badge]
    # The set-up cell: replaced where it is, else inserted before the first code cell.
    markers = _cells(lines)
    code = [i for i in markers if not lines[i].startswith("# %% [markdown]")]
    if not code:
        raise ValueError(f"{notebook}: no code cell")
    start = code[0]
    cell = [CELL_MARKER] + setup_cell(repo, extras(text)).split("\n") + [""]
    if lines[start + 1].startswith((SETUP_MARK,) + LEGACY_MARKS):
        end = next((i for i in markers if i > start), len(lines))
        lines[start:end] = cell
    else:
        lines[start:start] = cell
    return "\n".join(lines)


#: The .ipynb's jupytext setting: which cell metadata the paired .py keeps (the set-up cell's).
CELL_METADATA_FILTER = "tags,cellView,jupyter,-all"


def _lines(text: str) -> List[str]:
    """``text`` as an .ipynb stores a source: lines, each but the last with its newline."""
    return text.splitlines(keepends=True)


def generate_ipynb(text: str, notebook: str, repo: str, extra: str) -> str:
    """``text`` (an executed ``.ipynb``, JSON) with the badge line of its header cell and its
    set-up cell's source and metadata as generated from ``repo``; outputs, execution counts and
    every other cell are kept. ``extra``: see :func:`setup_cell`."""
    nb = json.loads(text)
    cells = nb["cells"]
    header = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "markdown" else ""
    badge = [i for i, line in enumerate(_lines(header)) if line.startswith("[![Open In Colab]")]
    if not badge:
        raise ValueError(f"{notebook}.ipynb: no badge line in the header: run `make notebook`")
    lines = _lines(header)
    lines[badge[0]] = badge_line(notebook, repo) + ("\n" if lines[badge[0]].endswith("\n") else "")
    cells[0]["source"] = lines
    code = next((c for c in cells if c["cell_type"] == "code"), None)
    first = "".join(code["source"]) if code else ""
    if not first.startswith((SETUP_MARK,) + LEGACY_MARKS):
        raise ValueError(f"{notebook}.ipynb: no set-up cell first: run `make notebook`")
    code["source"] = _lines(setup_cell(repo, extra))
    kept = {k: v for k, v in code["metadata"].items() if k not in CELL_METADATA}
    code["metadata"] = {**kept, **json.loads(json.dumps(CELL_METADATA))}
    nb["metadata"].setdefault("jupytext", {})["cell_metadata_filter"] = CELL_METADATA_FILTER
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def sources(folder: Path = NOTEBOOKS) -> List[Path]:
    """The lecture notebooks' percent-format sources, ``NN_topic.py``, in order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def rewritten(path: Path, repo: str) -> "dict[Path, str]":
    """The files of ``path`` (``NN_topic.py``) and its ``.ipynb`` whose generated text differs
    from what they hold: {file: new text}."""
    text = path.read_text()
    new = {path: generate(text, path.stem, repo)}
    ipynb = path.with_suffix(".ipynb")
    if ipynb.exists():
        new[ipynb] = generate_ipynb(ipynb.read_text(), path.stem, repo, extras(text))
    return {p: t for p, t in new.items() if _differs(p, t)}


def _differs(path: Path, text: str) -> bool:
    """Whether ``text`` says something else than ``path`` holds (for a notebook, as JSON: the
    order of a cell's metadata keys, which executing it may change, does not count)."""
    old = path.read_text()
    if path.suffix == ".ipynb":
        return json.loads(text) != json.loads(old)
    return text != old


def stale(folder: Path = NOTEBOOKS, repo: Optional[str] = None) -> List[Path]:
    """The files (sources and notebooks) whose badge or set-up cell differs from what
    :func:`generate` and :func:`generate_ipynb` write."""
    repo = repo or repository_url()
    return [p for path in sources(folder) for p in rewritten(path, repo)]


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: ``--write``, ``--check`` or ``--print-cell NN_topic``; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.colab", description=__doc__.split("\n\n")[0]
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument(
        "--write", action="store_true", help="rewrite each notebook's badge and set-up cell"
    )
    group.add_argument(
        "--check", action="store_true", help="list the notebooks that differ; exit 1 if any"
    )
    group.add_argument("--print-cell", metavar="NN_topic", help="print one notebook's set-up cell")
    args = parser.parse_args(argv)
    repo = repository_url()
    if args.print_cell:
        path = NOTEBOOKS / f"{args.print_cell}.py"
        print(setup_cell(repo, extras(path.read_text())))
        return 0
    if args.check:
        out = stale(repo=repo)
        for path in out:
            print(
                f"{path.name}: badge or set-up cell differs from "
                "`python -m companion.colab --write`"
            )
        return 1 if out else 0
    for path in sources():
        for file, text in rewritten(path, repo).items():
            file.write_text(text)
            print(f"wrote {file.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
