"""Roofline arithmetic: the speed a kernel can reach at its arithmetic intensity.

A roofline bounds a kernel's speed by ``min(peak flop/s, intensity x bandwidth)``; the ridge is
where the two limits meet (``peak / bandwidth`` flop per byte). :data:`H200` holds the datasheet
figures notebook 06 (§ 8) uses for the GPU; :func:`measured_cpu` gives this machine's CPU
figures as the best numpy reaches (a large float32 matmul for the peak, a large copy for the
bandwidth), which is where a student's CPU kernels are placed (``benchmarks/student.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """A machine's two limits: ``peak`` flop/s and ``bandwidth`` bytes/s, and where they come
    from (``source``)."""

    source: str
    peak: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """The intensity (flop/byte) where the memory limit meets the compute limit."""
        return self.peak / self.bandwidth

    def bound(self, intensity: float) -> float:
        """The attainable flop/s at ``intensity`` flop per byte."""
        return min(self.peak, intensity * self.bandwidth)

    def place(self, intensity: float, flops_per_s: float) -> str:
        """One phrase: memory- or compute-bound at this intensity, and the share of the bound
        that ``flops_per_s`` reaches."""
        side = "memory-bound" if intensity < self.ridge else "compute-bound"
        share = flops_per_s / self.bound(intensity)
        return f"{side} at {intensity:.3g} flop/byte: {100 * share:.3g}% of its roofline bound"


#: NVIDIA's H200 SXM datasheet: 67 TFLOP/s FP32 without tensor cores, 4.8 TB/s HBM (notebook 06).
H200 = Roofline("H200 SXM datasheet", 67e12, 4.8e12)


def matmul_intensity(m: int, n: int, p: int, itemsize: int = 4) -> float:
    """Flop per byte of an (m, n) @ (n, p) product that reads each input and writes the output
    once (the minimum traffic): 2mnp / (itemsize (mn + np + mp))."""
    return 2.0 * m * n * p / (itemsize * (m * n + n * p + m * p))


def _best(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measured_cpu(size: int = 1024, elements: int = 1 << 24, repeats: int = 3) -> Roofline:
    """This machine's CPU roofline as numpy reaches it: the peak from a ``size``³ float32 matmul,
    the bandwidth from copying ``elements`` float32 (read + write)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    peak = 2.0 * size**3 / _best(lambda: a @ b, repeats)
    x = np.ones(elements, dtype=np.float32)
    y = np.empty_like(x)
    bandwidth = 2 * 4 * elements / _best(lambda: np.copyto(y, x), repeats)
    return Roofline(
        f"this CPU as numpy reaches it ({size}³ matmul, {elements * 4 >> 20} MiB copy)",
        peak,
        bandwidth,
    )
