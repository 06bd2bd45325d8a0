"""needle.ops: every op class of the course's op library and its helper function.

``ops_mathematic`` (arithmetic, shapes, matmul, stack/split), ``ops_logarithmic`` (stable
logsumexp / logsoftmax), ``ops_tuple`` (TensorTuple ops) and ``ops_conv`` (flip, dilate,
conv). The fused ops (one kernel for a composite) live in the opt-in fast wing.
"""

from .ops_conv import *
from .ops_logarithmic import *
from .ops_mathematic import *
from .ops_tuple import *
