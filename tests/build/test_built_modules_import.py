"""Every compiled device module the build left in the package imports. A module that fails to
load (a host function declared and called but never defined: an undefined symbol at import)
only disables its device, so every test of that device would be skipped as if no GPU were
there; this test fails instead, naming the symbol."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import needle.backend_ndarray as nd

PACKAGE = Path(nd.__file__).resolve().parent
BUILT = sorted(
    {
        p.name.split(".")[0]
        for suffix in ("so", "pyd")
        for p in PACKAGE.glob(f"ndarray_backend_*.{suffix}")
    }
)


@pytest.mark.parametrize(
    "name",
    BUILT or [pytest.param("", marks=pytest.mark.skip(reason="no compiled module in the package"))],
)
def test_a_built_module_imports(name):
    module = importlib.import_module(f"needle.backend_ndarray.{name}")
    assert module.__device_name__ in ("cpu", "cuda")
