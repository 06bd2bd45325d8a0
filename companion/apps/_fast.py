"""``needle.fast`` for the apps' fused twins, where the needle in use has it.

This project's needle has the fast wing; a student's (``NEEDLE_IMPL``, the course's package) does
not, and there the apps are the course's classes alone, with no twin registered.
"""

from __future__ import annotations

from typing import Any


def fast_wing() -> Any:
    """The ``needle.fast`` module (its ``nn`` submodule imported), or None when the imported
    needle has none; any other import error propagates."""
    try:
        import needle.fast as fast
        import needle.fast.nn  # noqa: F401 (fast.nn: the twins' fused layers)
    except ModuleNotFoundError as exc:
        if exc.name in ("needle.fast", "needle.fast.nn"):
            return None
        raise
    return fast
