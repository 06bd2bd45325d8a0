"""Offline data sets, written against ``needle.data.Dataset`` like any user code.

Stand-ins for the course's downloads, built from what the installed dependencies carry:
scikit-learn's handwritten digits for MNIST (:mod:`.digits`), procedurally drawn images for
CIFAR-10 (:mod:`.shapes`) and a stochastic grammar's corpus for Penn Treebank (:mod:`.grammar`).
``python -m companion.data.download`` fetches the real sets (``make data``).
"""

from .digits import *
from .grammar import *
from .shapes import *
