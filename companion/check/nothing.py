"""Telling "not implemented yet" from "wrong": a blank skeleton's functions return None.

The course's skeletons leave bodies as ``pass`` (or a docstring alone), so calling them gives
None where a value is due and the first use of that None raises (``cannot unpack non-iterable
NoneType object``, ``'NoneType' object has no attribute 'numpy'``). :func:`none_culprit` turns
such an exception into one line naming the function that returned None, without the checker's
own frames.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import traceback
import types


def is_stub(fn) -> bool:
    """True when ``fn`` is a Python function whose body does nothing (``pass``, ``...``, a
    docstring, or the course's ``### BEGIN YOUR SOLUTION`` block left empty)."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType):
        return False
    try:
        tree = ast.parse(inspect.getsource(fn).strip() if fn.__code__ else "")
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not defs:
        return False
    for stmt in defs[0].body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring or `...`
        return False
    return True


def _called_names(line: str) -> list[str]:
    """The dotted names called on one line of source (``a.b(x)`` gives ``a.b``)."""
    try:
        tree = ast.parse(line.strip().rstrip(":"))
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            try:
                names.append(ast.unparse(node.func))
            except Exception:  # pragma: no cover - unparse of odd nodes
                continue
    return names


def _resolve(name: str, frame) -> object:
    parts = name.split(".")
    scope = {**frame.f_globals, **frame.f_locals}
    obj = scope.get(
        parts[0], __builtins__.get(parts[0]) if isinstance(__builtins__, dict) else None
    )
    for part in parts[1:]:
        obj = getattr(obj, part, None)
    return obj


def _stubs_on_line(frame, lineno: int) -> list[str]:
    line = linecache.getline(frame.f_code.co_filename, lineno)
    found = []
    for name in _called_names(line):
        try:
            target = _resolve(name, frame)
        except Exception:
            continue
        if target is None:
            continue
        for candidate in (target, getattr(target, "forward", None), type(target).__call__):
            if candidate is not None and is_stub(candidate):
                code = inspect.unwrap(getattr(candidate, "__func__", candidate)).__code__
                where = f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}"
                found.append(f"{name} ({where})")
                break
    return found


def stub_codes(roots, cache: dict | None = None) -> dict:
    """code object -> "name (file:line)" of every function with an empty body in the student's
    loaded modules (those whose file is under ``roots``); ``cache`` keeps each module's, so a
    worker looks at a module once."""
    import sys

    found: dict = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or not any(os.path.abspath(path).startswith(r) for r in roots):
            continue
        if cache is not None and name in cache:
            found.update(cache[name])
            continue
        mine = _module_stubs(module, path)
        if cache is not None:
            cache[name] = mine
        found.update(mine)
    return found


def _module_stubs(module, path: str) -> dict:
    """The empty-bodied functions (and methods) defined in ``module``'s own file."""
    found = {}
    for value in list(vars(module).values()):
        members = list(vars(value).values()) if isinstance(value, type) else [value]
        for fn in members:
            fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
            if (
                isinstance(fn, types.FunctionType)
                and os.path.abspath(fn.__code__.co_filename) == os.path.abspath(path)
                and is_stub(fn)
            ):
                where = f"{os.path.relpath(fn.__code__.co_filename)}:{fn.__code__.co_firstlineno}"
                found[fn.__code__] = f"{fn.__qualname__} ({where})"
    return found


def watch_stubs(call, codes: dict, seen: list[str]):
    """``call()``, appending to ``seen`` each function of ``codes`` (``stub_codes``) that
    returned None, in the order they did; no watching (no cost) when ``codes`` is empty."""
    import sys

    if not codes:
        return call()

    def hook(frame, event, arg):
        if event == "return" and arg is None and frame.f_code in codes:
            name = codes[frame.f_code]
            if name not in seen:
                seen.append(name)

    sys.setprofile(hook)
    try:
        return call()
    finally:
        sys.setprofile(None)


def stubs_returning_none(call, roots) -> list[str]:
    """Run ``call()`` again, noting each empty-bodied student function that returned None (in
    the order they did); whatever ``call`` raises is ignored."""
    seen: list[str] = []
    try:
        watch_stubs(call, stub_codes(roots), seen)
    except BaseException:  # the failure already reported; only the names are wanted
        pass
    return seen


def named_stubs(names: list[str], saw: str) -> str:
    """The "not implemented" text naming the empty functions the question ran; ``saw`` is the
    first line of what went wrong because of them."""
    one = len(names) == 1
    return (
        f"{', '.join(names[:3])}{' and more' if len(names) > 3 else ''}: "
        f"{'its body is' if one else 'their bodies are'} still empty (`pass`), so "
        f"{'it is' if one else 'they are'} not implemented yet (what the check saw: {saw})"
    )


def none_culprit(exc: BaseException, roots) -> str | None:
    """ "Not implemented" text when ``exc`` came from using a None that a function returned,
    naming that function when its body is empty; else None."""
    if not isinstance(exc, (TypeError, AttributeError)) or "NoneType" not in str(exc):
        return None
    tb = exc.__traceback__
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    stubs: list[str] = []
    for frame, lineno in reversed(frames):
        stubs = _stubs_on_line(frame, lineno)
        if stubs:
            break
    summary = traceback.extract_tb(exc.__traceback__)
    mine = [s for s in summary if any(os.path.abspath(s.filename).startswith(r) for r in roots)]
    at = mine[-1] if mine else summary[-1] if summary else None
    line = f"\n  at {os.path.relpath(at.filename)}:{at.lineno}: {at.line}" if at else ""
    if stubs:
        return (
            f"{', '.join(stubs)} returned None where a value is due: its body is still "
            f"empty (`pass`), so it is not implemented yet ({type(exc).__name__}: {exc})"
        )
    return (
        f"a function returned None where a value is due (a body still `pass`, or a missing "
        f"`return`?): {type(exc).__name__}: {exc}{line}"
    )
