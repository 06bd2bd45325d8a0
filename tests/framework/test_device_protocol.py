"""The device-module protocol (needle/backend_ndarray/protocol.py), checked on every module.

One suite, parametrised over the numpy reference module, the compiled CPU module and (where a
GPU is visible) the CUDA module: every function's values against numpy, over compact,
permuted, sliced, negative-stride and broadcast (stride-0) views and special values, and the
errors the protocol promises (ValueError for wrong values, TypeError for wrong kinds).
"""

import itertools

import numpy as np
import pytest

import needle as ndl
from needle.backend_ndarray import protocol

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":
    pytest.skip("the device modules belong to NEEDLE_BACKEND=nd", allow_module_level=True)

from needle import backend_ndarray as nd  # noqa: E402


def _module_params():
    params = [pytest.param(nd.ndarray_backend_numpy, id="numpy")]
    cpu_mark = [] if nd.cpu().enabled() else [pytest.mark.skip(reason="cpu() is not built here")]
    params.append(pytest.param(nd.ndarray_backend_cpu, id="cpu", marks=cpu_mark))
    cuda_mark = [] if nd.cuda().enabled() else [pytest.mark.skip(reason="no GPU visible")]
    params.append(pytest.param(nd.ndarray_backend_cuda, id="cuda", marks=cuda_mark))
    return params


MODULES = _module_params()
SPECIAL = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -2.5], dtype=np.float32
)

# The oracle: numpy float32 semantics for every op, written here independently of any module.
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}
UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "sqrt": np.sqrt,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a.astype(np.float64))),
    "relu": lambda a: np.where(np.isnan(a), a, np.maximum(a, 0)),
}
REDUCE = {"sum": np.sum, "max": np.max}
EXACT = {
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "neg",
    "abs",
    "relu",
    "sqrt",
}


def oracle(fn, *args) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(fn(*args), dtype=np.float32)


def check(got, expected, name: str) -> None:
    if name in EXACT:
        np.testing.assert_array_equal(got, expected, err_msg=name)
    else:
        np.testing.assert_allclose(
            got, expected, rtol=2e-5, atol=1e-6, equal_nan=True, err_msg=name
        )


# ---- buffers and views ------------------------------------------------------------------------
def buffer(mod, flat: np.ndarray):
    """A module Array holding the 1-D float32 ``flat``."""
    a = mod.Array(flat.size)
    if flat.size:
        mod.from_numpy(np.ascontiguousarray(flat, dtype=np.float32), a)
    return a


def read(mod, a, shape=None) -> np.ndarray:
    """The whole buffer ``a`` (reshaped to ``shape``)."""
    flat = mod.to_numpy(a, (a.size,), (1,), 0) if a.size else np.zeros(0, np.float32)
    return flat if shape is None else flat.reshape(shape)


