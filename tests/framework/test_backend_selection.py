"""The NEEDLE_BACKEND switch: 'nd' and 'np' import, anything else is refused at import."""

import os
import subprocess
import sys

import pytest


def _import_needle(backend: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEEDLE_BACKEND=backend)
    code = (
        "import numpy, needle as ndl; data = ndl.Tensor([1.0]).cached_data; "
        "print(ndl.BACKEND, type(data).__name__, isinstance(data, numpy.ndarray))"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "backend, array_type, is_numpy", [("nd", "NDArray", "False"), ("np", "NDArray", "True")]
)
def test_known_backends(backend, array_type, is_numpy):
    """Under np the data is needle.backend_numpy.NDArray, a numpy.ndarray subclass."""
    result = _import_needle(backend)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [backend, array_type, is_numpy]


def test_unknown_backend_is_refused():
    result = _import_needle("torch")
    assert result.returncode != 0
    assert "RuntimeError" in result.stderr and "'torch'" in result.stderr
