"""`make bench` times each library in processes of its own (``benchmarks.common``): a child
(``python -m benchmarks.common MODULE:FUNCTION ARGS_JSON``) prints the {case: seconds} the
function returned, a failing child or one that loads a forbidden module is an error carrying
its stderr, the children alternate between libraries, and a real needle step times in a child
without loading PyTorch."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

import needle as ndl
from benchmarks import bench_lm, common

needs_cpu = pytest.mark.skipif(not ndl.cpu().enabled(), reason="needs the compiled cpu()")


def test_the_child_runner_loads_neither_numpy_nor_needle_nor_torch():
    # `python -m benchmarks` re-executes itself before numpy loads, and a child loads only what
    # the timed function imports
    code = (
        "import sys, benchmarks.common; "
        "print(sorted({'numpy', 'needle', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=common.ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["[]"]


# ---- the parent's side: parsing a child's output ------------------------------------------------


def test_the_last_marker_line_is_the_result():
    out = (
        f'warming up\n{common.CHILD_MARKER} {{"a": 0.5}}\nnoise\n'
        f'{common.CHILD_MARKER} {{"a": 0.0125, "b": 2}}\n'
    )
    assert common.parse_child_seconds(out, "x") == {"a": 0.0125, "b": 2.0}


@pytest.mark.parametrize(
    "out, message",
    [
        ('{"a": 1.5}\n', "printed no 'child seconds:' line"),
        (f"{common.CHILD_MARKER} fast\n", "printed 'fast', not {case: seconds}"),
        (f"{common.CHILD_MARKER} 1.5\n", "printed '1.5', not {case: seconds}"),
        (f"{common.CHILD_MARKER} {{}}\n", "printed '{}', not {case: seconds}"),
        (f'{common.CHILD_MARKER} {{"a": 0.0}}\n', "measured 0.0 s for a"),
        (f'{common.CHILD_MARKER} {{"a": NaN}}\n', "measured nan s for a"),
        (f'{common.CHILD_MARKER} {{"a": "1"}}\n', "measured '1' s for a"),
        (f'{common.CHILD_MARKER} {{"a": true}}\n', "measured True s for a"),
    ],
)
def test_output_without_positive_seconds_is_an_error(out, message):
    with pytest.raises(RuntimeError, match=f"timing the case: .*{re.escape(message)}"):
        common.parse_child_seconds(out, "the case")


# ---- alternation and medians --------------------------------------------------------------------


def test_children_alternate_between_libraries_and_medians_are_per_library_and_case():
    calls = []
    seconds = {"a": iter([3.0, 1.0, 2.0]), "b": iter([10.0, 30.0, 20.0])}

    def time_one(library):
        calls.append(library)
        s = next(seconds[library])
        return {"x": s, "y": 100 - s}

    medians = common.medians_of_children(time_one, ("a", "b"), runs=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert medians == {"a": {"x": 2.0, "y": 98.0}, "b": {"x": 20.0, "y": 80.0}}


def test_bad_alternation_arguments_are_errors():
    with pytest.raises(ValueError, match="runs must be at least 1, got 0"):
        common.medians_of_children(lambda lib: {"x": 1.0}, ("a",), runs=0)
    with pytest.raises(ValueError, match="no libraries to time"):
        common.medians_of_children(lambda lib: {"x": 1.0}, ())
    cases = iter([{"x": 1.0}, {"y": 1.0}])
    with pytest.raises(RuntimeError, match="a's children timed different cases"):
        common.medians_of_children(lambda lib: next(cases), ("a",), runs=2)


# ---- timing a step in this process --------------------------------------------------------------


def test_time_step_here_times_the_chosen_library_in_blocks():
    calls = {"needle": 0, "torch": 0}

    def builder(library):
        def step():
            calls[library] += 1

        return lambda: step

    builders = {name: builder(name) for name in calls}
    seconds = common.time_step_here("needle", builders, repeats=3, warmup=2, min_sample_s=1e-3)
    assert 0 < seconds < 1e-3 and math.isfinite(seconds)
    assert calls["torch"] == 0
    assert calls["needle"] >= 2 + 3 * 2  # warm-up, then blocks of several calls


def test_time_step_here_names_unknown_and_missing_libraries():
    with pytest.raises(ValueError, match="library must be one of needle, torch, got 'jax'"):
        common.time_step_here("jax", {"needle": lambda: None, "torch": lambda: None})
    with pytest.raises(RuntimeError, match="torch is not installed"):
        common.time_step_here("torch", {"needle": lambda: None, "torch": lambda: None})


# ---- real children ------------------------------------------------------------------------------


@needs_cpu
def test_matmul_children_time_both_libraries():
    t = common.time_libraries_in_children(
        "benchmarks.bench_ndarray:time_matmul_here",
        [[8, 9, 10]],
        what="8x9x10 product",
        libraries=("needle", "numpy"),
        runs=1,
    )
    assert set(t) == {"needle", "numpy"}
    assert all(set(s) == {"8x9x10"} for s in t.values())
    assert all(0 < s["8x9x10"] < 0.1 for s in t.values())  # an 8x9x10 product, timed per call


def test_a_failing_child_is_an_error_with_its_stderr():
    with pytest.raises(RuntimeError, match="timing torch: 8x9x10 failed") as info:
        common.time_libraries_in_children(
            "benchmarks.bench_ndarray:time_matmul_here",
            [[8, 9, 10]],
            what="8x9x10",
            libraries=("torch",),
            runs=1,
        )
    assert "library must be 'needle' or 'numpy', got 'torch'" in str(info.value)


def test_a_child_that_loads_a_forbidden_module_is_an_error():
    with pytest.raises(RuntimeError, match="numpy, which this child must not load"):
        common.time_in_child(
            "benchmarks.bench_ndarray:time_matmul_here",
            "numpy",
            [[8, 9, 10]],
            what="numpy 8x9x10",
            forbid=("numpy",),
        )


def test_a_bad_target_is_an_error():
    with pytest.raises(RuntimeError, match="target must be MODULE:FUNCTION"):
        common.time_in_child("benchmarks.bench_lm", what="no function")


@needs_cpu
def test_a_needle_training_step_times_in_a_child_without_pytorch():
    # The child is told not to load torch: it fails if companion.steps or bench_lm import it.
    t = common.time_libraries_in_children(
        "benchmarks.bench_lm:time_lm_steps",
        ["lstm_lm"],
        what="LSTM LM step",
        libraries=("needle",),
        runs=1,
    )
    assert list(t["needle"]) == ["lstm_lm"]
    assert 1e-4 < t["needle"]["lstm_lm"] < 5.0


@needs_cpu
def test_a_model_benchmark_without_pytorch_says_so(monkeypatch, capsys):
    monkeypatch.setattr(bench_lm, "LM_CASES", ("transformer_lm",))
    monkeypatch.setattr(bench_lm, "libraries", lambda: ("needle",))
    assert bench_lm.main(["--runs", "1"]) == {}
    out = capsys.readouterr().out
    assert "Transformer LM step" in out and "PyTorch: not installed" in out
