"""needle.ops: every op class and its helper function (API.md §3).

``ops_mathematic`` (arithmetic, shapes, matmul, stack/split), ``ops_logarithmic`` (stable
logsumexp / logsoftmax), ``ops_tuple`` (TensorTuple ops), ``ops_conv`` (flip, dilate, conv).
"""
from .ops_mathematic import *
from .ops_logarithmic import *
from .ops_tuple import *
from .ops_conv import *
