"""Which notebook cells time something, read from their source's syntax tree.

The rule (tests/notebooks/test_timing_cells.py applies it):

* A **timing primitive** is a reference (a call or not) to ``time.perf_counter``,
  ``time.perf_counter_ns``, ``time.time``, ``time.time_ns``, ``time.process_time``,
  ``time.process_time_ns``, ``time.thread_time``, ``time.thread_time_ns``, anything of the
  ``timeit`` or ``torch.utils.benchmark`` modules (names resolved through the cell's imports:
  ``from time import perf_counter as clock`` counts, a variable called ``time`` does not), or a
  ``.time_evaluator`` attribute (TVM's timer, on a compiled module whose type the source does
  not show). ``time.monotonic`` is not one: this project uses it only to pace redraws
  (``companion.viz.LiveCurves``).
* A **timing helper** is a function or class of the ``companion`` package, or one a notebook
  cell defines, whose body references a primitive or another timing helper (found by a fixed
  point over every module of ``companion/``, e.g. ``companion.timing.measure``,
  ``companion.roofline.measured_cpu``, ``companion.step_profile.profile_case``), and a name a
  ``companion`` module re-exports from one.
* A code cell **times something** when the code it runs at its top level (function and class
  bodies excluded: defining a timer times nothing; lambdas included) references a primitive or
  a helper, or runs the ``%timeit``/``%%timeit``/``%time``/``%%time`` magics, or carries a
  program another process runs: a string that is Python source which times (its own imports
  only), or the name of a ``companion`` module (``-m companion.apps.distributed_train``) whose
  top-level code times. Other IPython magics and ``!`` shell lines are removed before parsing.

Not followed: a name rebound to something else after it named a timer, and timing done inside
a library this rule does not list.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

COMPANION = Path(__file__).resolve().parents[2] / "companion"
PRIMITIVES = frozenset(
    f"time.{name}"
    for name in (
        "perf_counter",
        "perf_counter_ns",
        "time",
        "time_ns",
        "process_time",
        "process_time_ns",
        "thread_time",
        "thread_time_ns",
    )
) | {"timeit", "torch.utils.benchmark"}
# methods of objects whose type the source does not show: TVM's compiled-module timer
TIMING_METHODS = frozenset({"time_evaluator"})
TIMING_MAGICS = frozenset({"timeit", "time"})
PYTHON_CELL_MAGICS = frozenset({"timeit", "time", "capture", "prun"})
LINE_MAGIC = re.compile(r"^(\s*)(%{1,2}|!)(\w*)")
ASSIGNED_MAGIC = re.compile(r"^(\s*[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*)(%{1,2}|!)(\w*)")
MAIN = "__main__"
RUN_MODULE = "-m "  # marks a module whose top-level code times when run


def strip_magics(source: str) -> tuple[str, bool]:
    """Python source with IPython magics and shell lines replaced, and whether a timing magic
    was among them."""
    lines = source.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    timed = False
    cell_magic = LINE_MAGIC.match(lines[first]) if first is not None else None
    if first is not None and cell_magic and cell_magic.group(2) == "%%":
        name = cell_magic.group(3)
        timed = name in TIMING_MAGICS
        if name not in PYTHON_CELL_MAGICS:
            return "", timed
        lines[first] = ""
    out = []
    for line in lines:
        magic, assigned = LINE_MAGIC.match(line), ASSIGNED_MAGIC.match(line)
        if magic:
            timed |= magic.group(2) != "!" and magic.group(3) in TIMING_MAGICS
            line = magic.group(1) + "pass"
        elif assigned:
            timed |= assigned.group(2) != "!" and assigned.group(3) in TIMING_MAGICS
            line = assigned.group(1) + "None"
        out.append(line)
    return "\n".join(out), timed


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def import_aliases(tree: ast.AST, package: str = "") -> dict[str, str]:
    """Local name -> qualified name for every import in ``tree`` (relative ones resolved
    against ``package``)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def top_level_nodes(statements: Iterable[ast.stmt]) -> Iterator[ast.AST]:
    """Every node the statements run directly: function and class bodies left out (their
    decorators, defaults and base classes kept)."""
    stack: list[ast.AST] = list(statements)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept: list[ast.AST] = list(node.decorator_list)
            if isinstance(node, ast.ClassDef):
                kept += node.bases + [k.value for k in node.keywords]
            else:
                kept += node.args.defaults + [d for d in node.args.kw_defaults if d]
            stack.extend(kept)
        else:
            stack.extend(ast.iter_child_nodes(node))


