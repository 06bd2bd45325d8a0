"""MultiHeadAttention, AttentionLayer, TransformerLayer and Transformer against float64 numpy
references.

Oracles: scaled dot-product attention, layer norm and the pre-norm block written out in numpy
with the modules' own parameter values; gradients by central finite differences of those
references; causality by perturbing a later position and watching earlier outputs (with a
non-causal control that must change).
"""

import numpy as np
import pytest
from conftest import DEVICES
from helpers import central_difference, float32_tensor

import needle as ndl
from needle import nn

pytestmark = [pytest.mark.sequence, pytest.mark.both_backends]

F32 = np.float32


T = float32_tensor
fd_grad = central_difference


def check_fd(loss_ref, arrays, grads, rtol=2e-3, atol=2e-4):
    for name, value in arrays.items():

        def f(v, name=name):
            return loss_ref({**arrays, name: v})

        np.testing.assert_allclose(
            grads[name], fd_grad(f, value), rtol=rtol, atol=atol, err_msg=f"gradient of {name}"
        )


# ---- numpy references --------------------------------------------------------------------------
def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def mha_ref(q, k, v, causal):
    """q (B,H,Tq,D), k/v (B,H,Tk,D) → (result, probs); query i sees keys j <= i + Tk - Tq."""
    logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        tq, tk = q.shape[2], k.shape[2]
        allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
        logits = np.where(allowed, logits, -np.inf)
    probs = softmax(logits)
    return probs @ v, probs


def layernorm_ref(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return w * (x - mu) / np.sqrt(var + eps) + b


def attention_layer_ref(q, k, v, p, H, D, causal):
    def heads(x, n, proj):
        b, t, _ = x.shape
        y = layernorm_ref(x, p[f"{n}.w"], p[f"{n}.b"]) @ p[proj]
        return y.reshape(b, t, H, D).transpose(0, 2, 1, 3)

    out, _ = mha_ref(heads(q, "nq", "Wq"), heads(k, "nk", "Wk"), heads(v, "nv", "Wv"), causal)
    b, _, t, _ = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, t, H * D) @ p["Wo"]


def layer_params(layer):
    """AttentionLayer's parameters as float64 numpy, keyed for attention_layer_ref."""
    g = lambda t: t.numpy().astype(np.float64)  # noqa: E731
    return {
        "nq.w": g(layer.prenorm_q.weight),
        "nq.b": g(layer.prenorm_q.bias),
        "nk.w": g(layer.prenorm_k.weight),
        "nk.b": g(layer.prenorm_k.bias),
        "nv.w": g(layer.prenorm_v.weight),
        "nv.b": g(layer.prenorm_v.bias),
        "Wq": g(layer.q_projection.weight),
        "Wk": g(layer.k_projection.weight),
        "Wv": g(layer.v_projection.weight),
        "Wo": g(layer.out_projection.weight),
    }


def layer_tensors(layer):
    return {
        "nq.w": layer.prenorm_q.weight,
        "nq.b": layer.prenorm_q.bias,
        "nk.w": layer.prenorm_k.weight,
        "nk.b": layer.prenorm_k.bias,
        "nv.w": layer.prenorm_v.weight,
        "nv.b": layer.prenorm_v.bias,
        "Wq": layer.q_projection.weight,
        "Wk": layer.k_projection.weight,
        "Wv": layer.v_projection.weight,
        "Wo": layer.out_projection.weight,
    }


def block_params(block):
    g = lambda t: t.numpy().astype(np.float64)  # noqa: E731
    p = {f"attn.{k}": v for k, v in layer_params(block.attn).items()}
    p.update(
        {
            "ln.w": g(block.layernorm.weight),
            "ln.b": g(block.layernorm.bias),
            "W1": g(block.linear1.weight),
            "b1": g(block.linear1.bias),
            "W2": g(block.linear2.weight),
            "b2": g(block.linear2.bias),
        }
    )
    return p


def block_ref(x, p, H, D, causal=True):
    attn = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    x = x + attention_layer_ref(x, x, x, attn, H, D, causal)
    y = layernorm_ref(x, p["ln.w"], p["ln.b"])
    return x + np.maximum(y @ p["W1"] + p["b1"], 0) @ p["W2"] + p["b2"]


# ---- MultiHeadAttention ------------------------------------------------------------------------
def _host(a):
    """An NDArray (nd backend) or numpy array (np backend) as numpy."""
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


