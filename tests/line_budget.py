"""The size gate `make lint` runs: Python functions of at most 60 lines and source files of at
most 800 lines, except the justified entries below. Prints each offender; exits 1 if any.

Run: python tests/line_budget.py  (from the repository root; it reads `git ls-files`).
"""

from __future__ import annotations

import ast
import subprocess
import sys

MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 800
SOURCE_SUFFIXES = (".py", ".cc", ".cu", ".h", ".cuh")

# path -> why it may be longer. Notebooks are lectures (one file a lecture, read as a page);
# the kernel sources keep one device's protocol in one translation unit.
FILE_EXCEPTIONS = {
    "src/cuda/ndarray_backend_cuda.cu": "the CUDA device's kernels in one translation unit",
    "src/cpu/ndarray_backend_cpu.cc": "the CPU device's bindings for the whole protocol",
    "tests/framework/test_fused.py": "every fused kernel against its composition, one table",
    "tests/framework/test_device_protocol.py": "the conformance suite, one table of cases",
}
# "path:function" -> why it may be longer.
FUNCTION_EXCEPTIONS: dict = {}


def _files() -> list:
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if f.endswith(SOURCE_SUFFIXES)]


def _is_exempt_file(path: str) -> bool:
    return path in FILE_EXCEPTIONS or path.startswith("notebooks/")


def offenders() -> list:
    """Lines 'path: N lines' and 'path:line function: N lines' over the budget."""
    found = []
    for path in _files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        n = text.count("\n")
        if n > MAX_FILE_LINES and not _is_exempt_file(path):
            found.append(f"{path}: {n} lines (at most {MAX_FILE_LINES})")
        if not path.endswith(".py") or path.startswith("notebooks/"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                key = f"{path}:{node.name}"
                if length > MAX_FUNCTION_LINES and key not in FUNCTION_EXCEPTIONS:
                    found.append(
                        f"{path}:{node.lineno} {node.name}: {length} lines "
                        f"(at most {MAX_FUNCTION_LINES})"
                    )
    return found


if __name__ == "__main__":
    bad = offenders()
    for line in bad:
        print(line)
    print(f"line budget: {len(bad)} over" if bad else "line budget: every file and function within")
    sys.exit(1 if bad else 0)
