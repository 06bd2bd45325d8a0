"""hw4's numpy references for dilate and the convolution, and their known wrong answers.

Used by the checks in ``hw4.py``: the references only in the judge's reference run (a blind
worker beside student code never calls them), the wrong answers to name a student's mistake.
"""

import numpy as np

from .mistakes import Variant


def _dilate_ref(x, axes, d):
    shape = list(x.shape)
    for ax in axes:
        shape[ax] *= d + 1
    out = np.zeros(shape, dtype=x.dtype)
    out[tuple(slice(None, None, d + 1) if i in axes else slice(None) for i in range(x.ndim))] = x
    return out


def _dilate_variants(axes, d):
    def variants(arrays):
        found = []
        for wrong in (d + 1, d - 1):
            if wrong >= 0:
                found.append(
                    Variant(
                        _dilate_ref(arrays[0], axes, wrong),
                        f"your dilate inserts {wrong} zero(s) between elements "
                        f"instead of {d}: dilation d inserts d zeros, so each "
                        f"dilated axis grows by a factor d + 1 = {d + 1}",
                    )
                )
        return found

    return variants


def _undilate_variants(axes, d):
    def variants(arrays):
        x = arrays[0]
        return [
            Variant(
                x[
                    tuple(
                        slice(None, None, step) if i in axes else slice(None) for i in range(x.ndim)
                    )
                ],
                f"your undilate keeps every {step}th element instead of every "
                f"{d + 1}th (dilation {d} means a step of d + 1)",
            )
            for step in (d, d + 2)
            if step >= 1
        ]

    return variants


def conv_ref(x, w, stride=1, padding=0):
    """NHWC input, (K, K, C_in, C_out) weight, zero padding: the course's convolution."""
    x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    n, h, wd, _ = x.shape
    k = w.shape[0]
    ho, wo = (h - k) // stride + 1, (wd - k) // stride + 1
    out = np.zeros((n, ho, wo, w.shape[3]), dtype=np.float64)
    for i in range(k):
        for j in range(k):
            patch = x[:, i : i + stride * ho : stride, j : j + stride * wo : stride, :]
            out += patch @ w[i, j]
    return out


def _conv_forward_variants(s, p):
    def variants(arrays):
        x, w = arrays
        found = [
            Variant(
                conv_ref(x, w, s, p + 1),
                f"your conv pads by {p + 1} instead of the padding {p}: one too many",
            )
        ]
        if p:
            found.append(
                Variant(
                    conv_ref(x, w, s, p - 1),
                    f"your conv pads by {p - 1} instead of the padding {p}: one too few",
                )
            )
        if s > 1:
            found.append(Variant(conv_ref(x, w, 1, p), f"your conv ignores the stride {s}"))
        found.append(
            Variant(
                conv_ref(x, w[::-1, ::-1], s, p),
                "your conv flips the kernel: the course's conv (as PyTorch's) is "
                "a cross-correlation, out[i, j] = sum x[i + ki, j + kj] w[ki, kj]",
            )
        )
        return found

    return variants


def _conv_adjoints(x, w, g, s, p, dilation, pad_x, pad_w, flip=True):
    """The course's conv adjoints, with the dilation of out_grad and the paddings as given:
    x̄ = conv(dilate(ḡ, dilation), flip(w) with in/out swapped, pad_x),
    w̄ = conv(xᵀ (C, H, W, N), dilate(ḡ)ᵀ (H, W, N, C_out), pad_w)ᵀ."""
    gd = _dilate_ref(g, (1, 2), dilation) if dilation else g
    wf = (w[::-1, ::-1] if flip else w).transpose(0, 1, 3, 2)
    gx = conv_ref(gd, wf, 1, pad_x)
    gw = conv_ref(x.transpose(3, 1, 2, 0), gd.transpose(1, 2, 0, 3), 1, pad_w)
    return gx, gw.transpose(1, 2, 0, 3)


def _conv_backward_variants(s, p):
    def variants(arrays, g, correct):
        x, w = arrays
        k = w.shape[0]
        found = [[], []]
        wrong = [
            (
                s - 1 + dd,
                k - 1 - p + dp,
                p + dp,
                True,
                f"dilation {s - 1 + dd} of out_grad (the stride is {s}: dilate by stride - 1 "
                f"= {s - 1})"
                if dd
                else f"padding off by {dp:+d} (x̄ needs padding "
                f"K - 1 - p = {k - 1 - p}, w̄ padding p = {p})",
            )
            for dd, dp in ((1, 0), (-1, 0), (0, 1), (0, -1))
            if s - 1 + dd >= 0 and p + dp >= 0 and k - 1 - p + dp >= 0
        ]
        wrong.append(
            (
                s - 1,
                k - 1 - p,
                p,
                False,
                "the kernel not flipped (x̄ is a conv of "
                "out_grad with w flipped in both spatial axes, in/out channels swapped)",
            )
        )
        for dilation, pad_x, pad_w, flip, text in wrong:
            try:
                gx, gw = _conv_adjoints(x, w, g, s, p, dilation, pad_x, pad_w, flip)
            except ValueError:
                continue
            for i, (name, value) in enumerate((("x", gx), ("w", gw))):
                if value.shape != correct[i].shape or not np.allclose(value, correct[i]):
                    found[i].append(
                        Variant(
                            value,
                            f"your adjoint of {name} matches the course's formula with {text}",
                        )
                    )
        return found

    return variants
