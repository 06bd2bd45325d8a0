"""Known wrong answers: what a student's result equals when it has a common bug.

Each generator takes the problem and its correct numpy answer and returns ``Variant`` s, the
answers the usual mistakes give, each with the one line that names the mistake. A failing check
compares the student's value with them (``diagnose.name_mistake``) and prints the line of the
first that matches, before the numbers. Imports numpy only (it runs in the worker, next to the
student's needle).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np


class Variant:
    """A known wrong answer ``value`` and the ``message`` that names the mistake.

    ``reshape_ok``: also matches a result with the same values in another shape (the mistake is
    the shape)."""

    def __init__(self, value, message: str, reshape_ok: bool = False):
        self.value = np.asarray(value, dtype=np.float64)
        self.message = message
        self.reshape_ok = reshape_ok

    def matches(self, got: np.ndarray, rtol: float, atol: float) -> bool:
        """Whether ``got`` (float64) equals this wrong answer within the tolerance."""
        value = self.value
        if got.shape != value.shape:
            if not (self.reshape_ok and got.size == value.size):
                return False
            value = value.reshape(got.shape)
        return bool(value.size) and bool(
            np.isclose(got, value, rtol=rtol, atol=atol, equal_nan=True).all()
        )

    def pack(self) -> dict:
        """This wrong answer as plain data (``unpack`` rebuilds it), for the judge."""
        return {
            "kind": type(self).__name__,
            "value": self.value,
            "message": self.message,
            "reshape_ok": self.reshape_ok,
        }


class SumsTo(Variant):
    """Matches a result of shape ``shape`` that, summed down to the correct answer's shape
    (over leading axes and axes of size 1 there), equals the correct answer: a missing sum."""

    def __init__(self, correct, shape: tuple, message: str):
        super().__init__(correct, message)
        self.shape = tuple(shape)

    def pack(self) -> dict:
        return {**super().pack(), "shape": list(self.shape)}

    def matches(self, got: np.ndarray, rtol: float, atol: float) -> bool:
        if got.shape != self.shape or got.shape == self.value.shape:
            return False
        try:
            summed = sum_to(got, self.value.shape)
        except ValueError:
            return False
        return bool(np.isclose(summed, self.value, rtol=rtol, atol=atol).all())


class Reshaped(Variant):
    """Matches the correct values in another shape (the mistake is only the shape)."""

    def __init__(self, correct, message: str):
        super().__init__(correct, message, reshape_ok=True)

    def matches(self, got: np.ndarray, rtol: float, atol: float) -> bool:
        return got.shape != self.value.shape and super().matches(got, rtol, atol)


def unpack(data: dict, value: np.ndarray) -> Variant:
    """The ``Variant`` that ``pack`` wrote (``value`` already decoded); only the kinds defined
    here, so plain data cannot name anything else."""
    kind, message = data.get("kind"), str(data.get("message", ""))
    if kind == "SumsTo":
        return SumsTo(value, tuple(int(n) for n in data.get("shape", ())), message)
    if kind == "Reshaped":
        return Reshaped(value, message)
    if kind == "Variant":
        return Variant(value, message, bool(data.get("reshape_ok")))
    raise ValueError(f"unknown kind of known wrong answer {kind!r}")


def sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``x`` over the axes that broadcasting ``shape`` to ``x.shape`` stretched or added."""
    lead = x.ndim - len(shape)
    if lead < 0:
        raise ValueError("cannot sum to more dimensions")
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1
    )
    out = x.sum(axis=axes, keepdims=True)
    return out.reshape(shape)


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=1e-9)