def element_view(flat: np.ndarray, view: np.ndarray):
    """(strides, offset) in elements of the numpy ``view`` of the 1-D array ``flat``."""
    offset = (view.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // 4
    return tuple(s // 4 for s in view.strides), int(offset)


KINDS = ("compact", "permuted", "sliced", "flipped", "broadcast")


def make_view(rng, shape, kind: str, special: bool = False):
    """A flat float32 buffer and a view of ``shape`` of the given kind:
    (flat, strides, offset, expected values)."""
    shape = tuple(shape)
    n = int(np.prod(shape))
    ndim = len(shape)
    flat = rng.standard_normal(n * max(4, 2**ndim) + 16).astype(np.float32)
    if special:
        flat = rng.choice(SPECIAL, flat.size).astype(np.float32)
    if kind == "compact" or ndim == 0:
        view = flat[:n].reshape(shape)
    elif kind == "permuted":
        perm = rng.permutation(ndim)
        view = flat[:n].reshape(tuple(shape[p] for p in perm)).transpose(np.argsort(perm))
    elif kind == "sliced":  # step 2 over a larger array, starting at an offset
        big = flat[3 : 3 + n * 2**ndim].reshape(tuple(2 * s for s in shape))
        view = big[tuple(slice(1 if s else 0, None, 2) for s in shape)][
            tuple(slice(0, s) for s in shape)
        ]
    elif kind == "flipped":
        base = flat[5 : 5 + n].reshape(shape)
        axes = [d for d in range(ndim) if rng.random() < 0.7] or [0]
        view = np.flip(base, axes)
    elif kind == "broadcast":
        small = tuple(1 if rng.random() < 0.5 else s for s in shape[1:])
        view = np.broadcast_to(flat[: int(np.prod(small))].reshape(small), shape)
    else:
        raise AssertionError(kind)
    assert view.shape == shape
    strides, offset = element_view(flat, view)
    return flat, strides, offset, np.array(view, dtype=np.float32)


SHAPES = [(), (1,), (7,), (3, 4), (2, 3, 5), (2, 1, 3, 4), (33, 17)]


# ---- the op tables ---------------------------------------------------------------------------
@pytest.mark.parametrize("mod", MODULES)
def test_op_tables_are_the_protocols(mod):
    assert tuple(mod.__binary_ops__) == protocol.BINARY_OPS
    assert tuple(mod.__unary_ops__) == protocol.UNARY_OPS
    assert tuple(mod.__reduce_ops__) == protocol.REDUCE_OPS
    assert set(BINARY) == set(protocol.BINARY_OPS) and set(UNARY) == set(protocol.UNARY_OPS)


@pytest.mark.parametrize("mod", MODULES)
def test_module_has_every_protocol_function(mod):
    names = [n for n in dir(protocol.DeviceModule) if not n.startswith("_")]
    assert names and not [n for n in names if not callable(getattr(mod, n, None))]


# ---- memory ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mod", MODULES)
def test_memory_stats_count_live_and_peak_bytes(mod):
    mod.reset_peak()
    start = mod.memory_stats()
    assert start["peak_bytes"] == start["live_bytes"] >= 0
    a, b = mod.Array(1000), mod.Array(24)
    held = mod.memory_stats()
    # 4 bytes an element, plus at most one 64-byte alignment pad per buffer
    assert 4 * 1024 <= held["live_bytes"] - start["live_bytes"] <= 4 * 1024 + 2 * 64
    assert held["peak_bytes"] == held["live_bytes"]
    del a, b
    freed = mod.memory_stats()
    assert freed["live_bytes"] == start["live_bytes"]
    assert freed["peak_bytes"] == held["peak_bytes"]  # the peak stays until reset_peak()
    mod.reset_peak()
    assert mod.memory_stats()["peak_bytes"] == start["live_bytes"]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("kind", KINDS)
def test_to_numpy_and_compact(mod, kind):
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        flat, strides, offset, expected = make_view(rng, shape, kind)
        a = buffer(mod, flat)
        np.testing.assert_array_equal(mod.to_numpy(a, shape, strides, offset), expected)
        out = mod.Array(expected.size)
        mod.compact(a, out, shape, strides, offset)
        np.testing.assert_array_equal(read(mod, out, shape), expected)


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("kind", ("compact", "permuted", "sliced", "flipped"))
def test_setitem(mod, kind):
    rng = np.random.default_rng(2)
    for shape in SHAPES:
        flat, strides, offset, _ = make_view(rng, shape, kind)
        src = rng.standard_normal(shape).astype(np.float32)
        expected = flat.copy()
        np.lib.stride_tricks.as_strided(expected[offset:], shape, tuple(4 * s for s in strides))[
            ...
        ] = src
        out = buffer(mod, flat)
        mod.ewise_setitem(buffer(mod, src.ravel()), out, shape, strides, offset)
        np.testing.assert_array_equal(read(mod, out), expected)
        np.lib.stride_tricks.as_strided(expected[offset:], shape, tuple(4 * s for s in strides))[
            ...
        ] = -7.5
        mod.scalar_setitem(int(np.prod(shape)), -7.5, out, shape, strides, offset)
        np.testing.assert_array_equal(read(mod, out), expected)


@pytest.mark.parametrize("mod", MODULES)
def test_fill_and_from_numpy(mod):
    a = mod.Array(5)
    mod.fill(a, 2.5)
    np.testing.assert_array_equal(read(mod, a), np.full(5, 2.5, np.float32))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = mod.Array(6)
    mod.from_numpy(x, b)
    np.testing.assert_array_equal(read(mod, b), x.ravel())
    assert mod.Array(0).size == 0 and isinstance(a.ptr(), int)


# ---- element-wise ----------------------------------------------------------------------------
@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("name", protocol.BINARY_OPS)
def test_ewise_binary(mod, name):
    op = protocol.BINARY_OPS.index(name)
    rng = np.random.default_rng(op)
    for shape, (ka, kb), special in itertools.product(
        SHAPES,
        [
            ("compact", "compact"),
            ("permuted", "broadcast"),
            ("flipped", "sliced"),
            ("broadcast", "flipped"),
        ],
        (False, True),
    ):
        fa, sa, oa, xa = make_view(rng, shape, ka, special)
        fb, sb, ob, xb = make_view(rng, shape, kb, special)
        if name == "power" and not special:
            xa_abs = np.abs(fa)  # real powers of negative bases are NaN: test them with specials
            fa = xa_abs
            xa = np.abs(xa)
        out = mod.Array(int(np.prod(shape)))
        mod.ewise_binary(op, buffer(mod, fa), sa, oa, buffer(mod, fb), sb, ob, out, shape)
        check(read(mod, out, shape), oracle(BINARY[name], xa, xb), name)


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("name", protocol.BINARY_OPS)
def test_ewise_scalar(mod, name):
    op = protocol.BINARY_OPS.index(name)
    rng = np.random.default_rng(100 + op)
    for shape, kind, val, reverse in itertools.product(
        [(5,), (3, 4), (2, 3, 5)],
        ("compact", "flipped", "broadcast"),
        [2.5, -0.0, 3.0, float("nan"), float("inf")],
        (False, True),
    ):
        flat, strides, offset, x = make_view(rng, shape, kind, special=True)
        out = mod.Array(x.size)
        mod.ewise_scalar(op, buffer(mod, flat), strides, offset, val, out, shape, reverse)
        v = np.float32(val)
        expected = oracle(BINARY[name], v, x) if reverse else oracle(BINARY[name], x, v)
        check(read(mod, out, shape), expected, name)


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("name", protocol.UNARY_OPS)
def test_ewise_unary(mod, name):
    op = protocol.UNARY_OPS.index(name)
    rng = np.random.default_rng(200 + op)
    for shape, kind, special in itertools.product(SHAPES, KINDS, (False, True)):
        flat, strides, offset, x = make_view(rng, shape, kind, special)
        out = mod.Array(x.size)
        mod.ewise_unary(op, buffer(mod, flat), strides, offset, out, shape)
        check(read(mod, out, shape), oracle(UNARY[name], x), name)


@pytest.mark.parametrize("mod", MODULES)
def test_ewise_large_and_odd_sizes(mod):
    """Sizes around vector widths and thread splits, with an odd offset."""
    rng = np.random.default_rng(3)
    add = protocol.BINARY_OPS.index("add")
    exp = protocol.UNARY_OPS.index("exp")
    for n in (15, 16, 17, 63, 64, 65, 1023, 100_003):
        x = rng.standard_normal(n + 1).astype(np.float32)
        out = mod.Array(n)
        mod.ewise_binary(add, buffer(mod, x), (1,), 1, buffer(mod, x), (1,), 1, out, (n,))
        np.testing.assert_array_equal(read(mod, out), x[1:] + x[1:])
        mod.ewise_unary(exp, buffer(mod, x), (1,), 1, out, (n,))
        np.testing.assert_allclose(read(mod, out), np.exp(x[1:]), rtol=2e-6)


# ---- element-wise on compact operands (course) -------------------------------------------------
@pytest.mark.parametrize("mod", MODULES)
def test_course_compact_functions(mod):
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal(10).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    y[3] = x[3]
    a, b, out = buffer(mod, x), buffer(mod, y), mod.Array(10)
    for name, fn in [
        ("add", np.add),
        ("mul", np.multiply),
        ("div", np.divide),
        ("maximum", np.maximum),
        ("eq", np.equal),
        ("ge", np.greater_equal),
    ]:
        getattr(mod, "ewise_" + name)(a, b, out)
        check(read(mod, out), oracle(fn, x, y), name)
        getattr(mod, "scalar_" + name)(a, 0.5, out)
        check(read(mod, out), oracle(fn, x, np.float32(0.5)), name)
    mod.scalar_power(buffer(mod, np.abs(x)), 1.5, out)
    check(read(mod, out), oracle(np.power, np.abs(x), np.float32(1.5)), "power")
    for name in ("log", "exp", "tanh"):
        getattr(mod, "ewise_" + name)(buffer(mod, np.abs(x)), out)
        check(read(mod, out), oracle(UNARY[name], np.abs(x)), name)
    m = rng.standard_normal((3, 4)).astype(np.float32)
    for fn, ref in (("reduce_sum", np.sum), ("reduce_max", np.max)):
        r = mod.Array(3)
        getattr(mod, fn)(buffer(mod, m.ravel()), r, 4)
        np.testing.assert_allclose(read(mod, r), ref(m, axis=1), rtol=1e-6)
    p = rng.standard_normal((4, 5)).astype(np.float32)
    r = mod.Array(15)
    mod.matmul(buffer(mod, m.ravel()), buffer(mod, p.ravel()), r, 3, 4, 5)
    np.testing.assert_allclose(read(mod, r, (3, 5)), m @ p, rtol=1e-5, atol=1e-5)


# ---- reductions ------------------------------------------------------------------------------
@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("name", protocol.REDUCE_OPS)
def test_reduce(mod, name):
    op = protocol.REDUCE_OPS.index(name)
    rng = np.random.default_rng(300 + op)
    for shape, kind, special in itertools.product(
        [(7,), (3, 4), (2, 3, 5), (2, 1, 3, 4), (5, 67), (3, 1000)], KINDS, (False, True)
    ):
        flat, strides, offset, x = make_view(rng, shape, kind, special)
        for keep in range(len(shape) + 1):
            out = mod.Array(int(np.prod(shape[:keep])))
            mod.reduce(op, buffer(mod, flat), shape, strides, offset, keep, out)
            axes = tuple(range(keep, len(shape)))
            expected = oracle(REDUCE[name], x.astype(np.float64), axes)
            got = read(mod, out, shape[:keep])
            if name == "max":
                np.testing.assert_array_equal(got, expected)
            else:
                scale = oracle(np.sum, np.abs(x.astype(np.float64)), axes)
                n_reduced = int(np.prod(shape[keep:]))  # float32 summation's error bound
                tol = (1e-5 + n_reduced * 6e-8) * np.where(np.isfinite(scale), scale, 0) + 1e-5
                with np.errstate(invalid="ignore"):
                    diff = np.abs(got - expected)
                same = (got == expected) | (np.isnan(got) & np.isnan(expected))
                assert np.all(same | (diff <= tol)), (shape, kind, keep, got, expected)


@pytest.mark.parametrize("mod", MODULES)
def test_reduce_empty_extents(mod):
    sum_, max_ = protocol.REDUCE_OPS.index("sum"), protocol.REDUCE_OPS.index("max")
    a = mod.Array(4)
    out = mod.Array(3)
    mod.fill(out, 9.0)
    mod.reduce(sum_, a, (3, 0), (1, 1), 0, 1, out)  # an empty extent sums to 0
    np.testing.assert_array_equal(read(mod, out), [0, 0, 0])
    with pytest.raises(ValueError):
        mod.reduce(max_, a, (3, 0), (1, 1), 0, 1, out)  # the max of nothing has no identity
    mod.reduce(max_, a, (0, 3), (1, 1), 0, 1, mod.Array(0))  # no output: nothing to do


# ---- matrix products -------------------------------------------------------------------------
MATMUL_SIZES = [
    (1, 1, 1),
    (2, 3, 4),
    (5, 1, 7),
    (7, 0, 3),
    (0, 4, 5),
    (17, 33, 9),
    (64, 64, 64),
    (65, 31, 66),
    (1, 300, 1),
    (129, 7, 130),
]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("m,n,p", MATMUL_SIZES)
def test_matmul_strided(mod, m, n, p):
    rng = np.random.default_rng(m * 10_000 + n * 100 + p)
    for batch, trans_a, trans_b, shared in itertools.product(
        (1, 3), (False, True), (False, True), ("none", "a", "b")
    ):
        if shared != "none" and batch == 1:
            continue
        nb_a = 1 if shared == "a" else batch
        nb_b = 1 if shared == "b" else batch
        fa = rng.standard_normal(nb_a * m * n + 3).astype(np.float32)
        fb = rng.standard_normal(nb_b * n * p + 2).astype(np.float32)
        # A (m, n) per batch, stored transposed (n, m) when trans_a; offset 3 / 2
        if trans_a:
            A = fa[3:].reshape(nb_a, n, m).transpose(0, 2, 1)
        else:
            A = fa[3:].reshape(nb_a, m, n)
        if trans_b:
            B = fb[2:].reshape(nb_b, p, n).transpose(0, 2, 1)
        else:
            B = fb[2:].reshape(nb_b, n, p)
        sa, oa = element_view(fa, A)
        sb, ob = element_view(fb, B)
        if nb_a == 1:
            sa = (0,) + sa[1:]
        if nb_b == 1:
            sb = (0,) + sb[1:]
        out = mod.Array(batch * m * p)
        if out.size:
            mod.fill(out, np.nan)  # n == 0 must write zeros, not leave garbage
        mod.matmul_strided(buffer(mod, fa), sa, oa, buffer(mod, fb), sb, ob, out, batch, m, n, p)
        expected = np.matmul(
            np.broadcast_to(A, (batch, m, n)).astype(np.float64), np.broadcast_to(B, (batch, n, p))
        )
        np.testing.assert_allclose(
            read(mod, out, (batch, m, p)), expected, rtol=1e-4, atol=1e-4 * max(1, n) ** 0.5
        )


# ---- errors ----------------------------------------------------------------------------------
BIN_ADD = protocol.BINARY_OPS.index("add")


@pytest.mark.parametrize("mod", MODULES)
def test_views_outside_the_buffer_are_value_errors(mod):
    a, out = mod.Array(4), mod.Array(6)
    calls = {
        "to_numpy": lambda: mod.to_numpy(a, (2, 3), (3, 1), 0),
        "compact": lambda: mod.compact(a, out, (2, 3), (3, 1), 0),
        "compact negative": lambda: mod.compact(a, mod.Array(3), (3,), (-1,), 1),
        "ewise_setitem": lambda: mod.ewise_setitem(out, a, (2, 3), (3, 1), 0),
        "scalar_setitem": lambda: mod.scalar_setitem(3, 1.0, a, (3,), (1,), 2),
        "ewise_binary a": lambda: mod.ewise_binary(
            BIN_ADD, a, (3, 1), 0, out, (3, 1), 0, out, (2, 3)
        ),
        "ewise_binary b": lambda: mod.ewise_binary(
            BIN_ADD, out, (3, 1), 0, a, (0, 1), 2, out, (2, 3)
        ),
        "ewise_scalar": lambda: mod.ewise_scalar(
            BIN_ADD, a, (1,), 5, 1.0, mod.Array(1), (1,), False
        ),
        "ewise_unary": lambda: mod.ewise_unary(0, a, (2,), 0, mod.Array(3), (3,)),
        "reduce": lambda: mod.reduce(0, a, (2, 3), (3, 1), 0, 1, mod.Array(2)),
        "matmul_strided": lambda: mod.matmul_strided(
            a, (0, 2, 1), 0, out, (0, 3, 1), 0, mod.Array(9), 1, 3, 2, 3
        ),
        "huge stride": lambda: mod.to_numpy(a, (2,), (2**62,), 0),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match="outside the buffer|too many|elements"):
            call()
            pytest.fail(f"{what} did not raise")


@pytest.mark.parametrize("mod", MODULES)
def test_size_mismatches_are_value_errors(mod):
    a, b3, out = mod.Array(6), mod.Array(3), mod.Array(5)
    calls = {
        "ewise_binary out": lambda: mod.ewise_binary(
            BIN_ADD, a, (3, 1), 0, a, (3, 1), 0, out, (2, 3)
        ),
        "ewise_scalar out": lambda: mod.ewise_scalar(
            BIN_ADD, a, (3, 1), 0, 1.0, out, (2, 3), False
        ),
        "ewise_unary out": lambda: mod.ewise_unary(0, a, (3, 1), 0, out, (2, 3)),
        "reduce out": lambda: mod.reduce(0, a, (2, 3), (3, 1), 0, 1, b3),
        "reduce keep": lambda: mod.reduce(0, a, (2, 3), (3, 1), 0, 3, b3),
        "reduce keep<0": lambda: mod.reduce(0, a, (2, 3), (3, 1), 0, -1, b3),
        "matmul_strided out": lambda: mod.matmul_strided(
            a, (0, 3, 1), 0, a, (0, 2, 1), 0, out, 1, 2, 3, 2
        ),
        "matmul_strided negative": lambda: mod.matmul_strided(
            a, (0, 3, 1), 0, a, (0, 2, 1), 0, out, 1, -2, 3, 2
        ),
        "matmul negative": lambda: mod.matmul(a, a, out, -1, 2, 3),
        "compact out": lambda: mod.compact(a, out, (2, 3), (3, 1), 0),
        "shape/strides": lambda: mod.compact(a, a, (2, 3), (1,), 0),
        "negative dim": lambda: mod.compact(a, a, (-2, 3), (3, 1), 0),
        "scalar_setitem size": lambda: mod.scalar_setitem(4, 0.0, a, (2,), (1,), 0),
        "Array(-1)": lambda: mod.Array(-1),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what} did not raise")


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize(
    "fn,table",
    [
        ("ewise_binary", protocol.BINARY_OPS),
        ("ewise_scalar", protocol.BINARY_OPS),
        ("ewise_unary", protocol.UNARY_OPS),
        ("reduce", protocol.REDUCE_OPS),
    ],
)
def test_unknown_op_codes_are_value_errors(mod, fn, table):
    a, out = mod.Array(4), mod.Array(4)
    for op in (-1, len(table), 1000):
        args = {
            "ewise_binary": (op, a, (1,), 0, a, (1,), 0, out, (4,)),
            "ewise_scalar": (op, a, (1,), 0, 1.0, out, (4,), False),
            "ewise_unary": (op, a, (1,), 0, out, (4,)),
            "reduce": (op, a, (4,), (1,), 0, 1, out),
        }[fn]
        with pytest.raises(ValueError, match="op"):
            getattr(mod, fn)(*args)


@pytest.mark.parametrize("mod", MODULES)
def test_wrong_kinds_are_type_errors(mod):
    a, out = mod.Array(4), mod.Array(4)
    calls = {
        "list as Array": lambda: mod.ewise_unary(0, [1.0] * 4, (1,), 0, out, (4,)),
        "str as value": lambda: mod.ewise_scalar(BIN_ADD, a, (1,), 0, "1", out, (4,), False),
        "str as fill": lambda: mod.fill(a, "x"),
        "str as shape": lambda: mod.compact(a, out, "4", (1,), 0),
        "float in shape": lambda: mod.compact(a, out, (4.0,), (1,), 0),
        "str as op": lambda: mod.ewise_unary("neg", a, (1,), 0, out, (4,)),
        "float size": lambda: mod.Array(4.5),
        "str size": lambda: mod.Array("4"),
        "float m": lambda: mod.matmul_strided(a, (0, 2, 1), 0, a, (0, 2, 1), 0, out, 1, 2.0, 2, 2),
    }
    for what, call in calls.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} did not raise")


@pytest.mark.parametrize("mod", MODULES)
def test_huge_allocations(mod):
    for size in (2**50 + 1, 2**62):
        with pytest.raises((ValueError, MemoryError)):
            mod.Array(size)


# ---- the embedding kernels ---------------------------------------------------------------------
def _ids(rng, rows: int, vocab: int) -> np.ndarray:
    """``rows`` ids in [0, vocab) with repeats, the first and the last row of the table."""
    ids = rng.integers(0, vocab, rows).astype(np.float32)
    ids[: min(rows, 3)] = [0, vocab - 1, 0][: min(rows, 3)]
    return ids


def _scatter_in_order(grad: np.ndarray, ids: np.ndarray, vocab: int) -> np.ndarray:
    """The scatter-add oracle: float32 zeros, then each row added in row order."""
    out = np.zeros((vocab, grad.shape[1]), np.float32)
    for r, i in enumerate(ids.astype(int)):
        out[i] += grad[r]
    return out


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize(
    "vocab, cols, rows", [(1, 1, 1), (7, 5, 11), (7, 0, 4), (7, 5, 0), (300, 64, 5000)]
)  # last: threaded rows
def test_embedding_gather(mod, vocab, cols, rows):
    rng = np.random.default_rng(vocab + cols + rows)
    weight = rng.standard_normal((vocab, cols)).astype(np.float32)
    ids = _ids(rng, rows, vocab)
    out = mod.Array(rows * cols)
    mod.embedding_gather(buffer(mod, weight.ravel()), buffer(mod, ids), vocab, cols, rows, out)
    np.testing.assert_array_equal(read(mod, out, (rows, cols)), weight[ids.astype(int)])


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize(
    "rows, cols, vocab", [(1, 1, 1), (11, 5, 7), (4, 0, 7), (0, 5, 7), (5000, 64, 300)]
)
def test_embedding_scatter_add_accumulates_duplicates(mod, rows, cols, vocab):
    rng = np.random.default_rng(rows + cols + vocab)
    grad = rng.standard_normal((rows, cols)).astype(np.float32)
    ids = _ids(rng, rows, vocab)
    out = buffer(mod, np.full(vocab * cols, np.nan, np.float32))  # every element is written
    mod.embedding_scatter_add(buffer(mod, grad.ravel()), buffer(mod, ids), rows, cols, vocab, out)
    got = read(mod, out, (vocab, cols))
    exact = np.zeros((vocab, cols))
    np.add.at(exact, ids.astype(int), grad.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * max(1, rows / vocab))
    if mod is not nd.ndarray_backend_cuda:  # the CPU modules add in row order: deterministic
        np.testing.assert_array_equal(got, _scatter_in_order(grad, ids, vocab))


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize(
    "bad, shown", [(5.0, "5"), (-1.0, "-1"), (1.5, "1.5"), (np.nan, "nan"), (np.inf, "inf")]
)
def test_embedding_kernels_name_a_bad_id(mod, bad, shown):
    vocab, cols = 5, 3
    ids = np.array([0, 4, bad, 2], np.float32)
    table = buffer(mod, np.ones(vocab * cols, np.float32))
    rows = buffer(mod, np.ones(12, np.float32))
    message = rf"ids must be whole numbers \(integers\) in \[0, 5\), got {shown} at position 2"
    with pytest.raises(IndexError, match="embedding_gather: " + message):
        mod.embedding_gather(table, buffer(mod, ids), vocab, cols, 4, mod.Array(12))
    with pytest.raises(IndexError, match="embedding_scatter_add: " + message):
        mod.embedding_scatter_add(rows, buffer(mod, ids), 4, cols, vocab, mod.Array(vocab * cols))


@pytest.mark.parametrize("mod", MODULES)
def test_embedding_kernels_check_their_sizes(mod):
    ids = buffer(mod, np.array([0.0, 1.0], np.float32))
    w, g, out = mod.Array(6), mod.Array(4), mod.Array(4)
    calls = {  # (vocab, cols, rows) = (3, 2, 2) for the gather, (2, 2, 3) for the scatter-add
        "gather weight": lambda: mod.embedding_gather(mod.Array(5), ids, 3, 2, 2, out),
        "gather ids": lambda: mod.embedding_gather(w, ids, 3, 2, 3, mod.Array(6)),
        "gather out": lambda: mod.embedding_gather(w, ids, 3, 2, 2, mod.Array(5)),
        "gather negative": lambda: mod.embedding_gather(w, ids, -3, -2, 2, out),
        "scatter grad": lambda: mod.embedding_scatter_add(mod.Array(5), ids, 2, 2, 3, w),
        "scatter ids": lambda: mod.embedding_scatter_add(mod.Array(6), ids, 3, 2, 3, w),
        "scatter out": lambda: mod.embedding_scatter_add(g, ids, 2, 2, 3, mod.Array(5)),
        "scatter negative": lambda: mod.embedding_scatter_add(g, ids, 2, -2, -3, w),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match="embedding_"):
            call()
            pytest.fail(f"{what} did not raise")


# ---- the convolution kernels -------------------------------------------------------------------
# Oracles by definition, in float64, one kernel offset (a, b) at a time: xpad is the input
# zero-padded by p; offset (a, b) of window (i, j) reads xpad[:, i·s + a, j·s + b, :].
def _offset(a: int, b: int, s: int, ho: int, wo: int):
    return (slice(None), slice(a, a + s * (ho - 1) + 1, s), slice(b, b + s * (wo - 1) + 1, s))


def _conv_oracles(x, w, g, s, p):
    """(forward, input adjoint for the output adjoint g, weight adjoint for g), float64."""
    x, w, g = (v.astype(np.float64) for v in (x, w, g))
    kh, kw = w.shape[:2]
    xpad = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    ho, wo = g.shape[1:3]
    out = np.zeros(g.shape)
    dxpad = np.zeros(xpad.shape)
    dw = np.zeros(w.shape)
    for a, b in itertools.product(range(kh), range(kw)):
        window = _offset(a, b, s, ho, wo)
        out += xpad[window] @ w[a, b]
        dxpad[window] += g @ w[a, b].T
        dw[a, b] = np.einsum("nijc,nijo->co", xpad[window], g)
    return out, dxpad[:, p : p + x.shape[1], p : p + x.shape[2]], dw


CONV_CASES = [  # (n, h, w, c_in, kh, kw, c_out, stride, padding)
    (2, 6, 5, 3, 3, 3, 4, 1, 1),
    (2, 7, 6, 3, 3, 2, 4, 2, 2),  # non-square kernel, padding wider than needed
    (1, 5, 5, 2, 1, 1, 3, 1, 0),  # pointwise: no im2col
    (2, 6, 6, 4, 1, 1, 3, 2, 0),  # strided pointwise
    (3, 9, 8, 5, 3, 3, 7, 3, 1),
    (1, 3, 3, 2, 3, 3, 2, 5, 4),  # stride beyond the padded input: windows of padding only
    (1, 4, 6, 1, 4, 6, 2, 1, 0),  # the kernel covers the input: one window
    (0, 4, 4, 2, 3, 3, 2, 1, 1),  # empty batch
    (2, 4, 4, 0, 3, 3, 2, 1, 1),  # no input channels: zero output
    (2, 4, 4, 3, 3, 3, 0, 1, 1),  # no output channels
    (8, 16, 16, 32, 3, 3, 32, 1, 1),  # ResNet-9 sized: threaded im2col, col2im and product
    (4, 16, 16, 32, 3, 3, 64, 2, 1),
    (4, 16, 16, 128, 3, 3, 8, 1, 1),  # deep: more row blocks than weight-gradient parts
]


@pytest.mark.parametrize("mod", MODULES)
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c)))
def test_conv_kernels(mod, case):
    n, h, w, c_in, kh, kw, c_out, s, p = case
    ho, wo = (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1
    rng = np.random.default_rng(sum(case))
    x = rng.standard_normal((n, h, w, c_in)).astype(np.float32)
    wt = rng.standard_normal((kh, kw, c_in, c_out)).astype(np.float32)
    g = rng.standard_normal((n, ho, wo, c_out)).astype(np.float32)
    want = _conv_oracles(x, wt, g, s, p)
    X, W, G = (buffer(mod, v.ravel()) for v in (x, wt, g))

    def run():
        outs = [buffer(mod, np.full(v.size, np.nan, np.float32)) for v in want]  # all written
        mod.conv_fwd(X, W, n, h, w, c_in, kh, kw, c_out, s, p, outs[0])
        mod.conv_input_grad(G, W, kh, kw, c_in, c_out, n, h, w, s, p, outs[1])
        mod.conv_weight_grad(X, G, n, h, w, c_in, kh, kw, c_out, s, p, outs[2])
        return [read(mod, out, exact.shape) for out, exact in zip(outs, want)]

    first, again = run(), run()
    for name, got, repeat, exact in zip(
        ("forward", "input grad", "weight grad"), first, again, want
    ):
        scale = max(1.0, float(np.abs(exact).max()) if exact.size else 1.0)
        np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
        np.testing.assert_array_equal(repeat, got, err_msg=f"{name}: not the same on a rerun")


@pytest.mark.parametrize("mod", MODULES)
def test_conv_kernels_reject_bad_geometry(mod):
    """Bad sizes, strides, paddings and kernels are ValueErrors naming the function and the
    numbers (the buffers fit the sizes, so nothing but the geometry is wrong)."""
    a = mod.Array(64)
    good = dict(n=1, h=4, w=4, c_in=2, kh=3, kw=3, c_out=2, stride=1, padding=1)

    def call(fn, **change):
        d = {**good, **change}
        x, k, o = (d["n"], d["h"], d["w"], d["c_in"]), (d["kh"], d["kw"]), d["c_out"]
        sp = (d["stride"], d["padding"])
        if fn == "conv_input_grad":
            return mod.conv_input_grad(a, a, *k, x[3], o, *x[:3], *sp, a)
        return getattr(mod, fn)(a, a, *x, *k, o, *sp, a)

    cases = {
        "stride 0": ({"stride": 0}, "stride must be >= 1, got 0"),
        # the numpy module rejects every negative size at once, naming them all
        "stride -2": (
            {"stride": -2},
            "(stride must be >= 1, got -2|negative size in .*'stride': -2)",
        ),
        "padding -1": (
            {"padding": -1},
            "(padding must be >= 0, got -1|negative size in .*'padding': -1)",
        ),
        "kernel 0": ({"kh": 0}, "at least 1x1"),
        "kernel too large": (
            {"kh": 7, "padding": 1},
            "kernel 7x3 is larger than the padded input 6x6",
        ),
        "negative size": ({"n": -1}, "negative"),
        "negative channels": ({"c_out": -3}, "negative"),
        "too many elements": ({"padding": 2**40, "stride": 1}, "too"),
        "buffer sizes": ({}, "elements"),  # a 64-element buffer for every operand
    }
    for fn in ("conv_fwd", "conv_input_grad", "conv_weight_grad"):
        for what, (change, message) in cases.items():
            with pytest.raises(ValueError, match=f"{fn}: .*{message}"):
                call(fn, **change)
                pytest.fail(f"{fn}: {what} did not raise")


@pytest.mark.parametrize("mod", MODULES)
def test_conv_kernels_check_each_buffer(mod):
    n, h, w, c_in, kh, kw, c_out, s, p = 2, 5, 4, 3, 3, 2, 2, 2, 1
    ho, wo = (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1
    sizes = {"x": n * h * w * c_in, "w": kh * kw * c_in * c_out, "g": n * ho * wo * c_out}
    calls = {
        "conv_fwd": (
            ("x", "w", "g"),
            lambda b: mod.conv_fwd(b[0], b[1], n, h, w, c_in, kh, kw, c_out, s, p, b[2]),
        ),
        "conv_input_grad": (
            ("g", "w", "x"),
            lambda b: mod.conv_input_grad(b[0], b[1], kh, kw, c_in, c_out, n, h, w, s, p, b[2]),
        ),
        "conv_weight_grad": (
            ("x", "g", "w"),
            lambda b: mod.conv_weight_grad(b[0], b[1], n, h, w, c_in, kh, kw, c_out, s, p, b[2]),
        ),
    }
    for fn, (names, call) in calls.items():
        call([mod.Array(sizes[k]) for k in names])  # the right sizes pass
        for i in range(3):
            for delta in (-1, 1):
                bufs = [mod.Array(sizes[k] + delta * (j == i)) for j, k in enumerate(names)]
                with pytest.raises(
                    ValueError, match=f"{fn}: .* has {sizes[names[i]] + delta} elements"
                ):
                    call(bufs)


@pytest.mark.parametrize("mod", MODULES)
def test_conv_kernels_reject_wrong_kinds(mod):
    a = mod.Array(96)
    sizes = (1, 4, 4, 2, 3, 3, 2, 1, 1)
    calls = {
        "list as x": lambda: mod.conv_fwd([0.0] * 32, a, *sizes, a),
        "None as weight": lambda: mod.conv_fwd(a, None, *sizes, a),
        "float stride": lambda: mod.conv_fwd(a, a, *sizes[:7], 1.0, 1, a),
        "str padding": lambda: mod.conv_weight_grad(a, a, *sizes[:8], "1", a),
        "None out": lambda: mod.conv_input_grad(a, a, 3, 3, 2, 2, 1, 4, 4, 1, 1, None),
        "too few arguments": lambda: mod.conv_fwd(a, a, *sizes),
    }
    for what, call in calls.items():
        with pytest.raises(TypeError):
            call()
            pytest.fail(f"{what} did not raise")
