"""The checker's worker: runs questions one after another against the student's package.

Started by ``runner.py`` as ``python -m companion.check.worker CONFIG.json`` in a clean
environment (its own process session, so the runner can stop it with everything it started)
whose ``NEEDLE_IMPL`` names the homework's ``python/`` folder (unset for hw0): the student's
``needle`` is imported through :mod:`companion.impl`, the same mechanism a notebook uses, and the
checks (``companion.check.hwN``) import it like any user code. The homework's folders go first
on ``sys.path`` for its other modules (``simple_ml``, ``mlp_resnet``, ...).

It writes one JSON line per event to the pipe whose fd is its second argument (the config names
no results file; ``sandbox.py`` starts it, limited and unable to write outside the homework
and scratch folders where Landlock is available): ``{"start": "__import__"}`` and then
``{"imported": path}`` or ``{"import_error": text}`` for the import probe (the student's package
imported once, before any question, so a hang, an exit or a syntax error at import is reported
once); ``{"start": id}`` before a question and ``{"id", "status", "detail", "needle",
"comparisons"}`` after it. Beside student code the worker is blind (``diagnose``'s blind
mode): the checks never compute an expected value here, and ``comparisons`` carries the
student's value for every comparison made (``diagnose.Recorder``), whatever the status: a pass
is only a claim, and a failure may follow an earlier wrong value, which the runner's judge
(``judge.py``) finds from those values against expected values computed where the student's
code never runs. The worker is also how the judge computes them: the same checks in reference
mode on this project's needle (the runner's ``reference`` run, ``"reference": true`` in the
config). A crash (segfault) or an exit leaves a start without an end, which the runner reports
for that question alone.
"""

import faulthandler
import importlib
import json
import os
import sys
import traceback

from companion import impl
from companion.check.nothing import (
    named_stubs,
    none_culprit,
    stub_codes,
    stubs_returning_none,
    watch_stubs,
)

IMPORT_PROBE = "__import__"
_STUB_CACHE: dict = {}  # module name -> its empty-bodied functions (looked at once)


STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs")  # mugrade


def _isolate(paths, root):
    """Put the student's folders first on sys.path, then the homework folder (the course's tests
    run from it, so ``tests.hw2...`` and ``python.needle`` import), and last the stand-ins for
    what the course's environment has (``mugrade``); ``import needle`` comes from NEEDLE_IMPL."""
    impl.install()  # already done at start-up by the .pth where the wheel or `make build` put it
    first = list(paths) + [root]
    sys.path[:] = first + [p for p in sys.path if p not in first and p != ""] + [STUBS]


def _where(exc: BaseException, roots) -> str:
    """file:line in function (Class) of the innermost frame inside the student's folders."""
    frames = traceback.extract_tb(exc.__traceback__)
    tb = exc.__traceback__
    objs = []
    while tb is not None:
        objs.append(tb.tb_frame)
        tb = tb.tb_next
    for summary, frame in reversed(list(zip(frames, objs))):
        if any(os.path.abspath(summary.filename).startswith(r) for r in roots):
            owner = frame.f_locals.get("self")
            cls = f" ({type(owner).__name__})" if owner is not None else ""
            rel = os.path.relpath(summary.filename, os.getcwd())
            return f"{rel}:{summary.lineno} in {summary.name}{cls}"
    if frames:
        s = frames[-1]
        return f"{s.filename}:{s.lineno} in {s.name}"
    return "?"


def _base_exception(exc: BaseException, roots) -> str:
    """What a SystemExit / KeyboardInterrupt / other BaseException from student code means."""
    where = _where(exc, roots)
    if isinstance(exc, SystemExit):
        return (
            f"your code called sys.exit({exc.code!r}) (SystemExit) at {where}: a library "
            "function must not end the program; raise an exception instead"
        )
    if isinstance(exc, KeyboardInterrupt):
        return (
            f"KeyboardInterrupt raised at {where} (your code raised it, or the run was interrupted)"
        )
    return f"raised {type(exc).__name__}: {exc} at {where}"


