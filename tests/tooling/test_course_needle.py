"""Student mode on a course-style needle (``course_needle.py``): the fixture behaves as the
course's reference where this project differs, and every lecture cell not marked
``# companion-only:`` runs on it.

The probes check each course behaviour against hand-derived values and show that this project's
own needle answers differently (so each probe can fail). The notebook test executes a notebook
with ``NEEDLE_IMPL`` at the fixture, through the lecture report's grading. Measured on 2 cores
at load 1.1-1.4: all 13 in 233 s, of which 09 took 127 s and 11 44 s; so those two are marked
slow (``NEEDLE_SLOW=1``; ``.ci/run`` runs them) and the other eleven, about 60 s, run in
``make test``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest
from course_needle import PACKAGE, import_through_homework_root, make_course_needle

from companion import report_card

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: The two that train for minutes (see the module docstring): NEEDLE_SLOW=1 only.
SLOW = {"09_transformers", "11_generative_adversarial_networks"}


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """``hw4/python`` holding the course-style needle, importing ``randb`` through the
    homework root as a real student's hw2 did."""
    python = make_course_needle(tmp_path_factory.mktemp("course") / "hw4" / "python")
    import_through_homework_root(python)
    return python


@pytest.fixture(scope="module")
def companion_copy(tmp_path_factory) -> Path:
    """``hw4/python`` holding an unpatched copy of this project's needle."""
    python = tmp_path_factory.mktemp("companion") / "hw4" / "python"
    shutil.copytree(PACKAGE, python / "needle", ignore=shutil.ignore_patterns("__pycache__"))
    return python


def run(code: str, impl: Path) -> subprocess.CompletedProcess:
    """``python -c code`` with NEEDLE_IMPL=impl."""
    env = {k: v for k, v in os.environ.items() if k not in ("NEEDLE_IMPL", "PYTHONPATH")}
    env["NEEDLE_IMPL"] = str(impl)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# Each probe prints one JSON value: what the course's needle gives is in COURSE.
PROBES = """
import json
import numpy as np
import needle as ndl

def f32(values):
    return ndl.Tensor(np.array(values, dtype="float32"))

def outcome(fn):
    try:
        return fn()
    except Exception as exc:
        return type(exc).__name__

out = {}
w = f32([1.0, 2.0, 3.0])
def set_short():
    w.data = f32([1.0, 2.0])
    return list(w.shape)
out["setter"] = outcome(set_short)

p = ndl.nn.Parameter(f32([1.0, -2.0, 3.0]))
alias = p.data
(p * p).sum().backward()
ndl.optim.SGD([p], lr=0.1).step()
out["alias"] = [alias.numpy().tolist(), p.numpy().tolist()]

x = f32([1.0, 2.0])
h = x * x
h.sum().backward()
out["interior_grad"] = None if h.grad is None else h.grad.numpy().tolist()

b = f32([1.0, 2.0, 3.0])
seed = f32([4.0, 5.0, 6.0])
ndl.broadcast_to(b, (3,)).backward(seed)
out["broadcast_new_node"] = [b.grad is not seed, b.grad.numpy().tolist()]
s = f32([[1.0, 2.0]])
ndl.summation(s, axes=(0,)).backward(f32([7.0, 8.0]))
out["summation_grad"] = s.grad.numpy().tolist()

out["retain_grad"] = hasattr(x, "retain_grad")
out["no_grad"] = hasattr(ndl, "no_grad")
out["backward_keyword"] = outcome(lambda: (x * x).sum().backward(create_graph=False))
out["loader_keyword"] = outcome(
    lambda: ndl.data.DataLoader(ndl.data.Dataset(), 1, False, device=ndl.cpu())
)
out["broadcasting_add"] = outcome(lambda: (f32([[1.0, 2.0]]) + f32([[1.0], [2.0]])).shape)

q = ndl.nn.Parameter(f32([0.5, -1.0]))
adam = ndl.optim.Adam([q], lr=0.1, weight_decay=0.01)
for _ in range(2):
    adam.reset_grad()
    (q * q * q).sum().backward()
    adam.step()
out["adam"] = q.numpy().tolist()
out["overwrite"] = [(q * q).sum().backward() or q.grad.numpy().tolist(),
                    (q * q).sum().backward() or q.grad.numpy().tolist()]
out["clip_returns"] = outcome(lambda: adam.clip_grad_norm(0.1))
print(json.dumps(out))
"""


def adam_oracle() -> list[float]:
    """Two course Adam steps (g = grad + wd·θ, bias-corrected moments) on sum(q³), numpy."""
    q = np.array([0.5, -1.0])
    m = v = np.zeros(2)
    for t in (1, 2):
        g = 3 * q**2 + 0.01 * q
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g**2
        q = q - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return q.tolist()


