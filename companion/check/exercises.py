"""Checks for the exercises at the end of each lecture notebook.

An exercise cell defines a function whose body starts as ``raise NotImplementedError``; the
check cell after it calls ``check_exercise``, which prints one of three verdicts: not answered
yet, correct, or not yet (with what differs). Printing instead of raising keeps the committed
notebooks, stubs and all, passing strict nbval. With ``NEEDLE_EXERCISES=strict`` (the test that
runs every exercise with the reference answers from notebooks/solutions/) anything but
"correct" raises AssertionError.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .diagnose import mismatch, numerical_vjp


def _strict() -> bool:
    return os.environ.get("NEEDLE_EXERCISES") == "strict"


def check_exercise(
    label: str,
    answer: Callable[[], Any],
    expected: Any = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    predicate: Callable[[Any], str | None] | None = None,
) -> None:
    """Run ``answer()`` and print whether it matches ``expected`` (arrays or numbers, within
    ``atol + rtol·|expected|``) or, with ``predicate``, whether ``predicate(result)`` returns
    None (else the returned text says what is wrong). Returns nothing, so a check cell shows
    its verdict line only (no stray True/False under it).
    """
    try:
        got = answer()
    except NotImplementedError:
        message = f"{label}: not answered yet (replace the NotImplementedError above)"
        if _strict():
            raise AssertionError(message) from None
        print(message)
        return
    try:
        problem = predicate(got) if predicate is not None else _compare(got, expected, rtol, atol)
    except Exception as exc:  # an answer of the wrong structure: say so, don't crash the cell
        problem = f"could not compare your answer {got!r:.100} ({type(exc).__name__}: {exc})"
    if problem is None:
        print(f"{label}: correct")
        return
    message = f"{label}: not yet. {problem}"
    if _strict():
        raise AssertionError(message)
    print(message)


def _compare(got: Any, expected: Any, rtol: float, atol: float) -> str | None:
    """None when ``got`` matches ``expected`` (an array, a number, or a list of either)."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple, np.ndarray)) or len(got) != len(expected):
            return f"expected {len(expected)} results, got {got!r:.200}"
        for i, (g, e) in enumerate(zip(got, expected)):
            problem = _compare(g, e, rtol, atol)
            if problem is not None:
                return f"result {i}: {problem}"
        return None
    try:
        got = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return f"expected numbers, got {got!r:.200}"
    return mismatch(got, np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol)


def central_difference(
    f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """The gradient of the scalar function ``f`` at ``x`` (same shape) by central differences."""
    return numerical_vjp(lambda a: np.asarray(f(a)), [x], np.float64(1.0), eps=eps)[0]
