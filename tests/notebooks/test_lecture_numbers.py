"""The notebooks name the course's lectures by one numbering: the public 2022 recordings.

Each header's Lecture field names lectures as ``N, "Title"`` (a number, a comma, the title in
double quotes); a lecture whose number differs in the current schedule adds ``(lecture M in the
current schedule)``. No other number may appear (no ranges such as ``23-24``). Across all
notebooks one number means one title, and each title matches the 2022 schedule below.
"""

import re

import pytest
from test_notebook_headers import SOURCES, first_markdown_cell

# The 2022 online course (10-414/714, Deep Learning Systems), lecture number -> title.
# Lecture 22 is not listed: no notebook covers it.
SCHEDULE_2022 = {
    1: "Introduction and Logistics",
    2: "ML Refresher / Softmax Regression",
    3: "'Manual' Neural Networks",
    4: "Automatic Differentiation",
    5: "Automatic Differentiation Implementation",
    6: "Fully Connected Networks, Optimization, Initialization",
    7: "Neural Network Library Abstractions",
    8: "NN Library Implementation",
    9: "Normalization and Regularization",
    10: "Convolutional Networks",
    11: "Hardware Acceleration",
    12: "GPU Acceleration",
    13: "Hardware Acceleration Implementation",
    14: "Implementing Convolutions",
    15: "Training Large Models",
    16: "Generative Adversarial Networks",
    17: "Generative Adversarial Networks Implementation",
    18: "Sequence Modeling and Recurrent Networks",
    19: "RNN Implementation",
    20: "Transformers and Attention",
    21: "Transformer Implementation",
    23: "Model Deployment",
    24: "Machine Learning Compilation and Deployment Implementation",
}
REFERENCE = re.compile(r'(\d+), "([^"]+)"')
CURRENT = re.compile(r"\(lecture \d+ in the current schedule[);]")
# A lecture number in another form: "lecture 19" (no title), a bare "19," or "19 and"; a range.
STRAY = re.compile(
    r"\blectures?\s+\d+|(?:^|[\s(])\d+(?=[,;)]|\s+and\b|\s*$)", re.IGNORECASE | re.MULTILINE
)
RANGE = re.compile(r"\d+\s*[-–]\s*\d+")


def lecture_field(text: str) -> str:
    """The header's Lecture field, its continuation lines joined with spaces."""
    lines, inside = [], False
    for line in first_markdown_cell(text):
        line = line.strip()
        if line.startswith("**Lecture:**"):
            inside, line = True, line[len("**Lecture:**") :]
        elif inside and (not line or line.startswith("**")):
            break
        if inside:
            lines.append(line)
    return " ".join(lines).strip()


def lecture_references(field: str) -> list[tuple[int, str]]:
    """The (number, title) pairs a Lecture field names; ValueError for a number in another form."""
    references = [(int(n), " ".join(title.split())) for n, title in REFERENCE.findall(field)]
    rest = CURRENT.sub("", REFERENCE.sub("", field))
    stray = RANGE.findall(field) + [m.group().strip() for m in STRAY.finditer(rest)]
    if stray:
        raise ValueError(f'lecture numbers not written as N, "Title": {stray}')
    if not references:
        raise ValueError('names no lecture as N, "Title"')
    return references


def clashes(claims: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Numbers that two notebooks give different titles, and titles given two numbers."""
    titles: dict[int, dict[str, list[str]]] = {}
    numbers: dict[str, dict[int, list[str]]] = {}
    for notebook, references in claims.items():
        for number, title in references:
            titles.setdefault(number, {}).setdefault(title.lower(), []).append(notebook)
            numbers.setdefault(title.lower(), {}).setdefault(number, []).append(notebook)
    problems = [
        f"lecture {n} is {sorted(t)} in {sorted(sum(t.values(), []))}"
        for n, t in titles.items()
        if len(t) > 1
    ]
    problems += [
        f"{title!r} is lecture {sorted(n)} in {sorted(sum(n.values(), []))}"
        for title, n in numbers.items()
        if len(n) > 1
    ]
    return problems


def test_the_parser_reads_references_and_refuses_other_forms():
    field = (
        '8, "NN Library Implementation" (lecture 9 in the current schedule), with part of '
        'lecture 6, "Fully Connected Networks,\n Optimization, Initialization"'
    )
    assert lecture_references(field) == [
        (8, "NN Library Implementation"),
        (6, "Fully Connected Networks, Optimization, Initialization"),
    ]
    assert lecture_references('7, "Abstractions" (Caffe, TensorFlow 1.x)') == [(7, "Abstractions")]
    for bad in (
        '22, "Model Deployment", and 23-24, "ML Compilation"',
        "lecture 19 (GANs)",
        '19 and 20, "GANs"',
        "the GAN lecture",
    ):
        with pytest.raises(ValueError):
            lecture_references(bad)


def test_the_clash_finder_names_both_notebooks():
    assert clashes({"a": [(19, "RNN Implementation")], "b": [(19, "RNN Implementation")]}) == []
    found = clashes(
        {"08": [(19, "RNN Implementation")], "11": [(19, "Generative Adversarial Networks")]}
    )
    assert found == [
        "lecture 19 is ['generative adversarial networks', 'rnn implementation'] in ['08', '11']"
    ]
    assert clashes({"a": [(8, "X")], "b": [(9, "x")]}) == ["'x' is lecture [8, 9] in ['a', 'b']"]


def all_claims() -> dict[str, list[tuple[int, str]]]:
    return {
        py.stem: lecture_references(lecture_field(py.read_text(encoding="utf-8"))) for py in SOURCES
    }


def test_no_two_notebooks_claim_one_lecture_for_different_titles():
    assert clashes(all_claims()) == []


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_each_lecture_named_is_the_2022_lecture_of_that_number(py):
    for number, title in lecture_references(lecture_field(py.read_text(encoding="utf-8"))):
        assert number in SCHEDULE_2022, f"{py.name}: lecture {number} ({title!r}) is not known"
        assert title.lower() == SCHEDULE_2022[number].lower(), (
            f"{py.name}: lecture {number} is {SCHEDULE_2022[number]!r} in the 2022 course, "
            f"not {title!r}"
        )
