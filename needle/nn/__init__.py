"""needle.nn: modules (basic layers, convolutions, sequence models, Transformers)."""

from .nn_basic import *
from .nn_conv import *
from .nn_sequence import *
from .nn_transformer import *
