"""Comparisons that explain themselves: what the checks use to turn a wrong answer into advice.

This module runs inside the checker's worker process next to the *student's* ``needle``, so it
imports only numpy and the standard library (never ``needle``): tensors are converted through
their ``numpy()`` method. Because student code shares that process, nothing decided here is
believed: every comparison is also recorded (``Recorder``: the values copied out as bytes), and
the runner's judge (``judge.py``) decides a pass from the student's values against expected
values of its own. ``NumpyGuard`` notices student code replacing numpy's functions, which
this process's diagnoses are computed with.
"""

from __future__ import annotations

import base64
import types
from typing import Callable, Mapping, Sequence

import numpy as np

from .mistakes import adjoint_variants


class CheckFailure(AssertionError):
    """A question's answer is wrong; the message is the diagnosis shown to the student."""


class NotImplementedYet(CheckFailure):
    """The answer is not there at all (None where a value is due, an output left untouched, a
    C++ stub): reported as "not implemented", not as a failure."""


def to_numpy(x) -> np.ndarray:
    """``x`` (Tensor, NDArray, numpy array or number) as a numpy array; None (what an empty
    ``pass`` body returns) raises ``NotImplementedYet``."""
    if x is None:
        raise NotImplementedYet(
            "your code returned None where a value is due: the function's body is still "
            "empty (`pass`) or lacks a `return`"
        )
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x = x.numpy()
    return np.asarray(x)


def show(a, name: str | None = None) -> str:
    """A short printable view of an array: shape, dtype and (for small arrays) the values."""
    a = np.asarray(a)
    head = f"{name}: " if name else ""
    if a.size <= 24:
        body = np.array2string(a, precision=4, suppress_small=True, separator=", ")
        body = body.replace("\n", " ")
        return f"{head}shape {a.shape} {a.dtype} = {body}"
    flat = ", ".join(f"{v:.4g}" if a.dtype.kind == "f" else str(v) for v in a.ravel()[:6])
    return f"{head}shape {a.shape} {a.dtype}, first elements [{flat}, ...]"


def show_inputs(inputs: Mapping[str, object] | None) -> str:
    """One line per named input (arrays shown with ``show``, anything else with ``repr``)."""
    if not inputs:
        return ""
    lines = []
    for name, value in inputs.items():
        if isinstance(value, np.ndarray) or hasattr(value, "numpy"):
            lines.append("    " + show(to_numpy(value), name))
        else:
            lines.append(f"    {name} = {value!r}")
    return "  input:\n" + "\n".join(lines) + "\n"


def mismatch(got, expected, *, rtol: float = 1e-5, atol: float = 1e-6) -> str | None:
    """None when ``got`` matches ``expected``; otherwise what differs (shape or first elements).

    Elements match when |got - expected| <= atol + rtol·|expected| (NaN matches NaN only).
    """
    got, expected = to_numpy(got), np.asarray(expected)
    if got.shape != expected.shape:
        return f"expected shape {expected.shape}, got shape {got.shape}"
    if expected.size == 0:
        return None
    g = got.astype(np.float64)
    e = expected.astype(np.float64)
    close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    if e.ndim == 0:
        return (
            f"expected {float(e):.6g}, got {float(g):.6g} (tolerance {atol:g} + "
            f"{rtol:g}·|expected|)"
        )
    bad = np.argwhere(~close)
    diff = np.abs(g - e)
    diff[~np.isfinite(diff)] = np.inf
    worst = np.unravel_index(np.argmax(np.where(close, -1, diff)), diff.shape)
    lines = [
        f"{len(bad)} of {e.size} elements differ (tolerance {atol:g} + {rtol:g}·|expected|);"
        f" largest difference {diff[worst]:.4g} at index {tuple(int(i) for i in worst)}"
    ]
    for idx in bad[:4]:
        idx = tuple(int(i) for i in idx)
        lines.append(f"    at {idx}: expected {e[idx]:.6g}, got {g[idx]:.6g}")
    return "\n".join(lines)


