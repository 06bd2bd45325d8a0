"""A student's progress over runs of ``make check``: recorded in the homework folder, summarised.

Every run of ``python -m companion.check`` appends its per-question results to
``<homework>/.needle-check/history.json`` (the student's folder, never this repository; the
folder holds a ``.gitignore`` of ``*`` so the student's own git leaves it alone):
``{"version": 1, "homework": "hw2", "runs": [{"time": ISO-8601 UTC, "only": [...] | null,
"results": {question id: status}}, ...]}``, the latest :data:`KEEP` runs.

``python -m companion.check --progress [FOLDER ...]`` (``make progress HW=...``) prints, for each
homework folder given or found beside it (a folder named ``hwN`` brings its siblings ``hw0`` ...
``hw4_extra``; a folder that is no homework brings the homework folders inside it): passed/total,
what changed between the last two runs, and the next question to work on with the lecture
section that teaches it (:mod:`companion.check.sections`).

This module imports nothing from needle.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .questions import HOMEWORKS, questions_for
from .sections import lecture_section

FOLDER = ".needle-check"
FILE = "history.json"
VERSION = 1
KEEP = 200  # runs kept per homework
CHECKOUT = Path(__file__).resolve().parents[2]
_HW_NAME = re.compile(r"(hw4_extra|hw[0-4])")


def history_path(root: Path) -> Path:
    """The history file of the homework folder ``root``."""
    return Path(root) / FOLDER / FILE


def load_history(root: Path) -> list[dict]:
    """The recorded runs of ``root``, oldest first (empty when none, or the file is unreadable)."""
    try:
        doc = json.loads(history_path(root).read_text())
    except (OSError, ValueError):
        return []
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list):
        return []
    return [clean for clean in map(_clean_run, runs) if clean is not None]


def _clean_run(run) -> dict | None:
    """A recorded run in the shape this module reads, or None when it cannot be one (a file
    from another version, or edited by hand): a missing time reads "unknown time", entries
    that are not question -> status strings are dropped."""
    if not isinstance(run, dict) or not isinstance(run.get("results"), dict):
        return None
    results = {q: s for q, s in run["results"].items() if isinstance(s, str)}
    only = run.get("only")
    only = [str(o) for o in only] if isinstance(only, list) else None
    time = run.get("time")
    return {
        "time": time if isinstance(time, str) else "at an unknown time",
        "only": only or None,
        "results": results,
    }


def record(
    report, only: list[str] | None = None, *, now: datetime.datetime | None = None
) -> str | None:
    """Append ``report``'s results (a :class:`~companion.check.runner.Report`) to its folder's
    history. Returns None, or a one-line note when nothing was written (never raises for I/O)."""
    root = Path(report.root).resolve()
    if root == CHECKOUT or CHECKOUT in root.parents:
        return f"progress not recorded: {root} is inside this project's checkout"
    now = now or datetime.datetime.now(datetime.timezone.utc)
    runs = load_history(root)
    runs.append(
        {
            "time": now.isoformat(timespec="seconds"),
            "only": only or None,
            "results": {r.question.id: r.status for r in report.results},
        }
    )
    folder = history_path(root).parent
    try:
        folder.mkdir(exist_ok=True)
        ignore = folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# written by `make check` (companion.check.progress)\n*\n")
        tmp = folder / f".{FILE}.{os.getpid()}"
        tmp.write_text(
            json.dumps({"version": VERSION, "homework": report.hw, "runs": runs[-KEEP:]}, indent=1)
            + "\n"
        )
        os.replace(tmp, history_path(root))
    except OSError as exc:
        return f"progress not recorded in {folder}: {exc}"
    return None


def latest_status(runs: list[dict]) -> dict[str, str]:
    """Each question's status in the latest run that included it."""
    status: dict[str, str] = {}
    for run in runs:
        status.update(run["results"])
    return status


