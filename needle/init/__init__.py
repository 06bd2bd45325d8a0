"""needle.init: tensor factories (rand, randn, constant, ones, zeros, randb, one_hot, *_like)
and the weight initialisers (xavier_uniform/normal, kaiming_uniform/normal)."""

from .init_basic import *
from .init_initializers import *
