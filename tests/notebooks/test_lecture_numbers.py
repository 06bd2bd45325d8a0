"""The notebooks name the course's lectures by one numbering: the public 2022 recordings.

Each header's Lecture field names lectures as ``N, "Title"`` (a number, a comma, the title in
double quotes); a lecture whose number differs in the current schedule adds ``(lecture M in the
current schedule)``. No other number may appear (no ranges such as ``23-24``). Across all
notebooks one number means one title, and each title matches the 2022 schedule below.

In the prose (markdown cells and code comments), every "lecture N" uses the same numbering: N
is in the schedule, and the paragraph around it gives N's title or one of N's topic words
(TOPICS below), so "Lecture 12 reuses memory" fails where 12 is GPU Acceleration.
"""

import bisect
import io
import itertools
import re
import tokenize

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


# ---- "lecture N" in prose ----------------------------------------------------------------------
# Outside the header's Lecture field, a "lecture N" ("Lecture 12", "lectures 16 and 17",
# "lectures 23-24") in a markdown cell or a code comment uses the same 2022 numbering. Each N must
# be in SCHEDULE_2022, and the paragraph around it (markdown lines between blank lines; a run of
# comment lines) must say what lecture N is about: its title written as `lecture N, "Title"`
# (which must then be N's title), or one of N's topic words below (matched at a word start,
# case-insensitive). "lecture N in the current schedule" is the other numbering and is skipped.
# So "Lecture 12 reuses the memory of an activation" fails: 12 is GPU acceleration, and nothing
# in the paragraph is about GPUs.
TOPICS = {
    1: ("introduction", "logistics", "course overview"),
    2: ("softmax", "regression", "cross-entropy", "hypothesis class", "mnist", "gradient descent"),
    3: ("neural network", "layer", "two-layer", "multi-layer", "backprop", "backward pass",
        "forward pass", "nonlinear", "relu"),
    4: ("automatic differentiation", "autodiff", "adjoint", "reverse mode", "forward mode",
        "computational graph", "chain rule", "gradient"),
    5: ("automatic differentiation", "autodiff", "adjoint", "reverse mode", "computational graph",
        "topological", "gradient", "needle", "tensor"),
    6: ("fully connected", "mlp", "optimi", "sgd", "momentum", "adam", "initiali", "xavier",
        "kaiming", "learning rate"),
    7: ("abstraction", "module", "optimizer", "caffe", "tensorflow", "pytorch", "define and run",
        "define-and-run", "define, then run", "define-then-run", "imperative", "declarative",
        "computational graph", "dataloader", "data loader"),
    8: ("module", "parameter", "optimizer", "initiali", "dataloader", "data loader", "needle"),
    9: ("normali", "regulari", "dropout", "batchnorm", "batch norm", "layernorm", "layer norm",
        "weight decay"),
    10: ("convolution", "conv2d", "filter", "padding", "stride", "channel", "pooling", "receptive"),
    11: ("hardware", "accelerat", "vectori", "simd", "cache", "tiling", "tiled", "stride",
         "memory layout", "register", "blas", "ndarray", "parallel"),
    12: ("gpu", "cuda", "thread block", "threadidx", "warp", "shared memory", "simt",
         "kernel launch", "streaming multiprocessor"),
    13: ("ndarray", "stride", "compact", "backend", "kernel", "cuda", "cpu", "setitem",
         "broadcast"),
    14: ("convolution", "conv2d", "im2col", "stride", "nhwc", "nchw", "dilat", "padding", "flip"),
    15: ("memory", "checkpoint", "activation", "parallel", "pipeline", "all-reduce", "allreduce",
         "parameter server", "large model", "recomput"),
    16: ("gan", "generative", "adversar", "generator", "discriminator"),
    17: ("gan", "generative", "adversar", "generator", "discriminator"),
    18: ("sequence", "recurrent", "rnn", "lstm", "gru", "hidden state", "vanishing", "exploding",
         "truncated"),
    19: ("rnn", "lstm", "recurrent", "language model", "penn treebank", "ptb", "sequence",
         "truncated", "bptt"),
    20: ("transformer", "attention", "positional", "mask", "multi-head", "heads"),
    21: ("transformer", "attention", "positional", "mask", "multi-head", "heads"),
    23: ("deploy", "inference", "onnx", "runtime", "export", "quantiz", "edge device"),
    24: ("compil", "tvm", "schedule", "tensor program", "fusion", "fuse", "lowering", "codegen"),
}
PROSE_REFERENCE = re.compile(
    r"(?<![\w-])lectures?\s+(\d+(?:\s*(?:,|and|or|to|[-–])\s*\d+)*)"
    r"(?P<current>\s+in the current schedule)?(?:,\s*\"(?P<title>[^\"]+)\")?",
    re.IGNORECASE,
)


