"""Comparisons that explain themselves: what the checks use to turn a wrong answer into advice.

This module runs inside the checker's worker process next to the *student's* ``needle``, so it
imports only numpy and the standard library (never ``needle``): tensors are converted through
their ``numpy()`` method. The checks pass every expected value as a function (``lambda: ...``)
and its mode (``set_mode``) decides what happens to it: in a worker beside student code
("blind") it is never called and only the student's values are recorded (``Recorder``: copied
out as bytes), so the student's process never holds an expected value to read; the judge's
reference run (this project's needle) records the expected values, tolerances and what a
diagnosis needs, and the runner's judge (``judge.py``) compares and explains, outside the
student's process (``explain_close``, ``explain_adjoints``). In plain mode (tests, in-process
use) a mismatch raises ``CheckFailure`` here. ``NumpyGuard`` notices student code replacing
numpy's or the checker's functions.
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


# ---- where expected values are computed -----------------------------------------------------
# "plain": the checks compute expected values and raise on a mismatch (in-process use, tests);
# "reference": the judge's reference run (this project's needle): the same, and each
# comparison's expected value, tolerances and diagnosis material are recorded; "blind": the
# worker beside the student's code: expected values are never computed (the checks pass them
# as functions this mode never calls), only the student's values are recorded, and a wrong
# value is found by the judge, outside the student's process.
PLAIN, REFERENCE, BLIND = "plain", "reference", "blind"
_MODE = PLAIN


def set_mode(mode: str) -> None:
    """Switch this process to ``mode`` (the worker does, once, before any student code runs)."""
    global _MODE
    if mode not in (PLAIN, REFERENCE, BLIND):
        raise ValueError(f"unknown mode {mode!r}: expected plain, reference or blind")
    _MODE = mode


def mode() -> str:
    """The current mode (plain, reference or blind)."""
    return _MODE


def is_blind() -> bool:
    """True in a worker beside student code: no expected value may be computed here."""
    return _MODE == BLIND


def expect(compute: Callable[[], object]) -> object:
    """``compute()`` (an expected value, or what one is made of), or None in blind mode, where
    nothing expected is computed."""
    if _MODE == BLIND:
        return None
    return compute()


def _evaluate(expected, what: str):
    """An expected value from ``expected`` (a function of no arguments; a plain value only in
    plain mode, where tests call the comparisons directly)."""
    if callable(expected):
        return expected()
    if _MODE == REFERENCE:
        raise TypeError(
            f"checker bug: the expected value of {what!r} is passed as a value; pass a "
            "function (lambda: ...) so that a worker beside student code never computes it"
        )
    return expected


def explain_close(
    what: str,
    got,
    expected,
    *,
    rtol: float,
    atol: float,
    inputs_text: str = "",
    hint: str = "",
    variants: Sequence = (),
) -> str | None:
    """None when ``got`` matches ``expected``; else the diagnosis: what, the named mistake,
    the inputs, both values, the first differences and the hint."""
    problem = mismatch(got, expected, rtol=rtol, atol=atol)
    if problem is None:
        return None
    text = f"{what} is wrong.\n"
    named = name_mistake(got, variants, rtol=rtol, atol=atol)
    if named:
        text += f"  {named}\n"
    text += inputs_text
    text += "  expected: " + show(np.asarray(expected)) + "\n"
    text += "  got:      " + show(to_numpy(got)) + "\n  " + problem.replace("\n", "\n  ")
    if hint:
        text += "\n  hint: " + hint
    return text


def compare(
    what: str,
    got,
    expected,
    *,
    inputs: Mapping[str, object] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    hint: str | Callable[[], str] = "",
    variants: Callable[[], Sequence] | Sequence | None = None,
    scale_atol: bool = False,
    warning: str | None = None,
) -> str | None:
    """Record one comparison and return its diagnosis (None when it matches, and always in
    blind mode, where only ``got`` is recorded and ``expected``, ``hint`` and ``variants``,
    functions, are never called). ``scale_atol`` multiplies ``atol`` by max(1, |expected|);
    ``warning`` marks a robustness comparison whose mismatch is a warning, not a failure."""
    if _MODE == BLIND:
        _record_got(what, got)
        return None
    exp = np.asarray(_evaluate(expected, what))
    if scale_atol:
        atol = atol * max(1.0, float(np.abs(exp.astype(np.float64)).max(initial=0)))
    found = list((variants() if callable(variants) else variants) or ())
    hint = hint() if callable(hint) else hint
    inputs_text = show_inputs(inputs)
    if _MODE == REFERENCE:
        _record_reference(
            what,
            exp,
            rtol,
            atol,
            {"hint": hint, "inputs": inputs_text, "variants": [_pack(v) for v in found]},
            warning,
        )
    return explain_close(
        what, got, exp, rtol=rtol, atol=atol, inputs_text=inputs_text, hint=hint, variants=found
    )


def check_close(
    what: str,
    got,
    expected,
    *,
    inputs: Mapping[str, object] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    hint: str | Callable[[], str] = "",
    variants: Callable[[], Sequence] | Sequence | None = None,
    scale_atol: bool = False,
) -> None:
    """Raise ``CheckFailure`` naming ``what``, the inputs and the first differences on mismatch
    (``compare``: in blind mode the value is only recorded, for the judge).

    ``expected`` is a function of no arguments that computes the expected value (never called
    in blind mode); ``variants`` (a function returning them) are known wrong answers
    (``mistakes.Variant``): the first that ``got`` matches is named in one line before the
    numbers.
    """
    if got is None:
        raise NotImplementedYet(
            f"{what} is None where a value is due (a body still `pass`, or a missing `return`)"
        )
    text = compare(
        what,
        got,
        expected,
        inputs=inputs,
        rtol=rtol,
        atol=atol,
        hint=hint,
        variants=variants,
        scale_atol=scale_atol,
    )
    if text is not None:
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
    numeric: Callable[[], Sequence[np.ndarray]] | Sequence[np.ndarray],
    names: Sequence[str],
    *,
    inputs: Mapping[str, object],
    out_grad: np.ndarray,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    op: str | None = None,
    variants: Callable[..., list[list]] | None = None,
) -> None:
    """Compare each input's adjoint with its finite-difference value (``numeric``, a function
    computing them, never called in blind mode); name every wrong one.

    ``atol`` scales with the largest finite-difference entry so tiny gradients are not waved
    through and large ones are not failed for float32 rounding. A wrong adjoint is compared
    with the known wrong variants (``mistakes.adjoint_variants``, plus the op-specific ones
    ``variants(arrays, out_grad, correct)`` returns, one list per input) and the one it matches
    is named in one line before the numbers; ``op`` is how the op is written in that line.
    """
    if len(analytic) != len(names):
        raise CheckFailure(
            f"{what}: gradient returned {len(analytic)} adjoint(s), but the op "
            f"has {len(names)} input(s) ({', '.join(names)}); return one "
            "adjoint per input, in input order."
        )
    labels = [f"{what}: the adjoint of {name!r}" for name in names]
    if _MODE == BLIND:
        for label, got in zip(labels, analytic):
            _record_got(label, got)
        return
    fds = [np.asarray(n, dtype=np.float64) for n in _evaluate(numeric, what)]
    tolerances = [atol * (max(1.0, float(np.abs(fd).max())) if fd.size else 1.0) for fd in fds]
    found = _known_adjoint_mistakes(names, fds, inputs, out_grad, op, variants)
    shown = show_inputs(inputs) + "    " + show(out_grad, "out_grad") + "\n"
    wrong = []
    for i, (name, got, fd) in enumerate(zip(names, analytic, fds)):
        if _MODE == REFERENCE:
            extra = {"group": what, "name": name, "inputs": shown}
            extra["variants"] = [_pack(v) for v in found[i]]
            _record_reference(labels[i], fd, rtol, tolerances[i], extra, None)
        problem = mismatch(got, fd, rtol=rtol, atol=tolerances[i])
        if problem is not None:
            wrong.append((name, got, fd, problem, found[i], tolerances[i]))
    text = explain_adjoints(what, wrong, shown, rtol)
    if text is not None:
        raise CheckFailure(text)


def explain_adjoints(what: str, wrong: list, inputs_text: str, rtol: float) -> str | None:
    """The diagnosis of one op's wrong adjoints (``wrong``: name, got, finite difference,
    problem, known wrong variants, atol for each), or None when there are none."""
    if not wrong:
        return None
    text = f"{what} is wrong: the adjoint of {', '.join(repr(w[0]) for w in wrong)} "
    text += "does not match a finite-difference check.\n"
    for _name, got, _fd, _problem, found, tol in wrong:
        named = name_mistake(got, found, rtol=rtol, atol=tol)
        if named:
            text += f"  {named}\n"
    text += inputs_text
    text += _show_wrong_adjoints([w[:4] for w in wrong])
    return text.rstrip()


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


def _pack(variant) -> dict:
    """A known wrong answer as plain data for the judge (``mistakes.unpack`` reads it)."""
    packed = variant.pack()
    packed["value"] = _encode(packed["value"])
    return packed


def _record_got(what: str, got) -> None:
    """Copy the student's value out (float64 bytes; None when it is not numbers) while a
    ``Recorder`` is active: all a blind worker records."""
    if _RECORD is None:
        return
    try:
        g = _encode(got)
    except (TypeError, ValueError):
        g = None
    _RECORD.append({"what": what, "got": g})


def _record_reference(
    what: str, expected: np.ndarray, rtol: float, atol: float, extra: dict, warning: str | None
) -> None:
    """Copy a reference comparison out: the expected value, tolerances and what the judge's
    diagnosis needs (hint, inputs shown, known wrong answers)."""
    if _RECORD is None:
        return
    entry = {"what": what, "expected": _encode(expected), "rtol": float(rtol), "atol": float(atol)}
    entry.update(extra)
    if warning:
        entry["warn"] = warning
    _RECORD.append(entry)


class Recorder:
    """``with Recorder() as log:`` collects every comparison made inside the block into ``log``
    (JSON-ready dicts), for the judge in another process: the student's values in blind mode,
    the expected ones in reference mode."""

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
