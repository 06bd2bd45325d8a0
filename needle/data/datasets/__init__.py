"""Datasets: MNIST, CIFAR-10, Penn Treebank, in-memory arrays, and offline defaults."""

from .cifar10_dataset import *
from .mnist_dataset import *
from .ndarray_dataset import *
from .ptb_dataset import *
