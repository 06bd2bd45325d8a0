"""`make profile`'s tables: the before -> now comparison names each case's calls, kernel and
overhead milliseconds from the two profiles, and the saved profile it compares with loads."""

from __future__ import annotations

from companion import step_profile


def _case(calls: int, kernel: float, overhead: float) -> dict:
    return {"kernel_calls": calls, "kernel_ms": kernel, "overhead_ms": overhead}


def test_render_change_puts_before_beside_now():
    before = {"resnet9": _case(994, 24.19, 17.91), "lstm_lm": _case(4130, 43.2, 70.8)}
    now = {"resnet9": _case(201, 2.6, 3.1), "mlp_resnet": _case(180, 0.7, 1.5)}
    lines = step_profile.render_change(before, now).splitlines()
    assert lines[0].split() == ["case", "calls", "kernel", "ms", "overhead", "ms"]
    rows = [line.split() for line in lines[2:]]
    # only cases in both profiles; each figure as "before -> now"
    assert rows == [["resnet9", "994", "->", "201", "24.19", "->", "2.60", "17.91", "->", "3.10"]]


def test_the_saved_profile_has_every_case():
    saved = step_profile.before()
    assert set(saved["cases"]) == set(step_profile.CASES)
    for case in saved["cases"].values():
        assert case["kernel_calls"] > 0 and case["kernel_ms"] > 0 and case["overhead_ms"] > 0