def _run_one(qid, hw_module, ctx, roots, recorded, stubs):
    """(status, detail) of one question; a failure in a question that ran an empty-bodied
    student function (a blank skeleton's ``pass``) is "not implemented", naming it. What the
    second run (the stub search) records is dropped: ``recorded`` keeps the first run's.
    ``stubs`` gets the empty-bodied functions the question ran that returned None (for the
    judge: this blind worker cannot tell whether the values they led to are wrong)."""
    try:
        codes = stub_codes(roots, _STUB_CACHE)
    except Exception:  # a student module that cannot be looked through: no watching
        codes = {}
    status, detail, exc = watch_stubs(lambda: _outcome(qid, hw_module, ctx, roots), codes, stubs)
    if status in ("fail", "not implemented") and exc is not None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        kept = len(recorded)
        try:
            named = _name_the_stub(
                qid,
                hw_module,
                ctx,
                roots,
                f"{type(exc).__name__}: {first}" if not isinstance(exc, AssertionError) else first,
            )
        finally:
            del recorded[kept:]
        if named:
            return "not implemented", named
    return status, detail


def _outcome(qid, hw_module, ctx, roots):
    import numpy as np

    from companion.check.diagnose import CheckFailure, NotImplementedYet

    np.random.seed(0)
    fn = getattr(hw_module, qid, None)
    if fn is None:
        return "error", f"the checker has no check for {qid}", None
    try:
        fn(ctx)
        return "pass", "", None
    except NotImplementedError as exc:
        return "not implemented", f"NotImplementedError raised at {_where(exc, roots)}", None
    except NotImplementedYet as exc:
        return "not implemented", str(exc), exc  # named below when an empty function did it
    except CheckFailure as exc:
        return "fail", str(exc), exc
    except BlockingIOError as exc:  # fork() refused: RLIMIT_NPROC (not applied to root)
        return (
            "fail",
            (
                f"starting a process failed ({exc}) at {_where(exc, roots)}: the checker limits "
                "the processes a worker may run (RLIMIT_NPROC); a check needs none"
            ),
            None,
        )
    except MemoryError as exc:
        return (
            "fail",
            (
                f"ran out of memory (MemoryError{': ' + str(exc) if str(exc) else ''}) at "
                f"{_where(exc, roots)}: it reached the checker's memory limit of "
                f"{os.environ.get('COMPANION_CHECK_MEMORY', '?')} (RLIMIT_DATA); these checks use "
                "small arrays, so look for an allocation that grows without bound"
            ),
            None,
        )
    except Exception as exc:  # the student's code raised: report where, not a crash
        lines = traceback.format_exception_only(type(exc), exc)
        culprit = none_culprit(exc, roots)
        if culprit is not None:
            return "not implemented", culprit, exc
        return (
            "fail",
            (
                f"raised {''.join(lines).strip()}\n  at {_where(exc, roots)}\n"
                + "".join(_student_frames(exc, roots)[-3:]).rstrip()
            ),
            exc,
        )
    except BaseException as exc:  # sys.exit, KeyboardInterrupt: named, not a crash
        return "fail", _base_exception(exc, roots), None


def _student_frames(exc, roots) -> list[str]:
    """The formatted traceback entries outside the checker's own package."""
    here = os.path.dirname(os.path.abspath(__file__))
    keep = [
        s
        for s in traceback.extract_tb(exc.__traceback__)
        if not os.path.abspath(s.filename).startswith(here)
    ]
    return traceback.format_list(keep)


def _name_the_stub(qid, hw_module, ctx, roots, saw: str) -> str | None:
    """Run the question again, watching which empty-bodied student functions it runs, and
    name them (None when it ran none: the failure is a real one)."""
    import tempfile

    import numpy as np

    np.random.seed(0)
    scratch = ctx.scratch
    ctx.scratch = tempfile.mkdtemp(dir=scratch)  # the first run's files may be in the way
    try:
        names = stubs_returning_none(lambda: getattr(hw_module, qid)(ctx), roots)
    finally:
        ctx.scratch = scratch
    return named_stubs(names, saw) if names else None


