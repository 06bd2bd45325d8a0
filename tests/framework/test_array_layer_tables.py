"""The array layer's tables, written once on the Python side, reach every place they must.

* every op of ``protocol.OP_METHODS`` is a method of both array types (NDArray and the
  ``NEEDLE_BACKEND=np`` array), a module function of both array APIs, a numpy kernel, and an
  entry of every device module's op table; each computes what numpy computes;
* every fused kernel of ``fused_spec.KERNELS`` is an array-level function of both backends and
  a function of every device module, and a wrong shape of any operand is a ValueError naming
  the operand at every level (NDArray, numpy arrays, device buffers);
* the numpy kernels and the specification import no part of needle, and ``NEEDLE_BACKEND=np``
  never loads the NDArray layer or the compiled modules.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import needle.backend_ndarray as nd
from needle import backend_numpy as npb
from needle.backend_ndarray import fused_spec, numpy_kernels
from needle.backend_ndarray.protocol import BINARY_OPS, OP_METHODS, REDUCE_OPS, UNARY_OPS

F32 = np.float32
PACKAGE = Path(nd.__file__).parent


def _device_modules():
    """Every device module that is built here (numpy always; the compiled ones when built)."""
    params = []
    for name in ("ndarray_backend_numpy", "ndarray_backend_cpu", "ndarray_backend_cuda"):
        mod = getattr(nd, name)
        marks = [] if mod is not None else [pytest.mark.skip(reason=f"{name} is not built")]
        params.append(pytest.param(mod, id=name, marks=marks))
    return params


DEVICE_MODULES = _device_modules()


def _enabled_device_modules():
    """The device modules that can run here (the CUDA one needs a GPU)."""
    return [
        pytest.param(
            dev.mod,
            id=str(dev),
            marks=[] if dev.enabled() else [pytest.mark.skip(reason=f"{dev} is not enabled")],
        )
        for dev in (nd.cpu_numpy(), nd.cpu(), nd.cuda())
    ]


# ---- element-wise ops and reductions ------------------------------------------------------------
def test_op_methods_name_every_op_of_the_tables():
    assert list(OP_METHODS) == list(BINARY_OPS + UNARY_OPS + REDUCE_OPS)
    assert tuple(numpy_kernels.BINARY) == BINARY_OPS
    assert tuple(numpy_kernels.UNARY) == UNARY_OPS
    assert tuple(numpy_kernels.REDUCE) == REDUCE_OPS


@pytest.mark.parametrize("op", list(OP_METHODS))
def test_every_op_is_a_method_of_both_array_types_and_a_function_of_both_apis(op):
    for name in OP_METHODS[op]:
        assert callable(getattr(nd.NDArray, name, None)), f"NDArray lacks {name} ({op})"
        assert callable(getattr(npb.NDArray, name, None)), f"the np array lacks {name} ({op})"
        if not name.startswith("__"):
            assert callable(getattr(nd, name, None)), f"backend_ndarray lacks {name}()"
            assert callable(getattr(npb, name, None)), f"backend_numpy lacks {name}()"


@pytest.mark.parametrize("mod", DEVICE_MODULES)
def test_every_device_module_has_the_op_tables(mod):
    assert tuple(mod.__binary_ops__) == BINARY_OPS
    assert tuple(mod.__unary_ops__) == UNARY_OPS
    assert tuple(mod.__reduce_ops__) == REDUCE_OPS
    for fn in ("ewise_binary", "ewise_scalar", "ewise_unary", "reduce"):
        assert callable(getattr(mod, fn))


# numpy oracles, written here: op -> f(x, y) / f(x)
ORACLE = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "power": lambda x, y: np.abs(x) ** y,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "neg": np.negative,
    "abs": np.abs,
    "sqrt": lambda x: np.sqrt(np.abs(x)),
    "exp": np.exp,
    "log": lambda x: np.log(np.abs(x)),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    "relu": lambda x: np.where(x > 0, x, 0),
    "sum": lambda x: x.sum(axis=1),
    "max": lambda x: x.max(axis=1),
}
# the operand given to ops whose domain is x ≥ 0 (power, sqrt, log)
NON_NEGATIVE = {"power", "sqrt", "log"}


def _array_types():
    params = [pytest.param((lambda a: np.asarray(a).view(npb.NDArray), np.asarray), id="np")]
    for dev in (nd.cpu_numpy(), nd.cpu()):
        marks = [] if dev.enabled() else [pytest.mark.skip(reason=f"{dev} is not enabled")]
        params.append(
            pytest.param(
                (lambda a, d=dev: nd.array(a, device=d), lambda a: a.numpy()),
                id=f"NDArray-{dev}",
                marks=marks,
            )
        )
    return params


@pytest.mark.parametrize("kind", _array_types())
@pytest.mark.parametrize("op", list(OP_METHODS))
def test_every_method_and_module_function_computes_the_op(kind, op):
    make, host = kind
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4)).astype(F32)
    y = rng.standard_normal((3, 4)).astype(F32)
    if op in NON_NEGATIVE:
        x = np.abs(x)
    a, b = make(x), make(y)
    if op in BINARY_OPS:
        want = ORACLE[op](x, y)
        for name in OP_METHODS[op]:
            if name.startswith("__r"):  # the reflected form with a scalar first: 2 - a ...
                np.testing.assert_allclose(
                    host(getattr(a, name)(2.0)), ORACLE[op](F32(2), x), rtol=1e-5, err_msg=name
                )
                continue
            got = getattr(a, name)(b)
            np.testing.assert_allclose(host(got), want, rtol=1e-5, atol=1e-6, err_msg=name)
            if not name.startswith("__"):
                api = npb if isinstance(a, np.ndarray) else nd
                np.testing.assert_allclose(
                    host(getattr(api, name)(a, b)), want, rtol=1e-5, atol=1e-6
                )
    elif op in UNARY_OPS:
        want = ORACLE[op](x)
        for name in OP_METHODS[op]:
            np.testing.assert_allclose(
                host(getattr(a, name)()), want, rtol=1e-5, atol=1e-6, err_msg=name
            )
            if not name.startswith("__"):
                api = npb if isinstance(a, np.ndarray) else nd
                np.testing.assert_allclose(host(getattr(api, name)(a)), want, rtol=1e-5, atol=1e-6)
    else:
        api = npb if isinstance(a, np.ndarray) else nd
        for got in (getattr(a, op)(axis=1), getattr(api, op)(a, axis=1)):
            np.testing.assert_allclose(host(got).reshape(-1), ORACLE[op](x), rtol=1e-5)


def test_relu_and_sigmoid_edge_values_agree_on_every_path():
    x = np.array([-0.0, np.nan, -np.inf, np.inf, -100.0, 100.0], F32)
    paths = [np.asarray(npb.array(x).relu()), nd.array(x, device=nd.cpu_numpy()).relu().numpy()]
    if nd.cpu().enabled():
        paths.append(nd.array(x, device=nd.cpu()).relu().numpy())
    for got in paths:
        np.testing.assert_array_equal(got, [0.0, np.nan, 0.0, np.inf, 0.0, 100.0])
        assert not np.signbit(got[0]), "relu(-0.0) must be +0.0, as the compiled kernel gives"
    with np.errstate(over="raise"):  # exp(100) of the negated input must not warn or raise
        np.testing.assert_allclose(np.asarray(npb.array(x).sigmoid())[4:], [0.0, 1.0])


# ---- fused kernels ------------------------------------------------------------------------------
SCALARS = {
    "eps": 1e-5,
    "scale": 1.0,
    "lr": 0.1,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "beta1": 0.9,
    "beta2": 0.999,
    "step": 1,
    "queries": 3,
    "causal": 1,
}


# sizes of a strided, padded convolution with a non-square kernel, by name
CONV_SIZES = {"n": 2, "h": 5, "w": 4, "c_in": 3, "kh": 3, "kw": 2, "c_out": 2}
CONV_SIZES.update(stride=2, padding=1)


def _dims(kernel):
    """Sizes for ``kernel``: (3, 2) for the matrix kernels, (3, 2, 4) for the embeddings',
    (3, 2, 4, 5) for attention's, CONV_SIZES for the convolutions'."""
    if set(kernel.dims) == set(CONV_SIZES):
        return tuple(CONV_SIZES[d] for d in kernel.dims)
    return (3, 2, 4, 5)[: max(2, len(kernel.dims))]


# The array-level arguments after the arrays of the kernels that are not given their sizes as
# such (from the sizes by name), and the name of the first: the convolutions take the input's
# (h, w) or the kernel's (kh, kw) as a pair, then stride and padding, and read the other sizes
# off their arrays.
# Attention's array-level functions read their given size (keys) off k, so they take none.
API_SIZES = {
    "attention_fwd": (lambda d: (), None),
    "attention_bwd": (lambda d: (), None),
    "conv_fwd": (lambda d: (d["stride"], d["padding"]), "stride"),
    "conv_input_grad": (lambda d: ((d["h"], d["w"]), d["stride"], d["padding"]), "h"),
    "conv_weight_grad": (lambda d: ((d["kh"], d["kw"]), d["stride"], d["padding"]), "kh"),
}


def _api_sizes(kernel, dims, replace=None):
    """(arguments, the name of the first) that the array-level function takes after its arrays
    for the sizes ``dims``, each given size replaced by ``replace`` when that is not None."""
    named = dict(zip(kernel.dims, dims))
    if replace is not None:
        named.update(dict.fromkeys(kernel.given, replace))
    if kernel.api_name not in API_SIZES:
        return tuple(named[g] for g in kernel.given), kernel.given[0]
    args, first = API_SIZES[kernel.api_name]
    return args(named), first


def _inputs(kernel, dims):
    """Valid numpy inputs for ``kernel`` with sizes ``dims`` (an in-place update: shape (2, 3))."""
    arrays = []
    for op in kernel.inputs:
        shape = (2, 3) if op.match == "source" else op.shape(*dims)
        value = np.full(shape, 0.5, F32)
        if op.name in ("labels", "ids"):
            value = np.zeros(shape, F32)
        arrays.append(value)
    return arrays


def _apis():
    params = [pytest.param((npb, lambda a: a.copy()), id="np")]
    for dev in (nd.cpu_numpy(), nd.cpu()):
        marks = [] if dev.enabled() else [pytest.mark.skip(reason=f"{dev} is not enabled")]
        params.append(
            pytest.param(
                (nd, lambda a, d=dev: nd.array(a, device=d)), id=f"NDArray-{dev}", marks=marks
            )
        )
    return params


@pytest.mark.parametrize("api", _apis())
@pytest.mark.parametrize("name", list(fused_spec.KERNELS))
def test_every_fused_kernel_checks_each_operand_against_the_specification(api, name):
    module, make = api
    kernel = fused_spec.KERNELS[name]
    function = getattr(module, kernel.api_name)
    scalars = [SCALARS[s] for s in kernel.scalars]
    dims = _dims(kernel)
    given, first_given = _api_sizes(kernel, dims) if kernel.given else ((), None)
    arrays = _inputs(kernel, dims)
    result = function(*(make(a) for a in arrays), *given, *scalars)
    if kernel.outputs:
        results = result if isinstance(result, tuple) else (result,)
        assert [tuple(r.shape) for r in results] == list(kernel.output_shapes(dims))
    for i, op in enumerate(kernel.inputs):
        if op.name in kernel.sources:
            continue
        bad = list(arrays)
        bad[i] = np.zeros(np.asarray(arrays[i]).size + 1, F32)
        with pytest.raises(ValueError, match=f"{kernel.api_name}: {op.name} must"):
            function(*(make(a) for a in bad), *given, *scalars)
    if first_given is not None:
        for bad, error in ((-1, ValueError), (2.0, TypeError)):
            args, first = _api_sizes(kernel, dims, replace=bad)
            with pytest.raises(error, match=f"{kernel.api_name}: {first} must"):
                function(*(make(a) for a in arrays), *args, *scalars)


@pytest.mark.parametrize("mod", _enabled_device_modules())
@pytest.mark.parametrize("name", [n for n, k in fused_spec.KERNELS.items() if k.name])
def test_every_device_module_checks_each_fused_buffer(mod, name):
    kernel = fused_spec.KERNELS[name]
    dims = _dims(kernel)
    device_dims = dims if kernel.dims else ()
    size_dims = dims if kernel.dims else (6,)

    def buffers(wrong=None):
        out = []
        for op in kernel.inputs + kernel.outputs:
            n = int(np.prod(op.shape(*size_dims))) + (op.name == wrong)
            buf = mod.Array(n)
            mod.from_numpy(np.full(n, 0.0 if op.name in ("labels", "ids") else 0.5, F32), buf)
            out.append(buf)
        return out

    def call(bufs):
        n_in = len(kernel.inputs)
        getattr(mod, kernel.name)(
            *bufs[:n_in], *device_dims, *[SCALARS[s] for s in kernel.scalars], *bufs[n_in:]
        )

    call(buffers())
    for op in kernel.inputs + kernel.outputs:
        if op.name == kernel.source and not kernel.dims:
            continue  # an update's sizes come from param itself
        with pytest.raises(ValueError):
            call(buffers(wrong=op.name))


# ---- imports ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module, allowed",
    [
        ("numpy_kernels.py", {"__future__", "typing", "numpy"}),
        ("fused_spec.py", {"__future__", "typing", "functools", "math", "dataclasses"}),
    ],
)
def test_the_shared_modules_import_no_part_of_needle(module, allowed):
    tree = ast.parse((PACKAGE / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module} imports a relative module"
            imported.add(node.module.split(".")[0])
    assert imported <= allowed, f"{module} imports {sorted(imported - allowed)}"


def test_the_np_backend_never_loads_the_ndarray_layer():
    """Under NEEDLE_BACKEND=np, importing needle, computing, and running a fused op leave the
    compiled modules and the NDArray layer unloaded; asking for them still works (lazily)."""
    code = (
        "import sys, needle as ndl, needle.fast\n"
        "x = ndl.Tensor([[1.0, -2.0, 0.5]], device=ndl.cpu())\n"
        "w, b = ndl.init.ones(3), ndl.init.zeros(3)\n"
        "y = ndl.fast.ops.layernorm_rows(ndl.ops.relu(x) * 2, w, b, 1e-5).sum()\n"
        "y.backward()\n"
        "loaded = [m for m in ('needle.backend_ndarray.ndarray_backend_cpu',\n"
        "                      'needle.backend_ndarray.ndarray_backend_cuda',\n"
        "                      'needle.backend_ndarray.ndarray') if m in sys.modules]\n"
        "print('loaded', loaded, type(x.grad.cached_data).__module__)\n"
        "print('lazy', ndl.backend_ndarray.NDArray.__name__, "
        "'needle.backend_ndarray.ndarray' in sys.modules)\n"
    )
    env = dict(os.environ, NEEDLE_BACKEND="np")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["loaded [] needle.backend_numpy", "lazy NDArray True"]
