"""The device protocol's attention functions, checked on every module (numpy, C++ CPU, CUDA where
a GPU is visible) against numpy oracles written here: ``matmul_strided`` over several batch
dimensions (per-head views read in place) and the masked softmax kernels ``softmax_fwd`` /
``softmax_bwd``, values and the errors the protocol promises."""

import numpy as np
import pytest

import needle as ndl

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":
    pytest.skip("the device modules belong to NEEDLE_BACKEND=nd", allow_module_level=True)

from test_device_protocol import MODULES, buffer, element_view, read  # noqa: E402

# ---- matmul_strided over several batch dimensions ---------------------------------------------


def _operand(rng, batch, rows, cols, layout):
    """(flat buffer, strides, offset, values) of a batch + (rows, cols) operand in ``layout``:
    compact; "heads" (batch (B, H) viewed from (B, rows, H, cols), as attention's per-head
    split); "heads_t" (the same, transposed: keys read as Kᵀ); "shared" (stride 0 along the
    first batch dimension); "flipped" (the last batch dimension reversed, negative stride)."""
    nb = len(batch)
    if layout == "heads":
        base = (*batch[:-1], rows, batch[-1], cols)
        perm = (*range(nb - 1), nb, nb - 1, nb + 1)
    elif layout == "heads_t":
        base = (*batch[:-1], cols, batch[-1], rows)
        perm = (*range(nb - 1), nb, nb + 1, nb - 1)
    else:
        base = (*batch, rows, cols) if layout != "shared" else (1, *batch[1:], rows, cols)
        perm = tuple(range(nb + 2))
    flat = rng.standard_normal(int(np.prod(base)) + 5).astype(np.float32)
    view = flat[5:].reshape(base).transpose(perm)
    if layout == "shared":
        view = np.broadcast_to(view, (*batch, rows, cols))
    if layout == "flipped":
        view = np.flip(view, nb - 1)
    strides, offset = element_view(flat, view)
    return flat, strides, offset, np.array(view)


BATCH_CASES = [
    ((2, 3), "heads", "heads_t"),  # q @ kᵀ of attention, both operands per-head views
    ((2, 3), "compact", "heads"),  # probs @ v
    ((3, 1, 2), "heads", "compact"),  # an extent-1 batch dimension
    ((2, 3, 2), "heads_t", "flipped"),  # three batch dimensions no stride merges
    ((4, 2), "shared", "heads"),  # one matrix shared along the first batch dimension
    ((5,), "compact", "flipped"),
    ((), "compact", "compact"),  # no batch dimension at all
    ((2, 0, 3), "compact", "compact"),  # an empty batch
]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("batch,layout_a,layout_b", BATCH_CASES)
@pytest.mark.parametrize("m,n,p", [(5, 4, 6), (1, 7, 1), (17, 9, 33), (3, 0, 2)])
def test_matmul_strided_reads_every_batch_dimension_in_place(
    mod, batch, layout_a, layout_b, m, n, p
):
    rng = np.random.default_rng(len(batch) * 1000 + m * 100 + n * 10 + p)
    fa, sa, oa, A = _operand(rng, batch, m, n, layout_a)
    fb, sb, ob, B = _operand(rng, batch, n, p, layout_b)
    count = int(np.prod(batch, dtype=np.int64)) * m * p
    out = mod.Array(count)
    if count:
        mod.fill(out, np.nan)  # every element must be written
    mod.matmul_strided(buffer(mod, fa), sa, oa, buffer(mod, fb), sb, ob, out, batch, m, n, p)
    expected = np.matmul(A.astype(np.float64), B)
    got = read(mod, out, (*batch, m, p))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(1, n) ** 0.5)


