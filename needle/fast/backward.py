"""A backward pass that frees arrays as early as CPython's reference counts allow.

``backward(loss)`` computes the gradients that ``loss.backward(create_graph=False)`` computes,
with the same values; in addition it drops the array of a node whose op's gradient does not
read it (a product, a sum: ``Op.gradient_reads_output`` is False) before that gradient is
computed, when nothing but the pass holds the node. A language model's logits are then gone
before their product's two adjoints are allocated. Tensors the caller holds keep their values.
"""

from __future__ import annotations

import sys
from typing import Optional

from needle.autograd import Tensor, Value, compute_gradient_of_variables

__all__ = ["backward"]


def backward(output: Tensor, out_grad: Optional[Tensor] = None) -> None:
    """``output.backward(out_grad, create_graph=False)``, freeing arrays early (module doc)."""
    compute_gradient_of_variables(
        output,
        output.checked_out_grad(out_grad),
        create_graph=False,
        before_gradient=_free_unread_array,
    )


def _free_unread_array(node: Value) -> None:
    """Drop ``node``'s array when its op's gradient does not read it and only the pass holds
    ``node`` (no Tensor of the caller can see the array)."""
    op = node.op
    if op is not None and not op.gradient_reads_output and _only_the_pass_holds(node):
        node.cached_data = None


def _only_the_pass_holds(node: Value) -> bool:
    """True when the backward pass's own variables are the only references to ``node``: the
    pass's local, this function's argument and the caller's argument (CPython's count for that
    differs between versions, so it is measured once, below)."""
    return sys.getrefcount(node) <= _ONLY_THE_PASS


def _count_of_the_pass() -> int:
    """sys.getrefcount inside :func:`_only_the_pass_holds`, reached as the pass reaches it, for
    an object that only the pass's local variable holds."""
    seen = []

    def probe(obj: object) -> bool:
        seen.append(sys.getrefcount(obj))
        return True

    def hook(obj: object) -> None:
        probe(obj)

    local = object()
    hook(local)
    return seen[0]


_ONLY_THE_PASS = _count_of_the_pass()
