"""The checker's judge: every pass is decided here, from values, never from the worker's claim.

The worker runs the student's code and sends, for each question it passed, the values each
comparison compared (``diagnose.record``: a label, the student's value as float64 bytes with
its shape). Nothing it sends is believed: the expected values and tolerances come from a
*reference run*, the same checks run on this project's own needle and apps
(``reference_folder``) in a worker that never imports the student's code, and the comparison
is made here, in the runner's process. A question passes only if the student's worker sent a
well-formed value for every comparison the reference run made, and each value matches the
reference's expected value within the reference's tolerance.

So patching numpy, ``numpy.testing`` or the checker's own functions inside the worker, and
writing forged result lines into the worker's pipe, cannot make a wrong answer pass: the
expected values are not computed there. What the worker still does is compute its own copy
of the expected values for the diagnosis of a failure (the hints, the named mistakes), beside
the student's code: code written to read those values out of the worker's memory (its stack
frames) and hand them back as its answers is the one attack this does not stop.
"""

from __future__ import annotations

import base64
import math
import re
import tempfile
from pathlib import Path

import numpy as np

from .diagnose import mismatch, show

# The apps a homework imports (``from mlp_resnet import ...``), provided to the reference run
# by this project's versions; hw0's C++ question by the numpy function it must agree with.
_APPS = ("simple_ml", "mlp_resnet", "models")
_HW0_EXT = (
    "from companion.apps.simple_ml import softmax_regression_epoch as "
    "softmax_regression_epoch_cpp\n"
)
_DEVICE = re.compile(r"^on [^:]{1,80}: ")  # "on cpu(): ..." -- the same check on each device
_MAX_DIMS = 32

# (hw, question id) -> the reference run's comparisons, or why it has none; kept for the
# process's lifetime (the checks and this project's needle do not change under it)
_REFERENCE: dict[tuple[str, str], list[dict] | str] = {}


class Malformed(ValueError):
    """Something the worker sent is not a well-formed value."""


def reference_folder(tmp: Path, hw: str) -> Path:
    """A homework folder in the course's layout whose every part is this project's: no
    ``python/`` (so ``import needle`` is this project's needle), apps and hw0's ``src/`` that
    re-export ``companion.apps``."""
    root = tmp / hw
    if hw == "hw0":
        (root / "src").mkdir(parents=True)
        (root / "src" / "simple_ml.py").write_text("from companion.apps.simple_ml import *\n")
        (root / "src" / "simple_ml_ext.py").write_text(_HW0_EXT)
        return root
    (root / "apps").mkdir(parents=True)
    for app in _APPS:
        (root / "apps" / f"{app}.py").write_text(f"from companion.apps.{app} import *\n")
    return root


def references(hw: str, ids: list[str], timeout: float) -> dict[str, list[dict] | str]:
    """The reference run's comparisons for each question in ``ids`` (a string saying what went
    wrong where the reference itself did not pass), computed once per process."""
    from .questions import BY_ID
    from .runner import run_questions

    missing = [q for q in ids if (hw, q) not in _REFERENCE]
    if missing:
        with tempfile.TemporaryDirectory(prefix="companion-judge-") as tmp:
            root = reference_folder(Path(tmp), hw)
            results, _ = run_questions(
                root, hw, [BY_ID[q] for q in missing], timeout=timeout, reference=True
            )
        for r in results:
            _REFERENCE[(hw, r.question.id)] = (
                r.claims if r.status == "pass" else f"{r.status}: {r.detail}"
            )
    return {q: _REFERENCE[(hw, q)] for q in ids}


def decode(value: object) -> np.ndarray:
    """A value as the worker sent it (``{"shape": [...], "data": base64 of float64}``) as an
    array; anything else raises ``Malformed``. Plain data only: nothing here can run code."""
    if not isinstance(value, dict) or set(value) != {"shape", "data"}:
        raise Malformed("a value is not {shape, data}")
    shape, data = value["shape"], value["data"]
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_DIMS
        or not all(type(n) is int and n >= 0 for n in shape)
    ):
        raise Malformed(f"a shape is not a list of sizes: {str(shape)[:80]}")
    if not isinstance(data, str):
        raise Malformed("a value's data is not a string")
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise Malformed(f"a value's data is not base64 ({exc})") from None
    if len(raw) != 8 * math.prod(shape):
        raise Malformed(f"a value holds {len(raw)} bytes, not 8 per element of shape {shape}")
    return np.frombuffer(raw, dtype=np.float64).reshape(shape)