@pytest.mark.parametrize("mod", MODULES)
def test_matmul_strided_one_int_batch_is_one_batch_dimension(mod):
    rng = np.random.default_rng(1)
    fa, sa, oa, A = _operand(rng, (3,), 4, 5, "compact")
    fb, sb, ob, B = _operand(rng, (3,), 5, 2, "flipped")
    outs = []
    for batch in (3, (3,), [3]):
        out = mod.Array(3 * 4 * 2)
        mod.matmul_strided(buffer(mod, fa), sa, oa, buffer(mod, fb), sb, ob, out, batch, 4, 5, 2)
        outs.append(read(mod, out))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_allclose(outs[0].reshape(3, 4, 2), A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mod", MODULES)
def test_matmul_strided_batch_errors(mod):
    a, out = mod.Array(24), mod.Array(24)
    value_errors = {
        "too few strides": (
            lambda: mod.matmul_strided(a, (12, 2, 1), 0, a, (12, 4, 2, 1), 0, out, (2, 3), 2, 2, 2),
            "a_strides must hold 4",
        ),
        "too many strides": (
            lambda: mod.matmul_strided(
                a, (12, 4, 2, 1), 0, a, (0, 12, 4, 2, 1), 0, out, (2, 3), 2, 2, 2
            ),
            "b_strides must hold 4",
        ),
        "negative batch dimension": (
            lambda: mod.matmul_strided(
                a, (12, 4, 2, 1), 0, a, (12, 4, 2, 1), 0, out, (2, -3), 2, 2, 2
            ),
            "negative",
        ),
        "view past the end": (
            lambda: mod.matmul_strided(
                a, (12, 8, 2, 1), 0, a, (12, 4, 2, 1), 0, out, (2, 3), 2, 2, 2
            ),
            "outside the buffer",
        ),
        "out too small": (
            lambda: mod.matmul_strided(
                a, (12, 4, 2, 1), 0, a, (12, 4, 2, 1), 0, mod.Array(23), (2, 3), 2, 2, 2
            ),
            "out",
        ),
    }
    for what, (call, message) in value_errors.items():
        with pytest.raises(ValueError, match=message):
            call()
            pytest.fail(f"{what} did not raise")
    type_errors = {
        "str batch": lambda: mod.matmul_strided(
            a, (1, 2, 1), 0, a, (1, 2, 1), 0, out, "2", 2, 2, 2
        ),
        "float in batch": lambda: mod.matmul_strided(
            a, (4, 2, 1), 0, a, (4, 2, 1), 0, out, (2.0,), 2, 2, 2
        ),
        "None batch": lambda: mod.matmul_strided(a, (2, 1), 0, a, (2, 1), 0, out, None, 2, 2, 2),
    }
    for what, call in type_errors.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} did not raise")


# ---- softmax_fwd / softmax_bwd -----------------------------------------------------------------