def changes(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(newly passing, newly failing) between the last run and the question's previous result
    (questions the last run did not include, or never ran before, are not changes)."""
    if len(runs) < 2:
        return [], []
    before, last = latest_status(runs[:-1]), runs[-1]["results"]
    up = [q for q, s in last.items() if s == "pass" and q in before and before[q] != "pass"]
    down = [q for q, s in last.items() if s != "pass" and before.get(q) == "pass"]
    return up, down


@dataclass
class Progress:
    """One homework folder's standing: its history summarised."""

    hw: str
    root: Path
    runs: list[dict] = field(default_factory=list)

    @property
    def status(self) -> dict[str, str]:
        return latest_status(self.runs)

    @property
    def passed(self) -> int:
        status = self.status
        return sum(status.get(q.id) == "pass" for q in questions_for(self.hw))

    @property
    def total(self) -> int:
        return len(questions_for(self.hw))

    @property
    def next_question(self) -> str | None:
        """The first question, in the homework's order, that did not pass (or never ran)."""
        status = self.status
        return next((q.id for q in questions_for(self.hw) if status.get(q.id) != "pass"), None)

    def format(self) -> list[str]:
        """The lines ``--progress`` prints for this folder."""
        head = f"{self.hw:<10} {self.passed:>3}/{self.total:<3} passed  ({self.root})"
        if not self.runs:
            return [
                f"{self.hw:<10}   -/{self.total:<3} not checked yet  ({self.root}): "
                f"make check HW={self.root}"
            ]
        lines = [
            head,
            f"{'':<11}last run {self.runs[-1]['time']}"
            + (f" (only {', '.join(self.runs[-1]['only'])})" if self.runs[-1].get("only") else ""),
        ]
        up, down = changes(self.runs)
        if up:
            lines.append(f"{'':<11}newly passing: {', '.join(up)}")
        if down:
            lines.append(f"{'':<11}newly failing: {', '.join(down)}")
        if len(self.runs) >= 2 and not (up or down):
            lines.append(f"{'':<11}no change since the run before")
        nxt = self.next_question
        if nxt is None:
            lines.append(f"{'':<11}every question passes")
        else:
            state = self.status.get(nxt, "not run yet")
            lines.append(f"{'':<11}next: {nxt} ({state}); see {lecture_section(nxt)}")
        return lines


def homework_of(folder: Path) -> str | None:
    """The homework a folder's name names (``hw2``, ``hw3-main``), else the one its history
    records (``make check --hw``), or None."""
    match = _HW_NAME.search(folder.name)
    if match:
        return match.group(1)
    try:
        recorded = json.loads(history_path(folder).read_text()).get("homework")
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return recorded if isinstance(recorded, str) and recorded in HOMEWORKS else None


def find_homeworks(folders: Iterable[str | Path]) -> list[tuple[str, Path]]:
    """(homework, folder) for every folder given or found beside it, in homework order.

    A folder named after a homework brings its siblings named after one; any other folder
    brings the homework folders inside it. Raises FileNotFoundError for a missing folder and
    ValueError when no homework folder is found at all.
    """
    found: dict[Path, str] = {}
    for given in folders:
        folder = Path(given).expanduser().resolve()
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is not a folder")
        own = homework_of(folder)
        candidates = sorted(folder.parent.iterdir()) if own else sorted(folder.iterdir())
        for c in candidates:
            hw = homework_of(c)
            if hw and c.is_dir() and not c.name.startswith("."):
                found.setdefault(c, hw)
        if own:
            found.setdefault(folder, own)
    if not found:
        raise ValueError(
            f"no homework folder (hw0 ... hw4_extra) in or beside {', '.join(map(str, folders))}"
        )
    return sorted(
        ((hw, f) for f, hw in found.items()),
        key=lambda item: (HOMEWORKS.index(item[0]), str(item[1])),
    )


def progress(folders: Iterable[str | Path]) -> list[Progress]:
    """The progress of every homework folder :func:`find_homeworks` finds."""
    return [Progress(hw, f, load_history(f)) for hw, f in find_homeworks(folders)]


def format_progress(items: list[Progress]) -> str:
    """The ``--progress`` report: a block per homework folder and a total line."""
    lines = ["companion check: progress"]
    for item in items:
        lines += item.format()
    checked = [i for i in items if i.runs]
    if checked:
        lines.append(
            f"total: {sum(i.passed for i in checked)}/{sum(i.total for i in checked)} "
            f"questions pass in {len(checked)} checked homework folder(s)"
        )
    return "\n".join(lines)