@pytest.mark.hw4_extra_attention
def test_causal_mask_hand_derived():
    m = nn.MultiHeadAttention(causal=True)
    big = -np.finfo(np.float32).max
    mask = _host(m.create_causal_mask(3, 3, ndl.cpu()))
    assert mask.shape == (1, 1, 3, 3)
    np.testing.assert_array_equal(mask[0, 0], [[0, big, big], [0, 0, big], [0, 0, 0]])
    mask = _host(m.create_causal_mask(2, 4, ndl.cpu()))  # 2 queries, 4 keys
    np.testing.assert_array_equal(mask[0, 0], [[0, 0, 0, big], [0, 0, 0, 0]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(4, 4), (2, 5)])
@pytest.mark.hw4_extra_attention
def test_multihead_attention_forward_backward(device, causal, tq, tk):
    B, H, D = 2, 2, 3
    q = np.random.randn(B, H, tq, D)
    k, v = np.random.randn(B, H, tk, D), np.random.randn(B, H, tk, D)
    attn = nn.MultiHeadAttention(causal=causal, device=device)
    qt, kt, vt = T(q, device), T(k, device), T(v, device)
    result, probs = attn(qt, kt, vt)
    r_result, r_probs = mha_ref(q, k, v, causal)
    assert result.shape == (B, H, tq, D) and probs.shape == (B, H, tq, tk)
    np.testing.assert_allclose(probs.numpy(), r_probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.numpy(), r_result, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(probs.numpy().sum(-1), 1.0, rtol=1e-5)
    if causal:  # no query attends to a later key
        later = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
        assert later.any() and np.all(probs.numpy()[..., later] == 0)
    w = np.random.randn(B, H, tq, D)
    (result * T(w, device, False)).sum().backward()

    def loss(a):
        return np.sum(w * mha_ref(a["q"], a["k"], a["v"], causal)[0])

    check_fd(
        loss,
        {"q": q, "k": k, "v": v},
        {"q": qt.grad.numpy(), "k": kt.grad.numpy(), "v": vt.grad.numpy()},
    )


def course_attention(q, k, v, causal):
    """The course's MultiHeadAttention written with needle ops: logits / sqrt(D) plus
    create_causal_mask's -finfo.max, then softmax as exp(z - max) / sum (the path the fused
    kernel replaced)."""
    d = q.shape[-1]
    logits = ndl.ops.matmul(q, ndl.ops.transpose(k)) / float(np.sqrt(d))
    if causal:
        mask = nn.MultiHeadAttention().create_causal_mask(q.shape[2], k.shape[2], q.device)
        logits = logits + mask.broadcast_to(logits.shape)
    kept = logits.shape[:-1] + (1,)
    top = ndl.Tensor(logits.numpy().max(axis=-1, keepdims=True), device=q.device)
    e = ndl.ops.exp(logits - top.broadcast_to(logits.shape))
    probs = e / e.sum(axes=(3,)).reshape(kept).broadcast_to(logits.shape)
    return ndl.ops.matmul(probs, v), probs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(5, 5), (3, 6), (6, 3)])
def test_multihead_attention_matches_the_course_path(device, causal, tq, tk):
    # the fused path (strided products, scaled and masked softmax kernel) against the course's
    # ops, values and gradients; (6, 3) has queries that see no key (uniform rows)
    rng = np.random.default_rng(tq * 10 + tk)
    B, H, D = 2, 3, 4
    arrays = [rng.standard_normal(s) for s in ((B, H, tq, D), (B, H, tk, D), (B, H, tk, D))]
    w = rng.standard_normal((B, H, tq, D))
    got, want = {}, {}
    for fn in (nn.MultiHeadAttention(causal=causal, device=device), None):
        ts = [T(a, device) for a in arrays]
        result, probs = fn(*ts) if fn else course_attention(*ts, causal)
        (result * T(w, device, False)).sum().backward()
        grads = {n: t.grad.numpy() for n, t in zip("qkv", ts)}
        (got if fn else want).update(result=result.numpy(), probs=probs.numpy(), **grads)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_dropout_acts_on_probabilities(device):
    B, H, S, D = 2, 2, 6, 4
    q, k, v = (T(np.random.randn(B, H, S, D), device) for _ in range(3))
    attn = nn.MultiHeadAttention(dropout=0.5, causal=False, device=device)
    attn.eval()
    _, p_eval = attn(q, k, v)
    _, r_probs = mha_ref(q.numpy(), k.numpy(), v.numpy(), False)
    np.testing.assert_allclose(p_eval.numpy(), r_probs, rtol=1e-5, atol=1e-6)
    attn.train()
    result, p_train = attn(q, k, v)
    p_train, p_eval = p_train.numpy(), p_eval.numpy()
    dropped = p_train == 0
    assert 0.2 < dropped.mean() < 0.8
    np.testing.assert_allclose(p_train[~dropped], 2 * p_eval[~dropped], rtol=1e-5)
    np.testing.assert_allclose(result.numpy(), p_train @ v.numpy(), rtol=1e-4, atol=1e-5)