def check_close(
    what: str,
    got,
    expected,
    *,
    inputs: Mapping[str, object] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    hint: str = "",
    variants: Sequence | None = None,
) -> None:
    """Raise ``CheckFailure`` naming ``what``, the inputs and the first differences on mismatch.

    ``variants`` are known wrong answers (``mistakes.Variant``); the first that ``got`` matches
    is named in one line before the numbers.
    """
    if got is None:
        raise NotImplementedYet(
            f"{what} is None where a value is due (a body still `pass`, or a missing `return`)"
        )
    record(what, got, expected, rtol, atol)
    problem = mismatch(got, expected, rtol=rtol, atol=atol)
    if problem is None:
        return
    text = f"{what} is wrong.\n"
    named = name_mistake(got, variants or (), rtol=rtol, atol=atol)
    if named:
        text += f"  {named}\n"
    text += show_inputs(inputs)
    text += "  expected: " + show(np.asarray(expected)) + "\n"
    text += "  got:      " + show(to_numpy(got)) + "\n  " + problem.replace("\n", "\n  ")
    if hint:
        text += "\n  hint: " + hint
    raise CheckFailure(text)


def present(value, message: str) -> None:
    """Raise ``NotImplementedYet(message)`` when ``value`` is None (nothing was computed)."""
    if value is None:
        raise NotImplementedYet(message + " (not implemented yet?)")


