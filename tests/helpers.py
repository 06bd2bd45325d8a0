"""Shared test helpers: central finite differences as the oracle for every gradient.

``check_gradients(f, *arrays, device=...)`` builds needle tensors from numpy ``arrays``, runs
``f`` and its backward pass with a random adjoint R (so every output element matters), and
compares each input's ``.grad`` with central differences of L(x) = Σ f(x)·R. The oracle
evaluates ``f`` forward only; it never reads the op's gradient code.
"""

from __future__ import annotations

import numpy as np

import needle as ndl


def backend_dtype() -> str:
    """The dtype tests compute in: float32 on the NDArray backend, float64 on numpy.

    float64 under ``NEEDLE_BACKEND=np`` keeps finite differences tight; the NDArray backend
    is float32 only.
    """
    return "float64" if ndl.BACKEND == "np" else "float32"


def tensor(array, device, requires_grad: bool = True, dtype: str | None = None) -> ndl.Tensor:
    """A needle tensor from a numpy array, in the backend's test dtype."""
    dtype = dtype or backend_dtype()
    return ndl.Tensor(
        np.asarray(array, dtype=dtype), device=device, dtype=dtype, requires_grad=requires_grad
    )


def tolerances() -> dict:
    """Step and tolerances for finite differences in the current dtype.

    ``atol`` is relative to the largest gradient entry, so small gradients are not waved through.
    Measured worst errors of the five-point stencil over the op table: about 2e-4 (float32,
    step 1e-2) and 1e-10 (float64, step 1e-4).
    """
    if backend_dtype() == "float64":
        return {"eps": 1e-4, "rtol": 1e-7, "atol": 1e-7}
    return {"eps": 1e-2, "rtol": 2e-3, "atol": 2e-3}


def _objective(f, arrays, device, weights) -> float:
    """L = Σ f(arrays)·weights evaluated in float64 (forward only, no graph)."""
    inputs = [tensor(a, device, requires_grad=False) for a in arrays]
    out = f(*inputs)
    if isinstance(out, ndl.TensorTuple):
        return float(sum((o.numpy().astype(np.float64) * w).sum() for o, w in zip(out, weights)))
    return float((out.numpy().astype(np.float64) * weights).sum())


def numerical_gradients(f, arrays, device, weights, eps: float) -> list[np.ndarray]:
    """Finite differences of L = Σ f(x)·weights with respect to each array in ``arrays``.

    Five-point stencil (error O(eps⁴)), which lets float32 use a step large enough that
    rounding in f stays far below the tolerance.
    """
    grads = []
    for k, array in enumerate(arrays):
        grad = np.zeros(array.shape, dtype=np.float64)
        for idx in np.ndindex(*array.shape):
            shifted = [a.copy() for a in arrays]

            def at(step):
                shifted[k][idx] = array[idx] + step
                return _objective(f, shifted, device, weights)

            grad[idx] = (8 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12 * eps)
        grads.append(grad)
    return grads


def check_gradients(f, *arrays, device, eps=None, rtol=None, atol=None, seed: int = 0):
    """Assert that backward through ``f`` matches finite differences for every input.

    ``arrays`` are numpy arrays (cast to the test dtype). Returns the analytic gradients.
    """
    tol = tolerances()
    eps = tol["eps"] if eps is None else eps
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    dtype = backend_dtype()
    arrays = [np.asarray(a, dtype=dtype) for a in arrays]
    rng = np.random.default_rng(seed)
    tensors = [tensor(a, device) for a in arrays]
    out = f(*tensors)
    if isinstance(out, ndl.TensorTuple):
        weights = [rng.standard_normal(o.shape) for o in out]
        # the objective Σ_i out_i·R_i, built from needle ops so backward covers the tuple
        total = None
        for o, w in zip(out, weights):
            term = (o * tensor(w, device, requires_grad=False)).sum()
            total = term if total is None else total + term
        total.backward()
    else:
        weights = rng.standard_normal(out.shape)
        out.backward(tensor(weights, device, requires_grad=False))
    numeric = numerical_gradients(f, arrays, device, weights, eps)
    analytic = []
    for i, (t, num) in enumerate(zip(tensors, numeric)):
        assert t.grad is not None, f"input {i} received no gradient"
        got = t.grad.numpy().astype(np.float64)
        assert got.shape == num.shape, f"input {i}: gradient shape {got.shape} != {num.shape}"
        scale = np.abs(num).max() if num.size else 0.0
        np.testing.assert_allclose(
            got,
            num,
            rtol=rtol,
            atol=atol * scale + 1e-9,
            err_msg=f"gradient of input {i} differs from finite differences",
        )
        analytic.append(got)
    return analytic


def rand(shape, rng=None, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    """Uniform samples in [low, high) as float64 (cast later to the test dtype)."""
    rng = rng if rng is not None else np.random
    return rng.uniform(low, high, size=shape)


def away_from_zero(shape, rng=None, margin: float = 0.1) -> np.ndarray:
    """Samples with |x| in [margin, 1): keeps finite differences off kinks such as relu's."""
    rng = rng if rng is not None else np.random
    mag = rng.uniform(margin, 1.0, size=shape)
    sign = np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0)
    return mag * sign


def float32_tensor(a, device, requires_grad: bool = True) -> ndl.Tensor:
    """A float32 needle tensor from array-like ``a`` (the modules' own dtype, on any backend)."""
    return ndl.Tensor(np.asarray(a, dtype=np.float32), device=device, requires_grad=requires_grad)


def central_difference(fn, x, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar function ``fn`` at ``x`` (evaluated in float64)."""
    x = np.asarray(x, dtype=np.float64)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        g[idx] = (fn(xp) - fn(xm)) / (2 * eps)
    return g