# ---- AttentionLayer ----------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.hw4_extra_attention_layer
def test_attention_layer_self_attention_forward_backward(device, causal):
    B, S, F, H, D = 2, 3, 4, 2, 3
    np.random.seed(5)
    layer = nn.AttentionLayer(F, H, D, causal=causal, device=device)
    assert layer.q_projection.weight.shape == (F, H * D) and layer.q_projection.bias is None
    assert layer.out_projection.weight.shape == (H * D, F) and layer.out_projection.bias is None
    # perturb the norms away from (1, 0) so their gradients are exercised non-trivially
    for ln in (layer.prenorm_q, layer.prenorm_k, layer.prenorm_v):
        ln.weight.data = T(1 + 0.3 * np.random.randn(F), device, False)
        ln.bias.data = T(0.3 * np.random.randn(F), device, False)
    x = np.random.randn(B, S, F)
    xt = T(x, device)
    out = layer(xt)
    p = layer_params(layer)
    assert out.shape == (B, S, F)
    np.testing.assert_allclose(
        out.numpy(), attention_layer_ref(x, x, x, p, H, D, causal), rtol=1e-4, atol=1e-5
    )
    assert layer.probs.shape == (B, H, S, S)
    w = np.random.randn(B, S, F)
    (out * T(w, device, False)).sum().backward()
    grads = {n: t.grad.numpy() for n, t in layer_tensors(layer).items()}
    grads["x"] = xt.grad.numpy()

    def loss(a):
        return np.sum(w * attention_layer_ref(a["x"], a["x"], a["x"], a, H, D, causal))

    check_fd(loss, {"x": x, **p}, grads, rtol=5e-3, atol=5e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_extra_attention_layer
def test_attention_layer_cross_attention_feature_sizes(device):
    B, Tq, Tk, H, D = 2, 3, 5, 2, 2
    layer = nn.AttentionLayer(
        4, H, D, k_features=3, v_features=6, out_features=5, causal=False, device=device
    )
    q, k, v = np.random.randn(B, Tq, 4), np.random.randn(B, Tk, 3), np.random.randn(B, Tk, 6)
    out = layer(T(q, device), T(k, device), T(v, device))
    assert out.shape == (B, Tq, 5)
    ref = attention_layer_ref(q, k, v, layer_params(layer), H, D, False)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="k must have 3 features"):
        layer(T(q, device), T(v, device), T(v, device))


# ---- causality ---------------------------------------------------------------------------------
def _perturb_later(model, x, t0, time_axis):
    """Outputs before and after changing every input at positions >= t0."""
    y0 = model(x)
    y0 = (y0[0] if isinstance(y0, tuple) else y0).numpy()
    x2 = x.numpy().copy()
    idx = [slice(None)] * 3
    idx[time_axis] = slice(t0, None)
    x2[tuple(idx)] += 3.0 * np.random.randn(*x2[tuple(idx)].shape)
    y1 = model(ndl.Tensor(x2, device=x.device))
    y1 = (y1[0] if isinstance(y1, tuple) else y1).numpy()
    before = [slice(None)] * 3
    before[time_axis] = slice(0, t0)
    after = [slice(None)] * 3
    after[time_axis] = slice(t0, None)
    return (np.abs(y1 - y0)[tuple(before)].max(), np.abs(y1 - y0)[tuple(after)].max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False])
