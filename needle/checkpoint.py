"""Activation checkpointing: drop a block's activations in forward, recompute them in backward.

``checkpoint(fn, x, params)`` returns ``fn(x)`` as one graph node whose only saved inputs are
``x`` and ``params``: the activations inside ``fn`` are computed with no graph and freed at once.
In backward the node runs ``fn`` again, this time recording its graph, and differentiates it, so
the gradients are those of the un-checkpointed model (the same arithmetic, run twice). Memory
falls from every activation of the block to its input; time grows by one extra forward pass of
the block.

:class:`Checkpoint` wraps a module the same way, and :func:`checkpoint_sequential` splits a list
of modules into segments of ``every`` modules, each checkpointed (every=1 keeps only the
segment boundaries; the sqrt(N) rule takes segments of about sqrt(N) modules).

Limits: second derivatives through a checkpoint are not supported: the gradients it gives are
exact, and differentiating one of them again raises NotImplementedError. numpy's global random state
is saved at
forward and restored for the recomputation, so Dropout masks are the same both times; a module
that updates state in forward (BatchNorm's running statistics) updates it twice.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import numpy as np

from needle import autograd
from needle.autograd import Tensor, TensorOp
from needle.backend_selection import NDArray
from needle.nn import Module, Sequential


class CheckpointOp(TensorOp):
    """fn(x) as a single op with inputs (x, *params); its gradient re-runs fn with a graph."""

    def __init__(self, fn: Callable[[Tensor], Tensor], params: Sequence[Tensor]) -> None:
        self.fn = fn
        self.params = list(params)
        self.rng_state: Any = None  # numpy's global RNG state, saved by the forward pass

    def compute(self, x: NDArray, *param_arrays: NDArray) -> NDArray:
        self.rng_state = np.random.get_state()
        with autograd.no_grad():
            out = self.fn(Tensor.make_const(x))
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return a Tensor, got {type(out).__name__}")
        return out.realize_cached_data()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, ...]:
        x_in = node.inputs[0]
        x = Tensor.make_const(x_in.realize_cached_data(), requires_grad=x_in.requires_grad)
        saved_grads = [p.grad for p in self.params]
        state_now = np.random.get_state()
        try:
            for p in self.params:
                p.grad = None
            np.random.set_state(self.rng_state)
            with autograd.enable_grad():
                out = self.fn(x)
            self._refuse_unlisted_leaves(out, x)
            if out.requires_grad:
                autograd.compute_gradient_of_variables(out, out_grad.detach(), create_graph=False)
            found = [x.grad] + [p.grad for p in self.params]
        finally:
            np.random.set_state(state_now)
            for p, g in zip(self.params, saved_grads):
                p.grad = g
        grads = [g if g is not None else _zeros_like(inp) for g, inp in zip(found, node.inputs)]
        if not autograd.is_grad_enabled():
            return tuple(grads)
        # The backward pass is recording (the default): the gradients become graph nodes that
        # refuse a second differentiation instead of acting as constants (which would give a
        # silently wrong second derivative).
        inputs = [out_grad, *node.inputs]
        return tuple(FirstOrderOnly(g.realize_cached_data())(*inputs) for g in grads)

    def _refuse_unlisted_leaves(self, out: Tensor, x: Tensor) -> None:
        """ValueError naming each tensor fn used that needs a gradient but is neither the input
        nor in ``params``: its gradient cannot be routed through the checkpoint, and it would
        otherwise end up with only part of it (the uses outside the block)."""
        listed = {id(x), *(id(p) for p in self.params)}
        unlisted = [
            node
            for node in autograd.find_topo_sort([out])
            if node.op is None and node.requires_grad and id(node) not in listed
        ]
        if unlisted:
            # leaves of fn's graph are Tensors
            shapes = ", ".join(f"shape {tuple(cast(Tensor, t).shape)}" for t in unlisted)
            raise ValueError(
                f"checkpoint: fn uses {len(unlisted)} tensor(s) that require a "
                f"gradient but are not in params ({shapes}); list every such "
                f"tensor in params (a module's parameters())"
            )


class FirstOrderOnly(TensorOp):
    """A precomputed checkpoint gradient as a graph node over (out_grad, x, *params): its value
    is exact; differentiating it again raises NotImplementedError."""

    def __init__(self, value: NDArray) -> None:
        self.value = value

    def compute(self, *arrays: NDArray) -> NDArray:
        return self.value

    def gradient(self, out_grad: Tensor, node: Tensor):
        raise NotImplementedError(
            "second derivatives through a checkpoint are not supported: "
            "its gradient is computed by a separate pass"
        )


def _zeros_like(t: Tensor) -> Tensor:
    """A constant of zeros with t's shape, dtype and device (an input fn did not use)."""
    return Tensor.make_const(t.realize_cached_data() * 0)


