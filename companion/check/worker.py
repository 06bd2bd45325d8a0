"""The checker's worker: runs questions one after another against the student's package.

Started by ``runner.py`` as ``python worker.py CONFIG.json`` in a clean environment. It makes the
student's folders win the import of ``needle`` (dropping the editable-install finder that would
otherwise redirect to the installed copy), loads the check modules as the private package
``_needle_check`` (never as ``needle.check``, which would clash with the student's ``needle``),
and appends one JSON line per event to the result file: ``{"start": id}`` before a question and
``{"id": ..., "status": ..., "detail": ..., "needle": path}`` after it. A crash (segfault) leaves a
start without an end, which the runner reports for that question alone.
"""
import faulthandler
import importlib
import importlib.util
import json
import os
import sys
import traceback
import types

CHECK_DIR = os.path.dirname(os.path.abspath(__file__))


def _load_student_impl() -> types.ModuleType:
    """``needle/student_impl.py`` (shared with ``NEEDLE_IMPL``), loaded by path: importing it as
    ``needle.student_impl`` would import this project's ``needle`` first."""
    path = os.path.join(os.path.dirname(CHECK_DIR), "student_impl.py")
    spec = importlib.util.spec_from_file_location("_needle_student_impl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _isolate(paths):
    """Put the student's folders first on sys.path and drop any other route to a ``needle``."""
    student_impl = _load_student_impl()
    student_impl.drop_editable_finders()
    os.environ.pop(student_impl.ENV, None)  # the homework folder's needle, whatever NEEDLE_IMPL says
    # Keep interpreter/site-packages entries; drop the script folder and source checkouts that
    # hold another needle package.
    keep = []
    for entry in sys.path:
        full = os.path.abspath(entry or os.getcwd())
        if full == CHECK_DIR or os.path.isdir(os.path.join(full, "needle")):
            continue
        keep.append(entry)
    sys.path[:] = list(paths) + keep
    pkg = types.ModuleType("_needle_check")
    pkg.__path__ = [CHECK_DIR]
    sys.modules["_needle_check"] = pkg


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


def _run_one(qid, hw_module, ctx, roots):
    import numpy as np
    from _needle_check.diagnose import CheckFailure
    np.random.seed(0)
    fn = getattr(hw_module, qid, None)
    if fn is None:
        return "error", f"the checker has no check for {qid}"
    try:
        fn(ctx)
        return "pass", ""
    except NotImplementedError as exc:
        return "not implemented", f"NotImplementedError raised at {_where(exc, roots)}"
    except CheckFailure as exc:
        return "fail", str(exc)
    except Exception as exc:  # the student's code raised: report where, not a crash
        lines = traceback.format_exception_only(type(exc), exc)
        return "fail", (f"raised {''.join(lines).strip()}\n  at {_where(exc, roots)}\n"
                        + "".join(traceback.format_tb(exc.__traceback__)[-3:]).rstrip())


class Context:
    """What a check may use: the homework folder, a scratch folder for generated files, and
    ``note(text)``, which records the call about to run (shown if the process then crashes)."""

    def __init__(self, root: str, scratch: str, out):
        self.root = root
        self.scratch = scratch
        self._out = out

    def note(self, text: str) -> None:
        self._out.write(json.dumps({"note": text}) + "\n")
        self._out.flush()


def main(config_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    faulthandler.enable()
    _isolate(config["paths"])
    os.chdir(config["root"])
    roots = [os.path.abspath(p) for p in config["paths"]]
    hw_module = importlib.import_module(f"_needle_check.{config['hw']}")
    with open(config["results"], "a", buffering=1) as out:
        ctx = Context(config["root"], config["scratch"], out)
        for qid in config["questions"]:
            out.write(json.dumps({"start": qid}) + "\n")
            out.flush()
            status, detail = _run_one(qid, hw_module, ctx, roots)
            needle = sys.modules.get("needle")
            where = getattr(needle, "__file__", None) if needle is not None else None
            out.write(json.dumps({"id": qid, "status": status, "detail": detail,
                                  "needle": where}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1])
