"""``python -m companion <command>``: the student commands without make, with the make targets'
arguments (``NAME=value``), runnable from any folder (companion/__main__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]


def test_check_takes_the_make_targets_variables():
    args, env = cli.plan("check", ["HW=my hw/hw1", "Q=divide", "HWNUM=hw1", "ARGS=--timeout 30"])
    assert args == [
        "-m", "companion.check", "my hw/hw1", "-k", "divide", "--hw", "hw1", "--timeout", "30"
    ]  # fmt: skip
    assert env == {}
    # the folder as a plain argument and the checker's own options work too; blanks are unset
    assert cli.plan("check", ["Q=", "hw1", "--list"])[0] == [
        "-m",
        "companion.check",
        "hw1",
        "--list",
    ]


def test_progress_defaults_to_this_folder_and_reports_need_a_needle(tmp_path):
    assert cli.plan("progress", [])[0] == ["-m", "companion.check", "--progress", "."]
    assert cli.plan("progress", ["HW=~/dlsys"])[0][-1] == "~/dlsys"
    args, env = cli.plan("lecture-report", [f"NEEDLE_IMPL={tmp_path}/../x", "NB=n.ipynb"])
    assert args == ["-m", "companion.report_card", "n.ipynb"]
    assert env == {"NEEDLE_IMPL": str(tmp_path.parent / "x")}
    assert cli.plan("bench", [f"NEEDLE_IMPL={tmp_path}"])[0] == ["-m", "benchmarks.student"]
    assert cli.plan("bench", ["NEEDLE_IMPL="])[0] == ["-m", "benchmarks"]
    assert cli.plan("profile", [])[0] == ["-m", "companion.step_profile"]
    assert cli.plan("where", ["Q=hw2_sgd"])[0] == ["-m", "companion.where", "hw2_sgd"]
    assert cli.plan("where", [])[0] == ["-m", "companion.where"]


@pytest.mark.parametrize(
    "command, words, message",
    [
        ("check", [], "usage: python -m companion check HW="),
        ("lecture-report", ["NB=x"], "usage: python -m companion lecture-report NEEDLE_IMPL="),
        ("check", ["HW=x", "NB=y"], "unknown variable NB (it takes HW, Q, HWNUM, ARGS)"),
        ("train", [], "unknown command 'train'"),
    ],
)
def test_bad_commands_are_named(command, words, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
        cli.plan(command, words)


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "HW")}
    return subprocess.run(
        [sys.executable, "-m", "companion", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_runs_from_a_folder_outside_the_checkout(tmp_path):
    hw = tmp_path / "my hw" / "hw1"
    hw.mkdir(parents=True)
    done = _run(["check", f"HW={hw}", "Q=divide"], tmp_path)
    # the checker ran and got the path whole: it names the missing layout of that folder
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{hw / 'python' / 'needle' / '__init__.py'} is missing" in done.stderr
    done = _run(["--help"], tmp_path)
    assert done.returncode == 0 and "lecture-report" in done.stdout


def test_the_makefile_targets_call_it():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("check", "progress", "lecture-report", "bench", "profile"):
        assert f"$(PY) -m companion {target} " in makefile, target