def adjoint_variants(
    names: Sequence[str],
    arrays: Sequence[np.ndarray],
    out_grad: np.ndarray,
    correct: Sequence[np.ndarray],
    op: str | None = None,
) -> list[list[Variant]]:
    """The wrong adjoints every op's gradient can produce, one list per input: negated, swapped
    between inputs, right values in the wrong shape, the output's shape without the sum over
    the broadcast axes, a sum over the wrong axes, out_grad broadcast back without restoring
    the summed axes."""
    out = []
    for name, _x, c in zip(names, arrays, correct):
        d = f"∂{op}/∂{name}" if op else f"the derivative with respect to {name}"
        found: list[Variant] = []
        if c.size and np.abs(c).max() > 0:
            found.append(
                Variant(
                    -c,
                    f"your adjoint of {name} equals the correct one times -1: "
                    f"check the sign of {d}",
                )
            )
        for other, c2 in zip(names, correct):
            if other != name and c2.shape == c.shape and _differs(c2, c):
                found.append(
                    Variant(
                        c2,
                        f"your adjoint of {name} equals the correct adjoint of "
                        f"{other}: the adjoints are swapped (return one per "
                        "input, in the order of the inputs)",
                    )
                )
        out.append(found + _shape_variants(name, c, out_grad))
    return out


def _shape_variants(name: str, c: np.ndarray, g: np.ndarray) -> list[Variant]:
    """The wrong adjoints of input ``name`` (correct adjoint ``c``, out_grad ``g``) that get its
    shape wrong: right values in the wrong shape, the output's shape without the sum over the
    broadcast axes, a sum over the wrong axes, out_grad broadcast back without restoring the
    summed axes."""
    found: list[Variant] = [
        Reshaped(
            c,
            f"your adjoint of {name} has the right values in the wrong "
            f"shape: it must have {name}'s shape {tuple(c.shape)} (restore "
            "the dimensions a sum removed, with reshape)",
        )
    ]
    if g.shape != c.shape and g.size > c.size:
        found.append(
            SumsTo(
                c,
                g.shape,
                f"your adjoint of {name} has the output's shape "
                f"{tuple(g.shape)}: sum it over the broadcast axes "
                f"down to {name}'s shape {tuple(c.shape)}",
            )
        )
        for k in range(1, min(g.ndim, 3) + 1):
            for axes in itertools.combinations(range(g.ndim), k):
                s = g.sum(axis=axes)
                if s.size == c.size and _differs(s.reshape(c.shape), c):
                    found.append(
                        Variant(
                            s,
                            f"your adjoint of {name} sums out_grad over "
                            f"axes {axes}, which are not the axes that "
                            "were broadcast: sum over the axes where "
                            f"{name}'s shape {tuple(c.shape)} has 1 (or "
                            "that it lacks)",
                            reshape_ok=True,
                        )
                    )
    if g.size < c.size:
        try:
            b = np.broadcast_to(g, c.shape)
        except ValueError:
            b = None
        if b is not None and _differs(b, c):
            found.append(
                Variant(
                    b,
                    f"your adjoint of {name} broadcasts out_grad "
                    f"{tuple(g.shape)} to {tuple(c.shape)} without first "
                    "putting the summed axes back as size 1: reshape "
                    "out_grad so the reduced axes keep size 1, then "
                    "broadcast",
                )
            )
    return found


def matmul_variants(
    arrays: Sequence[np.ndarray], out_grad: np.ndarray, correct: Sequence[np.ndarray]
) -> list[list[Variant]]:
    """Wrong adjoints of ``a @ b``: transposed, an operand left untransposed, and (batched) the
    per-batch adjoints not summed over the axes an operand was broadcast along."""
    a, b = arrays
    g = out_grad
    ga, gb = correct

    def t(m):
        return np.swapaxes(m, -1, -2)

    found: list[list[Variant]] = [[], []]
    rules = ("∂(a @ b)/∂a = out_grad @ bᵀ", "∂(a @ b)/∂b = aᵀ @ out_grad")
    for k, (name, c) in enumerate((("a", ga), ("b", gb))):
        found[k].append(
            Variant(
                t(c),
                f"your adjoint of {name} is the transpose of the correct "
                f"one: {rules[k]} (check the order and which operand "
                "is transposed)",
            )
        )
    for k, (name, formula, text) in enumerate(
        (("a", lambda: g @ b, "out_grad @ b"), ("b", lambda: a @ g, "a @ out_grad"))
    ):
        try:
            value = formula()
        except ValueError:
            continue
        found[k].append(
            Variant(
                sum_to(value, correct[k].shape) if value.ndim > correct[k].ndim else value,
                f"your adjoint of {name} is {text}: transpose the other operand ({rules[k]})",
            )
        )
    for k, (name, full) in enumerate((("a", g @ t(b)), ("b", t(a) @ g))):
        if full.shape != correct[k].shape:
            found[k].append(
                Variant(
                    full,
                    f"your adjoint of {name} keeps the batch axes (shape "
                    f"{full.shape}): sum it over the axes {name} was "
                    f"broadcast along, to {name}'s shape "
                    f"{tuple(correct[k].shape)}",
                )
            )
    return found


