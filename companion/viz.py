"""Figure helpers shared by the lecture notebooks (an extension; not part of the course API)."""
from __future__ import annotations

import os
from pathlib import Path

FIGURES_DIR = Path(__file__).resolve().parents[1] / "figures"


def writing_figures() -> bool:
    """True when ``NEEDLE_WRITE_FIGURES=1`` (set by ``make figures``)."""
    return os.environ.get("NEEDLE_WRITE_FIGURES") == "1"


def save_figure(fig, name: str) -> Path | None:
    """Save ``fig`` as ``figures/NAME.png`` when ``make figures`` runs; otherwise do nothing.

    The PNG carries no software/date metadata, so re-running gives byte-identical files on one
    machine. Returns the path written, or None.
    """
    if not writing_figures():
        return None
    FIGURES_DIR.mkdir(exist_ok=True)
    path = FIGURES_DIR / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    return path