COURSE = {
    "setter": [2],  # no shape check: the array is replaced
    "alias": [[1.0, -2.0, 3.0], [0.8, -1.6, 2.4]],  # p.data = ...: the alias keeps the old array
    "interior_grad": [1.0, 1.0],  # every node keeps its adjoint
    "broadcast_new_node": [True, [4.0, 5.0, 6.0]],
    "summation_grad": [[7.0, 8.0]],
    "retain_grad": False,
    "no_grad": False,
    "backward_keyword": "TypeError",
    "loader_keyword": "TypeError",
    "broadcasting_add": "AssertionError",
    "clip_returns": None,
}


def probe(python: Path) -> dict:
    done = run(PROBES, python)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_fixture_behaves_as_the_course(course):
    out = probe(course)
    adam, overwrite = out.pop("adam"), out.pop("overwrite")
    alias, param = out.pop("alias")
    assert alias == pytest.approx(COURSE["alias"][0]) and param == pytest.approx(COURSE["alias"][1])
    assert {k: v for k, v in out.items()} == {k: v for k, v in COURSE.items() if k != "alias"}
    assert adam == pytest.approx(adam_oracle(), rel=1e-5)
    q = np.array(adam)
    assert overwrite[0] == overwrite[1] == pytest.approx((2 * q).tolist(), rel=1e-6)


#: The probes where this project's needle differs from the course's (it already agrees on the
#: alias, since its optimizers give a parameter a new array, and on the summation values).
DIFFERS = sorted(set(COURSE) - {"alias", "summation_grad"})


def test_the_probes_tell_the_fixture_from_this_projects_needle(companion_copy):
    """The probes can fail: this project's needle answers these differently."""
    out = probe(companion_copy)
    assert [key for key in DIFFERS if out[key] == COURSE[key]] == []
    assert out["broadcast_new_node"][0] is False  # its identity broadcast returns the seed


# ---- the lecture notebooks on the course-style needle ----------------------------------------
def marked_cells(notebook: Path) -> int:
    source = notebook.with_suffix(".py").read_text() if notebook.with_suffix(".py").exists() else ""
    if source:
        return len(re.findall(r"^# %%.*\n# companion-only: ", source, flags=re.M))
    nb = nbformat.read(notebook, as_version=4)
    return sum(1 for c in nb.cells if c.cell_type == "code" and c.source.startswith("# companion-"))


def run_on(python: Path, notebook: Path, monkeypatch) -> tuple[report_card.Card, str]:
    """The report card of ``notebook`` executed on ``python``'s needle, and its stream text."""
    monkeypatch.setenv("NEEDLE_IMPL", str(python))
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb, note = report_card.execute(notebook, timeout=600)
    card = report_card.grade(nb, notebook.stem)
    card.note = note
    streams = [o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name")]
    return card, "".join(streams)


def check(card: report_card.Card, text: str, python: Path, notebook: Path) -> None:
    """Every cell ran; the marked ones were skipped; none failed."""
    assert f"needle from {python} (NEEDLE_IMPL)" in text
    assert card.not_run == 0, card.note
    assert card.skipped == marked_cells(notebook)
    failed = {f["cell"]: f"{f['where']}: {f['error']}" for f in card.failures}
    assert not failed, f"{notebook.stem}: cells failing on the course's needle {failed}"


@pytest.mark.parametrize(
    "notebook",
    [
        pytest.param(nb, id=nb.stem, marks=pytest.mark.slow if nb.stem in SLOW else ())
        for nb in NOTEBOOKS
    ],
)
def test_the_lecture_runs_on_the_course_needle(course, notebook, monkeypatch):
    check(*run_on(course, notebook, monkeypatch), course, notebook)


PLANTED = [
    "import needle as ndl\nfrom companion import lecture\nlecture.setup()",
    "x = ndl.Tensor([1.0, 2.0])\nh = x * x\nh.retain_grad()\nh.sum().backward()",
    "# companion-only: retain_grad\nh.retain_grad()",
]


def test_a_course_incompatible_cell_is_caught(course, tmp_path, monkeypatch):
    """A cell using retain_grad that is not marked companion-only fails on the fixture (and the
    same line, marked, is skipped); on this project's needle it passes."""
    notebook = tmp_path / "planted.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in PLANTED])
    nbformat.write(nb, notebook)
    card, text = run_on(course, notebook, monkeypatch)
    assert (card.passed, card.failed, card.skipped) == (1, 1, 1)
    assert card.failures[0]["where"] == "line 3 `h.retain_grad()`"
    assert card.failures[0]["error"].startswith("AttributeError: ")
    with pytest.raises(AssertionError, match="cells failing on the course's needle"):
        check(card, text, course, notebook)
    monkeypatch.delenv("NEEDLE_IMPL")
    mine = report_card.run_notebook(notebook, timeout=120)
    assert (mine.passed, mine.failed) == (3, 0)
