"""`make bench`'s tables against PyTorch's standard modules (``benchmarks.idiomatic``,
``bench_idiomatic``) and the per-op table in own processes (``bench_overhead``): the two sides
are the same model on tiny shapes, mismatches are named, the arguments are checked, the tables
name the machine, the small graph's hand-derived gradients hold. No timings are asserted."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import needle as ndl
from benchmarks import bench_idiomatic, bench_overhead, common, idiomatic
from companion.steps import CASES

needs_cpu = pytest.mark.skipif(not ndl.cpu().enabled(), reason="needs the compiled cpu()")
TINY = idiomatic.Sizes(
    mlp_batch=4,
    mlp_dim=12,
    mlp_hidden=8,
    mlp_blocks=2,
    classes=5,
    image_batch=2,
    seq=5,
    lm_batch=3,
    embed=8,
    hidden=6,
    vocab=11,
    layers=2,
    heads=2,
    dim_head=4,
)


# ---- the same model on both sides ---------------------------------------------------------------


@needs_cpu
@pytest.mark.parametrize("case", CASES)
def test_both_sides_are_the_same_model_on_tiny_shapes(case):
    pytest.importorskip("torch")
    r = idiomatic.compare(case, TINY)
    assert r["needle params"] == r["torch params"] > 0
    assert r["logits gap"] < 1e-5 and r["loss gap"] < 1e-5


@needs_cpu
def test_the_transformer_comparison_sees_the_causal_mask(monkeypatch):
    # needle's layers attending to later positions make another model: the check must say so
    pytest.importorskip("torch")
    original = idiomatic.needle_model

    def unmasked(case, sizes, device):
        model = original(case, sizes, device)
        for layer in model.seq_model.layers.modules:
            layer.attn.attn.causal = False
        return model

    monkeypatch.setattr(idiomatic, "needle_model", unmasked)
    assert idiomatic.compare("transformer_lm", TINY)["logits gap"] > 1e-3


@needs_cpu
def test_layers_pair_up_in_definition_order():
    pytest.importorskip("torch")
    ours = idiomatic.needle_model("transformer_lm", TINY, ndl.cpu())
    theirs = idiomatic.torch_model("transformer_lm", TINY)
    kinds = [type(m).__name__ for m in idiomatic.needle_layers(ours)]
    assert kinds == ["Embedding", "Embedding", "TransformerLayer", "TransformerLayer", "Linear"]
    assert [type(m).__name__ for m in idiomatic.torch_layers(theirs)] == [
        idiomatic.LAYER_PAIRS[k] for k in kinds
    ]


@needs_cpu
def test_copying_into_another_shape_or_architecture_is_an_error():
    pytest.importorskip("torch")
    ours = idiomatic.needle_model("lstm_lm", TINY, ndl.cpu())
    wider = idiomatic.torch_model("lstm_lm", dataclasses.replace(TINY, hidden=7))
    with pytest.raises(ValueError, match=r"weight_ih_l0: PyTorch's shape \(28, 8\), needle's"):
        idiomatic.copy_weights(ours, wider)
    with pytest.raises(ValueError, match="the layers differ: needle .*'LSTM'.*PyTorch"):
        idiomatic.copy_weights(ours, idiomatic.torch_model("transformer_lm", TINY))


@needs_cpu
def test_differing_prenorms_cannot_be_copied_into_one_norm():
    pytest.importorskip("torch")
    ours = idiomatic.needle_model("transformer_lm", TINY, ndl.cpu())
    layer = ours.seq_model.layers.modules[0]
    layer.attn.prenorm_k.weight = ndl.nn.Parameter(layer.attn.prenorm_k.weight * 2.0)
    with pytest.raises(ValueError, match="prenorm_q, prenorm_k and prenorm_v differ"):
        idiomatic.copy_weights(ours, idiomatic.torch_model("transformer_lm", TINY))


def test_pytorchs_layer_needs_the_heads_to_fill_the_width():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"heads \* dim_head must equal embed, got 2 \* 3 != 8"):
        idiomatic.torch_model("transformer_lm", dataclasses.replace(TINY, dim_head=3))


def test_unknown_cases_are_errors():
    with pytest.raises(ValueError, match="unknown case 'gpt'; cases: mlp_resnet"):
        idiomatic.batch("gpt", TINY)
    with pytest.raises(ValueError, match=r"cases must be among .*, got \['gpt'\]"):
        bench_idiomatic.time_idiomatic_steps("needle", ["gpt"])


# ---- the check's verdict and report -------------------------------------------------------------


def _report(**changes):
    r = {"needle params": 10, "torch params": 10, "logits gap": 1e-7, "loss gap": 0.0}
    return {**r, **changes}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"torch params": 12}, "lstm_lm: needle's model has 10 parameters, PyTorch's 12"),
        ({"logits gap": 2e-3}, r"logits by 2.0e-03 \(relative\), loss by 0.0e\+00"),
        ({"loss gap": float("nan")}, "loss by nan"),
    ],
)
def test_a_different_model_stops_the_benchmark(monkeypatch, changes, message):
    monkeypatch.setattr(idiomatic, "compare", lambda case: _report(**changes))
    with pytest.raises(RuntimeError, match=message):
        bench_idiomatic.same_model_report(["lstm_lm"])


def test_the_same_model_passes_and_is_reported(monkeypatch):
    monkeypatch.setattr(
        idiomatic, "compare", lambda case: _report(**{"needle params": 1234, "torch params": 1234})
    )
    report = bench_idiomatic.same_model_report(["resnet9"])
    assert bench_idiomatic.same_model_lines(report) == [
        "resnet9: 1,234 parameters on both sides; with needle's weights copied, logits within "
        "1.0e-07 (relative), loss within 0.0e+00"
    ]


# ---- arguments ----------------------------------------------------------------------------------


def test_idiomatic_arguments():
    args = bench_idiomatic.parse_args([])
    assert args.runs == common.CHILD_RUNS and args.cases == list(CASES)
    args = bench_idiomatic.parse_args(["--runs", "2", "--cases", "resnet9", "lstm_lm"])
    assert args.runs == 2 and args.cases == ["resnet9", "lstm_lm"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "0"], "--runs must be at least 1, got 0"),
        (["--cases", "gpt"], "invalid choice: 'gpt'"),
    ],
)
def test_bad_idiomatic_arguments_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench_idiomatic.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "0"], "--runs must be at least 1, got 0"),
        (["--repeats", "-1"], "--repeats must be at least 1, got -1"),
        (["--clock", "gpu"], "invalid choice: 'gpu'"),
    ],
)
def test_bad_overhead_arguments_are_named(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench_overhead.parse_args(argv)
    assert message in capsys.readouterr().err


@needs_cpu
def test_without_pytorch_the_idiomatic_benchmark_says_so(monkeypatch, capsys):
    monkeypatch.setattr(bench_idiomatic, "libraries", lambda: ("needle",))
    assert bench_idiomatic.main(["--runs", "1"]) == {}
    assert "PyTorch: not installed" in capsys.readouterr().out


# ---- the tables ---------------------------------------------------------------------------------


def test_every_table_names_the_machine_under_its_title():
    table = common.Table("title", "ms", reference="PyTorch", higher_is_better=False, machine="M")
    table.add("case", 2.0, 1.0)
    lines = table.render().splitlines()
    assert lines[:2] == ["title", "M"]
    assert lines[3].split() == ["case", "needle", "ms", "PyTorch", "ms", "needle/PyTorch"]
    assert lines[5].split() == ["case", "2.00", "1.00", "0.50"]
    assert common.Table("t", "ms").machine.startswith("machine: ")


def test_the_steps_table_has_both_paths_of_each_case_and_their_ratios():
    times = {
        "needle": {"resnet9": 0.004},
        "needle-fast": {"resnet9": 0.001},
        "torch": {"resnet9": 0.002},
    }
    table, ratios = bench_idiomatic.steps_table(times, ["resnet9"], runs=3)
    title = idiomatic.TITLES["resnet9"]
    assert table.rows == [
        (f"{title} [course path]", 4.0, 2.0),
        (f"{title} [fast path]", 1.0, 2.0),
    ]
    assert ratios == {f"{title} [course path]": 0.5, f"{title} [fast path]": 2.0}
    assert "median of 3" in table.title


def test_the_per_op_table_lists_every_case_in_microseconds():
    times = {
        "needle": dict.fromkeys(bench_overhead.OPS, 4e-6),
        "torch": dict.fromkeys(bench_overhead.OPS, 2e-6),
    }
    table = bench_overhead.ops_table(times, runs=3)
    assert [row[0] for row in table.rows] == list(bench_overhead.OPS)
    assert all(row[1:] == (4.0, 2.0) for row in table.rows)
    assert table.ratio(4.0, 2.0) == 0.5


def test_the_per_op_benchmark_returns_each_cases_ratio(monkeypatch, capsys):
    times = {
        "needle": {case: (i + 1) * 1e-6 for i, case in enumerate(bench_overhead.OPS)},
        "torch": dict.fromkeys(bench_overhead.OPS, 2e-6),
    }
    monkeypatch.setattr(bench_overhead, "libraries", lambda: ("needle", "torch"))
    monkeypatch.setattr(bench_overhead, "time_libraries_in_children", lambda *a, **k: times)
    ratios = bench_overhead.bench_ops_in_children(repeats=1, runs=1)
    assert ratios == {f"per op: {c}": 2 / (i + 1) for i, c in enumerate(bench_overhead.OPS)}
    assert "a + b (no grad)" in capsys.readouterr().out


# ---- the per-op cases ---------------------------------------------------------------------------


def test_the_small_graphs_gradients_match_finite_differences():
    a, b = (m.astype(np.float64) for m in bench_overhead.operands())

    def loss(a, b):
        return float(((a @ b).sum(axis=1)[:, None] * a).sum())

    want_a, want_b = bench_overhead.graph_gradients(a, b)
    eps = 1e-6
    for x, want, f in ((a, want_a, lambda x: loss(x, b)), (b, want_b, lambda x: loss(a, x))):
        for i, j in ((0, 0), (3, 5), (7, 2)):
            step = np.zeros_like(x)
            step[i, j] = eps
            assert abs((f(x + step) - f(x - step)) / (2 * eps) - want[i, j]) < 1e-5


def test_wrong_gradients_are_caught():
    a_grad, b_grad = bench_overhead.graph_gradients(*bench_overhead.operands())
    bench_overhead.check_gradients(a_grad, b_grad, "ok")
    with pytest.raises(AssertionError, match="graph: d/db"):
        bench_overhead.check_gradients(a_grad, b_grad.T, "graph")


@needs_cpu
def test_needles_per_op_cases_compute_what_they_say():
    ops = bench_overhead.needle_ops()  # checks values and both backwards' gradients
    assert list(ops) == list(bench_overhead.OPS)


def test_torchs_per_op_cases_compute_what_they_say():
    pytest.importorskip("torch")
    assert list(bench_overhead.torch_ops()) == list(bench_overhead.OPS)


def test_per_op_timing_names_an_unknown_library():
    with pytest.raises(ValueError, match="library must be 'needle' or 'torch', got 'jax'"):
        bench_overhead.time_ops_here("jax", 1)


def test_per_op_timing_names_an_unknown_clock():
    with pytest.raises(ValueError, match="clock must be one of wall, cpu, got 'tsc'"):
        bench_overhead.time_ops_here("needle", 1, "tsc")


def test_cpu_clock_counts_cpu_time_not_waiting(monkeypatch):
    """A call that sleeps 2 ms costs almost no CPU time; one that spins 2 ms costs about 2 ms."""
    import time

    def spin():
        end = time.perf_counter() + 2e-3
        while time.perf_counter() < end:
            pass

    monkeypatch.setattr(bench_overhead, "CPU_BLOCK", 20)
    slept = bench_overhead.cpu_seconds_per_call(lambda: time.sleep(2e-3), 3)
    spun = bench_overhead.cpu_seconds_per_call(spin, 3)
    assert slept < 0.5e-3 and 1e-3 < spun < 10e-3


@needs_cpu
def test_needles_per_op_child_runs_with_the_cpu_clock():
    t = common.time_libraries_in_children(
        "benchmarks.bench_overhead:time_ops_here",
        1,
        "cpu",
        what="per-op overhead",
        libraries=("needle",),
        runs=1,
    )
    assert list(t["needle"]) == list(bench_overhead.OPS)
    assert all(0 < s < 0.01 for s in t["needle"].values())


@needs_cpu
def test_needles_per_op_child_runs_without_pytorch():
    t = common.time_libraries_in_children(
        "benchmarks.bench_overhead:time_ops_here",
        1,
        what="per-op overhead",
        libraries=("needle",),
        runs=1,
    )
    assert list(t["needle"]) == list(bench_overhead.OPS)
    assert all(0 < s < 0.01 for s in t["needle"].values())