def checkpoint(
    fn: Callable[[Tensor], Tensor], x: Tensor, params: Optional[Sequence[Tensor]] = None
) -> Tensor:
    """``fn(x)`` without keeping fn's activations; they are recomputed in backward.

    ``params`` lists every tensor ``fn`` uses that needs a gradient (a module's
    ``parameters()``); backward raises ValueError naming any such tensor left out (it would
    otherwise get only the part of its gradient from outside the block). The result has fn's output
    shape, and
    its gradients equal those of calling ``fn(x)`` directly.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"checkpoint: x must be a needle Tensor, got {type(x).__name__}")
    params = list(params or [])
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"checkpoint: params[{i}] is a {type(p).__name__}, not a Tensor")
    return CheckpointOp(fn, params)(x, *params)


class Checkpoint(Module):
    """Wraps ``module`` so that its forward activations are recomputed in backward."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"Checkpoint wraps a Module, got {type(module).__name__}")
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.module, x, self.module.parameters())


def checkpoint_sequential(modules: Sequence[Module], every: int) -> Sequential:
    """A Sequential of ``Checkpoint(Sequential(segment))`` for segments of ``every`` modules.

    Only the input of each segment is kept during forward: about len(modules)/every saved
    activations, plus one segment's activations while that segment is recomputed in backward.
    """
    modules = list(modules)
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"checkpoint_sequential: every must be a positive int, got {every!r}")
    if not modules:
        raise ValueError("checkpoint_sequential: no modules given")
    segments: List[Module] = [
        Checkpoint(Sequential(*modules[i : i + every])) for i in range(0, len(modules), every)
    ]
    return Sequential(*segments)


def sqrt_rule(n_layers: int) -> int:
    """The segment length ceil(sqrt(n)) that balances saved boundaries against one segment."""
    if n_layers < 1:
        raise ValueError(f"sqrt_rule: n_layers must be positive, got {n_layers}")
    return math.ceil(math.sqrt(n_layers))


def graph_bytes(*outputs: Tensor) -> int:
    """Bytes of the distinct arrays held by the nodes of the graph behind ``outputs``.

    Counts each underlying buffer once (views share one), so it is the memory that keeping the
    outputs alive keeps allocated: the saved activations plus the leaves (inputs, parameters).
    """
    seen = set()
    total = 0
    for node in autograd.find_topo_sort(list(outputs)):
        data = node.cached_data
        if data is None:
            continue
        key = _buffer_key(data)
        if key in seen:
            continue
        seen.add(key)
        total += _buffer_nbytes(data)
    return total


def _buffer_key(data) -> int:
    handle = getattr(data, "_handle", None)
    if handle is not None:  # an NDArray: views share the device buffer
        return id(handle)
    base = getattr(data, "base", None)  # a numpy array: views share their base
    return id(base if base is not None else data)


def _buffer_nbytes(data) -> int:
    handle = getattr(data, "_handle", None)
    if handle is not None:
        return int(handle.size) * np.dtype(data.dtype).itemsize
    base = getattr(data, "base", None)
    return int((base if base is not None else data).nbytes)
