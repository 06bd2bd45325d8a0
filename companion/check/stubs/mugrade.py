"""A stand-in for ``mugrade``, the course's grader client (installed in the course's own
environment, not on PyPI). The checker's worker puts this folder last on ``sys.path``, so that a
student's module that imports one of the course's test files (which ``import mugrade``) still
imports; a real ``mugrade``, where installed, comes first and wins. Every name is a function that
does nothing and returns None: nothing is submitted from a check.
"""

from __future__ import annotations

from typing import Any, Callable


def submit(*args: Any, **kwargs: Any) -> None:
    """Does nothing (the real one sends an answer to the course's grader)."""
    return None


def __getattr__(name: str) -> Callable[..., None]:
    if name.startswith("__"):
        raise AttributeError(name)
    return lambda *args, **kwargs: None
