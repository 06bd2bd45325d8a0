"""Build the lectures' website: ``python -m book.build [OUT]`` (default build/book).

Sphinx reads the repository root with the configuration in book/; the committed notebooks are
rendered as they are (myst-nb, execution off). Warnings fail the build, so a broken link or a
notebook missing from the navigation is an error, not a line scrolled past. The doctree cache
and myst-nb's output folder go beside OUT, not into the published site.

The build is incremental: afterwards the pages of notebooks that are no longer lectures (a
deleted or renamed one, a JupyterLab "Duplicate" removed again) are deleted from OUT. Two builds
into one OUT take turns on a lock file beside it (``.OUT.lock``): Sphinx's output of two runs at
once is corrupt (the second failed with "search index couldn't be loaded").
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from book import toc

ROOT = Path(__file__).resolve().parents[1]


def sphinx_command(out: Path) -> list[str]:
    """The sphinx-build command line that writes the site into ``out``."""
    out = Path(out).resolve()
    return [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-q",
        "-W",
        "--keep-going",
        "-c",
        str(ROOT / "book"),
        "-d",
        str(out.parent / f"{out.name}-doctrees"),
        str(ROOT),
        str(out),
    ]


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold OUT's lock file (waiting, and saying so, while another build holds it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another build of {out} is running; waiting for it", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def remove_stale_pages(out: Path, root: Path = ROOT) -> list[Path]:
    """Delete from ``out`` the pages (and page sources) of notebooks that are not lectures;
    return what was deleted."""
    current = {lec.stem for lec in toc.lectures(root)}
    stale = [
        page
        for folder in (out / "notebooks", out / "_sources" / "notebooks")
        for page in sorted(folder.glob("*"))
        if page.is_file() and page.name.split(".", 1)[0] not in current
    ]
    for page in stale:
        page.unlink()
    return stale


def main(argv: list[str] | None = None) -> int:
    """Run the build; the exit status is sphinx-build's."""
    parser = argparse.ArgumentParser(
        prog="python -m book.build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "build" / "book")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    with _locked(out):
        code = subprocess.run(sphinx_command(out), check=False).returncode
        if code == 0:
            remove_stale_pages(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