def test_no_position_attends_to_a_later_one(device, causal):
    B, S, F = 2, 6, 8
    x = T(np.random.randn(B, S, F), device)
    models = [
        (nn.AttentionLayer(F, 2, 4, causal=causal, device=device), 1),
        (nn.TransformerLayer(F, 2, 4, 16, causal=causal, device=device), 1),
        (
            nn.Transformer(
                F,
                16,
                2,
                num_head=2,
                dim_head=4,
                causal=causal,
                device=device,
                batch_first=True,
                sequence_len=S,
            ),
            1,
        ),
    ]
    for model, axis in models:
        for t0 in (1, 3, 5):
            d_before, d_after = _perturb_later(model, x, t0, axis)
            assert d_after > 1e-3, type(model).__name__
            if causal:
                assert d_before < 1e-5, (type(model).__name__, t0, d_before)
            else:  # the control: without the mask, earlier outputs do see the change
                assert d_before > 1e-3, (type(model).__name__, t0, d_before)
    # time-major Transformer: the time axis is 0
    tm = nn.Transformer(F, 16, 1, num_head=2, dim_head=4, causal=causal, device=device)
    d_before, d_after = _perturb_later(tm, T(np.random.randn(S, B, F), device), 2, 0)
    assert d_after > 1e-3 and ((d_before < 1e-5) if causal else (d_before > 1e-3))


# ---- TransformerLayer and Transformer ----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_extra_transformer_layer
def test_transformer_layer_forward_backward(device):
    B, S, F, H, D, HID = 2, 3, 4, 2, 2, 5
    layer = nn.TransformerLayer(F, H, D, HID, device=device)
    x = np.random.randn(B, S, F)
    xt = T(x, device)
    out = layer(xt)
    p = block_params(layer)
    assert out.shape == (B, S, F)
    np.testing.assert_allclose(out.numpy(), block_ref(x, p, H, D), rtol=1e-4, atol=1e-4)
    w = np.random.randn(B, S, F)
    (out * T(w, device, False)).sum().backward()
    tensors = {f"attn.{k}": t for k, t in layer_tensors(layer.attn).items()}
    tensors.update(
        {
            "ln.w": layer.layernorm.weight,
            "ln.b": layer.layernorm.bias,
            "W1": layer.linear1.weight,
            "b1": layer.linear1.bias,
            "W2": layer.linear2.weight,
            "b2": layer.linear2.bias,
        }
    )
    grads = {n: t.grad.numpy().reshape(p[n].shape) for n, t in tensors.items()}
    grads["x"] = xt.grad.numpy()

    def loss(a):
        return np.sum(w * block_ref(a["x"], a, H, D))

    check_fd(loss, {"x": x, **p}, grads, rtol=5e-3, atol=5e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.hw4_extra_transformer
def test_transformer_forward_matches_reference(device, batch_first):
    B, S, E, HID, L, H, D = 2, 4, 6, 8, 2, 2, 3
    model = nn.Transformer(
        E, HID, L, num_head=H, dim_head=D, device=device, batch_first=batch_first, sequence_len=10
    )
    assert model.positional_embedding.weight.shape == (10, E)
    assert len(model.layers.modules) == L
    x = np.random.randn(*((B, S, E) if batch_first else (S, B, E)))
    out, h = model(T(x, device))
    assert out.shape == x.shape and h.shape == x.shape
    np.testing.assert_array_equal(h.numpy(), np.zeros(x.shape))
    xb = x if batch_first else x.transpose(1, 0, 2)
    y = xb + model.positional_embedding.weight.numpy()[:S][None]
    for block in model.layers.modules:
        y = block_ref(y, block_params(block), H, D)
    if not batch_first:
        y = y.transpose(1, 0, 2)
    np.testing.assert_allclose(out.numpy(), y, rtol=1e-4, atol=1e-4)
    # the positional embedding is learned: it gets a gradient
    out.sum().backward()
    g = model.positional_embedding.weight.grad.numpy()
    assert np.abs(g[:S]).max() > 0 and np.all(g[S:] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_bad_input(device):
    model = nn.Transformer(4, 8, 1, num_head=2, dim_head=2, device=device, sequence_len=3)
    with pytest.raises(ValueError, match="sequence_len=3"):
        model(T(np.zeros((5, 1, 4)), device))
    with pytest.raises(ValueError, match="E = 4"):
        model(T(np.zeros((2, 1, 5)), device))
    attn = nn.MultiHeadAttention()
    with pytest.raises(ValueError, match="4-D"):
        attn(*(T(np.zeros((2, 3, 4)), device) for _ in range(3)))
    with pytest.raises(ValueError, match="dim_head"):
        attn(
            T(np.zeros((1, 1, 2, 3)), device),
            T(np.zeros((1, 1, 2, 4)), device),
            T(np.zeros((1, 1, 2, 4)), device),
        )
