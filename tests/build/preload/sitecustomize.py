"""Start-up hook for the alternative-build test runs (``make test-clang``, ``make test-sanitize``).

With this folder on PYTHONPATH and NEEDLE_TEST_CPU_MODULE naming a compiled CPU module (a
``ndarray_backend_cpu*.so`` built elsewhere), every Python process, the test workers and the
children they start included, imports that file as ``needle.backend_ndarray.ndarray_backend_cpu``
instead of the module beside the sources. The import itself stays where needle does it (a
finder placed first on sys.meta_path answers for that one name), so what the module does when it
loads, such as warning about NEEDLE_CPU_ISA, happens at the usual moment. Without the variable
this file does nothing.
"""

import os

_PATH = os.environ.get("NEEDLE_TEST_CPU_MODULE")
if _PATH:
    import importlib.abc
    import importlib.util
    import sys

    if not os.path.isfile(_PATH):
        raise ImportError(f"NEEDLE_TEST_CPU_MODULE={_PATH!r} is not a file")

    class _OtherBuildFinder(importlib.abc.MetaPathFinder):
        """Finds ``needle.backend_ndarray.ndarray_backend_cpu`` at NEEDLE_TEST_CPU_MODULE."""

        NAME = "needle.backend_ndarray.ndarray_backend_cpu"

        def find_spec(self, fullname, path=None, target=None):
            if fullname != self.NAME:
                return None
            return importlib.util.spec_from_file_location(fullname, _PATH)

    sys.meta_path.insert(0, _OtherBuildFinder())
