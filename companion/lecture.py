"""Lecture notebooks in student mode: cells that need this project's extensions skip cleanly.

A notebook cell whose first line is ``# companion-only: <what it needs>`` uses something the
course's needle does not have (a fused op, ``create_graph=True``, ``matmul_tiled``, ...), or the
results of such a cell. The notebook's first code cell after the Colab set-up cell calls
:func:`setup`; when ``NEEDLE_IMPL`` has loaded a student's needle (:mod:`companion.impl`), that
registers an IPython input transformer which replaces each such cell's source by one ``print``
saying what it skips and why.
Without ``NEEDLE_IMPL`` :func:`setup` does nothing and every cell runs as written.

In that mode :func:`setup` also tallies every cell the kernel runs; :func:`report_card` prints
which passed, failed or were skipped so far (``python -m companion.report_card`` does the same
for whole notebooks, from outside).

(A comment rather than a cell magic: Jupytext keeps comments intact in the paired .py files.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List, Optional

#: This project's checkout (its ``src/`` and ``notebooks/``) when companion runs from one (an
#: editable install), whichever needle is imported; in a wheel install, site-packages.
CHECKOUT = Path(__file__).resolve().parents[1]
#: The copy of the checkout's ``src/`` that a wheel ships inside companion (pyproject.toml's
#: ``wheel.packages`` maps ``src`` there), for :func:`kernel_source` where there is no checkout.
SHIPPED_SRC = Path(__file__).resolve().parent / "src"
MARKER = re.compile(r"#\s*companion-only:\s*(?P<reason>\S.*?)\s*$")
#: How every skip line begins (``companion.report_card`` counts skipped cells by it).
SKIP_PREFIX = "companion-only cell skipped: "
#: The cells run in this kernel under NEEDLE_IMPL: (status, first line or, for a failed cell, the
#: line that raised (:func:`raised_at`), error), in order.
CELLS: List[tuple] = []


def companion_only_reason(lines: List[str]) -> Optional[str]:
    """The ``<what it needs>`` of a cell whose first non-blank line is the marker, else None."""
    for line in lines:
        if line.strip():
            match = MARKER.fullmatch(line.strip())
            return match.group("reason") if match else None
    return None


def skip_line(reason: str, folder: str) -> str:
    """The one line a skipped cell prints."""
    return (
        f"{SKIP_PREFIX}it uses {reason}, which the course's needle "
        f"(from {folder}, NEEDLE_IMPL) does not have"
    )


def skip_companion_only(lines: List[str], folder: str = "NEEDLE_IMPL") -> List[str]:
    """An IPython input transformer: a marked cell becomes ``print(<skip line>)``; any other cell
    is returned unchanged."""
    reason = companion_only_reason(lines)
    if reason is None:
        return lines
    return [f"print({skip_line(reason, folder)!r})\n"]


def _transformer(folder: str):
    def transform(lines: List[str]) -> List[str]:
        return skip_companion_only(lines, folder)

    transform.needle_companion_only = True  # lets setup() find its own transformer
    return transform


def setup() -> bool:
    """Register the companion-only transformer when a student's needle is in use (NEEDLE_IMPL)
    and this runs in IPython; returns whether it is registered. Calling it again is harmless."""
    from companion.impl import active_folder

    folder = active_folder()
    if folder is None:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    transformers = shell.input_transformers_post
    if not any(getattr(t, "needle_companion_only", False) for t in transformers):
        transformers.append(_transformer(str(folder)))
        shell.events.register("post_run_cell", _tally)
    return True


def _tally(result) -> None:
    """IPython's post_run_cell hook: record the cell's status for :func:`report_card`."""
    source = getattr(result.info, "raw_cell", "") or ""
    lines = source.splitlines(keepends=True)
    first = next((line.strip() for line in lines if line.strip()), "")
    if not first or "report_card(" in source:
        return
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        CELLS.append(
            ("failed", raised_at(error) or f"`{first[:60]}`", f"{type(error).__name__}: {error}")
        )
    elif companion_only_reason(lines) is not None:
        CELLS.append(("skipped", first, ""))
    else:
        CELLS.append(("passed", first, ""))


def raised_at(error: BaseException) -> str:
    """Where ``error`` was raised: ``path:line `code``` of the deepest frame in the student's
    homework folder (the folder above NEEDLE_IMPL's; the path relative to it), else "" (the
    error came from the cell itself or from code outside that folder)."""
    import traceback

    from companion.impl import active_folder
    from companion.report_card import student_site

    folder = active_folder()
    frames = traceback.extract_tb(error.__traceback__)
    return student_site(
        ((f.filename, f.lineno, (f.line or "").strip()) for f in frames),
        folder.parent if folder is not None else None,
    )


def report_card() -> None:
    """Print the cells this kernel ran under NEEDLE_IMPL since :func:`setup`: counts of passed,
    failed and skipped, then each failure (the student's line that raised it, else the cell's
    first line, and the error)."""
    counts = {k: sum(1 for c in CELLS if c[0] == k) for k in ("passed", "failed", "skipped")}
    lines = [
        f"report card: {counts['passed']} cells passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped (companion-only)"
    ]
    lines += [
        f"  failed: {where}: {error[:150]}" for status, where, error in CELLS if status == "failed"
    ]
    print("\n".join(lines))


def in_checkout() -> bool:
    """Whether companion runs from this project's checkout (an editable install), not from an
    installed wheel (site-packages)."""
    return (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "notebooks").is_dir()


def data_dir() -> Path:
    """Where the downloaded data sets are: the checkout's ``data/`` (``make data`` fills it) in
    a checkout, else ``data/`` in the current folder (``python -m companion.data.download
    --all --root data`` fills it, e.g. in Colab)."""
    return CHECKOUT / "data" if in_checkout() else Path("data").resolve()


def kernel_source_dir() -> Path:
    """The folder :func:`kernel_source` reads: the checkout's ``src/`` when companion runs from
    a checkout (an editable install), else the copy the installed package ships
    (``companion/src``)."""
    if in_checkout() and (CHECKOUT / "src").is_dir():
        return CHECKOUT / "src"
    return SHIPPED_SRC


def kernel_source(relpath: str) -> str:
    """The text of this project's C++/CUDA source ``src/<relpath>`` (e.g.
    ``"cuda/ndarray_backend_cuda.cu"``), from :func:`kernel_source_dir`. Raises ValueError for
    a path that leaves ``src/`` and FileNotFoundError, naming the folder, for a missing file."""
    rel = Path(relpath)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"kernel_source: {relpath!r} is not a relative path inside src/")
    path = kernel_source_dir() / rel
    if not path.is_file():
        raise FileNotFoundError(f"kernel_source: no {rel.as_posix()} in {path.parent}")
    return path.read_text()


#: What a cell that needs MPI prints instead of running, when :func:`mpiexec` finds none.
NO_MPI = (
    "skipped: {what} needs mpi4py and an mpiexec (the lectures extra: "
    "pip install 'needle[lectures]'), and this Python has none"
)


def mpiexec() -> Optional[str]:
    """The ``mpiexec`` that goes with this Python's mpi4py: the one the mpich wheel puts beside
    the interpreter or in pip's scripts folder, else the first on PATH; None when mpi4py is not
    installed or no mpiexec is found (e.g. where the lectures extra has no wheel)."""
    import importlib.util
    import shutil
    import sys
    import sysconfig

    if importlib.util.find_spec("mpi4py") is None:
        return None
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / "mpiexec").is_file():
            return str(folder / "mpiexec")
    return shutil.which("mpiexec")


def require_modules(*modules: str, what: str) -> None:
    """Raise one ModuleNotFoundError naming every module of ``modules`` (import names such as
    ``"tvm"``) that this Python cannot import, and the extra that provides them: what a notebook
    built around the lectures extra says, in one line, where that extra has no wheel."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"{what} needs {', '.join(missing)} (the lectures extra: pip install "
            f"'needle[lectures]' or python -m companion.extras), which this Python does not have"
        )


def best_device() -> Any:
    """The device a lecture's models and arrays live on: ``cuda()`` where its module is built
    and a GPU is visible (Colab's GPU runtime), else the compiled ``cpu()``, else ``cpu_numpy()``
    (a needle without a compiled CPU module). Works on a student's needle (NEEDLE_IMPL) too."""
    import needle as ndl

    for name in ("cuda", "cpu"):
        make = getattr(ndl, name, None)
        if make is None:
            continue
        device = make()
        if device.enabled():
            return device
    return ndl.cpu_numpy()


def fast_path(*modules: Any) -> bool:
    """Swap each module's course layers for needle's fused twins (``needle.fast.fuse``, in
    place: the same values and gradients to float32 rounding, fewer nodes and arrays), for the
    lectures' longer training runs. A needle without the fast wing (a student's, through
    NEEDLE_IMPL) keeps its modules as they are. Returns whether the fast path is in use."""
    try:
        import needle.fast as fast
    except ImportError:
        return False
    for module in modules:
        fast.fuse(module)
    return True
