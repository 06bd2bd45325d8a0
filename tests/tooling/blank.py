"""Blank homework skeletons for the checker's tests: the course's layout with every function a
student writes left as the course leaves it (``raise NotImplementedError()`` or ``pass``).

``blank_function`` empties one function (found by its qualified name) in a source file, keeping
its signature and docstring, so a copy of this project's needle becomes a skeleton whose given
code works and whose homework parts are not written yet.
"""

from __future__ import annotations

import ast
from pathlib import Path

RAISE = "raise NotImplementedError()"
PASS = "pass"


def _find(tree: ast.AST, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body  # type: ignore[attr-defined]
    node = None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            raise LookupError(f"{qualname}: no {part!r}")
        scope = node.body
    assert isinstance(node, ast.FunctionDef), qualname
    return node


def blank_function(path: Path, qualname: str, style: str = RAISE) -> None:
    """Replace the body of ``qualname`` in ``path`` (docstring kept) by ``style``."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    fn = _find(ast.parse(source), qualname)
    body = fn.body
    keep = 1 if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    first = body[keep].lineno - 1 if len(body) > keep else body[0].end_lineno
    last = body[-1].end_lineno
    indent = " " * body[0].col_offset
    stub = f"{indent}### BEGIN YOUR SOLUTION\n{indent}{style}\n{indent}### END YOUR SOLUTION\n"
    if keep and len(body) == 1:
        first = last
    lines[first:last] = [stub]
    path.write_text("".join(lines))


def blank_all(root: Path, blanks: dict[str, list[str]], style: str = RAISE) -> None:
    """``blanks``: file (relative to ``root``) -> qualified names to blank."""
    for relative, names in blanks.items():
        for name in names:
            blank_function(root / relative, name, style)
