"""Fused kernels for ``NEEDLE_BACKEND=np`` (plain numpy arrays), with the same names and
results as ``needle.backend_ndarray.fused``."""

__all__: list = []  # the public fused functions, re-exported by the array API
