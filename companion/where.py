"""Where each homework question's answer lives: the file, line and function.

Every function, method or class that a homework question asks for carries one marker comment
on the line just above its ``def``/``class`` (C++: above the function's first line)::

    # question: hw2_sgd
    def step(self) -> None:

``// question: hw3_compact`` in C++ sources. A marker may name several questions when one
function answers each (``# question: hw0_softmax_loss hw1_softmax_loss``). The ids are the
checker's (``companion.check.questions``). The map is read from the sources each time, so it
cannot drift from the code.

Run: ``python -m companion.where hw2_sgd`` (or ``make where Q=hw2_sgd``) prints
``path:line  function`` lines; with no argument, the whole table.
"""

from __future__ import annotations

import difflib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

from companion.check.questions import BY_ID

ROOT = Path(__file__).resolve().parent.parent
# The course's code: the framework, the applications, the C++/CUDA sources.
SCANNED = ("needle", "companion/apps", "src")
SUFFIXES = (".py", ".cc", ".cu", ".h", ".cuh")
MARKER = re.compile(r"^\s*(?:#|//) question: (?P<ids>[\w ]+?)\s*$")
_PY_DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?:def|class)\s+(?P<name>\w+)")
_CC_DEF = re.compile(r"(?P<name>\w+)\s*\(")


class Location(NamedTuple):
    """One marker: the file (relative to the repository root), the marker's 1-based line
    (the definition is on the next line) and the function's name (``Class.method``)."""

    path: str
    line: int
    function: str


def _python_name(lines: List[str], i: int) -> Optional[str]:
    """The qualified name defined on line ``i`` (0-based), or None if it defines nothing."""
    m = _PY_DEF.match(lines[i])
    if m is None:
        return None
    names, indent = [m.group("name")], len(m.group("indent"))
    for j in range(i - 1, -1, -1):
        if indent == 0:
            break
        outer = _PY_DEF.match(lines[j])
        if outer and len(outer.group("indent")) < indent:
            names.insert(0, outer.group("name"))
            indent = len(outer.group("indent"))
    return ".".join(names)


def _cc_name(line: str) -> Optional[str]:
    """The function a C++ line starts to define (the name before its first parenthesis)."""
    if not line or line[0].isspace() or line.lstrip().startswith(("//", "#")):
        return None
    m = _CC_DEF.search(line)
    return m.group("name") if m else None


def _scan_file(path: Path, rel: str) -> List[tuple]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for i, text in enumerate(lines):
        m = MARKER.match(text)
        if m is None:
            continue
        nxt = i + 1 < len(lines)
        if path.suffix == ".py":
            name = _python_name(lines, i + 1) if nxt else None
        else:
            name = _cc_name(lines[i + 1]) if nxt else None
        if name is None:
            raise ValueError(f"{rel}:{i + 1}: a question marker must sit just above a definition")
        for qid in m.group("ids").split():
            found.append((qid, Location(rel, i + 1, name)))
    return found


@lru_cache(maxsize=1)
def markers() -> Dict[str, List[Location]]:
    """Every marker in the scanned sources: question id -> its locations, in file order.
    Ids are returned as written, known to the checker or not (the tests check both ways)."""
    table: Dict[str, List[Location]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for qid, loc in _scan_file(path, path.relative_to(ROOT).as_posix()):
                table.setdefault(qid, []).append(loc)
    return table


def close_matches(question_id: str) -> List[str]:
    """Known question ids that look like ``question_id`` (for an error message)."""
    ids = list(BY_ID)
    near = difflib.get_close_matches(question_id, ids, n=5, cutoff=0.6)
    return near or [q for q in ids if question_id and question_id in q][:5]


def locate(question_id: str) -> List[Location]:
    """Where ``question_id``'s answer lives: a list of (path, line, function), the line being
    the marker's (the definition follows it). Raises KeyError naming close matches for an id
    the checker does not know."""
    if question_id not in BY_ID:
        near = close_matches(question_id)
        hint = f"; did you mean {', '.join(near)}?" if near else "; run with no argument for all"
        raise KeyError(f"unknown question {question_id!r}{hint}")
    return list(markers().get(question_id, []))


def table() -> List[str]:
    """Every known question with its locations, one line each, in the checker's order."""
    rows = []
    for qid in BY_ID:
        for loc in markers().get(qid, []) or [Location("-", 0, "(no marker)")]:
            rows.append(f"{qid:36s} {loc.path}:{loc.line}  {loc.function}")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: ``python -m companion.where [QUESTION]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print("usage: python -m companion.where [QUESTION]  (e.g. hw2_sgd)", file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    if not args:
        print("\n".join(table()))
        return 0
    try:
        found = locate(args[0])
    except KeyError as exc:
        print(f"companion.where: {exc.args[0]}", file=sys.stderr)
        return 2
    if not found:
        print(f"companion.where: no marker for {args[0]}", file=sys.stderr)
        return 1
    for loc in found:
        print(f"{loc.path}:{loc.line}  {loc.function}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
