"""The basic modules of needle.nn (hw2): Parameter, Module and the layers built on them.

Parameter discovery (:meth:`Module.parameters`) walks a module's attributes in definition
order and descends into sub-modules, lists, tuples and dicts (nested to any depth); see its
docstring for the exact policy.
"""

import math
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

import needle.init as init
from needle import ops
from needle.autograd import Tensor
from needle.ops import ops_fused
from needle.ops.ops_mathematic import NCHW_TO_NHWC, NHWC_TO_NCHW


class Parameter(Tensor):
    """A tensor that a :class:`Module` reports from ``parameters()`` (a trainable weight)."""


class _Walk:
    """Depth-first walk over a module's attributes: one shared state for one traversal.

    Each Parameter is yielded once (the first occurrence in walk order wins, compared by
    identity) and each module is entered once, which also makes reference cycles safe.
    """

    def __init__(self) -> None:
        self.seen_params: set = set()
        self.seen_modules: set = set()

    def params(self, value: Any, prefix: str) -> Iterator[Tuple[str, "Parameter"]]:
        if isinstance(value, Parameter):
            if id(value) not in self.seen_params:
                self.seen_params.add(id(value))
                yield prefix, value
        elif isinstance(value, Module):
            if id(value) not in self.seen_modules:
                self.seen_modules.add(id(value))
                yield from self.params(value.__dict__, prefix)
        elif isinstance(value, dict):
            for key, v in value.items():
                yield from self.params(v, _join(prefix, key))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from self.params(v, _join(prefix, i))
        elif isinstance(value, (set, frozenset)):
            _reject_unordered(value, prefix)

    def modules(self, value: Any, prefix: str) -> Iterator["Module"]:
        if isinstance(value, Module):
            if id(value) not in self.seen_modules:
                self.seen_modules.add(id(value))
                yield value
                yield from self.modules(value.__dict__, prefix)
        elif isinstance(value, dict):
            for key, v in value.items():
                yield from self.modules(v, _join(prefix, key))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from self.modules(v, _join(prefix, i))
        elif isinstance(value, (set, frozenset)):
            _reject_unordered(value, prefix)


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _holds_module_or_param(value: Any) -> bool:
    if isinstance(value, (Parameter, Module)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_module_or_param(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_module_or_param(v) for v in value.values())
    return False


def _reject_unordered(value: Any, prefix: str) -> None:
    if _holds_module_or_param(value):
        raise TypeError(
            f"attribute {prefix!r} is a {type(value).__name__} holding parameters or modules: a "
            "set has no stable order, so parameters() could list them in a different order on "
            "each run and optimizer state would be matched to the wrong tensors; use a list, "
            "tuple or dict instead"
        )


class Module:
    """Base class of every layer: holds parameters and sub-modules as attributes.

    ``module(x)`` calls ``forward(x)``. ``training`` is True after construction and is switched
    for the whole tree by :meth:`train` and :meth:`eval`.
    """

    training: bool = True  # a class default, so a subclass that skips __init__ still works

    def __init__(self) -> None:
        self.training = True

    def named_parameters(self) -> Iterator[Tuple[str, "Parameter"]]:
        """Yield ``(dotted_name, parameter)`` in the order of :meth:`parameters`.

        Names join attribute names, list/tuple indices and dict keys with dots, e.g.
        ``"layers.0.weight"`` or ``"branches.left.s"``.
        """
        return _Walk().params(self.__dict__, "")

    def parameters(self) -> List[Tensor]:
        """The module's parameters, each listed once.

        Discovery policy: attributes are visited in definition order (``self.__dict__``); a
        :class:`Parameter` is collected, a :class:`Module` is descended into, and lists, tuples
        and dicts (in index / insertion order, nested to any depth) are searched too. Plain
        tensors that are not Parameters (e.g. running statistics) are not parameters. A
        parameter reachable twice (shared by two sub-modules, or stored twice) is returned
        once, at its first position; identity decides, not value. A set or frozenset holding a
        parameter or module raises TypeError, because its iteration order is not stable.
        """
        return [p for _, p in self.named_parameters()]

    def _children(self) -> List["Module"]:
        """Every sub-module (not self), each once, in discovery order."""
        walk = _Walk()
        walk.seen_modules.add(id(self))
        return list(walk.modules(self.__dict__, ""))

    def eval(self) -> "Module":
        """Switch this module and every sub-module to evaluation mode (returns self)."""
        self.training = False
        for m in self._children():
            m.training = False
        return self

    def train(self) -> "Module":
        """Switch this module and every sub-module to training mode (returns self)."""
        self.training = True
        for m in self._children():
            m.training = True
        return self

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Identity(Module):
    """f(x) = x, any shape."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    """y = x @ W + b with W (in_features, out_features) and b (1, out_features).

    x is (N, in_features) (or (..., in_features)); y is (N, out_features). W is drawn first as
    kaiming_uniform(in, out), then b as kaiming_uniform(out, 1) reshaped to (1, out), matching
    the course's RNG order.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype: str = "float32",
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(
            init.kaiming_uniform(
                in_features, out_features, device=device, dtype=dtype, requires_grad=True
            )
        )
        self.bias: Optional[Parameter]
        if bias:
            b = init.kaiming_uniform(out_features, 1, device=device, dtype=dtype)
            self.bias = Parameter(b.reshape((1, out_features)), requires_grad=True)
        else:
            self.bias = None

    def forward(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.in_features:
            raise ValueError(
                f"Linear expects inputs with {self.in_features} features in the last "
                f"dimension, got shape {X.shape}"
            )
        out = X @ self.weight
        if self.bias is not None:
            out = ops.bias_add(out, self.bias)  # = out + bias.broadcast_to(out.shape)
        return out


class Flatten(Module):
    """(N, d1, d2, ...) -> (N, d1·d2·...)."""

    def forward(self, X: Tensor) -> Tensor:
        return X.reshape((X.shape[0], int(np.prod(X.shape[1:]))))


class ReLU(Module):
    """max(x, 0) element-wise."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.relu(x)


class Tanh(Module):
    """tanh(x) element-wise."""

    def forward(self, x: Tensor) -> Tensor:
        return ops.tanh(x)


class Sigmoid(Module):
    """1 / (1 + exp(-x)) element-wise.

    Computed as (1 + tanh(x/2)) / 2, the same function, because the course's form
    (1 + exp(-x))**-1 overflows exp for x below about -88 in float32 and its gradient is then
    0·inf = NaN.
    """

    def forward(self, x: Tensor) -> Tensor:
        return (ops.tanh(x * 0.5) + 1) * 0.5


class Sequential(Module):
    """Applies ``modules`` in order; they are stored as the tuple ``self.modules``.

    An extension, the same values: in training, a ``BatchNorm1d`` right after a ``Linear``
    with a bias, and a ``ReLU`` right after such a ``BatchNorm1d``, join its one node
    (``ops_fused.BatchNormTrain`` with the Linear's bias and the ReLU), so the graph does not
    keep the Linear's sum with its bias and the norm's output beside the block's result (hw2's
    MLP-ResNet: 0.24 MB of a step's peak). Only these exact classes are joined; a subclass, or a
    module replaced by another, is called as it is.
    """

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(m).__name__}, not a Module")
        self.modules = modules

    def forward(self, x: Tensor) -> Tensor:
        modules, i = self.modules, 0
        while i < len(modules):
            m = modules[i]
            norm = modules[i + 1] if i + 1 < len(modules) else None
            if (
                isinstance(m, Linear)
                and type(norm) is BatchNorm1d
                and norm.training
                and _joins_norm(m, x)
            ):
                relu = i + 2 < len(modules) and type(modules[i + 2]) is ReLU
                x = _linear_norm(m, norm, x, relu)
                i += 3 if relu else 2
                continue
            if type(m) is BatchNorm1d and m.training and type(norm) is ReLU:
                _check_features(x, m.dim, "BatchNorm1d")
                x = m._normalise(x, relu=True)
                i += 2
                continue
            x = m(x)
            i += 1
        return x


def _joins_norm(m: "Linear", x: Tensor) -> bool:
    """True when ``m`` is an nn.Linear itself (not a subclass) with a bias that takes ``x`` as
    it is (2-D, its features): Sequential then runs it and the BatchNorm1d after as one node."""
    return (
        type(m) is Linear
        and m.bias is not None
        and len(x.shape) == 2
        and x.shape[1] == m.in_features
    )


def _linear_norm(linear: "Linear", norm: "BatchNorm1d", x: Tensor, relu: bool) -> Tensor:
    """norm(linear(x)), then its ReLU when ``relu``: the product, then the bias, the norm and
    the ReLU as one node (the same values as the modules called in turn)."""
    h = x @ linear.weight
    _check_features(h, norm.dim, "BatchNorm1d")
    return norm._normalise(h, pre_bias=linear.bias, relu=relu)


class SoftmaxLoss(Module):
    """Mean cross-entropy of logits (N, k) against integer labels y (N,); returns a scalar.

    loss = mean_i(logsumexp(z_i) - z_i[y_i]), computed by one fused kernel
    (``ops_fused.softmax_cross_entropy``) that subtracts each row's max, so large logits do not
    overflow and a non-target logit of -inf contributes nothing (the loss stays finite, as in
    PyTorch). The labels get no gradient.
    """

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        if len(logits.shape) != 2:
            raise ValueError(f"SoftmaxLoss expects logits of shape (N, k), got {logits.shape}")
        n, k = logits.shape
        if tuple(y.shape) != (n,):
            raise ValueError(
                f"SoftmaxLoss expects labels of shape ({n},) for logits of shape "
                f"{logits.shape}, got {y.shape}"
            )
        return ops_fused.softmax_cross_entropy(logits, y)


def _check_features(x: Tensor, dim: int, name: str) -> None:
    if len(x.shape) != 2 or x.shape[1] != dim:
        raise ValueError(f"{name} expects input of shape (N, {dim}), got {x.shape}")


class BatchNorm1d(Module):
    """Batch normalisation over the batch axis: x (N, dim) -> (N, dim).

    Training: y = w·(x - mean)/sqrt(var + eps) + b with the batch mean and biased batch
    variance (one fused kernel forward, one backward), and running = (1 - momentum)·running +
    momentum·observed. Evaluation uses the running statistics (plain tensors, not parameters).
    weight and bias have shape (dim,). An empty batch in training mode leaves the running
    statistics unchanged and returns the empty output.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-5,
        momentum: float = 0.1,
        device=None,
        dtype: str = "float32",
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.momentum = momentum
        self.weight = Parameter(init.ones(dim, device=device, dtype=dtype, requires_grad=True))
        self.bias = Parameter(init.zeros(dim, device=device, dtype=dtype, requires_grad=True))
        self.running_mean = init.zeros(dim, device=device, dtype=dtype)
        self.running_var = init.ones(dim, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        _check_features(x, self.dim, type(self).__name__)
        return self._normalise(x)

    def fold_statistics(self, op: Any, out: Tensor) -> Tensor:
        """``out``, the result of a training-mode batch-norm ``op`` over this module's channels
        (one with ``statistics()``: ``ops_fused.BatchNormTrain``, ``ConvBatchNormTrain``), after
        folding the op's batch mean and variance into the running averages (an extension)."""
        out.realize_cached_data()  # computed now even in lazy mode: the statistics are read
        mean, var = op.statistics()
        m = self.momentum
        # plain arrays: the running statistics never join the graph
        self.running_mean = Tensor.make_const(
            self.running_mean.realize_cached_data() * (1 - m) + mean * m
        )
        self.running_var = Tensor.make_const(
            self.running_var.realize_cached_data() * (1 - m) + var * m
        )
        return out

    def _normalise(
        self, x: Tensor, pre_bias: Optional[Tensor] = None, relu: bool = False
    ) -> Tensor:
        """Normalise each column of ``x`` (..., dim) over all its leading indices; with
        ``pre_bias`` (dim elements) added to x first and max(·, 0) applied after when ``relu``
        (in training, all in one node: ``ops_fused.BatchNormTrain``)."""
        n = math.prod(x.shape[:-1])
        if self.training and n > 0:
            op = ops_fused.BatchNormTrain(self.eps, pre_bias=pre_bias is not None, relu=relu)
            return self.fold_statistics(op, op.apply(x, self.weight, self.bias, pre_bias))
        # Evaluation, and an empty training batch (which has no statistics: the running
        # statistics stay unchanged and the empty output is normalised with them, as in PyTorch).
        if pre_bias is not None:
            x = ops.bias_add(x, pre_bias)
        row = (1,) * (len(x.shape) - 1) + (self.dim,)
        centred = x - self.running_mean.reshape(row).broadcast_to(x.shape)
        std = ((self.running_var + self.eps) ** 0.5).reshape(row).broadcast_to(x.shape)
        w = self.weight.reshape(row).broadcast_to(x.shape)
        b = self.bias.reshape(row).broadcast_to(x.shape)
        out = w * (centred / std) + b
        return ops.relu(out) if relu else out


class BatchNorm2d(BatchNorm1d):
    """Batch normalisation per channel of an NCHW tensor: x (N, C, H, W) -> (N, C, H, W).

    As the course does it: move channels last, view as (N·H·W, C), apply BatchNorm1d, undo
    (each layout change one ``permute`` rather than the course's two transposes).
    """

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) != 4 or x.shape[1] != self.dim:
            raise ValueError(
                f"BatchNorm2d expects input of shape (N, {self.dim}, H, W), got {x.shape}"
            )
        y = self.forward_nhwc(ops.permute(x, NCHW_TO_NHWC))
        return ops.permute(y, NHWC_TO_NCHW)

    def forward_nhwc(
        self, x: Tensor, pre_bias: Optional[Tensor] = None, relu: bool = False
    ) -> Tensor:
        """Normalise channels-last ``x`` (N, H, W, C) per channel; returns (N, H, W, C).

        The same map as :meth:`forward` without its two layout changes. ``pre_bias`` (C
        elements, say the convolution's bias) is added to x first and ``relu`` applies max(·, 0)
        after: the same values as ``bias_add``, this layer and ``ReLU`` in turn, one graph node
        in training."""
        if len(x.shape) != 4 or x.shape[3] != self.dim:
            raise ValueError(
                f"BatchNorm2d.forward_nhwc expects input of shape "
                f"(N, H, W, {self.dim}), got {x.shape}"
            )
        return self._normalise(x, pre_bias, relu)


class LayerNorm1d(Module):
    """Layer normalisation over the last axis: x (..., dim) -> (..., dim).

    y = w·(x - mean)/sqrt(var + eps) + b with the mean and biased variance of each row (one
    fused kernel forward, one backward); weight and bias have shape (dim,). The course takes
    2-D input; more leading axes are an extension.
    """

    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype: str = "float32") -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = Parameter(init.ones(dim, device=device, dtype=dtype, requires_grad=True))
        self.bias = Parameter(init.zeros(dim, device=device, dtype=dtype, requires_grad=True))

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm1d expects input of shape (..., {self.dim}), got {x.shape}")
        return ops_fused.layernorm_rows(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Zeroes each element with probability p in training and scales survivors by 1/(1-p).

    The mask is ``init.randb(*x.shape, p=1-p)`` (one numpy RNG call per forward); in eval
    mode the module is the identity. Any shape.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout probability p must lie in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return x
        mask = init.randb(*x.shape, p=1 - self.p, device=x.device, dtype=x.dtype)
        return x * mask / (1 - self.p)


class Residual(Module):
    """fn(x) + x; fn must keep the shape."""

    def __init__(self, fn: Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x) + x
