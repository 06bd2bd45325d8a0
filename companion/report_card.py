"""A lecture report card: which notebook cells pass, fail or are skipped on a student's needle.

``python -m companion.report_card [NOTEBOOK ...]`` (``make lecture-report NEEDLE_IMPL=...``)
executes each lecture notebook (default: every ``notebooks/NN_*.ipynb``) in a fresh kernel that
inherits ``NEEDLE_IMPL`` (so ``import needle`` is the student's package, :mod:`companion.impl`),
carrying on after a failing cell, and prints one table: per notebook the code cells that passed,
failed and were skipped (companion-only cells, which :func:`companion.lecture.setup` turns into
one skip line under ``NEEDLE_IMPL``), and the first failing cell's number, the line that raised
and the error. The line that raised is read from the error's traceback: the deepest frame in the
student's homework folder (the folder above ``NEEDLE_IMPL``: their ``file:line`` and its code),
else the cell's own line.
Nothing is written back to the notebooks. Exit status 1 when any cell failed.

Inside one notebook, :func:`companion.lecture.report_card` prints the same tally for the cells
run so far in that kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from companion.lecture import CHECKOUT, SKIP_PREFIX

NOTEBOOKS = CHECKOUT / "notebooks"


@dataclass
class Card:
    """One notebook's result: counts of code cells, and the first failure (cell number counts
    code cells from 1; ``first_line`` is the cell's first non-blank line, ``where`` the line
    that raised, see :func:`failing_line`)."""

    notebook: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_run: int = 0
    first_failure: dict | None = None
    failures: list[dict] = field(default_factory=list)
    note: str = ""


def _first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# IPython's frame headers: "File /path/x.py:12, in f()" (or "File /path/x.py:12") and
# "Cell In[3], line 4" (", in f()" for a function the notebook defined); the line that ran is
# marked "----> 12 code".
_FILE_FRAME = re.compile(r"\s*File (?P<path>.+?):(?P<line>\d+)(?:, in .*)?")
_CELL_FRAME = re.compile(r"\s*Cell In\[\d*\], line (?P<line>\d+)(?:, in .*)?")
_ARROW = re.compile(r"\s*-+>\s*(?P<line>\d+)\s?(?P<code>.*)")


def _frames(traceback: list[str]) -> list[tuple[str | None, str, str]]:
    """(path or None for the cell, line number, code) of each frame in an IPython traceback."""
    frames = []
    for entry in traceback:
        lines = [line for line in _ANSI.sub("", entry).splitlines() if line.strip()]
        if not lines:
            continue
        file, cell = _FILE_FRAME.fullmatch(lines[0]), _CELL_FRAME.fullmatch(lines[0])
        if not (file or cell):
            continue
        marked = [m for m in map(_ARROW.fullmatch, lines[1:]) if m]
        code = marked[-1].group("code") if marked else (lines[1] if len(lines) > 1 else "")
        number = (file or cell).group("line")  # type: ignore[union-attr]
        frames.append((file.group("path") if file else None, number, code.strip()))
    return frames


def _site(frame: tuple[str | None, str, str]) -> str:
    """A frame as ``line N `code``` (a notebook cell) or ``path:N `code``` (the path relative
    to this project's checkout when inside it)."""
    path, number, code = frame
    if path is None:
        return f"line {number} `{code}`"
    resolved = Path(path).resolve()
    if resolved.is_relative_to(CHECKOUT):
        path = resolved.relative_to(CHECKOUT).as_posix()
    return f"{path}:{number} `{code}`"


def failing_line(traceback: list[str], student: Path | None) -> str:
    """Where an error was raised, from its IPython ``traceback`` (a notebook's error output):
    ``path:line `code``` for the deepest frame inside ``student`` (the student's homework
    folder; the path relative to it); else the cell's line, ``line N `code```, followed by
    ``(raised at ...)`` when a deeper frame (a function the notebook or a library defines)
    raised; "" when the traceback names no frame."""
    frames = _frames(traceback)
    if not frames:
        return ""
    in_student = student_site(frames, student)
    if in_student:
        return in_student
    cell = next((f for f in frames if f[0] is None), frames[0])
    where = _site(cell)
    return where if frames[-1] is cell else f"{where} (raised at {_site(frames[-1])})"


def student_site(frames: Iterable[tuple[str | None, object, str]], student: Path | None) -> str:
    """``path:line `code``` of the deepest of ``frames`` ((path, line, code), outermost first)
    inside the folder ``student`` (the path relative to it); "" when none is, or no folder."""
    if student is None:
        return ""
    for path, number, code in reversed(list(frames)):
        if path is not None and Path(path).resolve().is_relative_to(student):
            relative = Path(path).resolve().relative_to(student).as_posix()
            return f"{relative}:{number} `{code}`"
    return ""


def _homework_root() -> Path | None:
    """The folder above NEEDLE_IMPL's (the homework root, which holds the student's files)."""
    impl = os.environ.get("NEEDLE_IMPL", "").strip()
    return Path(impl).expanduser().resolve().parent if impl else None


def grade(nb, name: str) -> Card:
    """The card of an executed notebook ``nb`` (an nbformat node): each non-empty code cell is
    skipped (it printed the companion-only skip line), failed (an error output), not run (no
    execution count: the kernel died or timed out before it) or passed."""
    card = Card(name)
    student = _homework_root()
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1
        if not cell.source.strip():
            continue
        outputs = cell.get("outputs", [])
        error = next((o for o in outputs if o.get("output_type") == "error"), None)
        if error is not None:
            card.failed += 1
            failure = {
                "cell": number,
                "first_line": _first_line(cell.source),
                "where": failing_line(error.get("traceback", []), student),
                "error": f"{error.get('ename', '?')}: {error.get('evalue', '')}".strip(),
            }
            card.failures.append(failure)
            card.first_failure = card.first_failure or failure
        elif any(
            o.get("output_type") == "stream" and o.get("text", "").startswith(SKIP_PREFIX)
            for o in outputs
        ):
            card.skipped += 1
        elif cell.get("execution_count") is None:
            card.not_run += 1
        else:
            card.passed += 1
    return card


def execute(path: Path, timeout: int = 1200):
    """Execute the notebook at ``path`` (cwd: its folder) from scratch, carrying on after a
    failing cell; returns (the executed nbformat node, note). A kernel that dies or a cell that
    times out ends the run; ``note`` then says why (else "")."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:  # grade this run's outputs only
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    note = ""
    try:
        client.execute()
    except Exception as exc:  # DeadKernelError, CellTimeoutError: grade what ran
        first = (str(exc).strip().splitlines() or [""])[0]
        note = f"{type(exc).__name__}: {first}"
    return nb, note


def run_notebook(path: Path, timeout: int = 1200) -> Card:
    """Execute the notebook at ``path`` (:func:`execute`) and grade it; the cells after a dead
    kernel or a timed-out cell count as not run, and ``note`` says why."""
    nb, note = execute(path, timeout)
    card = grade(nb, path.stem)
    card.note = note
    return card


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 4] + "...`"


def format_cards(cards: list[Card], needle: str) -> str:
    """The table: notebook, passed, failed, skipped (and not run), the first failure (its cell,
    the line that raised and the error)."""
    lines = [
        f"lecture report card: needle from {needle}",
        f"{'notebook':<36}{'passed':>7}{'failed':>7}{'skipped':>8}  first failing cell",
    ]
    lines.append("-" * 100)
    for c in cards:
        first = ""
        if c.first_failure:
            f = c.first_failure
            where = f.get("where") or f"`{f['first_line'][:50]}`"
            first = f"cell {f['cell']}: {_clip(where, 110)}: {f['error'][:120]}"
        if c.not_run:
            first += f"{'; ' if first else ''}{c.not_run} cell(s) not run ({c.note})"
        lines.append(f"{c.notebook:<36}{c.passed:>7}{c.failed:>7}{c.skipped:>8}  {first}")
    total = [sum(getattr(c, k) for c in cards) for k in ("passed", "failed", "skipped")]
    lines.append("-" * 100)
    lines.append(f"{'total':<36}{total[0]:>7}{total[1]:>7}{total[2]:>8}")
    return "\n".join(lines)


def _needle_in_use() -> str:
    impl = os.environ.get("NEEDLE_IMPL", "").strip()
    if impl:
        return f"{Path(impl).expanduser().resolve()} (NEEDLE_IMPL)"
    return f"{CHECKOUT / 'needle'} (this project's; set NEEDLE_IMPL for your own)"


def main(argv: list[str] | None = None) -> int:
    """Run the notebooks, print the table; exit status 1 when a cell failed or did not run."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.report_card", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "notebooks",
        nargs="*",
        type=Path,
        help="notebooks (.ipynb, or the paired .py); default: all of notebooks/",
    )
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per cell")
    parser.add_argument("--json", type=Path, help="also write the cards as JSON")
    args = parser.parse_args(argv)
    paths = [p.with_suffix(".ipynb") for p in args.notebooks] or sorted(
        NOTEBOOKS.glob("[0-9]*.ipynb")
    )
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"companion report card: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    needle = _needle_in_use()
    cards = []
    for path in paths:
        print(f"running {path.name} ...", file=sys.stderr, flush=True)
        cards.append(run_notebook(path.resolve(), args.timeout))
    print(format_cards(cards, needle))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cards], indent=1) + "\n")
    return 1 if any(c.failed or c.not_run for c in cards) else 0


if __name__ == "__main__":
    sys.exit(main())
