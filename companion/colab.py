"""Open a lecture in Colab: each notebook's badge and first (set-up) code cell, generated.

The repository's address is written once, in ``pyproject.toml``'s ``[project.urls] Repository``.
From it this module derives, for every ``notebooks/NN_topic.py``:

* the "Open in Colab" badge line, right under the title of the header (first markdown) cell;
* the set-up cell, the first code cell: in Colab (``"google.colab" in sys.modules``) it installs
  this project with one ``pip install "needle @ git+<repository>"`` (then, for the notebooks
  that import the lectures' extras, ``python -m companion.extras``: each of its packages on its
  own, so one without a wheel stops nothing), which compiles the CPU module and, where ``nvcc``
  exists and a GPU is present, the CUDA module for that GPU's architecture only (T4 sm_75,
  A100 sm_80, L4 sm_89; ``CUDAARCHS`` keeps the build short). Anywhere else it does nothing and
  prints nothing, so the committed outputs and nbval are unaffected.

Two environment variables let the cell be tested outside Colab: ``NEEDLE_COLAB_SIMULATE=1``
makes it act as in Colab, ``NEEDLE_COLAB_REPO`` (a local clone's folder or any pip ``git+`` URL
target) replaces the repository; ``NEEDLE_COLAB_GPU_CAP`` (``7.5``) stands for ``nvidia-smi``'s
answer on a machine without a GPU.

``python -m companion.colab --write`` rewrites every notebook's badge and set-up cell (the
``.py`` sources; regenerate the ``.ipynb`` with ``jupytext --to ipynb --update``);
``python -m companion.colab --check`` lists the notebooks that differ from what it would write.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: The branch Colab opens the notebooks from.
BRANCH = "main"
#: The set-up cell's marker line: the website (book/) leaves the cell out (``remove-cell``).
CELL_MARKER = '# %% tags=["remove-cell"]'
#: The first line of the set-up cell: how the generator finds the cell it wrote.
SETUP_MARK = "# Colab set-up"
#: A notebook that imports one of these modules (or runs mpiexec) installs the lectures extra.
LECTURES_MODULES = ("mpi4py", "mpiexec", "onnx", "onnxruntime", "tvm")

SETUP_TEMPLATE = """\
# Colab set-up (written by `python -m companion.colab --write`): in Colab this installs needle
# and compiles its CPU module, and its CUDA module for the GPU runtime's GPU (about 2-3 minutes);
# anywhere else it does nothing.
import importlib.util, os, sys
in_colab = "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1"
if in_colab and importlib.util.find_spec("needle"):
    print("needle is installed (by this cell, earlier in this Colab session)")
elif in_colab:
    import importlib, shutil, subprocess
    repo = os.environ.get("NEEDLE_COLAB_REPO", "{repo}")
    repo = "file://localhost" + os.path.abspath(repo) if os.path.isdir(repo) else repo
    env = dict(os.environ)
    if not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        env["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
    cap = os.environ.get("NEEDLE_COLAB_GPU_CAP", "")
    if not cap and shutil.which("nvidia-smi"):  # compute capability: T4 7.5, A100 8.0, L4 8.9
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().split("\\n")[0]
    cap = cap if cap.replace(".", "").isdigit() else ""
    if cap:  # the CUDA module for this GPU's architecture only
        env["CUDAARCHS"] = cap.replace(".", "") + "-real"
    else:  # no GPU: no CUDA module (Runtime > Change runtime type > GPU, then run this again)
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DNEEDLE_CUDA=OFF").strip()
    print(f"installing needle from {{repo}} (GPU: {{cap or 'none'}}); this takes 2-3 minutes")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"needle @ git+{{repo}}"],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError("pip install failed:\\n" + done.stdout[-3000:] + done.stderr[-3000:])
    importlib.invalidate_caches(){extras_step}
    import needle
    print("needle installed:", "cuda() is available" if needle.cuda().enabled() else "cpu() only")
"""


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


#: What the cell adds for a notebook that needs the lectures extra: each of its packages on its
#: own (``companion.extras``), so one without a wheel for the platform stops nothing.
EXTRAS_STEP = """
    extra = subprocess.run([sys.executable, "-m", "companion.extras"], capture_output=True,
                           text=True)  # MPI, ONNX, TVM: each where it installs
    print(extra.stdout, end="")"""


def setup_cell(repo: str, extra: str = "") -> str:
    """The set-up cell's Python source (no trailing newline) for ``repo``; ``extra`` is
    ``"[lectures]"`` for a notebook that needs the lectures extra (see :func:`extras`)."""
    step = EXTRAS_STEP if extra == "[lectures]" else ""
    if extra not in ("", "[lectures]"):
        raise ValueError(f"unknown extra {extra!r}: the set-up cell knows '' and '[lectures]'")
    return SETUP_TEMPLATE.format(repo=repo, extras_step=step).rstrip("\n")


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
    if lines[start + 1] == SETUP_MARK or lines[start + 1].startswith(SETUP_MARK + " "):
        end = next((i for i in markers if i > start), len(lines))
        lines[start:end] = cell
    else:
        lines[start:start] = cell
    return "\n".join(lines)


def sources(folder: Path = NOTEBOOKS) -> List[Path]:
    """The lecture notebooks' percent-format sources, ``NN_topic.py``, in order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def stale(folder: Path = NOTEBOOKS, repo: Optional[str] = None) -> List[Path]:
    """The sources whose badge or set-up cell differs from what :func:`generate` writes."""
    repo = repo or repository_url()
    return [p for p in sources(folder) if generate(p.read_text(), p.stem, repo) != p.read_text()]


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
        new = generate(path.read_text(), path.stem, repo)
        if new != path.read_text():
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
