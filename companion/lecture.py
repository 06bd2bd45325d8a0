"""Lecture notebooks in student mode: cells that need this project's extensions skip cleanly.

A notebook cell whose first line is ``# companion-only: <what it needs>`` uses something the
course's needle does not have (a fused op, ``create_graph=True``, ``matmul_tiled``, ...), or the
results of such a cell. The notebook's first code cell calls :func:`setup`; when ``NEEDLE_IMPL``
has loaded a student's needle (:mod:`companion.impl`), that registers an IPython input
transformer which replaces each such cell's source by one ``print`` saying what it skips and why.
Without ``NEEDLE_IMPL`` :func:`setup` does nothing and every cell runs as written.

(A comment rather than a cell magic: Jupytext keeps comments intact in the paired .py files.)
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

#: This project's checkout (its ``src/`` and ``benchmarks/``), whichever needle is imported.
CHECKOUT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"#\s*companion-only:\s*(?P<reason>\S.*?)\s*$")


def companion_only_reason(lines: List[str]) -> Optional[str]:
    """The ``<what it needs>`` of a cell whose first non-blank line is the marker, else None."""
    for line in lines:
        if line.strip():
            match = MARKER.fullmatch(line.strip())
            return match.group("reason") if match else None
    return None


def skip_line(reason: str, folder: str) -> str:
    """The one line a skipped cell prints."""
    return (f"companion-only cell skipped: it uses {reason}, which the course's needle "
            f"(from {folder}, NEEDLE_IMPL) does not have")


def skip_companion_only(lines: List[str], folder: str = "NEEDLE_IMPL") -> List[str]:
    """An IPython input transformer: a marked cell becomes ``print(<skip line>)``; any other cell
    is returned unchanged."""
    reason = companion_only_reason(lines)
    if reason is None:
        return lines
    return [f"print({skip_line(reason, folder)!r})\n"]


def _transformer(folder: str):
    def transform(lines: List[str]) -> List[str]:
        return skip_companion_only(lines, folder)
    transform.needle_companion_only = True  # lets setup() find its own transformer
    return transform


def setup() -> bool:
    """Register the companion-only transformer when a student's needle is in use (NEEDLE_IMPL)
    and this runs in IPython; returns whether it is registered. Calling it again is harmless."""
    from companion.impl import active_folder
    folder = active_folder()
    if folder is None:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    transformers = shell.input_transformers_post
    if not any(getattr(t, "needle_companion_only", False) for t in transformers):
        transformers.append(_transformer(str(folder)))
    return True
