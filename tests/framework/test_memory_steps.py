"""Bytes a training step's ops keep and allocate, counted by the device module's allocator
counter (``memory_stats``): deterministic figures derived from the shapes, one test per memory
fix of the language-model steps (issue 22's memory target).

Each test states the bytes the op needs (its result, the arrays its backward reads) and checks
the counter's peak against that figure; the code before each fix allocated or kept whole extra
arrays of the same size, which these bounds exclude.
"""

from __future__ import annotations

import gc
from typing import Callable, Tuple

import numpy as np
import pytest
from conftest import device_params

import needle as ndl
from needle.backend_ndarray import fused

# The NDArray devices with an allocator counter (the numpy backend's arrays have none).
COUNTED = device_params(("cpu", "cpu_numpy"))
F32 = 4
# Slack for the small arrays around a big one (a column of N, alignment pads of 64 bytes).
SMALL = 64 * 1024


def _peak(device, fn: Callable[[], object]) -> Tuple[int, object]:
    """(peak bytes allocated above the start during ``fn()``, its result), cycle collector off."""
    gc.collect()
    gc.disable()
    try:
        mod = device.mod
        start = mod.memory_stats()["live_bytes"]
        mod.reset_peak()
        out = fn()
        return mod.memory_stats()["peak_bytes"] - start, out
    finally:
        gc.enable()


@pytest.mark.parametrize("device", COUNTED)
def test_softmax_xent_gradient_allocates_only_its_result(device):
    """(probs - one_hot) * column used to hold the one-hot matrix and the difference beside the
    result: three (N, C) arrays, the peak of a language model's step. Now one."""
    rows, cols = 256, 1000
    rng = np.random.default_rng(0)
    logits = ndl.NDArray(rng.standard_normal((rows, cols)).astype(np.float32), device=device)
    labels = ndl.NDArray(rng.integers(0, cols, rows).astype(np.float32), device=device)
    dloss = ndl.NDArray(rng.standard_normal(rows).astype(np.float32), device=device)
    _, probs = fused.softmax_xent(logits, labels)
    fused.softmax_xent_bwd(probs, labels, dloss, 0.5)  # the one-hot's iota row is cached once
    peak, grad = _peak(device, lambda: fused.softmax_xent_bwd(probs, labels, dloss, 0.5))
    result = rows * cols * F32
    assert result <= peak <= result + SMALL, peak
    # the values: (softmax - one_hot) * dloss * scale, against numpy
    p = probs.numpy()
    one_hot = np.eye(cols, dtype=np.float32)[labels.numpy().astype(int)]
    want = (p - one_hot) * (dloss.numpy()[:, None] * np.float32(0.5))
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6, atol=1e-7)
