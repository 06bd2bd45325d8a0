"""needle.ops: every op class of the course's op library and its helper function.

``ops_mathematic`` (arithmetic, shapes, matmul, stack/split), ``ops_logarithmic`` (stable
logsumexp / logsoftmax), ``ops_tuple`` (TensorTuple ops), ``ops_conv`` (flip, dilate, conv), and
``ops_fused`` (an extension: softmax cross-entropy, layer/batch norm and the LSTM cell as single
ops over fused kernels, with their exact gradients).
"""

from .ops_conv import *
from .ops_fused import *
from .ops_logarithmic import *
from .ops_mathematic import *
from .ops_tuple import *
