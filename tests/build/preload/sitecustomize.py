"""Start-up hook for the alternative-build test runs (``make test-clang``, ``make test-sanitize``).

With this folder on PYTHONPATH and NEEDLE_TEST_CPU_MODULE naming a compiled CPU module (a
``ndarray_backend_cpu*.so`` built elsewhere), every Python process, the test workers and the
children they start included, imports that module as ``needle.backend_ndarray.ndarray_backend_cpu``
instead of the one beside the sources. Without the variable this file does nothing.
"""
import os

_PATH = os.environ.get("NEEDLE_TEST_CPU_MODULE")
if _PATH:
    import importlib.util
    import sys

    _NAME = "needle.backend_ndarray.ndarray_backend_cpu"
    if not os.path.isfile(_PATH):
        raise ImportError(f"NEEDLE_TEST_CPU_MODULE={_PATH!r} is not a file")
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    sys.modules[_NAME] = _module
