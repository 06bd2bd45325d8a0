"""Checks shared by the homeworks: an op's forward against numpy, its gradient against
finite differences of the numpy reference, a module's forward against a numpy re-computation.

``needle`` here is always the student's package (imported inside the functions, in the worker).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .diagnose import (
    NotImplementedYet,
    check_adjoints,
    check_close,
    compare,
    mismatch,
    numerical_vjp,
    require,
    to_numpy,
)


@dataclass
class OpCase:
    """One call of an op: ``label`` as the student would write it, the needle call on Tensors,
    the numpy reference on arrays, and the named inputs. ``variants(arrays, out_grad, correct)``
    optionally returns op-specific wrong adjoints (``mistakes.Variant``), one list per input;
    ``forward_variants(arrays)`` wrong forward results; ``outputs`` is how many Tensors the op
    returns when it returns a tuple (0: one Tensor)."""

    label: str
    call: Callable
    ref: Callable[..., np.ndarray]
    inputs: dict
    variants: Callable | None = None
    forward_variants: Callable | None = None
    outputs: int = 0

    @property
    def arrays(self) -> list[np.ndarray]:
        return [np.asarray(v, dtype=np.float32) for v in self.inputs.values()]

    def reference(self):
        """The numpy reference on the inputs in float64 (never called in a blind worker)."""
        return self.ref(*[a.astype(np.float64) for a in self.arrays])


def tensors(arrays: Sequence[np.ndarray], requires_grad: bool = True) -> list:
    """Student Tensors (float32) holding copies of ``arrays``."""
    import needle as ndl

    return [ndl.Tensor(np.array(a, dtype=np.float32), requires_grad=requires_grad) for a in arrays]


def require_unchanged(
    what: str,
    xs: Sequence,
    arrays: Sequence[np.ndarray],
    names: Sequence[str],
    *,
    judged: bool = True,
) -> None:
    """Each Tensor in ``xs`` still holds its ``arrays`` value after ``what`` ran: an op must
    not write into its inputs (the course's composite expressions, e.g. add_scalar(x, 1) * x,
    would then see the changed x). The values compared are the inputs themselves, which the
    student's code is given anyway, so this is decided here as well as by the judge
    (``judged`` False: here only, for values of the student's own, such as its output)."""
    for x, a, name in zip(xs, arrays, names):
        now = to_numpy(x)
        message = (
            f"{what} changed {name} in place: it must return a "
            "new array and leave its arguments alone (an `a += ...` or "
            "`a[...] = ...` on the input writes into the caller's Tensor, so "
            "an expression such as add_scalar(x, 1) * x would use the changed "
            "x)"
        )
        require(mismatch(now, a, rtol=0.0, atol=0.0) is None, message)
        if judged:  # and by the judge, in case numpy was made to say so here
            compare(
                f"{what}: {name} afterwards", now, lambda a=a: a, rtol=0.0, atol=0.0, hint=message
            )


def check_forward(case: OpCase, *, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """The op's output on ``case.inputs`` matches the numpy reference, and the inputs are
    unchanged afterwards."""
    xs = tensors(case.arrays)
    out = case.call(*xs)
    require_unchanged(
        f"{case.label} (forward)", xs, case.arrays, [f"its input {n!r}" for n in case.inputs]
    )
    if case.outputs:
        outs = list(out)
        require(
            len(outs) == case.outputs,
            f"{case.label}: expected {case.outputs} outputs, got {len(outs)}",
        )
        for i, o in enumerate(outs):
            check_close(
                f"{case.label}[{i}] (forward)",
                o,
                lambda i=i: case.reference()[i],
                inputs=case.inputs,
                rtol=rtol,
                atol=atol,
                scale_atol=True,
            )
        return
    forward_variants = case.forward_variants
    check_close(
        f"{case.label} (forward)",
        out,
        case.reference,
        inputs=case.inputs,
        rtol=rtol,
        atol=atol,
        scale_atol=True,
        variants=(lambda: forward_variants([a.astype(np.float64) for a in case.arrays]))
        if forward_variants
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
    The out_grad has the shape of the student's output, which is compared with the
    reference's first (a wrong shape is the cause of whatever follows).
    """
    arrays = case.arrays
    xs = tensors(arrays)
    out = case.call(*xs)
    ref64 = [a.astype(np.float64) for a in arrays]
    rng = np.random.default_rng(7)
    if case.outputs:
        numeric, analytic, shown_w = _adjoints_of_tuple(case, xs, out, ref64, rng)
    else:
        numeric, analytic, shown_w = _adjoints_of_one(case, xs, out, ref64, rng, via_backward)
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


def _check_shapes(what: str, shapes: list[tuple], expected: Callable[[], list[tuple]]) -> None:
    """The student's output shapes against the reference's (a count, then each shape's
    length and sizes, as one array of numbers for the judge)."""

    def flat(found: list[tuple]) -> np.ndarray:
        return np.array([len(found)] + [d for s in found for d in (len(s), *s)], np.float64)

    check_close(
        f"{what}: the output's shape",
        flat(shapes),
        lambda: flat(expected()),
        rtol=0.0,
        atol=0.0,
        hint="fix the forward first (the output shape is wrong, so out_grad cannot match)",
    )


def _adjoints_of_tuple(case: OpCase, xs: list, out, ref64: list, rng) -> tuple:
    """For an op returning several outputs: (numeric, analytic, out_grad shown) of
    ``sum_i <out_i, w_i>`` for random weights, the analytic adjoints from ``backward``."""
    import needle as ndl

    outs = list(out)
    shapes = [tuple(o.shape) for o in outs]
    _check_shapes(case.label, shapes, lambda: [np.shape(e) for e in case.reference()])
    weights = [rng.standard_normal(s) for s in shapes]

    def objective(*a):
        return np.concatenate([np.ravel(o) for o in case.ref(*a)])

    flat_w = np.concatenate([w.ravel() for w in weights])
    loss = None
    for o, w in zip(outs, weights):
        term = (o * ndl.Tensor(w.astype(np.float32), requires_grad=False)).sum()
        loss = term if loss is None else loss + term
    loss.backward()
    return (lambda: numerical_vjp(objective, ref64, flat_w)), [x.grad for x in xs], flat_w


def _adjoints_of_one(case: OpCase, xs: list, out, ref64: list, rng, via_backward: bool) -> tuple:
    """For an op returning one output: (numeric, analytic, out_grad) for a random out_grad,
    the analytic adjoints from ``gradient_as_tuple`` (or ``backward`` when ``via_backward``);
    out_grad and the output node must be unchanged afterwards."""
    import needle as ndl

    shape = tuple(out.shape)
    _check_shapes(case.label, [shape], lambda: [np.shape(case.reference())])
    w = rng.standard_normal(shape)
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
        judged=False,
    )
    return (lambda: numerical_vjp(case.ref, ref64, w)), analytic, w


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
