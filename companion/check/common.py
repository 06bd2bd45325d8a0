"""Checks shared by the homeworks: an op's forward against numpy, its gradient against
finite differences of the numpy reference, a module's forward against a numpy re-computation.

``needle`` here is always the student's package (imported inside the functions, in the worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .diagnose import (
    CheckFailure,
    NotImplementedYet,
    check_adjoints,
    check_close,
    mismatch,
    numerical_vjp,
    record,
    require,
    to_numpy,
)


@dataclass
class OpCase:
    """One call of an op: ``label`` as the student would write it, the needle call on Tensors,
    the numpy reference on arrays, and the named inputs. ``variants(arrays, out_grad, correct)``
    optionally returns op-specific wrong adjoints (``mistakes.Variant``), one list per input;
    ``forward_variants(arrays)`` wrong forward results."""

    label: str
    call: Callable
    ref: Callable[..., np.ndarray]
    inputs: dict
    variants: Callable | None = None
    forward_variants: Callable | None = None

    @property
    def arrays(self) -> list[np.ndarray]:
        return [np.asarray(v, dtype=np.float32) for v in self.inputs.values()]


def tensors(arrays: Sequence[np.ndarray], requires_grad: bool = True) -> list:
    """Student Tensors (float32) holding copies of ``arrays``."""
    import needle as ndl

    return [ndl.Tensor(np.array(a, dtype=np.float32), requires_grad=requires_grad) for a in arrays]


def require_unchanged(
    what: str, xs: Sequence, arrays: Sequence[np.ndarray], names: Sequence[str]
) -> None:
    """Each Tensor in ``xs`` still holds its ``arrays`` value after ``what`` ran: an op must
    not write into its inputs (the course's composite expressions, e.g. add_scalar(x, 1) * x,
    would then see the changed x)."""
    for x, a, name in zip(xs, arrays, names):
        now = to_numpy(x)
        record(f"{what}: {name} afterwards", now, a, 0.0, 0.0)
        if mismatch(now, a, rtol=0.0, atol=0.0) is not None:
            raise CheckFailure(
                f"{what} changed {name} in place: it must return a "
                "new array and leave its arguments alone (an `a += ...` or "
                "`a[...] = ...` on the input writes into the caller's Tensor, so "
                "an expression such as add_scalar(x, 1) * x would use the changed "
                "x)"
            )


def check_forward(case: OpCase, *, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """The op's output on ``case.inputs`` matches the numpy reference, and the inputs are
    unchanged afterwards."""
    xs = tensors(case.arrays)
    out = case.call(*xs)
    require_unchanged(
        f"{case.label} (forward)", xs, case.arrays, [f"its input {n!r}" for n in case.inputs]
    )
    expected = case.ref(*[a.astype(np.float64) for a in case.arrays])
    if isinstance(expected, (tuple, list)):
        outs = list(out)
        require(
            len(outs) == len(expected),
            f"{case.label}: expected {len(expected)} outputs, got {len(outs)}",
        )
        for i, (o, e) in enumerate(zip(outs, expected)):
            check_close(
                f"{case.label}[{i}] (forward)",
                o,
                e,
                inputs=case.inputs,
                rtol=rtol,
                atol=atol * max(1.0, float(np.abs(e).max(initial=0))),
            )
        return
    check_close(
        f"{case.label} (forward)",
        out,
        expected,
        inputs=case.inputs,
        rtol=rtol,
        atol=atol * max(1.0, float(np.abs(expected).max(initial=0))),
        variants=case.forward_variants([a.astype(np.float64) for a in case.arrays])
        if case.forward_variants
        else None,
    )


def check_backward(
    case: OpCase, *, rtol: float = 1e-3, atol: float = 1e-3, via_backward: bool = False
) -> None:
    """Each input's adjoint from the op's ``gradient`` matches finite differences of the
    reference, for a random out_grad (so every output element matters).

    By default the op's own ``gradient_as_tuple(out_grad, node)`` is called, as the course's
    gradient check does, so this question does not depend on the reverse-mode question;
    ``via_backward`` runs ``out.backward(out_grad)`` instead (for ops returning tuples, modules).
    """
    import needle as ndl

    arrays = case.arrays
    xs = tensors(arrays)
    out = case.call(*xs)
    ref64 = [a.astype(np.float64) for a in arrays]
    expected = case.ref(*ref64)
    rng = np.random.default_rng(7)
    if isinstance(expected, (tuple, list)):
        weights = [rng.standard_normal(np.shape(e)) for e in expected]

        def objective(*a):
            return np.concatenate([np.ravel(o) for o in case.ref(*a)])

        flat_w = np.concatenate([w.ravel() for w in weights])
        numeric = numerical_vjp(objective, ref64, flat_w)
        loss = None
        for o, w in zip(out, weights):
            term = (o * ndl.Tensor(w.astype(np.float32), requires_grad=False)).sum()
            loss = term if loss is None else loss + term
        loss.backward()
        analytic = [x.grad for x in xs]
        shown_w = flat_w
    else:
        w = rng.standard_normal(np.shape(expected))
        numeric = numerical_vjp(case.ref, ref64, w)
        require(
            tuple(out.shape) == tuple(np.shape(expected)),
            f"{case.label}: output shape "
            f"{tuple(out.shape)}, expected {np.shape(expected)} (fix the forward first)",
        )
        out_grad = ndl.Tensor(w.astype(np.float32), requires_grad=False)
        before = to_numpy(out).copy()
        if via_backward:
            out.backward(out_grad)
            analytic = [x.grad for x in xs]
        else:
            analytic = list(out.op.gradient_as_tuple(out_grad, out))
        require_unchanged(
            f"{case.label}: the gradient",
            [out_grad, out],
            [w.astype(np.float32), before],
            ["out_grad", "the op's output (node)"],
        )
        shown_w = w
    require_unchanged(
        f"{case.label} (forward and backward)",
        xs,
        arrays,
        [f"its input {n!r}" for n in case.inputs],
    )
    for i, g in enumerate(analytic):
        if g is None:
            raise NotImplementedYet(
                f"{case.label}: the adjoint of input {list(case.inputs)[i]!r} is None "
                "(gradient() still has an empty body, or returns None for it)"
            )
    check_adjoints(
        f"{case.label} backward",
        [to_numpy(g) for g in analytic],
        numeric,
        list(case.inputs),
        inputs=case.inputs,
        out_grad=shown_w,
        rtol=rtol,
        atol=atol,
        op=f"({case.label})",
        variants=case.variants,
    )


def randn(*shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """A reproducible float32 normal array (independent of the global numpy seed)."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def away_from_zero(*shape, seed: int = 0, low: float = 0.3) -> np.ndarray:
    """Random values with |x| >= low (kinks and poles stay out of finite differences' way)."""
    x = randn(*shape, seed=seed)
    return np.where(x >= 0, x + low, x - low).astype(np.float32)


def positive(*shape, seed: int = 0) -> np.ndarray:
    """Random values in [0.5, 2)."""
    return (0.5 + 1.5 * np.random.default_rng(seed).random(shape)).astype(np.float32)