def require(condition: bool, message: str) -> None:
    """Raise ``CheckFailure(message)`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailure(message)


def numerical_vjp(
    f: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    weights: np.ndarray,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """Central differences (float64) of L(x) = Σ f(x)·weights with respect to each array.

    ``f`` is the numpy reference of the operation, so the gradient it yields is the true one,
    independent of the student's forward pass.
    """
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(*a.shape):
            old = a[idx]
            a[idx] = old + eps
            up = float((f(*arrays) * weights).sum())
            a[idx] = old - eps
            down = float((f(*arrays) * weights).sum())
            a[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def check_adjoints(
    what: str,
    analytic: Sequence,
    numeric: Sequence[np.ndarray],
    names: Sequence[str],
    *,
    inputs: Mapping[str, object],
    out_grad: np.ndarray,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    op: str | None = None,
    variants: Callable[..., list[list]] | None = None,
) -> None:
    """Compare each input's adjoint with its finite-difference value; name every wrong one.

    ``atol`` scales with the largest finite-difference entry so tiny gradients are not waved
    through and large ones are not failed for float32 rounding. A wrong adjoint is compared
    with the known wrong variants (``mistakes.adjoint_variants``, plus the op-specific ones
    ``variants(arrays, out_grad, correct)`` returns, one list per input) and the one it matches
    is named in one line before the numbers; ``op`` is how the op is written in that line.
    """
    wrong = []
    if len(analytic) != len(numeric):
        raise CheckFailure(
            f"{what}: gradient returned {len(analytic)} adjoint(s), but the op "
            f"has {len(numeric)} input(s) ({', '.join(names)}); return one "
            "adjoint per input, in input order."
        )
    tolerances = []
    for name, got, fd in zip(names, analytic, numeric):
        scale = max(1.0, float(np.abs(fd).max())) if fd.size else 1.0
        tolerances.append(atol * scale)
        record(f"{what}: the adjoint of {name!r}", got, fd, rtol, atol * scale)
        problem = mismatch(got, fd, rtol=rtol, atol=atol * scale)
        if problem is not None:
            wrong.append((name, got, fd, problem))
    if not wrong:
        return
    text = f"{what} is wrong: the adjoint of {', '.join(repr(w[0]) for w in wrong)} "
    text += "does not match a finite-difference check.\n"
    found = _known_adjoint_mistakes(names, numeric, inputs, out_grad, op, variants)
    for name, got, _fd, _problem in wrong:
        i = list(names).index(name)
        named = name_mistake(got, found[i], rtol=rtol, atol=tolerances[i])
        if named:
            text += f"  {named}\n"
    text += show_inputs(inputs)
    text += "    " + show(out_grad, "out_grad") + "\n"
    text += _show_wrong_adjoints(wrong)
    raise CheckFailure(text.rstrip())


def _known_adjoint_mistakes(
    names: Sequence[str],
    numeric: Sequence[np.ndarray],
    inputs: Mapping[str, object],
    out_grad: np.ndarray,
    op: str | None,
    variants: Callable[..., list[list]] | None,
) -> list[list]:
    """The known wrong adjoints of each input (``variants``'s op-specific ones first), to name
    the one a wrong adjoint matches."""
    arrays = [np.asarray(to_numpy(v), dtype=np.float64) for v in inputs.values()][: len(names)]
    arrays += [np.zeros_like(n) for n in numeric[len(arrays) :]]  # adjoints of parameters
    found = adjoint_variants(
        list(names),
        arrays,
        np.asarray(out_grad, dtype=np.float64),
        [np.asarray(n, dtype=np.float64) for n in numeric],
        op=op,
    )
    if variants is not None:
        for i, extra in enumerate(
            variants(
                arrays,
                np.asarray(out_grad, dtype=np.float64),
                [np.asarray(n, dtype=np.float64) for n in numeric],
            )
        ):
            found[i] = list(extra) + found[i]
    return found


def _show_wrong_adjoints(wrong: list) -> str:
    """Each wrong adjoint (name, got, finite difference, problem) beside its finite difference."""
    text = ""
    for name, got, fd, problem in wrong:
        got = to_numpy(got)
        text += f"  adjoint of {name!r}:\n"
        text += "    finite difference: " + show(fd) + "\n"
        text += "    your gradient:     " + show(got) + "\n"
        if got.shape == fd.shape:
            err = float(np.abs(got.astype(np.float64) - fd).max())
            text += f"    off by up to {err:.4g} (largest |finite difference| is "
            text += f"{float(np.abs(fd).max()):.4g})\n"
        text += "    " + problem.replace("\n", "\n    ") + "\n"
    return text


def name_mistake(got, variants: Sequence, *, rtol: float, atol: float) -> str | None:
    """The message of the first known wrong answer (``mistakes.Variant``) that ``got`` equals."""
    try:
        g = np.asarray(to_numpy(got), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    for v in variants:
        if v.matches(g, rtol, atol):
            return v.message
    return None


# ---- verdicts the student's code cannot reach ------------------------------------------------
_RECORD: list | None = None


def _encode(x) -> dict | None:
    a = np.asarray(to_numpy(x))
    if a.dtype == object:
        return None
    a = np.ascontiguousarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def record(what: str, got, expected, rtol: float, atol: float) -> None:
    """Copy one comparison's values out (as float64 bytes) while a ``Recorder`` is active."""
    if _RECORD is None:
        return
    try:
        g, e = _encode(got), _encode(expected)
    except (TypeError, ValueError):
        return  # not numbers: the comparison itself reports that
    if g is not None and e is not None:
        _RECORD.append(
            {"what": what, "got": g, "expected": e, "rtol": float(rtol), "atol": float(atol)}
        )


class Recorder:
    """``with Recorder() as log:`` collects every ``check_close``/``check_adjoints`` comparison
    made inside the block into ``log`` (JSON-ready dicts), for the judge in another process."""

    def __enter__(self) -> list:
        global _RECORD
        self._log: list = []
        _RECORD = self._log
        return self._log

    def __exit__(self, *exc) -> None:
        global _RECORD
        _RECORD = None


class NumpyGuard:
    """Remembers the functions the checks compute and compare with (numpy's, the builtins,
    ``math``, ``json``, this package's) before student code runs; ``tampered()`` names any
    that were replaced since, and puts the originals back."""

    def __init__(self) -> None:
        import sys

        names = ["builtins", "math", "json", "base64", __name__] + [
            m
            for m in list(sys.modules)
            if m == "numpy" or m.startswith(("numpy.", "companion.check"))
        ]  # every loaded numpy module: numpy._core.numeric.less_equal is as good as isclose
        self._saved: list[tuple[types.ModuleType, str, object, object]] = []
        for name in names:
            module = sys.modules.get(name)
            if module is None:
                continue
            for attr, value in list(vars(module).items()):
                if callable(value):
                    self._saved.append((module, attr, value, getattr(value, "__code__", None)))

    def tampered(self) -> str | None:
        """None, or which saved functions were replaced or rewritten (restored now)."""
        changed = []
        for module, attr, value, code in self._saved:
            if getattr(module, attr, None) is not value or (
                code is not None and getattr(value, "__code__", None) is not code
            ):
                changed.append(f"{module.__name__}.{attr}")
                setattr(module, attr, value)
                if code is not None:
                    value.__code__ = code
        if not changed:
            return None
        return (
            f"your code replaced {', '.join(changed[:5])}"
            + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            + ": the checker computes its answers with these, so it cannot trust this "
            "run; do not assign to numpy's (or the checker's) functions"
        )