def _split(what: str) -> tuple[str, str]:
    """(device prefix or "", the comparison's label without it)."""
    m = _DEVICE.match(what)
    return (m.group(0), what[m.end() :]) if m else ("", what)


def _expected_by_label(reference: list[dict]) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """The reference's comparisons by label (on its first device only: the expected values
    are numpy's, the same on every device), and the device prefix each label had."""
    by_label: dict[str, list[dict]] = {}
    device: dict[str, str] = {}
    for c in reference:
        dev, label = _split(c["what"])
        device.setdefault(label, dev)
        if device[label] == dev:
            by_label.setdefault(label, []).append(c)
    return by_label, device


def _group(claims: object) -> dict[tuple[str, str], list[dict]]:
    """The worker's values by (device, label), checked to be a list of labelled records."""
    if not isinstance(claims, list):
        raise Malformed("the record of values is not a list")
    groups: dict[tuple[str, str], list[dict]] = {}
    for c in claims:
        if not isinstance(c, dict) or not isinstance(c.get("what"), str):
            raise Malformed("a record has no label")
        groups.setdefault(_split(c["what"]), []).append(c)
    return groups


def _lacking(groups: dict, device: dict[str, str]) -> list[str]:
    """Labels the reference compared that the worker sent no value for (on each device the
    worker used, for the per-device ones)."""
    sent_plain = {label for dev, label in groups if dev == ""}
    lacking = [label for label, dev in device.items() if dev == "" and label not in sent_plain]
    per_device = [label for label, dev in device.items() if dev != ""]
    devices = {dev for dev, _ in groups if dev} or ({"?"} if per_device else set())
    for d in sorted(devices):
        lacking += [label for label in per_device if (d, label) not in groups]
    return lacking


def judge(claims: object, reference: list[dict]) -> str | None:
    """None when the worker's values (``claims``) answer every comparison of the reference run
    correctly; otherwise what is wrong, for the report."""
    by_label, device = _expected_by_label(reference)
    groups = _group(claims)
    if not groups:
        return "your process sent no values for this question's comparisons"
    for (dev, label), sent in groups.items():
        refs = by_label.get(label)
        if refs is None:
            return (
                f"your process sent a value for {dev + label!r}, which this question does "
                "not compare"
            )
        if len(sent) != len(refs):
            return (
                f"your process sent {len(sent)} value(s) for {dev + label!r}; this question "
                f"compares {len(refs)}"
            )
        for c, r in zip(sent, refs):
            problem = _compare(dev + label, c, r)
            if problem is not None:
                return problem
    lacking = _lacking(groups, device)
    if lacking:
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        return f"your process sent no value for {lacking[0]!r}{more}, which this question compares"
    return None


def _compare(what: str, claim: dict, ref: dict) -> str | None:
    """One value against the reference's expected value, with the reference's tolerance."""
    got, expected = decode(claim.get("got")), decode(ref["expected"])
    problem = mismatch(got, expected, rtol=ref["rtol"], atol=ref["atol"])
    if problem is None:
        return None
    try:  # what the worker computed beside the student's code, for the explanation only
        beside = decode(claim.get("expected"))
        same = mismatch(beside, expected, rtol=ref["rtol"], atol=ref["atol"]) is None
    except Malformed:
        same = False
    why = (
        "so your code changes how numpy or the checker compares"
        if same
        else "and the expected value computed beside your code differs from the judge's: your "
        "code changes numpy or the checker's functions, or this value depends on your earlier "
        "answers (parameters that are not the course's seeded initialisation, say: the "
        "course's tests compare with fixed numbers too)"
    )
    return (
        f"{what} is wrong (judged outside your process, against expected values computed "
        f"where your code never runs; inside your process it looked right, {why}).\n"
        f"  expected: {show(expected)}\n  got:      {show(got)}\n  " + problem.replace("\n", "\n  ")
    )