# ---- NDArray: strided views, reductions, tiles --------------------------------------------------
def compact_strides(shape: Sequence[int]) -> tuple:
    """Row-major strides (in elements) of a compact array of ``shape``."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def read_strided(flat: np.ndarray, shape, strides, offset: int) -> np.ndarray | None:
    """The view (shape, strides, offset) of the 1-D ``flat`` as a new array; None if it would
    read outside ``flat``."""
    if any(n == 0 for n in shape):
        return np.zeros(shape)
    hi = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    lo = offset + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    if lo < 0 or hi >= flat.size:
        return None
    index = offset + sum(
        np.arange(n).reshape([-1 if i == k else 1 for i in range(len(shape))]) * s
        for k, (n, s) in enumerate(zip(shape, strides))
    )
    return flat[np.asarray(index, dtype=np.int64)]


def _wrong_views(shape, strides, offset) -> list[tuple[tuple, tuple, int, str]]:
    views = []
    if offset:
        views.append(
            (
                tuple(shape),
                tuple(strides),
                0,
                f"ignores the view's offset ({offset}): start at offset, not at element 0",
            )
        )
    dense = compact_strides(shape)
    if tuple(strides) != dense:
        views.append(
            (
                tuple(shape),
                dense,
                offset,
                f"ignores the strides {tuple(strides)}: it reads the elements one after "
                "another from the offset; the element at index (i, j, ...) is at "
                "offset + i·strides[0] + j·strides[1] + ...",
            )
        )
    for k, s in enumerate(strides):
        if s != dense[k] and shape[k] > 1:
            wrong = tuple(dense[k] if i == k else v for i, v in enumerate(strides))
            views.append(
                (
                    tuple(shape),
                    wrong,
                    offset,
                    f"ignores the stride of axis {k} ({s}, used as {dense[k]})",
                )
            )
    return views


def compact_variants(flat: np.ndarray, shape, strides, offset: int) -> list[Variant]:
    """What ``compact()`` of the view (shape, strides, offset) of ``flat`` returns when it
    ignores the offset, all strides, or one axis's stride."""
    found = []
    for s, st, off, text in _wrong_views(shape, strides, offset):
        value = read_strided(flat, s, st, off)
        if value is not None:
            found.append(Variant(value, f"your compact {text}"))
    return found


def setitem_variants(
    base: np.ndarray, shape, strides, offset: int, values: np.ndarray
) -> list[Variant]:
    """The array after ``view[...] = values`` when the write ignores the offset or a stride."""
    found = []
    flat = base.ravel()
    for s, st, off, text in _wrong_views(shape, strides, offset):
        index = read_strided(np.arange(flat.size), s, st, off)
        if index is not None:
            out = flat.astype(np.float64).copy()
            out[index.astype(np.int64).ravel()] = np.broadcast_to(values, s).ravel()
            found.append(Variant(out.reshape(base.shape), f"your setitem {text}"))
    return found


def permute_variants(a: np.ndarray, axes: Sequence[int]) -> list[Variant]:
    """``a.permute(axes)`` done wrong: the shape permuted with compact strides for it (a
    reshape), or the inverse permutation applied."""
    shape = tuple(a.shape[i] for i in axes)
    found = [
        Variant(
            a.reshape(shape),
            "your permute reorders the shape but not the strides "
            "(that is a reshape): new strides[i] = "
            "strides[axes[i]]",
        )
    ]
    inverse = tuple(int(i) for i in np.argsort(axes))
    if inverse != tuple(axes):
        found.append(
            Variant(
                np.transpose(a, inverse),
                f"your permute applies the inverse "
                f"permutation {inverse}: axis i of the "
                "result is axis axes[i] of the input",
            )
        )
    return found


