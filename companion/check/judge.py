"""The checker's judge: every verdict on a value is reached here, never in the student's process.

The worker beside the student's code is *blind*: its checks pass every expected value as a
function it never calls (``diagnose``'s blind mode), so it computes no expected value, no
finite difference and no known wrong answer, and sends, for each question, only the values
the student's code produced (a label and float64 bytes with their shape), in order. The
expected values, tolerances and what a diagnosis needs (hint, the inputs shown, the known
wrong answers' values by name) come from a *reference run*: the same checks on this project's
own needle and apps (``reference_folder``) in a worker that never imports the student's code.
The comparison and the diagnosis are made here, in the runner's process, with the same
functions a check uses in-process (``explain_close``, ``explain_adjoints``).

A question passes only if the student's worker sent a well-formed value for every comparison
the reference run made, and each matches the reference's expected value within the
reference's tolerance. A blind worker goes on after a wrong value (it cannot notice one); when
it then fails or raises, the values it sent so far are judged too, and the first wrong one is
the cause reported. Robustness comparisons (``warn``) give a warning beside a pass.

So patching numpy, ``numpy.testing`` or the checker's functions inside the worker, writing
forged result lines into its pipe, or reading the checker's stack frames, records or memory
cannot make a wrong answer pass: no expected value exists in that process. What stays
possible is for student code to *compute* the answer with the checker's own numpy reference
functions (they are importable there, as numpy is); that is writing the answer, not reading
the checker's.
"""

from __future__ import annotations

import base64
import math
import re
import tempfile
from pathlib import Path

import numpy as np

from .diagnose import explain_adjoints, explain_close, mismatch
from .mistakes import unpack

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


def _labelled(claims: object) -> list[tuple[str, str, dict]]:
    """The worker's values in the order sent, as (device, label, record); each checked to be
    a labelled record."""
    if not isinstance(claims, list):
        raise Malformed("the record of values is not a list")
    out = []
    for c in claims:
        if not isinstance(c, dict) or not isinstance(c.get("what"), str):
            raise Malformed("a record has no label")
        out.append((*_split(c["what"]), c))
    return out


def _lacking(sent: dict[tuple[str, str], int], by_label: dict, device: dict[str, str]) -> list:
    """Labels the reference compared that the worker sent fewer values for (on each device the
    worker used, for the per-device ones); robustness (warning) comparisons are not due."""
    due = {label: sum(1 for r in refs if not r.get("warn")) for label, refs in by_label.items()}
    devices = {dev for dev, _ in sent if dev} or {"?"}
    lacking = []
    for label, n in due.items():
        for dev in sorted(devices) if device[label] else [""]:
            if n and sent.get((dev, label), 0) < n:
                lacking.append(label)
    return lacking


def judge(
    claims: object, reference: list[dict], *, complete: bool = True
) -> tuple[str | None, list[str]]:
    """(None, warnings) when the worker's values (``claims``) answer every comparison of the
    reference run correctly, else (the diagnosis of the first wrong one, []). With
    ``complete`` False (the worker stopped at a failure of its own) only the values it sent
    are judged: a wrong one among them is the cause, and None means there is none."""
    by_label, device = _expected_by_label(reference)
    labelled = _labelled(claims)
    if complete and not labelled:
        return "your process sent no values for this question's comparisons", []
    pairs, sent = _paired(labelled, by_label)
    warnings: list[str] = []
    for i, (dev, label, claim, ref) in enumerate(pairs):
        if isinstance(ref, str):
            return ref, []
        problem = _compare(dev + label, claim, ref, pairs[i:])
        if problem is not None and ref.get("warn"):
            warnings.append(f"{ref['warn']}:\n  " + problem.replace("\n", "\n  "))
        elif problem is not None:
            return problem, []
    lacking = _lacking(sent, by_label, device) if complete else []
    if lacking:
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        return (
            f"your process sent no value for {lacking[0]!r}{more}, which this question compares"
        ), []
    return None, warnings[:1]


def _paired(labelled: list, by_label: dict) -> tuple[list, dict]:
    """Each value sent with the reference comparison it answers (the k-th value sent for a
    label answers the reference's k-th comparison of that label), or why none; and how many
    values were sent per (device, label)."""
    sent: dict[tuple[str, str], int] = {}
    pairs: list = []
    for dev, label, claim in labelled:
        refs = by_label.get(label)
        k = sent[(dev, label)] = sent.get((dev, label), 0) + 1
        if refs is None:
            ref: dict | str = (
                f"your process sent a value for {dev + label!r}, which this question does "
                "not compare"
            )
        elif k > len(refs):
            ref = f"your process sent {k} value(s) for {dev + label!r}; this question compares "
            ref += str(len(refs))
        else:
            ref = refs[k - 1]
        pairs.append((dev, label, claim, ref))
    return pairs, sent


def _got(what: str, claim: dict) -> np.ndarray | str:
    """The student's value, or why there is none (not numbers)."""
    if "expected" in claim:
        return (
            f"your process sent an expected value for {what!r}: the checker beside your code "
            "never computes one (your code switched its mode, or wrote this record)"
        )
    if claim.get("got") is None:
        return f"{what} is wrong: your value is not an array of numbers"
    return decode(claim["got"])


def _compare(what: str, claim: dict, ref: dict, rest: list) -> str | None:
    """One value against the reference's expected value, with the reference's tolerance; the
    diagnosis as the check itself would write it (an op's wrong adjoints together)."""
    got = _got(what, claim)
    if isinstance(got, str):
        return got
    expected = decode(ref["expected"])
    if mismatch(got, expected, rtol=ref["rtol"], atol=ref["atol"]) is None:
        return None
    if "group" in ref:
        return _adjoints(ref, rest)
    return explain_close(
        what,
        got,
        expected,
        rtol=ref["rtol"],
        atol=ref["atol"],
        inputs_text=str(ref.get("inputs", "")),
        hint=str(ref.get("hint", "")),
        variants=_variants(ref),
    )


def _variants(ref: dict) -> list:
    """The known wrong answers the reference run recorded for this comparison."""
    found = []
    for v in ref.get("variants", []):
        if isinstance(v, dict):
            found.append(unpack(v, decode(v.get("value"))))
    return found


def _adjoints(first: dict, rest: list) -> str | None:
    """The diagnosis of one op's adjoints (``first``'s group): every wrong one among the
    values sent from ``first`` on for the same call, named and shown beside its finite
    difference."""
    names: set = set()
    wrong = []
    for _dev, label, claim, ref in rest:
        if not isinstance(ref, dict) or ref.get("group") != first["group"] or ref["name"] in names:
            break
        names.add(ref["name"])
        got = _got(label, claim)
        if isinstance(got, str):
            break
        fd = decode(ref["expected"])
        problem = mismatch(got, fd, rtol=ref["rtol"], atol=ref["atol"])
        if problem is not None:
            wrong.append((ref["name"], got, fd, problem, _variants(ref), ref["atol"]))
    return explain_adjoints(first["group"], wrong, str(first.get("inputs", "")), first["rtol"])
