"""Element-wise ops broadcast like numpy, with gradients of each input's own shape; scalar ops
take every kind of real scalar and refuse the rest; constructors refuse unknown keywords.

Forward values against numpy, gradients against central finite differences (helpers), over
the broadcasting pairs a newcomer writes: scalar-like, row, column, leading 1s, rank mismatch.
Each test is named after the course function it exercises and runs on every enabled device of
the current backend (once with ``NEEDLE_BACKEND=np``, once with ``nd``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from helpers import backend_dtype, check_gradients, tensor

import needle as ndl

pytestmark = [pytest.mark.ops, pytest.mark.both_backends]

# (left shape, right shape): every way numpy lines two shapes up
PAIRS = [
    ((2, 3), (1, 1)),  # scalar-like
    ((1,), (2, 3)),  # scalar-like, lower rank, on the left
    ((2, 3), (3,)),  # row, rank mismatch
    ((2, 3), (1, 3)),  # row
    ((2, 3), (2, 1)),  # column
    ((3, 1), (1, 4)),  # outer: both sides broadcast
    ((2, 1, 3), (4, 1)),  # leading 1s and a rank mismatch, both sides broadcast
    ((1, 2, 3), (2, 3)),  # leading 1
    ((2, 3), (2, 3)),  # equal shapes (the course's case)
]
PAIR_IDS = ["x".join(map(str, a)) + "-" + "x".join(map(str, b)) for a, b in PAIRS]

# needle function, numpy oracle, whether inputs must be positive (power: a ** b needs a > 0)
BINARY = {
    "add": (ndl.add, np.add, False),
    "add_operator": (lambda a, b: a + b, np.add, False),
    "subtract_operator": (lambda a, b: a - b, np.subtract, False),
    "multiply": (ndl.multiply, np.multiply, False),
    "divide": (ndl.divide, np.divide, True),
    "power": (ndl.power, np.power, True),
}


def _inputs(shapes, positive: bool, seed: int):
    rng = np.random.default_rng(seed)
    if positive:
        return [rng.uniform(0.5, 2.0, size=s) for s in shapes]
    return [rng.uniform(-1.0, 1.0, size=s) for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("name", list(BINARY))
def test_broadcasting_forward_matches_numpy(name, shapes, device):
    fn, ref, positive = BINARY[name]
    a, b = _inputs(shapes, positive, seed=len(name))
    out = fn(tensor(a, device), tensor(b, device))
    expected = ref(a, b)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("name", list(BINARY))
def test_broadcasting_gradient_matches_finite_differences(name, shapes, device):
    """check_gradients also asserts each ``x.grad.shape == x.shape``."""
    fn, _, positive = BINARY[name]
    a, b = _inputs(shapes, positive, seed=len(name) + 1)
    check_gradients(fn, a, b, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_power_course_example_broadcasts(device):
    """The issue's example: a (1, 3) base and a (3,) exponent."""
    x = tensor([[1.0, 2.0, 3.0]], device)
    y = tensor(np.ones(3) * 2, device)
    out = ndl.power(x, y)
    np.testing.assert_allclose(out.numpy(), [[1.0, 4.0, 9.0]], rtol=1e-6)
    out.sum().backward()
    assert x.grad.shape == (1, 3) and y.grad.shape == (3,)
    np.testing.assert_allclose(x.grad.numpy(), [[2.0, 4.0, 6.0]], rtol=1e-5)
    np.testing.assert_allclose(
        y.grad.numpy(), np.log([1.0, 2.0, 3.0]) * [1.0, 4.0, 9.0], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("device", DEVICES)
def test_broadcasting_gradient_through_a_chain(device):
    """A bias added to a matmul and scaled by a column: the usual layer, without broadcast_to."""
    rng = np.random.default_rng(3)
    check_gradients(
        lambda x, w, b, s: ndl.tanh((x @ w + b) * s),
        rng.uniform(-1, 1, (4, 3)),
        rng.uniform(-1, 1, (3, 2)),
        rng.uniform(-1, 1, (2,)),
        rng.uniform(-1, 1, (4, 1)),
        device=device,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_add_shapes_that_do_not_broadcast_raise(device):
    with pytest.raises(ValueError, match=r"\(2, ?3\).*\(2, ?2\)"):
        ndl.add(tensor(np.ones((2, 3)), device), tensor(np.ones((2, 2)), device))


# ---- scalar ops: which scalars they take -----------------------------------------------------
SCALAR_OPS = {
    "add_scalar": (ndl.add_scalar, lambda a, s: a + s),
    "mul_scalar": (ndl.mul_scalar, lambda a, s: a * s),
    "divide_scalar": (ndl.divide_scalar, lambda a, s: a / s),
    "power_scalar": (ndl.power_scalar, lambda a, s: a**s),
    "add_operator": (lambda t, s: t + s, lambda a, s: a + s),
    "radd_operator": (lambda t, s: s + t, lambda a, s: s + a),
    "sub_operator": (lambda t, s: t - s, lambda a, s: a - s),
    "rsub_operator": (lambda t, s: s - t, lambda a, s: s - a),
    "mul_operator": (lambda t, s: t * s, lambda a, s: a * s),
    "rmul_operator": (lambda t, s: s * t, lambda a, s: s * a),
    "truediv_operator": (lambda t, s: t / s, lambda a, s: a / s),
    "rtruediv_operator": (lambda t, s: s / t, lambda a, s: s / a),
    "pow_operator": (lambda t, s: t**s, lambda a, s: a**s),
}
GOOD_SCALARS = {
    "int": 2,
    "float": 1.5,
    "numpy_float64": np.float64(1.5),
    "numpy_float32": np.float32(-0.5),
    "numpy_int64": np.int64(3),
    "zero_d_array": np.array(0.75),
    "one_element_array": np.array([1.25]),
    "one_element_2d_array": np.array([[2.0]], dtype=np.float32),
}
BAD_SCALARS = {
    "string": "1",
    "complex": 1 + 2j,
    "numpy_complex": np.complex64(1),
    "bool": True,
    "list": [1.0],
    "two_element_array": np.array([1.0, 2.0]),
    "none": None,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scalar", list(GOOD_SCALARS))
@pytest.mark.parametrize("name", list(SCALAR_OPS))
def test_scalar_ops_accept_real_scalars(name, scalar, device):
    """Result equals numpy with the scalar as a Python number, in the tensor's own dtype."""
    fn, ref = SCALAR_OPS[name]
    s = GOOD_SCALARS[scalar]
    a = np.array([[0.5, 1.0, 2.0]])
    x = tensor(a, device)
    out = fn(x, s)
    assert out.dtype == x.dtype, "a numpy scalar must not promote the tensor's dtype"
    np.testing.assert_allclose(out.numpy(), ref(a, float(np.asarray(s).item())), rtol=1e-5)
    assert out.shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
def test_divide_scalar_course_gradient_check(device):
    """The course passes ``scalar=np.random.randn(1)``; the gradient is 1/scalar."""
    s = np.random.randn(1)
    check_gradients(lambda a: ndl.divide_scalar(a, scalar=s), np.random.randn(5, 4), device=device)
    check_gradients(
        lambda a: ndl.power_scalar(a, scalar=np.int64(2)), np.random.randn(5, 4), device=device
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scalar", list(BAD_SCALARS))
@pytest.mark.parametrize("name", list(SCALAR_OPS))
def test_scalar_ops_reject_other_values(name, scalar, device):
    """Both backends raise the same TypeError (a complex scalar included)."""
    fn, _ = SCALAR_OPS[name]
    x = tensor([[0.5, 1.0, 2.0]], device)
    with pytest.raises(TypeError, match="real number|scalar|one-element"):
        fn(x, BAD_SCALARS[scalar])


# ---- unknown keywords -----------------------------------------------------------------------
def test_tensor_rejects_unknown_keyword():
    """``require_grad`` (a typo) must not be silently accepted."""
    with pytest.raises(TypeError, match="require_grad"):
        ndl.Tensor([1.0], require_grad=False)
    with pytest.raises(TypeError, match="devise"):
        ndl.Tensor([1.0], devise=ndl.cpu())


def test_tensor_dtype_is_kept_by_the_backend():
    """float32 in, float32 out on both backends (numpy's dtype under np, float32 under nd)."""
    t = ndl.Tensor(np.ones(2, dtype=np.float32))
    assert t.dtype == "float32" and (t * np.float64(2.0)).dtype == "float32"


def test_numpy_scalar_on_the_left_gives_a_tensor():
    """numpy defers to Tensor's reflected operators instead of making an object array."""
    t = ndl.Tensor(np.array([1.0, 2.0], dtype=backend_dtype()))
    for out in (np.float64(2.0) * t, np.float32(1.0) + t, np.float64(3.0) - t):
        assert isinstance(out, ndl.Tensor) and out.shape == (2,)
    np.testing.assert_allclose((np.float64(3.0) - t).numpy(), [2.0, 1.0])
