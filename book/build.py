"""Build the lectures' website: ``python -m book.build [OUT]`` (default build/book).

Sphinx reads the repository root with the configuration in book/; the committed notebooks are
rendered as they are (myst-nb, execution off). Warnings fail the build, so a broken link or a
notebook missing from the navigation is an error, not a line scrolled past. The doctree cache
and myst-nb's output folder go beside OUT, not into the published site.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    """Run the build; the exit status is sphinx-build's."""
    parser = argparse.ArgumentParser(
        prog="python -m book.build", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "build" / "book")
    args = parser.parse_args(argv)
    return subprocess.run(sphinx_command(args.out), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
