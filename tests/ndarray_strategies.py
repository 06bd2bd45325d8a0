"""Hypothesis settings, strategies and data shared by the NDArray suites."""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SETTINGS = settings(
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SEEDS = st.integers(0, 2**32 - 1)
SHAPES = st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple)
SHAPES_NONEMPTY = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def rand(seed: int, shape) -> np.ndarray:
    """Standard normal float32 data of ``shape`` from its own seeded generator."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