def getitem_variants(
    a: np.ndarray,
    view: np.ndarray,
    starts: Sequence[int],
    steps: Sequence[int],
    base: tuple[tuple, tuple, int],
) -> list[Variant]:
    """``a[slices]`` done wrong, for the view (shape, strides, offset) ``base`` of the compact
    ``a``'s buffer: the slice starts not added to the offset, the view's own offset dropped,
    or the steps not multiplied into the strides."""
    _, strides, offset = base
    flat = a.ravel()
    shift = sum(s * st for s, st in zip(starts, strides))
    candidates = [
        (
            view.shape,
            strides_times(strides, steps),
            offset,
            "your getitem ignores the slice starts: the new offset is offset + sum(start·stride)",
        ),
        (
            view.shape,
            strides_times(strides, steps),
            shift,
            f"your getitem drops the view's own offset ({offset}): add the starts to "
            "it, do not replace it",
        ),
        (
            view.shape,
            tuple(strides),
            offset + shift,
            "your getitem ignores the slice steps: each stride is multiplied by its step",
        ),
    ]
    found = []
    for shape, st, off, text in candidates[: 2 if offset else 1] + candidates[2:]:
        value = read_strided(flat, shape, st, off)
        if value is not None:
            found.append(Variant(value, text))
    return found


def strides_times(strides: Sequence[int], steps: Sequence[int]) -> tuple:
    """Each stride multiplied by its slice step."""
    return tuple(s * k for s, k in zip(strides, steps))


def reduction_variants(a: np.ndarray, axis: int, reduce: str) -> list[Variant]:
    """``a.sum(axis)``/``a.max(axis)`` done wrong: over another axis, or over runs of
    ``a.shape[axis]`` consecutive elements (the axis not moved last before reducing)."""
    f = np.sum if reduce == "sum" else np.max
    found = []
    n = a.shape[axis]
    expected_shape = f(a, axis=axis).shape
    if axis != a.ndim - 1:
        runs = f(a.reshape(-1, n), axis=1).reshape(expected_shape)
        found.append(
            Variant(
                runs,
                f"your {reduce} over axis {axis} reduces runs of {n} "
                "consecutive elements in memory: permute the axis to the "
                "end and compact before reducing over the last dimension",
            )
        )
    for other in range(a.ndim):
        if other != axis:
            found.append(
                Variant(
                    f(a, axis=other), f"your {reduce} reduced axis {other} instead of axis {axis}"
                )
            )
    return found


def tile_variants(expected: np.ndarray, tiles: Sequence[int]) -> list[Variant]:
    """A tiled matmul's result (m, p) with the tiles in the wrong order: the (m/T, p/T, T, T)
    layout read as (m, p) without the permute, each tile transposed, or the grid transposed."""
    m, p = expected.shape
    found = []
    for t in sorted(set(tiles)):
        if t <= 1 or m % t or p % t:
            continue
        blocks = expected.reshape(m // t, t, p // t, t)
        found.append(
            Variant(
                blocks.transpose(0, 2, 1, 3).reshape(m, p),
                f"your tiled matmul's result is in tile order (m/T, p/T, T, T) "
                f"read as (m, p) (T = {t}): permute it with (0, 2, 1, 3) before "
                "the final compact",
            )
        )
        found.append(
            Variant(
                blocks.transpose(0, 3, 2, 1).reshape(m, p),
                f"every {t}x{t} tile of your tiled matmul's result is transposed: "
                "check the row/column order inside a tile",
            )
        )
        if m == p:
            found.append(
                Variant(
                    blocks.transpose(2, 1, 0, 3).reshape(m, p),
                    f"your tiled matmul puts tile (i, j) at (j, i) (T = {t}): "
                    "check the order of the tile indices",
                )
            )
    return found
