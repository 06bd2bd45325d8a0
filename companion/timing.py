"""Timing a callable the way the benchmarks and the lecture notebooks do (an extension).

``measure`` waits for other libraries' spinning threads to go idle, warms up, and returns the
median seconds per call over repeated samples, each long enough to read the clock reliably.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

# Seconds to pause before timing: OpenBLAS's worker threads keep spinning for about 0.1 s
# after each call (and needle's pool for 0.2 ms), and on a 2-core machine a spinning thread of
# the library timed just before halves the speed of the one timed next.
SETTLE_S = 0.3


def measure(
    fn: Callable[[], object],
    repeats: int = 7,
    warmup: int = 2,
    min_sample_s: float = 2e-3,
    settle_s: float = SETTLE_S,
) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` samples, after ``warmup`` calls.

    Waits ``settle_s`` first so that threads left spinning by earlier work go idle. Each
    sample calls ``fn`` enough times to last at least ``min_sample_s`` (calibrated once), so
    microsecond-scale calls are timed as averages over many calls.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if settle_s > 0:
        time.sleep(settle_s)
    for _ in range(max(warmup, 1)):
        fn()
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_sample_s or number >= 1 << 20:
            break
        number *= max(2, min(10, int(min_sample_s / max(elapsed, 1e-9)) + 1))
    samples = [elapsed / number]
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)
