"""Optimizers (hw2): SGD with averaged momentum and Adam, both with L2 weight decay.

Updates follow the course exactly (see each class) and go through ``param.data``, so no
computation graph grows across steps; ``param.grad`` is read, never modified in place; every
state tensor stays in the parameter's dtype (float32). Optimizer state is kept per position
in the parameter list.
"""
from __future__ import annotations

import math
from typing import Iterable, List

import numpy as np

import needle as ndl
from needle.autograd import Tensor


class Optimizer:
    """Base class: holds the parameter list; ``step()`` updates, ``reset_grad()`` clears grads.

    ``params`` is any iterable of Tensors (usually ``model.parameters()``). It must be
    non-empty and must not contain the same tensor twice: a duplicate would be updated twice
    per step and given two sets of optimizer state.
    """

    def __init__(self, params: Iterable[Tensor]) -> None:
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        seen = {}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} is a "
                                f"{type(p).__name__}, not a needle Tensor")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: the parameter list contains the same "
                                 f"tensor twice (positions {seen[id(p)]} and {i}, shape "
                                 f"{p.shape}); it would be updated twice per step")
            seen[id(p)] = i
        self.params: List[Tensor] = params

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient."""
        raise NotImplementedError()

    def reset_grad(self) -> None:
        """Set every parameter's ``grad`` to None."""
        for p in self.params:
            p.grad = None

    def clip_grad_norm(self, max_norm: float = 0.25) -> float:
        """Rescale all gradients together so that their global L2 norm is at most ``max_norm``.

        coef = max_norm / (norm + 1e-6), clamped to 1; each ``p.grad`` is replaced by a new
        tensor ``p.grad * coef`` (never modified in place). Returns the norm before clipping
        (an extension; the course returns nothing).
        """
        if not max_norm > 0:
            raise ValueError(f"clip_grad_norm: max_norm must be positive, got {max_norm}")
        grads = [p.grad for p in self.params if p.grad is not None]
        total = math.sqrt(sum(float(np.sum(np.square(g.numpy().astype(np.float64))))
                              for g in grads))
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad = p.grad.detach() * coef
        return total

    def _arrays(self, i: int, p: Tensor, weight_decay: float):
        """(g, θ) as raw arrays, g = p.grad + weight_decay·θ in p's dtype and device; None
        when p has no gradient.

        Updates work on raw arrays: the same float32 arithmetic the Tensor ops would do,
        without building (and discarding) a graph node per operation.
        """
        g = p.grad
        if g is None:
            return None
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(f"{type(self).__name__}: parameter {i} has shape {p.shape} but its "
                             f"grad has shape {g.shape}")
        if g.dtype != p.dtype or g.device != p.device:
            g = Tensor(g.numpy().astype(p.dtype), device=p.device, dtype=p.dtype,
                       requires_grad=False)
        g, w = g.realize_cached_data(), p.realize_cached_data()
        if weight_decay:
            g = g + w * weight_decay
        return g, w


class SGD(Optimizer):
    """Stochastic gradient descent with averaged momentum and L2 weight decay.

    g = grad + weight_decay·θ;  u = momentum·u + (1 - momentum)·g  (u starts at 0);
    θ = θ - lr·u. Note the average: PyTorch's SGD uses u = momentum·u + g instead.
    """

    def __init__(self, params: Iterable[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params)
        if lr < 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0:
            raise ValueError(f"SGD: need lr >= 0, 0 <= momentum < 1 and weight_decay >= 0; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.u: dict = {}

    def step(self) -> None:
        """One SGD update of every parameter that has a gradient."""
        lr, beta, wd = float(self.lr), float(self.momentum), float(self.weight_decay)
        for i, p in enumerate(self.params):
            arrays = self._arrays(i, p, wd)
            if arrays is None:
                continue
            g, w = arrays
            if beta:
                prev = self.u.get(i)
                # u starts at 0, and beta·0 + (1-beta)·g is exactly (1-beta)·g
                u = g * (1 - beta) if prev is None else prev * beta + g * (1 - beta)
                self.u[i] = u
            else:
                u = g
            p.data = Tensor.make_const(w - u * lr)


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay (added to the gradient).

    g = grad + weight_decay·θ;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
    m̂ = m/(1-β1^t);  v̂ = v/(1-β2^t);  θ = θ - lr·m̂/(sqrt(v̂) + eps), where t counts
    ``step()`` calls (including those in which a parameter had no gradient).
    """

    def __init__(self, params: Iterable[Tensor], lr: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params)
        if lr < 0 or not 0.0 <= beta1 < 1.0 or not 0.0 <= beta2 < 1.0 or eps < 0 \
                or weight_decay < 0:
            raise ValueError(f"Adam: need lr >= 0, 0 <= beta1, beta2 < 1, eps >= 0 and "
                             f"weight_decay >= 0; got lr={lr}, beta1={beta1}, beta2={beta2}, "
                             f"eps={eps}, weight_decay={weight_decay}")
        self.lr = lr
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        self.t = 0
        self.m: dict = {}
        self.v: dict = {}

    def step(self) -> None:
        """One Adam update of every parameter that has a gradient."""
        self.t += 1
        lr, b1, b2 = float(self.lr), float(self.beta1), float(self.beta2)
        eps, wd = float(self.eps), float(self.weight_decay)
        for i, p in enumerate(self.params):
            arrays = self._arrays(i, p, wd)
            if arrays is None:
                continue
            g, w = arrays
            if i in self.m:
                m = self.m[i] * b1 + g * (1 - b1)
                v = self.v[i] * b2 + (g ** 2) * (1 - b2)
            else:  # moments start at 0: b·0 + (1-b)·x is exactly (1-b)·x
                m, v = g * (1 - b1), (g ** 2) * (1 - b2)
            self.m[i], self.v[i] = m, v
            m_hat = m / (1 - b1 ** self.t)
            v_hat = v / (1 - b2 ** self.t)
            p.data = Tensor.make_const(w - (m_hat * lr) / (v_hat ** 0.5 + eps))
