"""NEEDLE_IMPL: ``import needle`` loads a student's own package instead of this one.

With ``NEEDLE_IMPL=path/to/hwN/python`` (a folder holding ``needle/__init__.py``, the course's
skeleton layout), the first lines of this project's ``needle/__init__.py`` call
:func:`use_student_package`, which loads the student's package as ``needle`` (its submodules
too, from the student's folder) and makes it ``sys.modules["needle"]``; ``import needle`` then
returns it. A lecture notebook run this way executes its asserts on the student's code.

What still comes from this project, because the course's package does not have it:

- the notebooks' tools (:data:`TOOL_MODULES`: ``needle.viz``, ``needle.timing``,
  ``needle.lecture``, ``needle.check``, and the course's applications ``needle.apps`` written
  against the course API): a finder placed after the normal ones serves ``needle.X`` from this
  project's folder when ``X`` is a tool the student's folder lacks. Nothing else: the course's
  modules and this project's extensions (``checkpoint``, ``export``, ...) come from the student's
  folder or not at all;
- the offline data sets the notebooks train on (:data:`OFFLINE_DATA`): their names are added
  to the student's ``needle.data`` where it lacks them, built on the student's ``Dataset``.

This module is also loaded by path by the checker's worker (``needle/check/worker.py``), which
shares :func:`drop_editable_finders`; so it imports nothing from ``needle``.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ENV = "NEEDLE_IMPL"
COMPANION_DIR = Path(__file__).resolve().parent
# The notebooks' tools, not part of the course's package: taken from this project when missing.
TOOL_MODULES = frozenset({"apps", "check", "lecture", "student_impl", "timing", "viz"})
# This project's offline data sets (extensions), by the data module that defines them.
OFFLINE_DATA = {
    "mnist_dataset": ("load_digits_mnist_like", "write_digits_idx", "DigitsDataset"),
    "cifar10_dataset": ("ShapesDataset", "make_shapes_images", "SHAPES_CLASSES",
                        "CIFAR10_CLASSES"),
    "ptb_dataset": ("StochasticGrammar", "default_grammar", "grammar_entropy_rate",
                    "write_grammar_corpus"),
}

#: The student's folder (the one holding ``needle/``) once :func:`use_student_package` loaded it.
active_folder: Path | None = None


def drop_editable_finders() -> None:
    """Remove the editable install's import hooks, which map ``needle.*`` to this checkout
    whatever ``sys.path`` or a package's ``__path__`` says."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not type(f).__module__.startswith("_editable_")]


def student_folder(raw: str) -> Path:
    """The absolute folder named by ``NEEDLE_IMPL``; ImportError naming it if it holds no package."""
    folder = Path(raw).expanduser().resolve()
    if not folder.is_dir():
        raise ImportError(f"{ENV}={raw}: {folder} is not a folder (point it at the folder that "
                          f"holds your needle/ package, e.g. hw2/python)")
    if not (folder / "needle" / "__init__.py").is_file():
        missing = "needle/" if not (folder / "needle").is_dir() else "needle/__init__.py"
        raise ImportError(f"{ENV}={raw}: {folder} has no {missing} (point it at the folder that "
                          f"holds your needle/ package, e.g. hw2/python)")
    return folder


class CompanionTools:
    """A meta-path finder, last in line: ``needle.X`` from this project's folder when ``X`` is
    one of :data:`TOOL_MODULES` and the student's package has no module ``X``."""

    def find_spec(self, fullname: str, path=None, target=None):
        """The spec of this project's ``needle.X`` tool module, or None."""
        parts = fullname.split(".")
        if len(parts) != 2 or parts[0] != "needle" or parts[1] not in TOOL_MODULES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(COMPANION_DIR)])


def _graft_offline_data() -> None:
    """Add :data:`OFFLINE_DATA`'s names to the student's ``needle.data`` where missing.

    Each of this project's data modules is loaded once more under a private name inside the
    student's ``needle.data.datasets``, so its relative imports reach the student's ``Dataset``.
    """
    data = sys.modules.get("needle.data")
    datasets = sys.modules.get("needle.data.datasets")
    if data is None or datasets is None:
        return  # a package before hw2's data module: nothing to add to
    for name, names in OFFLINE_DATA.items():
        source = COMPANION_DIR / "data" / "datasets" / f"{name}.py"
        private = f"needle.data.datasets._companion_{name}"
        spec = importlib.util.spec_from_file_location(private, source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[private] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the student's data module lacks what ours builds on
            del sys.modules[private]
            print(f"needle ({ENV}): the offline data sets of {name} are unavailable: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        targets = [data, datasets, sys.modules.get(f"needle.data.datasets.{name}")]
        for target in filter(None, targets):
            for attr in names:
                if not hasattr(target, attr):
                    setattr(target, attr, getattr(module, attr))


def use_student_package() -> bool:
    """Load the student's ``needle`` named by ``NEEDLE_IMPL`` in place of this project's.

    Returns False (nothing done) when ``NEEDLE_IMPL`` is unset or empty, names this project's
    own folder, or was already used in this process (a student's copy of this ``__init__``
    calls it again); then the calling ``__init__`` continues. Otherwise the student's package is
    ``sys.modules["needle"]`` on return and True says to stop this project's ``__init__``.
    Raises ImportError when the folder holds no ``needle/__init__.py``; errors raised by the
    student's ``__init__`` propagate unchanged. Prints once (stderr) which needle is in use.
    """
    global active_folder
    raw = os.environ.get(ENV, "").strip()
    if not raw or active_folder is not None:  # unset, or the student's package is loading now
        return False
    folder = student_folder(raw)
    if folder == COMPANION_DIR.parent:
        return False
    os.environ[ENV] = str(folder)  # absolute: subprocesses find the same package from any cwd
    drop_editable_finders()
    spec = importlib.util.spec_from_file_location(
        "needle", folder / "needle" / "__init__.py",
        submodule_search_locations=[str(folder / "needle")])
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules["needle"] = module
    if not any(isinstance(f, CompanionTools) for f in sys.meta_path):
        sys.meta_path.append(CompanionTools())
    active_folder = folder
    print(f"needle from {folder} ({ENV})", file=sys.stderr)
    spec.loader.exec_module(module)
    _graft_offline_data()
    return True
