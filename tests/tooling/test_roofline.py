"""companion.roofline: the arithmetic behind notebook 06's roofline and the student benchmark."""

from __future__ import annotations

import pytest

from companion.roofline import H200, Roofline, matmul_intensity


def test_the_h200_figures_give_notebook_06s_numbers():
    # notebook 06, section 8 states (and asserts): ridge 13.96 flop/byte, 1.2 TFLOP/s at 0.25
    assert H200.ridge == pytest.approx(13.958, abs=1e-3)
    assert H200.bound(0.25) == pytest.approx(1.2e12)
    assert H200.bound(16) == H200.peak == 67e12


def test_bound_and_place():
    roof = Roofline("test", peak=100e9, bandwidth=10e9)
    assert roof.ridge == 10
    assert roof.bound(2) == 20e9 and roof.bound(50) == 100e9
    assert roof.place(2, 5e9) == "memory-bound at 2 flop/byte: 25% of its roofline bound"
    assert roof.place(20, 50e9) == "compute-bound at 20 flop/byte: 50% of its roofline bound"


def test_matmul_intensity_counts_each_operand_once():
    n = 1024
    assert matmul_intensity(n, n, n) == pytest.approx(2 * n**3 / (4 * 3 * n * n))  # n / 6
    assert matmul_intensity(2, 3, 4) == pytest.approx(2 * 24 / (4 * (6 + 12 + 8)))
