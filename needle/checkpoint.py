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

Random numbers: the random arrays the block draws in forward through a device (``init.rand``,
``init.randn``, ``init.randb``, so Dropout's masks) are kept, per block, and given back in the same
order to the recomputation, so it uses the same masks; numpy's global random state is never
rewound, so other threads drawing at the same time (another training thread, a data loader) neither
change the block's masks nor get their own numbers repeated. Keeping them costs one array per draw
until the backward pass. A recomputation that draws differently (another shape, or more or fewer
draws) raises RuntimeError; numbers drawn from numpy directly inside ``fn`` are not kept.

Limits: second derivatives through a checkpoint are not supported: the gradients it gives are
exact, and differentiating one of them again raises NotImplementedError. A module that updates
state in forward (BatchNorm's running statistics) updates it twice.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from needle import autograd
from needle.autograd import Tensor, TensorOp
from needle.backend_selection import NDArray
from needle.nn import Module, Sequential

# One random draw of a checkpointed block: (kind "rand"/"randn", shape, dtype, device, array).
Draw = Tuple[str, Tuple[Any, ...], str, Any, Any]


class _Replay:
    """The draws a block's forward pass made, given back in order to its recomputation."""

    def __init__(self, draws: List[Draw]) -> None:
        self.draws = draws
        self.taken = 0

    def take(self, kind: str, shape: Tuple[Any, ...], dtype: str, device: Any) -> Any:
        """The recorded array of the next draw, which must be the same kind of draw."""
        if self.taken >= len(self.draws):
            raise RuntimeError(
                f"checkpoint: the recomputation in backward draws more random arrays than "
                f"the forward pass did ({len(self.draws)}): fn must draw the same way both "
                f"times (no branch on state that changed in between)"
            )
        want = self.draws[self.taken]
        if want[:3] != (kind, shape, dtype) or want[3] != device:
            raise RuntimeError(
                f"checkpoint: random draw {self.taken + 1} of the recomputation in backward "
                f"is {kind}{shape} ({dtype}) on {device}, the forward pass drew "
                f"{want[0]}{want[1]} ({want[2]}) on {want[3]}: fn must draw the same way "
                f"both times"
            )
        self.taken += 1
        return want[4]

    def check_all_taken(self) -> None:
        if self.taken != len(self.draws):
            raise RuntimeError(
                f"checkpoint: the recomputation in backward drew {self.taken} random "
                f"array(s), the forward pass {len(self.draws)}: fn must draw the same way "
                f"both times"
            )


class _Frames(threading.local):
    """This thread's open checkpoint frames, innermost last: a list records the draws of a
    block's forward pass, a :class:`_Replay` gives them back to its recomputation."""

    def __init__(self) -> None:
        self.frames: List[Union[List[Draw], _Replay]] = []


_frames = _Frames()


@contextlib.contextmanager
def _frame(frame: Union[List[Draw], _Replay]) -> Iterator[None]:
    _frames.frames.append(frame)
    try:
        yield
    finally:
        _frames.frames.pop()


def _hooked_draw(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``device.rand``/``randn`` that, inside a checkpointed block in this thread, takes its
    array from the innermost recomputation (if any, else from ``original``, numpy's global
    generator) and records it in every forward pass opened since."""

    def draw(device: Any, *shape: Any, dtype: str = "float32") -> Any:
        frames = _frames.frames
        if not frames:
            return original(device, *shape, dtype=dtype)
        recorders: List[List[Draw]] = []
        source = None
        for frame in reversed(frames):
            if isinstance(frame, _Replay):
                source = frame
                break
            recorders.append(frame)
        key = tuple(shape)
        if source is not None:
            array = source.take(kind, key, dtype, device)
        else:
            array = original(device, *shape, dtype=dtype)
        for recorder in recorders:
            recorder.append((kind, key, dtype, device, array))
        return array

    draw.__wrapped__ = original  # type: ignore[attr-defined]
    draw.__doc__ = original.__doc__
    return draw


def _install_draw_hooks() -> None:
    """Route every device's ``rand``/``randn`` through :func:`_hooked_draw` (once; outside a
    checkpointed block they call numpy exactly as before)."""
    from needle import backend_numpy
    from needle.backend_ndarray import device as nd_device

    for cls in (nd_device.BackendDevice, backend_numpy.CPUDevice):
        for kind in ("rand", "randn"):
            current = cls.__dict__[kind]
            if not hasattr(current, "__wrapped__"):
                setattr(cls, kind, _hooked_draw(kind, current))


_install_draw_hooks()


class CheckpointOp(TensorOp):
    """fn(x) as a single op with inputs (x, *params); its gradient re-runs fn with a graph."""

    def __init__(self, fn: Callable[[Tensor], Tensor], params: Sequence[Tensor]) -> None:
        self.fn = fn
        self.params = list(params)
        self.draws: List[Draw] = []  # the random arrays the forward pass drew, in order

    def compute(self, x: NDArray, *param_arrays: NDArray) -> NDArray:
        draws: List[Draw] = []
        with _frame(draws), autograd.no_grad():
            out = self.fn(Tensor.make_const(x))
        self.draws = draws
        if not isinstance(out, Tensor):
            raise TypeError(f"checkpoint: fn must return a Tensor, got {type(out).__name__}")
        return out.realize_cached_data()

    def gradient(self, out_grad: Tensor, node: Tensor) -> Tuple[Tensor, ...]:
        x_in = node.inputs[0]
        x = Tensor.make_const(x_in.realize_cached_data(), requires_grad=x_in.requires_grad)
        saved_grads = [p.grad for p in self.params]
        try:
            for p in self.params:
                p.grad = None
            replay = _Replay(self.draws)
            with _frame(replay), autograd.enable_grad():
                out = self.fn(x)
            replay.check_all_taken()
            outside = self._check_graph(out, x)
            if out.requires_grad:
                try:
                    autograd.compute_gradient_of_variables(
                        out, out_grad.detach(), create_graph=False
                    )
                finally:
                    for n, op, inputs in outside:  # the pass frees what it reaches: not these
                        n.op, n.inputs = op, inputs
            found = [x.grad] + [p.grad for p in self.params]
        finally:
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

    def _check_graph(self, out: Tensor, x: Tensor) -> List[Tuple[Any, Any, List[Any]]]:
        """Refuse unlisted leaves (below); return (node, op, inputs) of every interior node of
        the recomputed graph that does not depend on ``x``: it may have been made outside the
        block (``h = w * 2`` used inside fn), and the caller's graph still needs it after the
        recomputation's backward pass, which frees every node it reaches."""
        order = autograd.find_topo_sort([out])
        self._refuse_unlisted_leaves(order, x)
        freed = [n for n in order if n.requires_grad and isinstance(n.op, autograd._Released)]
        if freed:
            raise RuntimeError(
                f"checkpoint: fn uses a tensor computed outside the block that needs a "
                f"gradient (shape {tuple(cast(Tensor, freed[0]).shape)}, e.g. h = w * 2 made "
                f"before the call), and this backward(create_graph=False) had already passed "
                f"that tensor's gradient on and freed its graph before it reached the block, "
                f"so the part of its gradient from inside fn is lost: compute it inside fn, "
                f"or call backward() with create_graph=True (the default)"
            )
        from_x = {id(x)}
        for n in order:
            if any(id(i) in from_x for i in n.inputs):
                from_x.add(id(n))
        return [
            (n, n.op, list(n.inputs)) for n in order if n.op is not None and id(n) not in from_x
        ]

    def _refuse_unlisted_leaves(self, order: List[Any], x: Tensor) -> None:
        """ValueError naming each tensor fn used that needs a gradient but is neither the input
        nor in ``params``: its gradient cannot be routed through the checkpoint, and it would
        otherwise end up with only part of it (the uses outside the block)."""
        listed = {id(x), *(id(p) for p in self.params)}
        unlisted = [
            node
            for node in order
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
