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
from needle.ops.ops_mathematic import NCHW_TO_NHWC, NHWC_TO_NCHW  # noqa: F401 (re-exported)


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

    def submodules(self) -> List["Module"]:
        """Every sub-module (not self), each once, in discovery order (an extension)."""
        walk = _Walk()
        walk.seen_modules.add(id(self))
        return list(walk.modules(self.__dict__, ""))

    def _children(self) -> List["Module"]:
        """The course's name for :meth:`submodules`."""
        return self.submodules()

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


# question: hw2_linear
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


# question: hw2_flatten
class Flatten(Module):
    """(N, d1, d2, ...) -> (N, d1·d2·...)."""

    def forward(self, X: Tensor) -> Tensor:
        return X.reshape((X.shape[0], int(np.prod(X.shape[1:]))))


# question: hw2_relu
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


# question: hw2_sequential
class Sequential(Module):
    """Applies ``modules`` in order; they are stored as the tuple ``self.modules``."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(m).__name__}, not a Module")
        self.modules = modules

    def forward(self, x: Tensor) -> Tensor:
        for module in self.modules:
            x = module(x)
        return x


def check_softmax_loss_shapes(logits: Tensor, y: Tensor) -> None:
    """Raise ValueError unless ``logits`` is (N, k) and ``y`` is (N,)."""
    if len(logits.shape) != 2:
        raise ValueError(f"SoftmaxLoss expects logits of shape (N, k), got {logits.shape}")
    n = logits.shape[0]
    if tuple(y.shape) != (n,):
        raise ValueError(
            f"SoftmaxLoss expects labels of shape ({n},) for logits of shape "
            f"{logits.shape}, got {y.shape}"
        )


# question: hw2_softmax_loss
class SoftmaxLoss(Module):
    """Mean cross-entropy of logits (N, k) against integer labels y (N,); returns a scalar.

    loss = mean_i(logsumexp(z_i) - z_i[y_i]): the stable ``ops.logsumexp`` of each row minus
    the target logit, picked by a one-hot product. The labels get no gradient.
    """

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        check_softmax_loss_shapes(logits, y)
        n, k = logits.shape
        y_one_hot = init.one_hot(k, y, device=logits.device, dtype=logits.dtype)
        z_y = (logits * y_one_hot).sum((1,))
        return (ops.logsumexp(logits, (1,)) - z_y).sum() / n


def check_features(x: Tensor, dim: int, name: str) -> None:
    """Raise ValueError unless ``x`` is (N, dim), the input ``name`` takes."""
    if len(x.shape) != 2 or x.shape[1] != dim:
        raise ValueError(f"{name} expects input of shape (N, {dim}), got {x.shape}")


# question: hw2_batchnorm
class BatchNorm1d(Module):
    """Batch normalisation over the batch axis: x (N, dim) -> (N, dim).

    Training: y = w·(x - mean)/sqrt(var + eps) + b with the batch mean and biased batch
    variance, and running = (1 - momentum)·running + momentum·observed (plain arrays, outside
    the graph). Evaluation uses the running statistics. weight and bias have shape (dim,).
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
        check_features(x, self.dim, type(self).__name__)
        n = x.shape[0]
        if self.training:
            mean = x.sum((0,)) / n
            centred = x - mean.reshape((1, self.dim)).broadcast_to(x.shape)
            var = (centred**2).sum((0,)) / n
            m = self.momentum
            self.running_mean = (1 - m) * self.running_mean + m * mean.detach()
            self.running_var = (1 - m) * self.running_var + m * var.detach()
        else:
            centred = x - self.running_mean.reshape((1, self.dim)).broadcast_to(x.shape)
            var = self.running_var
        std = ((var + self.eps) ** 0.5).reshape((1, self.dim)).broadcast_to(x.shape)
        w = self.weight.reshape((1, self.dim)).broadcast_to(x.shape)
        b = self.bias.reshape((1, self.dim)).broadcast_to(x.shape)
        return w * (centred / std) + b


class BatchNorm2d(BatchNorm1d):
    """Batch normalisation per channel of an NCHW tensor: x (N, C, H, W) -> (N, C, H, W).

    As the course does it: move channels last with two transposes, view as (N·H·W, C), apply
    BatchNorm1d, and undo.
    """

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) != 4 or x.shape[1] != self.dim:
            raise ValueError(
                f"BatchNorm2d expects input of shape (N, {self.dim}, H, W), got {x.shape}"
            )
        n, c, h, w = x.shape
        rows = x.transpose((1, 2)).transpose((2, 3)).reshape((n * h * w, c))
        y = super().forward(rows).reshape((n, h, w, c))
        return y.transpose((2, 3)).transpose((1, 2))


# question: hw2_layernorm
class LayerNorm1d(Module):
    """Layer normalisation over the last axis: x (..., dim) -> (..., dim).

    y = w·(x - mean)/sqrt(var + eps) + b with the mean and biased variance of each row; weight
    and bias have shape (dim,). The course takes 2-D input; more leading axes are an extension
    (they are flattened into rows).
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
        shape = x.shape
        if len(shape) != 2:
            x = x.reshape((math.prod(shape[:-1]), self.dim))
        n = x.shape[0]
        mean = (x.sum((1,)) / self.dim).reshape((n, 1)).broadcast_to(x.shape)
        centred = x - mean
        var = ((centred**2).sum((1,)) / self.dim).reshape((n, 1)).broadcast_to(x.shape)
        std = (var + self.eps) ** 0.5
        w = self.weight.reshape((1, self.dim)).broadcast_to(x.shape)
        b = self.bias.reshape((1, self.dim)).broadcast_to(x.shape)
        y = w * centred / std + b
        return y.reshape(shape) if len(shape) != 2 else y


# question: hw2_dropout
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


# question: hw2_residual
class Residual(Module):
    """fn(x) + x; fn must keep the shape."""

    def __init__(self, fn: Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor) -> Tensor:
        return self.fn(x) + x