def softmax_oracle(x: np.ndarray, scale: float, queries: int) -> np.ndarray:
    """The course's attention softmax in float64: scale·x plus its causal mask (-finfo.max above
    the diagonal cols - queries of each block of ``queries`` rows), shifted by the row max."""
    rows, cols = x.shape
    z = scale * x.astype(np.float64)
    if queries:
        mask = np.triu(np.ones((queries, cols)), cols - queries + 1) * -np.finfo(np.float32).max
        z = (z.reshape(rows // queries, queries, cols) + mask).reshape(rows, cols)
        z = z.astype(np.float32).astype(np.float64)  # the course adds the mask in float32
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


def softmax_bwd_oracle(y: np.ndarray, dy: np.ndarray, scale: float) -> np.ndarray:
    y64, g = y.astype(np.float64), dy.astype(np.float64)
    return scale * y64 * (g - (g * y64).sum(axis=1, keepdims=True))


SOFTMAX_CASES = [  # (rows, cols, queries)
    (12, 7, 0),
    (12, 4, 4),  # causal self-attention, 3 matrices of 4 queries and 4 keys
    (6, 5, 3),  # fewer queries than keys (a cache of earlier keys)
    (8, 2, 4),  # more queries than keys: the first rows see no key (uniform)
    (3, 200, 1),  # one query per block sees every key
    (130, 130, 130),
]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("rows,cols,queries", SOFTMAX_CASES)
@pytest.mark.parametrize("scale", [1.0, 0.35])
def test_softmax_fwd_matches_the_course_mask(mod, rows, cols, queries, scale):
    rng = np.random.default_rng(rows * cols + queries)
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    y = mod.Array(rows * cols)
    mod.fill(y, np.nan)
    mod.softmax_fwd(buffer(mod, x.ravel()), rows, cols, scale, queries, y)
    got = read(mod, y, (rows, cols))
    expected = softmax_oracle(x, scale, queries)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    if queries:  # masked weights are exactly 0, not just small
        j = np.arange(cols)[None, :]
        i = (np.arange(rows) % queries)[:, None]
        sees_some = (i + cols - queries >= 0)[:, 0]
        assert np.all(got[sees_some][(j > i + cols - queries)[sees_some]] == 0)


@pytest.mark.parametrize("mod", MODULES)
def test_softmax_fwd_special_values(mod):
    x = np.array(
        [
            [0.0, -np.inf, 1.0, 2.0],  # -inf: weight 0
            [-np.inf] * 4,  # all -inf: NaN, as numpy
            [np.nan, 0.0, 1.0, 2.0],  # NaN spreads over its row
            [3e38, 3e38, -3e38, 0.0],  # huge but finite: the shift keeps it finite
        ],
        np.float32,
    )
    y = mod.Array(16)
    mod.softmax_fwd(buffer(mod, x.ravel()), 4, 4, 1.0, 0, y)
    got = read(mod, y, (4, 4))
    np.testing.assert_allclose(got[0], softmax_oracle(x[:1], 1.0, 0)[0], rtol=1e-6)
    assert got[0, 1] == 0
    assert np.all(np.isnan(got[1])) and np.all(np.isnan(got[2]))
    np.testing.assert_allclose(got[3], [0.5, 0.5, 0, 0], atol=1e-7)


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("rows,cols,queries", SOFTMAX_CASES)
def test_softmax_bwd_is_the_gradient(mod, rows, cols, queries):
    rng = np.random.default_rng(rows + cols)
    y = softmax_oracle(rng.standard_normal((rows, cols)).astype(np.float32), 1.0, queries)
    y = y.astype(np.float32)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    dx = mod.Array(rows * cols)
    mod.softmax_bwd(buffer(mod, y.ravel()), buffer(mod, dy.ravel()), rows, cols, 0.5, dx)
    np.testing.assert_allclose(
        read(mod, dx, (rows, cols)), softmax_bwd_oracle(y, dy, 0.5), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("mod", MODULES)
def test_softmax_kernels_check_their_arguments(mod):
    x, y = mod.Array(12), mod.Array(12)
    value_errors = {
        "negative queries": (lambda: mod.softmax_fwd(x, 4, 3, 1.0, -1, y), "queries"),
        "rows not whole blocks": (lambda: mod.softmax_fwd(x, 4, 3, 1.0, 3, y), "queries"),
        "x too small": (lambda: mod.softmax_fwd(mod.Array(11), 4, 3, 1.0, 0, y), "x"),
        "y too large": (lambda: mod.softmax_fwd(x, 4, 3, 1.0, 0, mod.Array(13)), "y"),
        "negative rows": (lambda: mod.softmax_fwd(x, -4, -3, 1.0, 0, y), "negative"),
        "bwd dy": (lambda: mod.softmax_bwd(x, mod.Array(6), 4, 3, 1.0, y), "dy"),
        "bwd dx": (lambda: mod.softmax_bwd(x, x, 4, 3, 1.0, mod.Array(3)), "dx"),
        "bwd negative": (lambda: mod.softmax_bwd(x, x, -4, -3, 1.0, y), "negative"),
    }
    for what, (call, message) in value_errors.items():
        with pytest.raises(ValueError, match=f"softmax_(fwd|bwd): .*{message}"):
            call()
            pytest.fail(f"{what} did not raise")
    type_errors = {
        "str scale": lambda: mod.softmax_fwd(x, 4, 3, "1", 0, y),
        "list as x": lambda: mod.softmax_fwd([0.0] * 12, 4, 3, 1.0, 0, y),
        "None as dy": lambda: mod.softmax_bwd(x, None, 4, 3, 1.0, y),
        "float rows": lambda: mod.softmax_bwd(x, x, 4.0, 3, 1.0, y),
    }
    for what, call in type_errors.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} did not raise")


# ---- attention_fwd / attention_bwd -------------------------------------------------------------


def attention_oracle(q, k, v, scale, causal):
    """(out, probs) in float64 per head: the course's masked softmax of scale·q kᵀ, then @ v."""
    heads, tq, _ = q.shape
    tk = k.shape[1]
    logits = np.einsum("hqd,hkd->hqk", q.astype(np.float64), k.astype(np.float64))
    if tk == 0:  # no key: no weight, and out is a sum of nothing
        return np.zeros((heads, tq, v.shape[2])), logits
    probs = softmax_oracle(logits.reshape(heads * tq, tk), scale, tq if causal else 0)
    probs = probs.reshape(heads, tq, tk)
    return probs @ v.astype(np.float64), probs


def attention_grad_oracle(d_out, d_probs, probs, q, k, v, scale):
    """(dq, dk, dv) in float64 from the chain rule through out = P v, P = softmax(scale·S)."""
    g, p = d_out.astype(np.float64), probs.astype(np.float64)
    dp = g @ np.swapaxes(v, 1, 2).astype(np.float64) + d_probs
    ds = scale * p * (dp - (dp * p).sum(axis=2, keepdims=True))
    return ds @ k.astype(np.float64), np.swapaxes(ds, 1, 2) @ q, np.swapaxes(p, 1, 2) @ g


ATTENTION_CASES = [  # (heads, queries, keys, dim, causal)
    (3, 5, 5, 4, 1),
    (2, 4, 7, 3, 1),  # fewer queries than keys
    (2, 7, 4, 3, 1),  # more queries than keys: the first see no key (uniform)
    (4, 17, 17, 40, 0),  # a partial block of queries, dim past a vector
    (64, 32, 32, 32, 1),  # the course Transformer LM's heads (B = 16, H = 4)
    (2, 3, 3, 0, 0),  # dim 0: logits 0, uniform weights
    (2, 0, 3, 2, 1),
    (2, 3, 0, 2, 0),
    (0, 3, 3, 2, 1),
]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("heads,tq,tk,dim,causal", ATTENTION_CASES)
def test_attention_kernels_match_the_course_attention(mod, heads, tq, tk, dim, causal):
    rng = np.random.default_rng(heads * 100 + tq * 10 + tk + dim)
    q, k, v = ((rng.standard_normal((heads, t, dim)) * 2).astype(np.float32) for t in (tq, tk, tk))
    scale = 0.4
    out, probs = mod.Array(heads * tq * dim), mod.Array(heads * tq * tk)
    for buf in (out, probs):
        mod.fill(buf, np.nan)
    mod.attention_fwd(
        *(buffer(mod, a.ravel()) for a in (q, k, v)), heads, tq, dim, tk, scale, causal, out, probs
    )
    want_out, want_probs = attention_oracle(q, k, v, scale, causal)
    got_probs = read(mod, probs, (heads, tq, tk))
    np.testing.assert_allclose(got_probs, want_probs, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(read(mod, out, (heads, tq, dim)), want_out, rtol=1e-4, atol=1e-5)
    if causal and tk:  # masked weights are exactly 0
        hidden = np.arange(tk)[None, :] > np.arange(tq)[:, None] + tk - tq
        sees = (np.arange(tq) + tk - tq >= 0)[:, None]
        assert np.all(got_probs[:, hidden & sees] == 0)
    d_out = rng.standard_normal((heads, tq, dim)).astype(np.float32)
    d_probs = rng.standard_normal((heads, tq, tk)).astype(np.float32)
    grads = [mod.Array(heads * t * dim) for t in (tq, tk, tk)]
    for buf in grads:
        mod.fill(buf, np.nan)
    inputs = (d_out, d_probs, got_probs.astype(np.float32), q, k, v)
    mod.attention_bwd(*(buffer(mod, a.ravel()) for a in inputs), heads, tq, dim, tk, scale, *grads)
    want = attention_grad_oracle(d_out, d_probs, got_probs, q, k, v, scale)
    for name, buf, t, w in zip(("dq", "dk", "dv"), grads, (tq, tk, tk), want):
        np.testing.assert_allclose(
            read(mod, buf, (heads, t, dim)), w, rtol=1e-4, atol=1e-5, err_msg=name
        )


@pytest.mark.parametrize("mod", MODULES)
def test_attention_kernels_check_their_arguments(mod):
    q, kv, p = mod.Array(2 * 3 * 4), mod.Array(2 * 5 * 4), mod.Array(2 * 3 * 5)
    out = mod.Array(2 * 3 * 4)

    def fwd(*, q=q, k=kv, v=kv, sizes=(2, 3, 4, 5), causal=1, out=out, probs=p):
        return lambda: mod.attention_fwd(q, k, v, *sizes, 0.5, causal, out, probs)

    def bwd(*, d_out=out, dk=mod.Array(2 * 5 * 4), sizes=(2, 3, 4, 5)):
        return lambda: mod.attention_bwd(d_out, p, p, q, kv, kv, *sizes, 0.5, out, dk, kv)

    value_errors = {
        "k too small": (fwd(k=mod.Array(39)), "k"),
        "v too large": (fwd(v=mod.Array(41)), "v"),
        "probs too small": (fwd(probs=mod.Array(29)), "probs"),
        "causal 2": (fwd(causal=2), "causal"),
        "negative heads": (fwd(sizes=(-2, -3, 4, 5)), "negative"),
        "bwd d_out": (bwd(d_out=mod.Array(5)), "d_out"),
        "bwd dk": (bwd(dk=mod.Array(7)), "dk"),
    }
    for what, (call, message) in value_errors.items():
        with pytest.raises(ValueError, match=f"attention_(fwd|bwd): .*{message}"):
            call()
            pytest.fail(f"{what} did not raise")
    type_errors = {
        "str scale": lambda: mod.attention_fwd(q, kv, kv, 2, 3, 4, 5, "1", 1, out, p),
        "None as v": lambda: mod.attention_fwd(q, kv, None, 2, 3, 4, 5, 0.5, 1, out, p),
        "float heads": lambda: mod.attention_bwd(
            out, p, p, q, kv, kv, 2.0, 3, 4, 5, 0.5, out, kv, kv
        ),
    }
    for what, call in type_errors.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} did not raise")