def comment_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line number, text) of the comments of a code cell (tokenize, so '#' in strings is not
    one; lines starting with '#' where the cell does not tokenize)."""
    source = "".join(text + "\n" for _, text in lines)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return [(n, t.strip()[1:]) for n, t in lines if t.strip().startswith("#")]
    return [
        (lines[tok.start[0] - 1][0], tok.string[1:])
        for tok in tokens
        if tok.type == tokenize.COMMENT
    ]


def prose_paragraphs(text: str) -> list[list[tuple[int, str]]]:
    """Each paragraph of the markdown cells and each run of comment lines in the code cells of a
    percent-format source, as (1-based line number, text) lines; the header's Lecture field left
    out (test_each_lecture_named_is_the_2022_lecture_of_that_number reads it)."""
    cells: list[tuple[bool, list[tuple[int, str]]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            cells.append(("[markdown]" in line, []))
        elif cells:
            cells[-1][1].append((number, line))
    paragraphs: list[list[tuple[int, str]]] = [[]]
    for markdown, lines in cells:
        if markdown:
            prose = [(n, t[2:] if t.startswith("# ") else t.lstrip("#")) for n, t in lines]
        else:
            prose = comment_lines(lines)
        last = None
        for n, line in prose:
            if not line.strip() or (last is not None and n != last + 1) or line.startswith("**"):
                paragraphs.append([])
            if line.strip():
                paragraphs[-1].append((n, line))
            last = n
        paragraphs.append([])
    return [p for p in paragraphs if p and not p[0][1].startswith("**Lecture:**")]


def lecture_numbers(listed: str) -> list[int]:
    """The numbers of "12", "16 and 17", "11, 12 or 13", "23-24" (a range: every number in it)."""
    numbers = []
    for part in re.split(r"\s*(?:,|and|or)\s*", listed):
        ends = [int(n) for n in re.split(r"\s*(?:to|[-–])\s*", part) if n]
        numbers += list(range(ends[0], ends[-1] + 1)) if ends else []
    return numbers


def prose_problems(text: str, name: str = "notebook") -> list[str]:
    """``name:line: ...`` for each "lecture N" in prose that is not a 2022 lecture, names another
    lecture's title, or sits in a paragraph naming none of N's topics."""
    problems = []
    for paragraph in prose_paragraphs(text):
        joined = "\n".join(line for _, line in paragraph)
        starts = list(itertools.accumulate(len(line) + 1 for _, line in paragraph))
        for match in PROSE_REFERENCE.finditer(joined):
            if match.group("current"):
                continue
            line = paragraph[bisect.bisect_right(starts, match.start())][0]
            for number in lecture_numbers(match.group(1)):
                problem = reference_problem(number, match.group("title"), joined)
                if problem:
                    problems.append(f"{name}:{line}: {match.group().strip()!r}: {problem}")
    return problems


def reference_problem(number: int, title: str | None, paragraph: str) -> str | None:
    """What is wrong with a reference to lecture ``number`` (with ``title`` if written) in
    ``paragraph``, or None."""
    if number not in SCHEDULE_2022:
        return f"lecture {number} is not in the 2022 schedule"
    expected = SCHEDULE_2022[number]
    if title is not None:
        if " ".join(title.split()).lower() != expected.lower():
            return f"lecture {number} is {expected!r} in the 2022 numbering, not {title!r}"
        return None
    lowered = paragraph.lower()
    if any(re.search(r"(?<!\w)" + re.escape(word), lowered) for word in TOPICS[number]):
        return None
    return (
        f"lecture {number} is {expected!r} in the 2022 numbering, and its paragraph names none "
        f"of its topics {list(TOPICS[number])}"
    )


PROSE = """# %% [markdown]
# # 99 · Example
#
# **Lecture:** 15, "Training Large Models" (lecture 16 in the current schedule)
#
# **The memory plan.** Lecture 15 reuses the memory of an activation once nothing reads it
# (lecture 16 in the current schedule).

# %%
x = 1  # as lecture 7, "Neural Network Library Abstractions" says
print("lecture 99 in a string is not prose")
"""


def test_prose_references_that_fit_pass():
    assert prose_problems(PROSE) == []
    assert lecture_numbers("16 and 17") == [16, 17] and lecture_numbers("23-24") == [23, 24]
    assert lecture_numbers("11, 12 or 13") == [11, 12, 13]


@pytest.mark.parametrize(
    "old, new, problems",
    [
        ("Lecture 15 reuses", "Lecture 12 reuses", ["lecture 12 is 'GPU Acceleration'"]),
        ("Lecture 15 reuses", "Lectures 15 and 22 reuse", ["lecture 22 is not in the 2022"]),
        ("Lecture 15 reuses", "Lectures 14-16 reuse", ["lecture 14 is", "lecture 16 is"]),
        ('lecture 7, "Neural', 'lecture 8, "Neural', ["lecture 8 is 'NN Library Implementation'"]),
        ("x = 1  # as", "x = 1  # lecture 20 said this, as", ["lecture 20 is 'Transformers"]),
    ],
)
def test_a_planted_wrong_reference_is_named(old, new, problems):
    planted = PROSE.replace(old, new)
    found = prose_problems(planted, "99_x.py")
    assert len(found) == len(problems), found
    for problem, text in zip(problems, found):
        name, line, rest = text.split(":", 2)
        assert name == "99_x.py" and problem in rest, text
        assert new.split()[-2] in planted.splitlines()[int(line) - 1]


@pytest.mark.parametrize("py", SOURCES, ids=[p.stem for p in SOURCES])
def test_lecture_numbers_in_prose_are_the_2022_lectures(py):
    problems = prose_problems(py.read_text(encoding="utf-8"), py.name)
    assert not problems, "\n".join(problems)
