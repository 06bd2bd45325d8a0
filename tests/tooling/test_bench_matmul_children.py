"""`make bench`'s matmul table times each library in processes of its own: the child protocol
(``python -m benchmarks.bench_ndarray --child LIBRARY M N P`` prints seconds) works for both
libraries and a failing child is an error naming what it timed, not a number."""

from __future__ import annotations

import pytest

import needle as ndl
from benchmarks import bench_ndarray

pytestmark = pytest.mark.skipif(not ndl.cpu().enabled(), reason="needs the compiled cpu()")


@pytest.mark.parametrize("library", ["needle", "numpy"])
def test_a_child_times_one_library(library):
    seconds = bench_ndarray.time_matmul_in_child(library, 8, 9, 10)
    assert 0 < seconds < 0.1  # an 8x9x10 product, timed per call


def test_a_failing_child_is_an_error():
    with pytest.raises(RuntimeError, match="timing torch 8x9x10 failed"):
        bench_ndarray.time_matmul_in_child("torch", 8, 9, 10)
