"""Inline math that wraps onto a line starting with a Markdown block marker is never typeset.

A wrapped ``$a \\cdot (b`` / ``+ c)$`` reads as a list item (``+ c)$``) to Markdown, which splits
the formula in two and leaves raw TeX on the page (the website's browser test sees it; this
check sees it without a browser).
"""

from __future__ import annotations

import re

import pytest
from notebook_json import NOTEBOOKS, load_cells

# A line Markdown reads as the start of a new block: list item, heading, quote, numbered item.
BLOCK_START = re.compile(r"^\s*([-+*]\s|#{1,6}\s|>|\d+[.)]\s)")


def _unbalanced_dollars(line: str) -> bool:
    """Whether ``line`` leaves inline math open (an odd number of unescaped single ``$``)."""
    singles = re.sub(r"\\\$|\$\$", "", line)
    return singles.count("$") % 2 == 1


def math_split_by_block_markers(markdown: str) -> list[str]:
    """The lines that start a Markdown block while inline math from the line before is open."""
    found, open_math, in_fence = [], False, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if open_math and BLOCK_START.match(line):
            found.append(line)
        if _unbalanced_dollars(line):
            open_math = not open_math
        if not line.strip():
            open_math = False
    return found


def test_the_check_finds_a_formula_wrapped_onto_a_list_marker():
    assert math_split_by_block_markers("step $\\hat m / (\\sqrt{v}\n+ \\epsilon)$: so") == [
        "+ \\epsilon)$: so"
    ]
    assert math_split_by_block_markers("step $\\hat m / (\\sqrt{v}\n\\epsilon)$:\n- item") == []
    assert math_split_by_block_markers("costs \\$5 and\n- item $x$") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_inline_math_is_split_by_a_block_marker(path):
    split = [
        line
        for cell in load_cells(path)
        if cell["cell_type"] == "markdown"
        for line in math_split_by_block_markers(cell["source"])
    ]
    assert not split, f"{path.name}: inline math wraps onto a line that starts a block: {split}"
