"""Optimizers (hw2): SGD with averaged momentum and Adam, both with L2 weight decay.

Updates follow the course exactly (see each class). As the course's ``p.data = ...``, each
update gives the parameter a new array: a tensor that shared the old one (a snapshot
``ndl.Tensor(p)``, ``p.data``, ``p.detach()``, a second Parameter made from ``p``) keeps the old
values. The new values are computed on the raw arrays by one fused kernel per parameter, so no
computation graph grows across steps; ``param.grad`` is read, never modified; every state array
stays in the parameter's dtype (float32) and on its device. Optimizer state is kept per
position in the parameter list.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, Iterable, List

import numpy as np

from needle.autograd import Tensor
from needle.backend_selection import array_api


class Optimizer:
    """Base class: holds the parameter list; ``step()`` updates, ``reset_grad()`` clears grads.

    ``params`` is any iterable of Tensors (usually ``model.parameters()``). It must be
    non-empty and must not contain the same tensor twice: a duplicate would be updated twice
    per step and given two sets of optimizer state. ``step()`` checks this again, so a tensor
    appended to ``opt.params`` later is refused too.
    """

    def __init__(self, params: Iterable[Tensor]) -> None:
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(
                    f"{type(self).__name__}: parameter {i} is a "
                    f"{type(p).__name__}, not a needle Tensor"
                )
        self.params: List[Tensor] = params
        self._refuse_duplicates()

    def _refuse_duplicates(self) -> None:
        """ValueError naming the positions of a tensor that ``params`` holds twice."""
        if len({id(p) for p in self.params}) == len(self.params):
            return
        seen: Dict[int, int] = {}
        for i, p in enumerate(self.params):
            if id(p) in seen:
                raise ValueError(
                    f"{type(self).__name__}: the parameter list contains the same "
                    f"tensor twice (positions {seen[id(p)]} and {i}, shape "
                    f"{p.shape}); it would be updated twice per step"
                )
            seen[id(p)] = i

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
        total = math.sqrt(
            sum(float(np.sum(np.square(g.numpy().astype(np.float64)))) for g in grads)
        )
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad = p.grad.detach() * coef
        return total

    def _grad_and_param(self, i: int, p: Tensor):
        """(g, θ) as raw arrays of p's dtype and device, θ a compact copy of p's array that
        becomes p's array (the update kernel writes it in place); None when p has no gradient."""
        g = p.grad
        if g is None:
            return None
        if tuple(g.shape) != tuple(p.shape):
            raise ValueError(
                f"{type(self).__name__}: parameter {i} has shape {p.shape} but its "
                f"grad has shape {g.shape}"
            )
        if g.dtype != p.dtype or g.device != p.device:
            g = Tensor(
                g.numpy().astype(p.dtype), device=p.device, dtype=p.dtype, requires_grad=False
            )
        w = p.realize_cached_data()
        fresh = w.compact()
        if fresh is w:
            fresh = w.copy()
        p.replace_array(fresh)  # the course's p.data = new value
        return g.realize_cached_data(), fresh

    def _zeros(self, w):
        """A zero optimizer-state array shaped like the raw array ``w``, on its device."""
        return array_api.full(tuple(w.shape), 0.0, dtype=w.dtype, device=w.device)

    def _scratch(self, w):
        """An uninitialised array shaped like the raw array ``w``, on its device (a kernel's
        workspace for one call)."""
        return array_api.empty(tuple(w.shape), dtype=w.dtype, device=w.device)


def _hyper(
    owner: str,
    name: str,
    value,
    low: float,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float after checking it is a finite real number in the stated interval
    (TypeError for a non-number, ValueError naming the argument otherwise)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number, got {value!r}")
    value = float(value)
    ok = (
        math.isfinite(value)
        and (value > low if low_open else value >= low)
        and (value < high if high_open else value <= high)
    )
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{owner}: {name} must be a finite number in {interval}, got {value!r}")
    return value


class SGD(Optimizer):
    """Stochastic gradient descent with averaged momentum and L2 weight decay.

    g = grad + weight_decay·θ;  u = momentum·u + (1 - momentum)·g  (u starts at 0);
    θ = θ - lr·u. Note the average: PyTorch's SGD uses u = momentum·u + g instead.

    ``self.u`` holds u per parameter index while momentum > 0. With momentum 0 the rule is
    θ = θ - lr·g, which needs no state, so none is kept (as in PyTorch's SGD): a step at momentum
    0 drops u, and a momentum raised later starts u again from 0, as at construction (the
    course's code would keep the last g as u; keeping it costs a copy of every parameter).

    Each step is one fused kernel per parameter (``array_api.sgd_update_``) that writes the
    parameter's new array (see the module's docstring: what shared the old array keeps it).
    ``lr`` and ``weight_decay`` must be finite and ≥ 0, ``momentum``
    in [0, 1) (checked at construction and at every step, so a schedule cannot slip in a NaN).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params)
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.u: dict = {}
        self._hypers()

    def _hypers(self):
        return (
            _hyper("SGD", "lr", self.lr, 0.0),
            _hyper("SGD", "momentum", self.momentum, 0.0, 1.0, high_open=True),
            _hyper("SGD", "weight_decay", self.weight_decay, 0.0),
        )

    # question: hw2_sgd
    def step(self) -> None:
        """One SGD update of every parameter that has a gradient."""
        lr, beta, wd = self._hypers()
        self._refuse_duplicates()
        for i, p in enumerate(self.params):
            arrays = self._grad_and_param(i, p)
            if arrays is None:
                continue
            g, w = arrays
            if beta == 0.0:  # u = g: a scratch for the kernel, not state (see the docstring)
                self.u.pop(i, None)
                array_api.sgd_update_(w, g, self._scratch(w), lr, beta, wd)
                continue
            if i not in self.u:
                self.u[i] = self._zeros(w)
            array_api.sgd_update_(w, g, self.u[i], lr, beta, wd)


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay (added to the gradient).

    g = grad + weight_decay·θ;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
    m̂ = m/(1-β1^t);  v̂ = v/(1-β2^t);  θ = θ - lr·m̂/(sqrt(v̂) + eps), where t counts
    ``step()`` calls (including those in which a parameter had no gradient).

    One fused kernel per parameter (``array_api.adam_update_``) writing its new array, as for
    :class:`SGD`.
    ``lr`` and ``weight_decay`` must be finite and ≥ 0, ``beta1``/``beta2`` in [0, 1) and
    ``eps`` finite and > 0 (checked at construction and at every step).
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params)
        self.lr = lr
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        self.t = 0
        self.m: dict = {}
        self.v: dict = {}
        self._hypers()

    def _hypers(self):
        return (
            _hyper("Adam", "lr", self.lr, 0.0),
            _hyper("Adam", "beta1", self.beta1, 0.0, 1.0, high_open=True),
            _hyper("Adam", "beta2", self.beta2, 0.0, 1.0, high_open=True),
            _hyper("Adam", "eps", self.eps, 0.0, low_open=True),
            _hyper("Adam", "weight_decay", self.weight_decay, 0.0),
        )

    # question: hw2_adam
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient."""
        lr, b1, b2, eps, wd = self._hypers()
        self._refuse_duplicates()
        self.t += 1
        for i, p in enumerate(self.params):
            arrays = self._grad_and_param(i, p)
            if arrays is None:
                continue
            g, w = arrays
            if i not in self.m:
                self.m[i], self.v[i] = self._zeros(w), self._zeros(w)
            array_api.adam_update_(w, g, self.m[i], self.v[i], lr, b1, b2, eps, wd, self.t)