class Context:
    """What a check may use: the homework folder, a scratch folder for generated files, and
    ``note(text)``, which records the call about to run (shown if the process then crashes)."""

    def __init__(self, root: str, scratch: str, out):
        self.root = root
        self.scratch = scratch
        self._out = out
        self.warnings: list[str] = []

    def note(self, text: str) -> None:
        self._out.write(json.dumps({"note": text}) + "\n")
        self._out.flush()

    def warn(self, text: str) -> None:
        """A robustness problem the course's tests do not check: shown beside a pass."""
        self.warnings.append(text)


def _probe(hw: str, roots) -> str | None:
    """Import the student's package once; None when it imports, else what went wrong."""
    module = "simple_ml" if hw == "hw0" else "needle"
    try:
        importlib.import_module(module)
    except Exception as exc:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        where = _where(exc, roots)
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f"{os.path.relpath(exc.filename, os.getcwd())}:{exc.lineno}"
        return (
            f"importing your {module} raised {type(exc).__name__}: {exc}\n  at {where}\n"
            + "\n".join(text.rstrip().splitlines()[-8:])
        )
    except BaseException as exc:
        return f"importing your {module}: " + _base_exception(exc, roots)
    return None


def _tampered_state(diagnose, mode: str, swapped: bool) -> str | None:
    """What student code changed in the checker's state (the record, the mode), put back."""
    if diagnose._MODE != mode:
        diagnose.set_mode(mode)
        return (
            "your code switched the checker's mode (it must not compute expected values "
            "beside your code)"
        )
    return "your code replaced the checker's record of comparisons" if swapped else None


def main(config_path: str, fd: int) -> None:
    with open(config_path) as f:
        config = json.load(f)
    faulthandler.enable()
    _isolate(config["paths"], config["root"])
    os.chdir(config["root"])
    roots = [os.path.abspath(p) for p in config["paths"]]
    hw_module = importlib.import_module(f"companion.check.{config['hw']}")
    import companion.check.diagnose as diagnose
    from companion.check.diagnose import NumpyGuard, Recorder

    # blind beside student code: no expected value is ever computed in this process
    mode = diagnose.REFERENCE if config.get("reference") else diagnose.BLIND
    diagnose.set_mode(mode)
    guard = NumpyGuard()  # before any student code runs
    with os.fdopen(fd, "w", buffering=1) as out:
        if config.get("probe"):
            out.write(json.dumps({"start": IMPORT_PROBE}) + "\n")
            out.flush()
            problem = _probe(config["hw"], roots) or guard.tampered()
            if problem:
                out.write(json.dumps({"import_error": problem}) + "\n")
                out.flush()
                return
            needle = sys.modules.get("needle")
            out.write(json.dumps({"imported": getattr(needle, "__file__", None)}) + "\n")
            out.flush()
        ctx = Context(config["root"], config["scratch"], out)
        for qid in config["questions"]:
            out.write(json.dumps({"start": qid}) + "\n")
            out.flush()
            ctx.warnings = []
            stubs: list[str] = []
            with Recorder() as recorded:
                status, detail = _run_one(qid, hw_module, ctx, roots, recorded, stubs)
                swapped = diagnose._RECORD is not recorded
            tampered = guard.tampered() or _tampered_state(diagnose, mode, swapped)
            if tampered:  # and what it recorded cannot be believed: the verdict is this
                status, detail, recorded = "fail", tampered, []
            needle = sys.modules.get("needle")
            where = getattr(needle, "__file__", None) if needle is not None else None
            out.write(
                json.dumps(
                    {
                        "id": qid,
                        "status": status,
                        "detail": detail,
                        "needle": where,
                        "warnings": ctx.warnings if status == "pass" else [],
                        "comparisons": recorded,  # every status: the judge looks for the cause
                        "stubs": stubs if status == "pass" else [],
                    }
                )
                + "\n"
            )
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    # End now: an atexit handler or a thread that student code left running must not keep
    # the worker (and so the checker) alive after the last answer is written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