class Resolver:
    """Qualifies names through imports and local definitions, and knows the timing ones."""

    def __init__(self, aliases: dict[str, str], local: str, timing: set[str]):
        self.aliases, self.local, self.timing = aliases, local, timing
        self.defined: set[str] = set()

    def qualify(self, name: str) -> str | None:
        """The qualified name, None where its head is neither imported nor defined here."""
        head, _, rest = name.partition(".")
        if head in self.aliases:
            base = self.aliases[head]
        elif head in self.defined:
            base = f"{self.local}.{head}"
        else:
            return None
        return f"{base}.{rest}" if rest else base

    def is_timing(self, qualified: str | None) -> bool:
        if qualified is None:
            return False
        parts = qualified.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        return bool(prefixes & (self.timing | PRIMITIVES))

    def references_timing(self, nodes: Iterable[ast.AST], programs: bool = False) -> bool:
        """Whether any Name/Attribute among ``nodes`` is timing; with ``programs``, also a string
        that is a timing program or names a timing companion module."""
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr in TIMING_METHODS:
                return True
            if isinstance(node, (ast.Name, ast.Attribute)):
                name = dotted(node)
                if name is not None and self.is_timing(self.qualify(name)):
                    return True
            elif programs and isinstance(node, ast.Constant) and isinstance(node.value, str):
                if f"{RUN_MODULE}{node.value}" in self.timing or string_program_times(
                    node.value, self.timing
                ):
                    return True
        return False


def string_program_times(text: str, timing: set[str]) -> bool:
    """Whether ``text`` is Python source (with a newline or an import) that times, resolved with
    its own imports only."""
    if "\n" not in text and "import" not in text:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    resolver = Resolver(import_aliases(tree), MAIN, set(timing))
    return resolver.references_timing(ast.walk(tree))


def define(resolver: Resolver, statements: list[ast.stmt]) -> None:
    """Register the functions and classes ``statements`` define at their top level, marking
    timing the ones whose bodies reference timing (a fixed point: they may call each other)."""
    defs = [
        node
        for node in top_level_nodes(statements)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    resolver.defined |= {d.name for d in defs}
    changed = True
    while changed:
        changed = False
        for node in defs:
            name = f"{resolver.local}.{node.name}"
            if name not in resolver.timing and resolver.references_timing(ast.walk(node), True):
                resolver.timing.add(name)
                changed = True


def companion_modules(root: Path = COMPANION) -> dict[str, ast.Module]:
    """Qualified module name -> syntax tree, for every module of the companion package."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return modules


def timing_helpers(modules: dict[str, ast.Module]) -> set[str]:
    """Qualified names of the timing helpers of ``modules`` (functions, classes, re-exported
    names) and of the modules whose top-level code times (they time when run with ``-m``)."""
    timing: set[str] = set()
    resolvers = {}
    for name, tree in modules.items():
        resolvers[name] = Resolver(import_aliases(tree, package_of(name, modules)), name, timing)
    size = -1
    while size != len(timing):
        size = len(timing)
        for name, tree in modules.items():
            define(resolvers[name], tree.body)
            for alias, target in resolvers[name].aliases.items():
                if resolvers[name].is_timing(target):
                    timing.add(f"{name}.{alias}")
            if resolvers[name].references_timing(top_level_nodes(tree.body)):
                timing.add(f"{RUN_MODULE}{name}")
    return timing


def package_of(module: str, modules: dict[str, ast.Module]) -> str:
    """The package relative imports in ``module`` are resolved against."""
    is_package = any(other.startswith(module + ".") for other in modules)
    return module if is_package else module.rpartition(".")[0]


def timing_cells(sources: list[str], helpers: set[str]) -> list[int]:
    """Indices (into ``sources``, the code cells of one notebook in order) of the cells that
    time something; ValueError naming a cell that does not parse."""
    resolver = Resolver({}, MAIN, set(helpers))
    found = []
    for index, source in enumerate(sources):
        python, magic = strip_magics(source)
        try:
            tree = ast.parse(python)
        except SyntaxError as error:
            raise ValueError(f"code cell {index} does not parse after magics: {error}") from None
        resolver.aliases.update(import_aliases(tree))
        define(resolver, tree.body)
        if magic or resolver.references_timing(top_level_nodes(tree.body), programs=True):
            found.append(index)
    return found
