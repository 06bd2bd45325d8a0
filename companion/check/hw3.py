"""hw3 checks: the NDArray class (Python views) and the device modules (C++/CUDA kernels).

Every check runs on ``cpu()`` and, where enabled, ``cuda()``; results are compared with numpy.
"""

import numpy as np

from .common import randn
from .diagnose import check_close, require
from .mistakes import (
    compact_variants,
    getitem_variants,
    permute_variants,
    reduction_variants,
    setitem_variants,
    tile_variants,
)
from .stubprobe import BINARY, SCALAR, UNARY, require_written


def np_view(base: np.ndarray, view: np.ndarray) -> tuple[tuple, tuple, int]:
    """(shape, strides, offset) in elements of the numpy ``view`` of the compact ``base``."""
    item = base.itemsize
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    return view.shape, tuple(s // item for s in view.strides), offset


def devices():
    """The student's enabled compiled devices."""
    from needle import backend_ndarray as nd

    out = [nd.cpu()]
    cuda = getattr(nd, "cuda", None)
    if cuda is not None:
        try:
            if cuda().enabled():
                out.append(cuda())
        except Exception:  # a missing CUDA module is not this homework's failure
            pass
    return out


def kernels_written(ctx, names) -> None:
    """Each kernel in ``names`` exists and writes its output on every device (else the question
    is "not implemented": the course's C++ stub, with or without NDEBUG)."""
    for dev in devices():
        tiled = ("matmul_tiled",) if "matmul" in names and hasattr(dev, "matmul_tiled") else ()
        ctx.note(f"on {dev}: {', '.join(names + tiled)} once each, on small inputs")
        require_written(dev, tuple(names) + tiled)


def arr(a, dev):
    from needle import backend_ndarray as nd

    return nd.NDArray(np.asarray(a, dtype=np.float32), device=dev)


def _view(what, base, view):
    require(
        getattr(view, "_handle", None) is getattr(base, "_handle", object()),
        f"{what} copied the data: it must return a view of the same memory (same _handle,"
        " new shape/strides/offset, via as_strided / NDArray.make)",
    )


def hw3_reshape(ctx):
    a = randn(4, 6, seed=70)
    for dev in devices():
        A = arr(a, dev)
        for shape in [(2, 3, 4), (24,), (6, 4)]:
            B = A.reshape(shape)
            check_close(
                f"on {dev}: A.reshape({shape}) for A of shape (4, 6)",
                B.numpy(),
                lambda shape=shape: a.reshape(shape),
            )
            _view(f"reshape{shape}", A, B)


def hw3_permute(ctx):
    a = randn(2, 3, 4, seed=71)
    for dev in devices():
        A = arr(a, dev)
        for axes in [(2, 0, 1), (1, 0, 2), (0, 2, 1)]:
            B = A.permute(axes)
            check_close(
                f"on {dev}: A.permute({axes}) for A of shape (2, 3, 4)",
                B.numpy(),
                lambda axes=axes: np.transpose(a, axes),
                hint="permute the shape and the strides",
                variants=lambda axes=axes: permute_variants(a, axes),
            )
            _view(f"permute{axes}", A, B)


def hw3_broadcast_to(ctx):
    for dev in devices():
        for shape, new in [((3, 1), (3, 4)), ((1, 4), (3, 4)), ((2, 1, 3), (2, 4, 3))]:
            a = randn(*shape, seed=72)
            A = arr(a, dev)
            B = A.broadcast_to(new)
            check_close(
                f"on {dev}: A.broadcast_to({new}) for A of shape {shape}",
                B.numpy(),
                lambda a=a, new=new: np.broadcast_to(a, new),
                hint="stride 0 along broadcast axes",
            )
            _view(f"broadcast_to{new}", A, B)


def hw3_getitem(ctx):
    a = randn(4, 5, 6, seed=73)
    cases = [
        (
            (1, slice(2, 5), slice(None, None, 2)),
            (slice(1, 2), slice(2, 5), slice(None, None, 2)),
            "A[1, 2:5, ::2]",
        ),
        (
            (slice(1, 4, 2), slice(None), slice(3, 6)),
            (slice(1, 4, 2), slice(None), slice(3, 6)),
            "A[1:4:2, :, 3:6]",
        ),
    ]
    at = np.transpose(a, (2, 1, 0))
    for dev in devices():
        A = arr(a, dev)
        views = [(A, a, "A", idx, np_idx, text) for idx, np_idx, text in cases]
        views.append(
            (
                A.permute((2, 1, 0)),
                at,
                "A.permute((2, 1, 0))",
                (slice(1, 5), slice(2, 4), slice(None, None, 2)),
                (slice(1, 5), slice(2, 4), slice(None, None, 2)),
                "A.permute((2, 1, 0))[1:5, 2:4, ::2] (a slice of a non-compact view)",
            )
        )
        for base, np_base, _base_text, idx, np_idx, text in views:
            B = base[idx]
            check_close(
                f"on {dev}: {text} for A of shape (4, 5, 6) (integer indices keep "
                "their axis with size 1)",
                B.numpy(),
                lambda np_base=np_base, np_idx=np_idx: np_base[np_idx],
                hint="offset = the view's offset + sum(start * stride); "
                "strides *= step (start from the view's own strides and offset)",
                variants=lambda np_base=np_base, np_idx=np_idx: _getitem_variants(
                    a, np_base, np_idx
                ),
            )
            _view(text, base, B)


def _getitem_variants(a, np_base, np_idx):
    ranges = [s.indices(n) for s, n in zip(np_idx, np_base.shape)]
    return getitem_variants(
        a,
        np_base[np_idx],
        [r[0] for r in ranges],
        [r[2] for r in ranges],
        np_view(a, np_base),
    )


def hw3_compact(ctx):
    kernels_written(ctx, ("compact",))
    a = randn(4, 5, 6, seed=74)
    col = np.ascontiguousarray(a[:, :1])
    cases = [
        (
            lambda A, C: A.permute((2, 0, 1)),
            a,
            lambda: np.transpose(a, (2, 0, 1)),
            "A.permute((2, 0, 1))",
        ),
        (lambda A, C: A[1:4:2, 1:5, ::3], a, lambda: a[1:4:2, 1:5, ::3], "A[1:4:2, 1:5, ::3]"),
        (
            lambda A, C: A[2:4, 3:5, 1:6].permute((1, 0, 2)),
            a,
            lambda: np.transpose(a[2:4, 3:5, 1:6], (1, 0, 2)),
            "A[2:4, 3:5, 1:6].permute((1, 0, 2))",
        ),
        (
            lambda A, C: C.broadcast_to((4, 3, 6)),
            col,
            lambda: np.broadcast_to(col, (4, 3, 6)),
            "A[:, :1].broadcast_to((4, 3, 6))",
        ),
    ]
    for dev in devices():
        A, C = arr(a, dev), arr(col, dev)
        for make, base, expected, text in cases:
            ctx.note(f"on {dev}: {text}.compact() for A of shape (4, 5, 6)")
            out = make(A, C).compact()
            require(out.is_compact(), f"on {dev}: {text}.compact() is not compact")
            check_close(
                f"on {dev}: {text}.compact()",
                out.numpy(),
                expected,
                hint="compact walks the view's shape in row-major order, reading "
                "offset + sum(index * stride)",
                variants=lambda base=base, expected=expected: compact_variants(
                    base.ravel(), *np_view(base, expected())
                ),
            )


def hw3_setitem(ctx):
    kernels_written(ctx, ("ewise_setitem", "scalar_setitem"))
    a = randn(5, 6, seed=75)
    b = randn(2, 3, seed=76)
    c = randn(3, 4, seed=84)
    for dev in devices():
        for text, setter, np_index, value in [
            (
                "A[1:5:2, 2:5] = B (ewise_setitem)",
                lambda A: A.__setitem__((slice(1, 5, 2), slice(2, 5)), arr(b, dev)),
                (slice(1, 5, 2), slice(2, 5)),
                b,
            ),
            (
                "A[1:4, 2:4] = C[0:3, 1:3] (ewise_setitem from a non-compact view)",
                lambda A: A.__setitem__((slice(1, 4), slice(2, 4)), arr(c, dev)[0:3, 1:3]),
                (slice(1, 4), slice(2, 4)),
                c[0:3, 1:3],
            ),
            (
                "A[::2, 1:3] = 7.5 (scalar_setitem)",
                lambda A: A.__setitem__((slice(None, None, 2), slice(1, 3)), 7.5),
                (slice(None, None, 2), slice(1, 3)),
                np.float32(7.5),
            ),
        ]:
            A = arr(a, dev)
            ctx.note(f"on {dev}: {text} for A (5, 6)")
            setter(A)

            def assigned(np_index=np_index, value=value):
                e = a.copy()
                e[np_index] = value
                return e

            check_close(
                f"on {dev}: {text}",
                A.numpy(),
                assigned,
                variants=lambda np_index=np_index, value=value: setitem_variants(
                    a, *np_view(a, a[np_index]), np.asarray(value, dtype=np.float64)
                ),
            )


def hw3_ewise_ops(ctx):
    kernels_written(ctx, BINARY + UNARY)
    a = randn(3, 4, seed=77)
    b = randn(3, 4, seed=78)
    b[0, 0] = a[0, 0]
    pos = np.abs(a) + 0.5
    for dev in devices():
        A, B = arr(a, dev), arr(b, dev)
        AT = arr(a.T.copy(), dev).permute((1, 0))  # a non-compact view of the same values
        for text, got, exp in [
            ("A + B", lambda: A + B, lambda: a + b),
            ("A * B", lambda: A * B, lambda: a * b),
            ("A / B", lambda: A / B, lambda: a / b),
            ("A.maximum(B)", lambda: A.maximum(B), lambda: np.maximum(a, b)),
            ("A == B", lambda: A == B, lambda: (a == b).astype(np.float32)),
            ("A >= B", lambda: A >= B, lambda: (a >= b).astype(np.float32)),
            ("A.log()", lambda: arr(pos, dev).log(), lambda: np.log(pos)),
            ("A.exp()", lambda: A.exp(), lambda: np.exp(a)),
            ("A.tanh()", lambda: A.tanh(), lambda: np.tanh(a)),
            ("A_view + B (A a permuted view)", lambda: AT + B, lambda: a + b),
        ]:
            ctx.note(f"on {dev}: {text} with A, B of shape (3, 4)")
            check_close(
                f"on {dev}: {text}",
                got().numpy(),
                exp,
                rtol=1e-5,
                atol=1e-6,
                inputs={"A": a, "B": b},
            )


def hw3_scalar_ops(ctx):
    kernels_written(ctx, SCALAR)
    a = randn(3, 4, seed=79)
    pos = np.abs(a) + 0.5
    for dev in devices():
        A = arr(a, dev)
        for text, got, exp in [
            ("A + 2.5", lambda: A + 2.5, lambda: a + 2.5),
            ("A * 2.5", lambda: A * 2.5, lambda: a * 2.5),
            ("A / 2.5", lambda: A / 2.5, lambda: a / 2.5),
            ("A ** 3", lambda: A**3, lambda: a**3),
            ("A ** 0.5 (A > 0)", lambda: arr(pos, dev) ** 0.5, lambda: pos**0.5),
            ("A.maximum(0.2)", lambda: A.maximum(0.2), lambda: np.maximum(a, 0.2)),
            (
                "A == A[0, 0]",
                lambda: A == float(a[0, 0]),
                lambda: (a == a[0, 0]).astype(np.float32),
            ),
            ("A >= 0.2", lambda: A >= 0.2, lambda: (a >= 0.2).astype(np.float32)),
        ]:
            ctx.note(f"on {dev}: {text} with A of shape (3, 4)")
            check_close(
                f"on {dev}: {text}", got().numpy(), exp, rtol=1e-5, atol=1e-6, inputs={"A": a}
            )


def _reduced(got, shape: tuple):
    """Course versions differ on keepdims: compare values when only size-1 axes differ."""
    got = np.asarray(got)
    return got.reshape(shape) if got.size == int(np.prod(shape)) else got


def hw3_reductions(ctx):
    kernels_written(ctx, ("reduce_sum", "reduce_max"))
    a = randn(3, 4, 5, seed=80)
    for dev in devices():
        A = arr(a, dev)
        for axis in (0, 1, 2):
            kept = tuple(n for i, n in enumerate(a.shape) if i != axis)
            ctx.note(f"on {dev}: A.sum(axis={axis}) / A.max(axis={axis}), A (3, 4, 5)")
            check_close(
                f"on {dev}: A.sum(axis={axis}) for A of shape (3, 4, 5)",
                _reduced(A.sum(axis=axis).numpy(), kept),
                lambda axis=axis: a.sum(axis),
                rtol=1e-5,
                atol=1e-5,
                variants=lambda axis=axis: reduction_variants(a, axis, "sum"),
            )
            check_close(
                f"on {dev}: A.max(axis={axis}) for A of shape (3, 4, 5)",
                _reduced(A.max(axis=axis).numpy(), kept),
                lambda axis=axis: a.max(axis),
                variants=lambda axis=axis: reduction_variants(a, axis, "max"),
            )
        check_close(
            f"on {dev}: A.sum() (all axes)",
            _reduced(A.sum().numpy(), ()),
            lambda: np.asarray(a.sum()),
            rtol=1e-5,
            atol=1e-4,
        )


def hw3_matmul(ctx):
    kernels_written(ctx, ("matmul",))
    for dev in devices():
        tiles = (
            getattr(dev, "__tile_size__", None)
            or getattr(getattr(dev, "mod", None), "__tile_size__", None)
            or 8,
            4,
            8,
        )
        for m, n, p in [(5, 7, 3), (1, 1, 1), (16, 24, 8), (16, 16, 16), (33, 17, 9), (72, 73, 74)]:
            a, b = randn(m, n, seed=81), randn(n, p, seed=82)
            ctx.note(f"on {dev}: A @ B with A ({m}, {n}), B ({n}, {p})")
            check_close(
                f"on {dev}: A @ B with A ({m}, {n}), B ({n}, {p})"
                + (
                    " (every size a multiple of the tile: matmul_tiled)"
                    if m % 8 == n % 8 == p % 8 == 0
                    else ""
                ),
                (arr(a, dev) @ arr(b, dev)).numpy(),
                lambda a=a, b=b: a @ b,
                rtol=1e-4,
                atol=1e-4,
                variants=lambda a=a, b=b, tiles=tiles: tile_variants(
                    a.astype(np.float64) @ b, tiles
                ),
            )
