"""The course's training loops keep their memory flat with the cycle collector off.

A default ``backward()`` records each gradient's graph (the course's semantics), and a
parameter's gradient graph refers back to the parameter: the only reference cycles a step
leaves, released when ``opt.reset_grad()`` clears the gradients at the next step. So, with
``gc.disable()``, neither the live-Value count nor the resident memory may grow over the loop:
``opt.reset_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step()``, with the LSTM's
state detached between chunks. The 1,000-step versions are marked ``slow`` (``NEEDLE_SLOW=1``).
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import needle as ndl
from companion.apps.language_model import LanguageModel
from companion.apps.models import ResNet9
from companion.apps.ptb_training import detach_state
from needle import autograd

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc"
)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run_flat(step, steps: int, check_at: int):
    """Run ``step()`` ``steps`` times with the cycle collector off; returns (live-Value counts
    after each step, RSS at ``check_at``, largest RSS after it)."""
    counts, base, peak = [], None, 0
    gc.collect()
    gc.disable()
    try:
        for i in range(1, steps + 1):
            step()
            counts.append(autograd.TENSOR_COUNTER)
            if i == check_at:
                base = _rss_bytes()
            elif i > check_at:
                peak = max(peak, _rss_bytes())
    finally:
        gc.enable()
    return counts, base, peak


def _mlp_step(batch=64, sizes=(256, 512, 512, 10)):
    rng = np.random.default_rng(0)
    x = ndl.Tensor(rng.standard_normal((batch, sizes[0])).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, sizes[-1], batch).astype(np.float32), requires_grad=False)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [ndl.nn.Linear(n_in, n_out)] + ([ndl.nn.ReLU()] if i < len(sizes) - 2 else [])
    model = ndl.nn.Sequential(*layers)
    loss_fn, opt = ndl.nn.SoftmaxLoss(), ndl.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.reset_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def _lstm_lm_step(seq_len=16, batch=8, vocab=200):
    rng = np.random.default_rng(1)
    model = LanguageModel(32, vocab, 32, num_layers=2, seq_model="lstm", seq_len=seq_len)
    loss_fn, opt = ndl.nn.SoftmaxLoss(), ndl.optim.SGD(model.parameters(), lr=0.1)
    state = {"h": None}

    def step():
        ids = rng.integers(0, vocab, (seq_len + 1, batch)).astype(np.float32)
        x = ndl.Tensor(ids[:-1], requires_grad=False)
        y = ndl.Tensor(ids[1:].reshape(-1), requires_grad=False)
        opt.reset_grad()
        out, h = model(x, state["h"])
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        state["h"] = detach_state(h)

    return step


def _resnet9_step(batch=4):
    rng = np.random.default_rng(2)
    model = ResNet9()
    model.train()
    loss_fn, opt = ndl.nn.SoftmaxLoss(), ndl.optim.SGD(model.parameters(), lr=0.01)
    x = ndl.Tensor(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), requires_grad=False)
    y = ndl.Tensor(rng.integers(0, 10, batch).astype(np.float32), requires_grad=False)

    def step():
        opt.reset_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


MODELS = {"mlp": _mlp_step, "lstm_lm": _lstm_lm_step, "resnet9": _resnet9_step}


def _assert_flat(counts, base, peak):
    assert len(set(counts[1:])) == 1, f"live Values grow: {counts[:5]} ... {counts[-5:]}"
    assert peak <= 1.15 * base, f"RSS grew from {base / 2**20:.0f} MiB to {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("name", list(MODELS))
def test_course_training_loop_memory_stays_flat(name):
    """60 steps: the live-Value count is the same after every step but the first, and the
    resident memory stays within 15 % of its step-20 value."""
    _assert_flat(*_run_flat(MODELS[name](), steps=60, check_at=20))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_course_training_loop_memory_stays_flat_1000_steps(name):
    """The issue's case: 1,000 steps, RSS within 15 % of its step-100 value, no gc.collect()."""
    _assert_flat(*_run_flat(MODELS[name](), steps=1000, check_at=100))
