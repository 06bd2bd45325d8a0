"""needle.data: datasets, transforms and the DataLoader."""

from .data_basic import *
from .data_transforms import *
from .datasets import *
