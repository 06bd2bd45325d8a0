"""NEEDLE_IMPL: which ``needle`` a Python process imports.

``NEEDLE_IMPL=path/to/hwN/python`` (the course's skeleton layout: a folder holding
``needle/__init__.py``) makes ``import needle`` -- and every ``needle.*`` -- come from that
folder; unset or empty, nothing changes. It decides nothing else: this project's tools
(``companion.*``) are imported as usual and import ``needle`` like any user code, so they run on
top of whichever needle is in use. A lecture notebook run this way executes its asserts on the
student's code.

How it is switched on. The wheel and the editable install (``make build``) put
``companion_needle_impl.pth`` into site-packages. Python runs its one line at every start-up; it
is a no-op unless ``NEEDLE_IMPL`` is set, and then it calls :func:`install`. So the variable
works wherever a process starts -- a notebook kernel whose first line is ``import needle as
ndl``, a script, ``make lab``, a subprocess, the checker's workers -- with nothing to call
first. Code that sets ``os.environ["NEEDLE_IMPL"]`` after start-up calls :func:`install` itself,
before the first ``import needle``.

How it takes over ``import needle``. :func:`install` puts a :class:`StudentNeedle` finder first
on ``sys.meta_path``. It answers only for ``needle`` and ``needle.*``: the package from the
student's folder, its submodules from that package's ``__path__`` (so from the same folder, or
not at all: a module the student's package lacks is a ``ModuleNotFoundError``, never this
project's copy). Being first matters for the editable install: scikit-build-core's in-place
mode puts the checkout on ``sys.path`` and a ``ScikitBuildInplaceFinder`` on ``sys.meta_path``
that resolves the top-level ``needle`` against the checkout whatever ``sys.path`` says. Our
finder answers before it for ``needle``; for everything else (``companion`` included, which the
editable install serves from the same checkout) it returns None and the normal finders run.

The folder is checked at every ``import needle`` that is not already done: a bad path raises
``ImportError`` naming it, at the ``import needle`` line. Once installed, the finder never lets
``needle`` or ``needle.*`` through to another finder: an import that failed (the student's
``__init__`` raised, or the folder lost its package) fails again or, once fixed, imports the
student's package, but never this project's, for as long as the process runs. An empty or blank
``NEEDLE_IMPL``, or one naming this project's own folder, is ignored with one line on stderr.
The first import prints (stderr) which needle is in use. A relative path is made absolute in
``os.environ``, so subprocesses started from another folder import the same package.

The course's environment, reproduced. The course's notebooks and tests run from the homework
root (the folder above ``python/``), so that folder is on ``sys.path`` there, and student code
may import through it (``from python.needle.init.init_basic import randb``). :func:`install`
therefore appends the folder above ``NEEDLE_IMPL`` to ``sys.path`` too (at the end: it adds
names, it shadows none; ``needle`` itself stays the finder's).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

ENV = "NEEDLE_IMPL"
#: The folder holding this project's ``needle`` and ``companion`` (the checkout, or site-packages).
OWN_FOLDER = Path(__file__).resolve().parents[1]
_HINT = "point it at the folder that holds your needle/ package, e.g. hw2/python"
_said: set[str] = set()  # notes already printed (site runs the .pth once per site dir: lib, lib64)


def _note(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(text, file=sys.stderr)


def student_folder(raw: str) -> Path:
    """The absolute folder ``NEEDLE_IMPL`` names; ImportError naming it if it holds no package."""
    folder = Path(raw).expanduser().resolve()
    if not folder.is_dir():
        raise ImportError(f"{ENV}={raw}: {folder} is not a folder ({_HINT})")
    if not (folder / "needle" / "__init__.py").is_file():
        missing = "needle/" if not (folder / "needle").is_dir() else "needle/__init__.py"
        raise ImportError(f"{ENV}={raw}: {folder} has no {missing} ({_HINT})")
    return folder


class StudentNeedle:
    """A meta-path finder, first in line: ``needle`` and ``needle.*`` from the student's folder.

    ``raw`` is ``NEEDLE_IMPL`` as given; it is validated by the first ``import needle``.
    """

    def __init__(self, raw: str):
        self.raw = raw
        self.folder: Path | None = None  # set once the folder has been validated

    def find_spec(self, fullname: str, path=None, target=None):
        """The student's spec for ``needle`` / ``needle.*``, None for any other module.

        For those it answers or raises, never returns None: no later finder (this project's
        editable install) may serve them."""
        if fullname != "needle" and not fullname.startswith("needle."):
            return None
        if fullname == "needle":
            folder = student_folder(self.raw)  # again on a retry: the folder may have changed
            if self.folder is None:
                print(f"needle from {folder} ({ENV})", file=sys.stderr)
            self.folder = folder
            path = [str(folder)]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return spec


def _finder() -> StudentNeedle | None:
    return next((f for f in sys.meta_path if isinstance(f, StudentNeedle)), None)


def install() -> bool:
    """Serve ``import needle`` from ``NEEDLE_IMPL``'s folder, with the folder above it (the
    homework root) at the end of ``sys.path``; returns whether it now does.

    A no-op returning False when ``NEEDLE_IMPL`` is unset, empty, or names this project's own
    folder (the last two say so in one line on stderr); calling it again is harmless. Raises
    RuntimeError when another ``needle`` is already imported (set the variable before Python
    starts, or call this first).
    """
    if ENV not in os.environ:
        return False
    raw = os.environ[ENV].strip()
    if not raw:
        _note(f"{ENV}={os.environ[ENV]!r} is blank: ignored, this project's needle is imported")
        return False
    if _finder() is not None:
        return True
    folder = Path(raw).expanduser().resolve()
    os.environ[ENV] = str(folder)  # absolute: subprocesses find the same package from any cwd
    if folder == OWN_FOLDER:
        _note(f"{ENV}={raw} is this project's own folder: ignored")
        return False
    loaded = sys.modules.get("needle")
    if loaded is not None:
        raise RuntimeError(
            f"{ENV}={raw}: needle is already imported (from "
            f"{getattr(loaded, '__file__', '?')}); set {ENV} before Python "
            "starts, or call companion.impl.install() before `import needle`"
        )
    sys.meta_path.insert(0, StudentNeedle(raw))
    homework_root = str(folder.parent)
    if homework_root not in sys.path:
        sys.path.append(homework_root)  # as in the course, which runs from the homework root
    return True


def active_folder() -> Path | None:
    """The student's folder when ``needle`` has been imported from it (NEEDLE_IMPL), else None."""
    finder = _finder()
    return finder.folder if finder is not None else None
