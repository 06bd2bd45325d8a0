"""Differential fuzzing of NDArray against numpy, and hostile calls into the device modules.

Each seeded case builds random arrays (special values included: NaN, ±inf, -0), takes random
views of them (slices with steps, integer indices, permutations, broadcasts, flips, reshapes),
applies one random operation and compares the result with numpy's. A few hundred cases run by
default; ``NEEDLE_FUZZ_CASES=20000`` runs that many per device. A failure names the case seed,
so ``NEEDLE_FUZZ_SEED=<seed> NEEDLE_FUZZ_CASES=1`` replays it.

The hostile-argument test calls the raw device modules with huge, negative and inconsistent
sizes, strides and offsets, in a subprocess so that a crash is a failure rather than the end of
the run: every call must return or raise TypeError, ValueError or MemoryError.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import DEVICES

import needle as ndl

pytestmark = pytest.mark.ndarray
if ndl.BACKEND != "nd":
    pytest.skip("the NDArray suite runs with NEEDLE_BACKEND=nd", allow_module_level=True)

from needle import backend_ndarray as nd  # noqa: E402

CASES = int(os.environ.get("NEEDLE_FUZZ_CASES", "500"))
SEED = int(os.environ.get("NEEDLE_FUZZ_SEED", "20261201"))
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)


# ---- random arrays and views, built in parallel on numpy and NDArray ----------------------------
def random_data(rng, shape) -> np.ndarray:
    if rng.random() < 0.25:  # small integers: ties, so == <= < >= > are told apart
        x = rng.integers(-2, 3, shape).astype(np.float32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    if x.size and rng.random() < 0.3:  # sprinkle special values
        mask = rng.random(shape) < 0.2
        x[mask] = rng.choice(SPECIAL, int(mask.sum()))
    return x


def random_shape(rng, ndim=None, max_dim: int = 5):
    ndim = int(rng.integers(0, 5)) if ndim is None else ndim
    return tuple(
        int(rng.integers(0 if rng.random() < 0.05 else 1, max_dim + 1)) for _ in range(ndim)
    )


def random_view(rng, x: np.ndarray, a: nd.NDArray, steps: int = 2):
    """Apply up to ``steps`` random view operations to the pair (numpy x, NDArray a)."""
    log = []
    for _ in range(int(rng.integers(0, steps + 1))):
        kind = rng.choice(["slice", "index", "permute", "flip", "reshape", "broadcast"])
        if kind == "slice" and x.ndim:
            idx = []
            for n in x.shape:
                start = int(rng.integers(-n, n + 1)) if n and rng.random() < 0.5 else None
                stop = int(rng.integers(-n, n + 1)) if n and rng.random() < 0.5 else None
                idx.append(slice(start, stop, int(rng.integers(1, 4))))
            idx = tuple(idx)
            x, a = x[idx], a[idx]
        elif kind == "index" and x.ndim and 0 not in x.shape:
            dim = int(rng.integers(0, x.ndim))
            i = int(rng.integers(-x.shape[dim], x.shape[dim]))
            idx = tuple(i if d == dim else slice(None) for d in range(x.ndim))
            # NDArray keeps the dimension (size 1); numpy's equivalent is a length-1 slice
            x = x[
                tuple(
                    slice(i, i + 1 if i != -1 else None) if d == dim else slice(None)
                    for d in range(x.ndim)
                )
            ]
            a = a[idx]
        elif kind == "permute" and x.ndim:
            perm = tuple(int(p) for p in rng.permutation(x.ndim))
            x, a = x.transpose(perm), a.permute(perm)
        elif kind == "flip" and x.ndim:
            axes = tuple(d for d in range(x.ndim) if rng.random() < 0.5) or (0,)
            x, a = np.flip(x, axes), a.flip(axes)
        elif kind == "reshape":
            a = a.compact()
            shape = tuple(int(s) for s in rng.permutation(x.shape))
            x, a = x.reshape(shape), a.reshape(shape)
        elif kind == "broadcast" and 1 in x.shape:
            shape = tuple(int(rng.integers(1, 4)) if n == 1 else n for n in x.shape)
            if rng.random() < 0.3:
                shape = (int(rng.integers(1, 3)),) + shape
            x, a = np.broadcast_to(x, shape), a.broadcast_to(shape)
        else:
            continue
        log.append(kind)
    assert a.shape == x.shape, (log, a.shape, x.shape)
    return x, a, log


def random_array(rng, device, shape=None):
    x = random_data(rng, random_shape(rng) if shape is None else shape)
    return random_view(rng, x, nd.array(x, device=device))


def random_operand(rng, device, shape):
    """An array of exactly ``shape``: compact, flipped, stored permuted, or broadcast."""
    kind = rng.choice(["compact", "flip", "permuted", "broadcast"])
    if kind == "broadcast" and shape:
        small = tuple(1 if rng.random() < 0.5 else n for n in shape)
        x = random_data(rng, small)
        return np.broadcast_to(x, shape), nd.array(x, device=device).broadcast_to(shape), [kind]
    x = random_data(rng, shape)
    a = nd.array(x, device=device)
    if kind == "flip" and shape:
        axes = tuple(d for d in range(len(shape)) if rng.random() < 0.5) or (0,)
        return x, nd.array(np.flip(x, axes), device=device).flip(axes), [kind]
    if kind == "permuted" and shape:
        perm = tuple(int(p) for p in rng.permutation(len(shape)))
        stored = np.ascontiguousarray(x.transpose(perm))
        return x, nd.array(stored, device=device).permute(tuple(np.argsort(perm))), [kind]
    return x, a, ["compact"]


def broadcastable_to(rng, shape):
    """A random shape that broadcasts with ``shape`` (dims dropped on the left or set to 1)."""
    lead = int(rng.integers(0, len(shape) + 1))
    return tuple(1 if rng.random() < 0.3 else n for n in shape[lead:])


def compare(got: nd.NDArray, expected, what, exact: bool = True, rtol=1e-5, atol=1e-5):
    expected = np.asarray(expected, dtype=np.float32)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if exact:
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=what)
    else:
        np.testing.assert_allclose(
            got.numpy(), expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=what
        )


# ---- one case of each kind ------------------------------------------------------------------
def _either(a, b, nd_fn, np_fn):
    """nd_fn when either operand is an NDArray (a reversed scalar form swaps them), else np_fn."""
    if isinstance(b, nd.NDArray) and not isinstance(a, nd.NDArray):
        return nd_fn(b, a)
    return nd_fn(a, b) if isinstance(a, nd.NDArray) else np_fn(a, b)


BINARY = [
    ("add", lambda a, b: a + b, True),
    ("sub", lambda a, b: a - b, True),
    ("mul", lambda a, b: a * b, True),
    ("div", lambda a, b: a / b, True),
    ("pow", lambda a, b: a**b, False),
    ("maximum", lambda a, b: _either(a, b, nd.maximum, np.maximum), True),
    ("minimum", lambda a, b: _either(a, b, nd.minimum, np.minimum), True),
    ("eq", lambda a, b: a == b, True),
    ("ne", lambda a, b: a != b, True),
    ("lt", lambda a, b: a < b, True),
    ("le", lambda a, b: a <= b, True),
    ("gt", lambda a, b: a > b, True),
    ("ge", lambda a, b: a >= b, True),
]
UNARY = [
    ("neg", lambda a: -a, lambda x: -x, True),
    ("abs", lambda a: a.abs(), np.abs, True),
    ("sqrt", nd.sqrt, np.sqrt, True),
    ("exp", nd.exp, np.exp, False),
    ("log", nd.log, np.log, False),
    ("tanh", nd.tanh, np.tanh, False),
    ("sigmoid", nd.sigmoid, lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), False),
    ("relu", nd.relu, lambda x: np.where(np.isnan(x), x, np.maximum(x, 0)), True),
]


def case_views(rng, device):
    x, a, log = random_array(rng, device)
    compare(a, x, f"views {log}")
    compare(a.compact(), x, f"compact of views {log}")


def case_binary(rng, device):
    name, fn, exact = BINARY[int(rng.integers(len(BINARY)))]
    x, a, log = random_array(rng, device)
    form = rng.choice(["array", "broadcast", "scalar", "reversed"])
    if form in ("array", "broadcast"):
        shape = x.shape if form == "array" else broadcastable_to(rng, x.shape)
        y, b, _ = random_operand(rng, device, shape)
        if form == "array" and rng.random() < 0.5:  # equal elements in places: ties
            y = np.where(rng.random(shape) < 0.5, x, y).astype(np.float32)
            b = nd.array(y, device=device)
        if rng.random() < 0.5:
            x, a, y, b = y, b, x, a
        with np.errstate(all="ignore"):
            expected = fn(x, y)
        got = fn(a, b)
    else:
        v = float(rng.choice([2.0, -0.5, 0.0, -0.0, 3.0, np.nan, np.inf]))
        if x.size and rng.random() < 0.3:  # a value the array holds: ties
            v = float(x.flat[int(rng.integers(x.size))])
        s = np.float32(v)
        with np.errstate(all="ignore"):
            expected = fn(x, s) if form == "scalar" else fn(s, x)
        got = fn(a, v) if form == "scalar" else fn(v, a)
    compare(got, expected, f"{name} {form} {log}", exact, rtol=1e-5, atol=1e-6)


def case_unary(rng, device):
    name, fn, ref, exact = UNARY[int(rng.integers(len(UNARY)))]
    x, a, log = random_array(rng, device)
    with np.errstate(all="ignore"):
        expected = ref(x)
    compare(fn(a), expected, f"{name} {log}", exact, rtol=2e-5, atol=1e-6)


def case_reduce(rng, device):
    x, a, log = random_array(rng, device)
    op = rng.choice(["sum", "max"])
    keepdims = bool(rng.random() < 0.5)
    if x.ndim == 0 or rng.random() < 0.2:
        axis = None
    elif rng.random() < 0.4:
        axis = int(rng.integers(-x.ndim, x.ndim))
    else:
        chosen = [d for d in range(x.ndim) if rng.random() < 0.5] or [0]
        axis = tuple(d - x.ndim if rng.random() < 0.5 else d for d in chosen)
    what = f"{op} axis={axis} keepdims={keepdims} of {x.shape} {log}"
    reduced = range(x.ndim) if axis is None else np.atleast_1d(np.array(axis)) % x.ndim
    empty = any(x.shape[d] == 0 for d in reduced) or (axis is None and x.size == 0)
    out_size = (
        1
        if axis is None
        else int(np.prod([n for d, n in enumerate(x.shape) if d not in set(reduced)]))
    )
    if op == "max" and empty and out_size:
        with pytest.raises(ValueError, match="max of an empty axis"):
            a.max(axis=axis, keepdims=keepdims)
        return
    got = getattr(a, op)(axis=axis, keepdims=keepdims)
    with np.errstate(all="ignore"):
        expected = (
            getattr(x.astype(np.float64), op)(axis=axis, keepdims=keepdims)
            if not (op == "max" and empty)
            else np.zeros(got.shape)
        )
    if axis is None and not keepdims:
        expected = np.reshape(expected, (1,))
    compare(got, expected, what, exact=op == "max", rtol=1e-5, atol=5e-4)


def case_matmul(rng, device):
    m, n, p = (int(rng.choice([0, 1, 2, 3, 5, 8, 16, 17, 33, 64, 65])) for _ in range(3))
    batch_a = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3))))
    batch_b = broadcastable_to(rng, batch_a) if rng.random() < 0.5 else batch_a[1:]
    if rng.random() < 0.5:
        batch_a, batch_b = batch_b, batch_a

    def operand(batch, rows, cols):
        if rng.random() < 0.5:  # stored transposed, passed as a permuted view
            x = rng.standard_normal(batch + (cols, rows)).astype(np.float32)
            perm = tuple(range(len(batch))) + (len(batch) + 1, len(batch))
            return x.transpose(perm), nd.array(x, device=device).permute(perm)
        x = rng.standard_normal(batch + (rows, cols)).astype(np.float32)
        return x, nd.array(x, device=device)

    x, a = operand(batch_a, m, n)
    y, b = operand(batch_b, n, p)
    if x.ndim < 2 or y.ndim < 2:
        return
    compare(
        a @ b,
        np.matmul(x.astype(np.float64), y),
        f"matmul {x.shape} @ {y.shape}",
        exact=False,
        rtol=1e-4,
        atol=1e-4,
    )


def case_setitem(rng, device):
    x = random_data(rng, random_shape(rng, ndim=int(rng.integers(1, 4)), max_dim=6))
    a = nd.array(x, device=device)
    x = x.copy()
    idx = tuple(
        slice(int(rng.integers(0, n // 2 + 1)), None, int(rng.integers(1, 3))) for n in x.shape
    )
    target = x[idx]
    if rng.random() < 0.3:
        v = float(rng.standard_normal())
        x[idx] = v
        a[idx] = v
    else:
        # a source that overlaps the target: another view of the same buffer, same shape
        src_idx = tuple(
            slice(int(rng.integers(0, n - t + 1)) if n - t >= 0 else 0, None)
            for n, t in zip(x.shape, target.shape)
        )
        src_idx = tuple(slice(s.start, s.start + t) for s, t in zip(src_idx, target.shape))
        if rng.random() < 0.5 and target.ndim:
            src_np, src_nd = np.flip(x[src_idx], 0), a[src_idx].flip(0)  # a copy
        else:
            src_np, src_nd = x[src_idx], a[src_idx]
        x[idx] = src_np.copy()  # numpy's own overlap handling, made explicit
        a[idx] = src_nd
    compare(a, x, f"setitem {idx}")


def case_pad(rng, device):
    x, a, log = random_array(rng, device)
    pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in x.shape)
    compare(a.pad(pads), np.pad(x, pads) if pads else x, f"pad {pads} {log}")


CASE_KINDS = [
    case_views,
    case_binary,
    case_binary,
    case_unary,
    case_reduce,
    case_reduce,
    case_matmul,
    case_setitem,
    case_pad,
]


@pytest.mark.parametrize("device", DEVICES)
def test_fuzz_against_numpy(device):
    counts = {}
    for i in range(CASES):
        seed = SEED + i
        rng = np.random.default_rng(seed)
        case = CASE_KINDS[int(rng.integers(len(CASE_KINDS)))]
        try:
            case(rng, device)
        except Exception as exc:
            raise AssertionError(
                f"fuzz case seed {seed} ({case.__name__}) on {device}: "
                f"replay with NEEDLE_FUZZ_SEED={seed} NEEDLE_FUZZ_CASES=1"
            ) from exc
        counts[case.__name__] = counts.get(case.__name__, 0) + 1
    assert sum(counts.values()) == CASES and len(counts) == len(set(CASE_KINDS))


# ---- hostile arguments to the raw device modules ----------------------------------------------
HOSTILE = textwrap.dedent("""
    import sys, random
    import numpy as np
    from needle.backend_ndarray import protocol
    import needle.backend_ndarray as nd
    mod = getattr(nd, sys.argv[1])
    calls, seed = int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    INTS = [0, 1, 2, 3, 7, -1, -2, -7, 2**31 - 1, 2**31, -2**31, 2**32 + 1, 2**40, -2**40,
            2**50 + 1, 2**62, -2**62, 2**63 - 1, -2**63]
    def i():
        return rnd.choice(INTS) if rnd.random() < 0.5 else rnd.randint(-3, 8)
    def seq(n=None):
        return tuple(i() for _ in range(rnd.randint(0, 4) if n is None else n))
    def buf():
        a = mod.Array(rnd.randint(0, 8))
        if a.size:
            mod.fill(a, 1.0)
        return a
    def op(table):
        return rnd.choice([0, len(table) - 1, len(table), -1, 2**31, i()])
    def shape_strides():
        n = rnd.randint(0, 4)
        return seq(n), seq(n if rnd.random() < 0.9 else n + 1)
    def val():
        return rnd.choice([1.0, float("nan"), float("inf"), -0.0, 1e38])
    FNS = {
        "to_numpy": lambda: mod.to_numpy(buf(), *shape_strides(), i()),
        "compact": lambda: mod.compact(buf(), buf(), *shape_strides(), i()),
        "ewise_setitem": lambda: mod.ewise_setitem(buf(), buf(), *shape_strides(), i()),
        "scalar_setitem": lambda: mod.scalar_setitem(i(), val(), buf(), *shape_strides(), i()),
        "ewise_binary": lambda: mod.ewise_binary(op(protocol.BINARY_OPS), buf(), seq(), i(),
                                                 buf(), seq(), i(), buf(), seq()),
        "ewise_scalar": lambda: mod.ewise_scalar(op(protocol.BINARY_OPS), buf(), seq(), i(),
                                                 val(), buf(), seq(), rnd.random() < 0.5),
        "ewise_unary": lambda: mod.ewise_unary(op(protocol.UNARY_OPS), buf(), seq(), i(), buf(),
                                               seq()),
        "reduce": lambda: mod.reduce(op(protocol.REDUCE_OPS), buf(), *shape_strides(), i(),
                                     i(), buf()),
        "matmul_strided": lambda: mod.matmul_strided(buf(), seq(3), i(), buf(), seq(3), i(),
                                                     buf(), i(), i(), i(), i()),
        "matmul": lambda: mod.matmul(buf(), buf(), buf(), i(), i(), i()),
        "reduce_sum": lambda: mod.reduce_sum(buf(), buf(), i()),
        "reduce_max": lambda: mod.reduce_max(buf(), buf(), i()),
        "ewise_add": lambda: mod.ewise_add(buf(), buf(), buf()),
        "scalar_power": lambda: mod.scalar_power(buf(), val(), buf()),
        "fill": lambda: mod.fill(buf(), val()),
        "Array": lambda: mod.Array(rnd.choice([-1, -2**40, 2**50 + 1, 2**62, 2**63 - 1])),
    }
    names = sorted(FNS)
    raised = 0
    # None where a buffer belongs, in every buffer position of every function
    for name, call in [
            ("to_numpy", lambda: mod.to_numpy(None, (1,), (1,), 0)),
            ("compact", lambda: mod.compact(None, mod.Array(1), (1,), (1,), 0)),
            ("compact out", lambda: mod.compact(mod.Array(1), None, (1,), (1,), 0)),
            ("ewise_setitem", lambda: mod.ewise_setitem(mod.Array(1), None, (1,), (1,), 0)),
            ("scalar_setitem", lambda: mod.scalar_setitem(1, 0.0, None, (1,), (1,), 0)),
            ("ewise_binary", lambda: mod.ewise_binary(0, mod.Array(1), (1,), 0, None, (1,), 0,
                                                      mod.Array(1), (1,))),
            ("ewise_scalar", lambda: mod.ewise_scalar(0, mod.Array(1), (1,), 0, 1.0, None, (1,),
                                                      False)),
            ("ewise_unary", lambda: mod.ewise_unary(0, mod.Array(1), (1,), 0, None, (1,))),
            ("reduce", lambda: mod.reduce(0, mod.Array(1), (1,), (1,), 0, 0, None)),
            ("matmul_strided", lambda: mod.matmul_strided(mod.Array(1), (0, 1, 1), 0, None,
                                                          (0, 1, 1), 0, mod.Array(1), 1, 1, 1, 1)),
            ("matmul", lambda: mod.matmul(mod.Array(1), mod.Array(1), None, 1, 1, 1)),
            ("reduce_sum", lambda: mod.reduce_sum(mod.Array(1), None, 1)),
            ("ewise_add", lambda: mod.ewise_add(mod.Array(1), None, mod.Array(1))),
            ("fill", lambda: mod.fill(None, 1.0)),
            ("from_numpy", lambda: mod.from_numpy(np.ones(1, np.float32), None))]:
        print("None as a buffer:", name, flush=True)
        try:
            call()
            print(f"{name} accepted None as a buffer")
            sys.exit(4)
        except TypeError:
            pass
        except Exception as exc:
            print(f"{name}: None as a buffer: unexpected {type(exc).__name__}: {exc}")
            sys.exit(3)
    for k in range(calls):
        name = names[k % len(names)]
        try:
            FNS[name]()
        except (TypeError, ValueError, MemoryError):
            raised += 1
        except Exception as exc:
            print(f"{name}: unexpected {type(exc).__name__}: {exc}")
            sys.exit(3)
    print(f"ok {calls} calls, {raised} raised")
""")


def _module_names():
    names = [pytest.param("ndarray_backend_numpy", id="numpy")]
    for attr, dev in (("ndarray_backend_cpu", nd.cpu()), ("ndarray_backend_cuda", nd.cuda())):
        marks = [] if dev.enabled() else [pytest.mark.skip(reason=f"{dev} is not enabled here")]
        names.append(pytest.param(attr, id=dev.name, marks=marks))
    return names


@pytest.mark.parametrize("module", _module_names())
def test_hostile_arguments_to_device_modules(module):
    calls = max(CASES * 4, 400)
    proc = subprocess.run(
        [sys.executable, "-c", HOSTILE, module, str(calls), str(SEED)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{module} exited with {proc.returncode} (a negative code is "
        f"a signal: the interpreter crashed)\n{proc.stdout}\n"
        f"{proc.stderr[-3000:]}"
    )
    assert proc.stdout.splitlines()[-1].startswith(f"ok {calls} calls"), proc.stdout
