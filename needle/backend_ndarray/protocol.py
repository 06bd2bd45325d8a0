"""The device-module protocol: what every NDArray device module provides.

A *device module* implements storage and kernels for one device. needle has three: the numpy
reference module (``ndarray_backend_numpy``, device ``cpu_numpy()``), the compiled C++ module
(``ndarray_backend_cpu``, ``cpu()``) and the compiled CUDA module (``ndarray_backend_cuda``,
``cuda()``). :class:`needle.backend_ndarray.NDArray` validates every argument in Python and then
calls these functions; the conformance suite (``tests/framework/test_device_protocol.py``)
checks all three modules against numpy, values and errors.

Conventions
-----------
* Every buffer is an ``Array`` of float32 elements. Sizes, strides and offsets count elements.
* A *view* of a buffer is ``(strides, offset)`` together with a ``shape``: element
  ``(i_0, ..., i_{k-1})`` lives at ``offset + sum(i_j * strides[j])``. Strides may be 0
  (broadcast) or negative (flip).
* Outputs are *compact*: a row-major buffer holding exactly ``prod(shape)`` elements, allocated
  by the caller. An output never overlaps an input unless a function says so.
* Op codes index the op tables ``__binary_ops__``, ``__unary_ops__`` and ``__reduce_ops__``,
  which are identical, name for name and in order, in every module (the compiled modules take
  them from ``src/common/ndarray_ops.h``).

Error policy (all layers of needle)
-----------------------------------
* ``TypeError``: a value of the wrong kind (a string where a number belongs, a list where an
  ``Array`` belongs, an unsupported dtype).
* ``ValueError``: a value of the right kind that is wrong — sizes that disagree, a view that
  leaves its buffer, a negative dimension, an unknown op code, the max of an empty axis.
* ``IndexError``: subscripts only (``NDArray.__getitem__`` with an index out of range).
* ``RuntimeError``: the device cannot run (module not built, no GPU, a CUDA failure).
* ``MemoryError``: an allocation the machine cannot satisfy.

The functions below marked *(course)* are the device functions of the course's hw3, with the
course's signatures (compact operands). The others are this project's extensions, which the
NDArray uses on its fast paths: strided operands, reductions over any trailing axes, batched and
transposed matrix products, and fused kernels for the composites a training step repeats.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Protocol, Sequence, Tuple

import numpy as np

# The op tables, in op-code order, with the array types' methods for each op (NDArray and the
# NEEDLE_BACKEND=np array both have every one; a binary op's second method is the reflected
# form, ``2 - a``). src/common/ndarray_ops.h lists the same names in the same order. The array-API
# modules generate one module function per method with a plain name (``array_api.exp(a)`` is
# ``a.exp()``) with :func:`module_functions`.
BINARY_METHODS: Dict[str, Tuple[str, ...]] = {
    "add": ("__add__", "__radd__"),
    "sub": ("__sub__", "__rsub__"),
    "mul": ("__mul__", "__rmul__"),
    "div": ("__truediv__", "__rtruediv__"),
    "power": ("__pow__", "__rpow__"),
    "maximum": ("maximum",),
    "minimum": ("minimum",),
    "eq": ("__eq__",),
    "ne": ("__ne__",),
    "lt": ("__lt__",),
    "le": ("__le__",),
    "gt": ("__gt__",),
    "ge": ("__ge__",),
}
UNARY_METHODS: Dict[str, Tuple[str, ...]] = {
    "neg": ("__neg__", "neg"),
    "abs": ("__abs__", "abs"),
    "sqrt": ("sqrt",),
    "exp": ("exp",),
    "log": ("log",),
    "tanh": ("tanh",),
    "sigmoid": ("sigmoid",),
    "relu": ("relu",),
}
REDUCE_METHODS: Dict[str, Tuple[str, ...]] = {
    "sum": ("sum",),
    "max": ("max",),
}
# The ops of the course's compact entry points (src/common/ndarray_bindings.h lists the same):
# ewise_<op>(a, b, out) and scalar_<op>(a, val, out) for COURSE_BINARY, scalar_<op> for
# COURSE_SCALAR as well, ewise_<op>(a, out) for COURSE_UNARY, reduce_sum/reduce_max(a, out,
# reduce_size). They take no strides, so the NDArray calls them for compact operands: a kernel
# call with four plain arguments costs a third of one with strides and shapes to convert.
COURSE_BINARY: Tuple[str, ...] = ("add", "mul", "div", "maximum", "eq", "ge")
COURSE_SCALAR: Tuple[str, ...] = COURSE_BINARY + ("power",)
COURSE_UNARY: Tuple[str, ...] = ("log", "exp", "tanh")
# {course entry point: its parameters}; each writes only ``out``.
COURSE_PARAMS: Dict[str, Tuple[str, ...]] = {
    **{f"ewise_{op}": ("a", "b", "out") for op in COURSE_BINARY},
    **{f"scalar_{op}": ("a", "val", "out") for op in COURSE_SCALAR},
    **{f"ewise_{op}": ("a", "out") for op in COURSE_UNARY},
    **{f"reduce_{op}": ("a", "out", "reduce_size") for op in ("sum", "max")},
}

BINARY_OPS: Tuple[str, ...] = tuple(BINARY_METHODS)
UNARY_OPS: Tuple[str, ...] = tuple(UNARY_METHODS)
REDUCE_OPS: Tuple[str, ...] = tuple(REDUCE_METHODS)
OP_METHODS: Dict[str, Tuple[str, ...]] = {**BINARY_METHODS, **UNARY_METHODS, **REDUCE_METHODS}

# The largest element count of any buffer or view (src/common/ndarray_checks.h: kMaxElements):
# larger sizes are a ValueError before anything is allocated, and every index product fits in
# int64.
MAX_ELEMENTS: int = 1 << 50

Shape = Sequence[int]
Strides = Sequence[int]

_DOCS = {
    "maximum": "Element-wise maximum of ``a`` and an array or scalar ``b`` (broadcast); "
    "NaN propagates.",
    "minimum": "Element-wise minimum of ``a`` and an array or scalar ``b`` (broadcast); "
    "NaN propagates.",
    "sum": "Sum of ``a`` over ``axis`` (None, an int or a tuple of ints; ``keepdims``).",
    "max": "Maximum of ``a`` over ``axis`` (as ``sum``); an empty axis is a ValueError.",
}


def _module_function(
    op: str, name: str, method: Callable[..., Any], coerce: Callable[[Any], Any] | None
) -> Callable[..., Any]:
    convert: Callable[[Any], Any] = coerce or (lambda a: a)
    function: Callable[..., Any]
    if op in BINARY_METHODS:

        def binary(a: Any, b: Any) -> Any:
            return method(convert(a), b)

        function = binary
    elif op in UNARY_METHODS:

        def unary(a: Any) -> Any:
            return method(convert(a))

        function = unary
    else:

        def reduction(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
            return method(convert(a), axis=axis, keepdims=keepdims)

        function = reduction
    function.__name__ = function.__qualname__ = name
    function.__doc__ = _DOCS.get(name, f"Element-wise ``{op}`` of ``a`` (``a.{name}()``).")
    return function


def module_functions(
    array_type: type, coerce: Callable[[Any], Any] | None = None
) -> Dict[str, Callable[..., Any]]:
    """The array-API module functions of the ops, generated from :data:`OP_METHODS`: for each
    method with a plain name, ``f(a, b) = a.method(b)`` (binary), ``f(a) = a.method()``
    (unary) or ``f(a, axis=None, keepdims=False) = a.method(axis=axis, keepdims=keepdims)``
    (reductions), the method looked up on ``array_type`` once and ``a`` passed through
    ``coerce`` when given (e.g. to accept a plain numpy array)."""
    return {
        name: _module_function(op, name, getattr(array_type, name), coerce)
        for op, methods in OP_METHODS.items()
        for name in methods
        if not name.startswith("__")
    }


class Array(Protocol):
    """A flat float32 buffer: ``Array(size)`` allocates ``size`` elements (uninitialised)."""

    size: int

    def ptr(self) -> int:
        """The address of the first element (for identity checks in tests)."""


# Array under another name, for the annotations inside DeviceModule (whose ``Array`` method
# hides the class there).
Buffer = Array


class DeviceModule(Protocol):
    """The functions and attributes of a device module (see the module docstring)."""

    __device_name__: str
    __binary_ops__: Tuple[str, ...]
    __unary_ops__: Tuple[str, ...]
    __reduce_ops__: Tuple[str, ...]

    def Array(self, size: int) -> Buffer:
        """A new buffer of ``size`` float32 elements. ValueError for a negative size,
        MemoryError when it cannot be allocated."""

    # ---- memory (course) ---------------------------------------------------------------
    def to_numpy(self, a: Buffer, shape: Shape, strides: Strides, offset: int) -> np.ndarray:
        """A new numpy float32 array of ``shape`` holding the view of ``a``."""

    def from_numpy(self, a: np.ndarray, out: Buffer) -> None:
        """Copy the float32 array ``a`` (row-major order) into ``out`` (same size)."""

    def fill(self, out: Buffer, val: float) -> None:
        """Set every element of ``out`` to ``val``."""

    def compact(self, a: Buffer, out: Buffer, shape: Shape, strides: Strides, offset: int) -> None:
        """``out`` (compact, prod(shape)) = the view of ``a``."""

    def ewise_setitem(
        self, a: Buffer, out: Buffer, shape: Shape, strides: Strides, offset: int
    ) -> None:
        """The view of ``out`` = the compact ``a`` (prod(shape) elements, row-major)."""

    def scalar_setitem(
        self, size: int, val: float, out: Buffer, shape: Shape, strides: Strides, offset: int
    ) -> None:
        """Every element of the view of ``out`` (``size`` = prod(shape) elements) = ``val``."""

    # ---- element-wise on compact operands (course) -------------------------------------
    # ewise_add/mul/div/maximum/eq/ge(a, b, out) and scalar_add/mul/div/power/maximum/eq/ge
    # (a, val, out) over out.size elements of compact buffers of equal size;
    # ewise_log/exp/tanh(a, out).

    # ---- element-wise on strided operands ----------------------------------------------
    def ewise_binary(
        self,
        op: int,
        a: Buffer,
        a_strides: Strides,
        a_offset: int,
        b: Buffer,
        b_strides: Strides,
        b_offset: int,
        out: Buffer,
        shape: Shape,
    ) -> None:
        """``out`` (compact, prod(shape)) = BINARY_OPS[op](view of a, view of b), both views of
        ``shape`` (broadcast operands have stride 0)."""

    def ewise_scalar(
        self,
        op: int,
        a: Buffer,
        a_strides: Strides,
        a_offset: int,
        val: float,
        out: Buffer,
        shape: Shape,
        reverse: bool,
    ) -> None:
        """``out`` = BINARY_OPS[op](view of a, val), or BINARY_OPS[op](val, view of a) when
        ``reverse`` (``2 - x``, ``2 / x``, ``2 ** x``)."""

    def ewise_unary(
        self, op: int, a: Buffer, a_strides: Strides, a_offset: int, out: Buffer, shape: Shape
    ) -> None:
        """``out`` = UNARY_OPS[op](view of a)."""

    # ---- reductions ----------------------------------------------------------------------
    def reduce(
        self,
        op: int,
        a: Buffer,
        shape: Shape,
        strides: Strides,
        offset: int,
        keep: int,
        out: Buffer,
    ) -> None:
        """``out`` (compact, prod(shape[:keep])) = REDUCE_OPS[op] over the trailing axes
        ``shape[keep:]`` of the view of ``a``. The caller orders the axes (a permuted view costs
        nothing); the kernel chooses the loop order. An empty reduced extent gives 0 for sum
        and is a ValueError for max."""

    # course: reduce_sum / reduce_max(a, out, reduce_size): out[j] = op of the compact
    # a[j * reduce_size : (j + 1) * reduce_size].

    # ---- matrix products -----------------------------------------------------------------
    def matmul_strided(
        self,
        a: Buffer,
        a_strides: Strides,
        a_offset: int,
        b: Buffer,
        b_strides: Strides,
        b_offset: int,
        out: Buffer,
        batch: int | Shape,
        m: int,
        n: int,
        p: int,
    ) -> None:
        """``out`` (compact, batch + (m, p)) = A[k] @ B[k] for every index k of the batch
        dimensions ``batch`` (a tuple, or one int for a single batch dimension), where, with d
        batch dimensions, ``A[k][i, j] = a[a_offset + Σ_t k_t*a_strides[t] + i*a_strides[d] +
        j*a_strides[d+1]]`` (m × n) and likewise B (n × p): one stride per batch dimension,
        then row and column. A transposed operand is the same buffer with swapped strides
        (BLAS's trans flag); a batch stride of 0 shares one matrix across that dimension; a
        permuted batch (attention's per-head (B, H, T, D) view of (B, T, H, D)) is read in
        place. n == 0 gives zeros."""

    def matmul(self, a: Buffer, b: Buffer, out: Buffer, m: int, n: int, p: int) -> None:
        """The course's product of compact row-major operands: ``out`` (m × p) = ``a``
        (m × n) @ ``b`` (n × p). ``NDArray.__matmul__`` uses it for two compact 2-D operands
        (it converts no strides); n == 0 gives zeros."""

    # course: matmul_tiled(a, b, out, m, n, p) (compiled modules, a lecture exhibit): operands and
    # result in the (rows/T, cols/T, T, T) tiled layout, T = __tile_size__.

    # ---- memory accounting ----------------------------------------------------------------
    def memory_stats(self) -> Dict[str, int]:
        """``{"live_bytes": ..., "peak_bytes": ...}``: bytes held by live ``Array`` buffers of
        this module (as allocated, alignment padding included), and their peak since
        :meth:`reset_peak`; a freed buffer kept in a cache for reuse does not count."""

    def reset_peak(self) -> None:
        """Restart the peak of :meth:`memory_stats` from the bytes live now."""

    # optional (a module that keeps freed buffers for reuse, like the compiled CPU module):
    # cache_info() -> dict (bytes and buffers held, the cap) and cache_clear(), which
    # BackendDevice.cache_info() / cache_clear() expose (None / no-op without them).

    # ---- fused kernels (compact operands; the caller guarantees sizes) --------------------
    def softmax_xent(
        self, logits: Buffer, labels: Buffer, rows: int, cols: int, loss: Buffer, probs: Buffer
    ) -> None:
        """Per row r of ``logits`` (rows × cols) and integer-valued ``labels[r]`` in [0, cols):
        ``loss[r] = logsumexp(logits[r]) - logits[r, labels[r]]`` and ``probs[r] =
        softmax(logits[r])``. A logit of -inf has probability 0 and contributes nothing. A
        label out of range is a ValueError."""

    def softmax_xent_bwd(
        self,
        probs: Buffer,
        labels: Buffer,
        dloss: Buffer,
        rows: int,
        cols: int,
        scale: float,
        dlogits: Buffer,
    ) -> None:
        """``dlogits[r, c] = (probs[r, c] - (c == labels[r])) * dloss[r] * scale`` (rows ×
        cols): the logits' gradient of ``softmax_xent`` from its saved ``probs``. ``dloss`` holds
        ``rows`` elements, or one shared by every row. ``dlogits`` may be ``probs`` itself (each
        element reads only the same element of probs). A label out of range is a ValueError."""

    def softmax_fwd(
        self, x: Buffer, rows: int, cols: int, scale: float, queries: int, y: Buffer
    ) -> None:
        """``y[r]`` = softmax of ``scale * x[r]`` for each row of ``x`` (rows × cols), shifted
        by the row maximum. ``queries`` = 0: no mask. ``queries`` = q > 0: the causal mask of
        attention with q queries and ``cols`` keys, the rows being blocks of q queries (rows
        a multiple of q): row r sees keys j <= r % q + cols - q only; the others get exactly 0
        and are not read, and a row that sees no key is uniform (as the course's finite
        -finfo.max mask makes it). ValueError for a negative ``queries`` or rows that are not
        whole blocks."""

    def softmax_bwd(
        self, y: Buffer, dy: Buffer, rows: int, cols: int, scale: float, dx: Buffer
    ) -> None:
        """The gradient of :meth:`softmax_fwd` from its result ``y`` and the adjoint ``dy``
        (rows × cols each): ``dx[r] = scale * y[r] * (dy[r] - Σ_j dy[r, j] * y[r, j])``."""

    def attention_fwd(
        self,
        q: Buffer,
        k: Buffer,
        v: Buffer,
        heads: int,
        queries: int,
        dim: int,
        keys: int,
        scale: float,
        causal: int,
        out: Buffer,
        probs: Buffer,
    ) -> None:
        """Attention per head for compact q (heads × queries × dim), k and v (heads × keys ×
        dim): ``probs[h]`` (queries × keys) = :meth:`softmax_fwd` of ``scale * q[h] k[h]ᵀ``,
        with the causal mask (query i sees keys j <= i + keys - queries) when ``causal`` is 1
        (0: no mask; ValueError otherwise), and ``out[h]`` (queries × dim) =
        ``probs[h] v[h]``. The values of the three separate kernels, in one call: the CPU
        module keeps each head's logits in cache."""

    def attention_bwd(
        self,
        d_out: Buffer,
        d_probs: Buffer,
        probs: Buffer,
        q: Buffer,
        k: Buffer,
        v: Buffer,
        heads: int,
        queries: int,
        dim: int,
        keys: int,
        scale: float,
        dq: Buffer,
        dk: Buffer,
        dv: Buffer,
    ) -> None:
        """The gradients of :meth:`attention_fwd` from the adjoints ``d_out`` of out and
        ``d_probs`` of probs (zeros when only out is used) and its saved ``probs``:
        ``dp = d_out vᵀ + d_probs``, ``ds`` = :meth:`softmax_bwd` of (probs, dp, scale),
        ``dq = ds k``, ``dk = dsᵀ q``, ``dv = probsᵀ d_out`` per head."""

    def layernorm_fwd(
        self,
        x: Buffer,
        w: Buffer,
        b: Buffer,
        rows: int,
        cols: int,
        eps: float,
        y: Buffer,
        xhat: Buffer,
        rstd: Buffer,
    ) -> None:
        """Normalise each row of ``x`` (rows × cols): ``xhat = (x - mean) * rstd`` with
        ``rstd = 1 / sqrt(var + eps)`` (biased variance), ``y = xhat * w + b`` (w, b: cols).
        ``xhat`` (rows × cols) and ``rstd`` (rows) are kept for the backward pass."""

    def layernorm_bwd(
        self,
        dy: Buffer,
        xhat: Buffer,
        rstd: Buffer,
        w: Buffer,
        rows: int,
        cols: int,
        dx: Buffer,
        dw: Buffer,
        db: Buffer,
    ) -> None:
        """The exact gradients of :meth:`layernorm_fwd`: ``dx`` (rows × cols), ``dw`` and
        ``db`` (cols, summed over rows)."""

    def batchnorm_fwd(
        self,
        x: Buffer,
        w: Buffer,
        b: Buffer,
        rows: int,
        cols: int,
        eps: float,
        y: Buffer,
        xhat: Buffer,
        rstd: Buffer,
        mean: Buffer,
        var: Buffer,
    ) -> None:
        """Normalise each column of ``x`` (rows × cols) over the rows (the batch): as
        :meth:`layernorm_fwd` with rows and columns exchanged; also writes the batch ``mean``
        and biased ``var`` (cols) for the running statistics. rows must be ≥ 1."""

    def batchnorm_bwd(
        self,
        dy: Buffer,
        xhat: Buffer,
        rstd: Buffer,
        w: Buffer,
        rows: int,
        cols: int,
        dx: Buffer,
        dw: Buffer,
        db: Buffer,
    ) -> None:
        """The exact gradients of :meth:`batchnorm_fwd` (``dw``, ``db``: cols)."""

    def lstm_cell_fwd(
        self,
        gates: Buffer,
        c_prev: Buffer,
        batch: int,
        hidden: int,
        h: Buffer,
        c: Buffer,
        act: Buffer,
        tanh_c: Buffer,
    ) -> None:
        """One LSTM step from the gate pre-activations ``gates`` (batch × 4·hidden, in the order
        i, f, g, o): ``act`` = (σ(i), σ(f), tanh(g), σ(o)) (batch × 4·hidden), ``c = σ(f)·c_prev +
        σ(i)·tanh(g)``, ``tanh_c = tanh(c)``, ``h = σ(o)·tanh_c`` (each batch × hidden)."""

    def lstm_cell_bwd(
        self,
        dh: Buffer,
        dc: Buffer,
        act: Buffer,
        c_prev: Buffer,
        tanh_c: Buffer,
        batch: int,
        hidden: int,
        dgates: Buffer,
        dc_prev: Buffer,
    ) -> None:
        """The exact gradients of :meth:`lstm_cell_fwd` given the adjoints ``dh`` and ``dc`` of
        its outputs: ``dgates`` (batch × 4·hidden) and ``dc_prev`` (batch × hidden)."""

    def lstm_layer_fwd(
        self,
        xw: Buffer,
        h0: Buffer,
        c0: Buffer,
        w_hh: Buffer,
        batch: int,
        hidden: int,
        steps: int,
        out: Buffer,
        h: Buffer,
        c: Buffer,
        act: Buffer,
    ) -> None:
        """An LSTM layer over ``steps`` steps: for t = 0, 1, ..., the gates
        ``xw[t] + h_{t-1} @ w_hh`` (``xw``: steps × batch × 4·hidden, ``w_hh``: hidden ×
        4·hidden, h_{-1} = ``h0``, c_{-1} = ``c0``: batch × hidden) go through
        :meth:`lstm_cell_fwd`; ``out[t]`` = h_t (steps × batch × hidden), ``act[t]`` the step's
        activations (steps × batch × 4·hidden), ``h``, ``c`` the last state (h0, c0 when
        steps = 0). One call for the whole loop."""

    def lstm_layer_bwd(
        self,
        d_out: Buffer,
        dh: Buffer,
        dc: Buffer,
        act: Buffer,
        out: Buffer,
        h0: Buffer,
        c0: Buffer,
        w_hh: Buffer,
        batch: int,
        hidden: int,
        steps: int,
        dxw: Buffer,
        dh0: Buffer,
        dc0: Buffer,
        dw_hh: Buffer,
    ) -> None:
        """The exact gradients of :meth:`lstm_layer_fwd` given the adjoints ``d_out``, ``dh``,
        ``dc`` of its ``out``, ``h``, ``c`` and its saved ``act`` and ``out`` (the cell states
        c_t = σf·c_{t-1} + σi·tanh g are recomputed from ``act``, as the forward pass computed
        them): ``dxw`` (every step's d gates), ``dh0``, ``dc0`` and ``dw_hh`` =
        Σ_t h_{t-1}ᵀ dxw[t] (zeros when steps = 0)."""

    def sgd_update(
        self,
        param: Buffer,
        grad: Buffer,
        buf: Buffer,
        lr: float,
        momentum: float,
        weight_decay: float,
    ) -> None:
        """In place, over param.size elements: ``g = grad + weight_decay·param``;
        ``buf = momentum·buf + (1 - momentum)·g``; ``param -= lr·buf`` (the course's form).
        With momentum 0, ``buf = g`` and its previous contents are not read (any scratch
        buffer will do: SGD keeps no state at momentum 0)."""

    def adam_update(
        self,
        param: Buffer,
        grad: Buffer,
        m: Buffer,
        v: Buffer,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        step: int,
    ) -> None:
        """In place: ``g = grad + weight_decay·param``; ``m = β1·m + (1-β1)·g``;
        ``v = β2·v + (1-β2)·g²``; ``param -= lr · m̂ / (sqrt(v̂) + eps)`` with the bias
        corrections ``m̂ = m / (1 - β1^step)``, ``v̂ = v / (1 - β2^step)``; step ≥ 1."""

    def embedding_gather(
        self, weight: Buffer, ids: Buffer, vocab: int, cols: int, rows: int, out: Buffer
    ) -> None:
        """``out[r] = weight[ids[r]]`` for r < rows: rows of ``weight`` (vocab × cols) picked by
        ``ids`` (rows), float32 holding whole numbers in [0, vocab); ``out`` is rows × cols.
        An id that is not such a number is an IndexError naming it and its position."""

    def embedding_scatter_add(
        self, grad: Buffer, ids: Buffer, rows: int, cols: int, vocab: int, out: Buffer
    ) -> None:
        """The adjoint of :meth:`embedding_gather`: ``out`` (vocab × cols) = zeros, then
        ``out[ids[r]] += grad[r]`` for each row r of ``grad`` (rows × cols), so a repeated id
        accumulates (in the order r = 0, 1, ... on the CPU; in any order on CUDA). IndexError
        for an id as in :meth:`embedding_gather`, before anything is written."""

    # ---- convolution: NHWC input x (n, h, w, c_in), weight (kh, kw, c_in, c_out), output
    # (n, h_out, w_out, c_out), h_out = (h + 2·padding - kh) // stride + 1 (likewise w_out)
    def conv_fwd(
        self,
        x: Buffer,
        weight: Buffer,
        n: int,
        h: int,
        w: int,
        c_in: int,
        kh: int,
        kw: int,
        c_out: int,
        stride: int,
        padding: int,
        out: Buffer,
    ) -> None:
        """``out[b, i, j, o] = Σ_{a, c, k} xpad[b, i·stride + a, j·stride + c, k] ·
        weight[a, c, k, o]``, with ``xpad`` the input zero-padded by ``padding`` on each side
        of h and w (the course's conv: a cross-correlation). ValueError unless stride ≥ 1,
        the kernel is at least 1×1 and no larger than the padded input, and every buffer
        holds exactly its shape's elements."""

    def conv_input_grad(
        self,
        grad: Buffer,
        weight: Buffer,
        kh: int,
        kw: int,
        c_in: int,
        c_out: int,
        n: int,
        h: int,
        w: int,
        stride: int,
        padding: int,
        out: Buffer,
    ) -> None:
        """The adjoint of :meth:`conv_fwd` for ``x``: ``out`` (n, h, w, c_in) given the output
        adjoint ``grad`` (n, h_out, w_out, c_out): each input element sums
        ``grad[b, i, j, :] · weight[a, c, k, :]`` over the windows and offsets that read it.
        The sizes come in the order the weight gives them, then the input's."""

    def conv_weight_grad(
        self,
        x: Buffer,
        grad: Buffer,
        n: int,
        h: int,
        w: int,
        c_in: int,
        kh: int,
        kw: int,
        c_out: int,
        stride: int,
        padding: int,
        out: Buffer,
    ) -> None:
        """The adjoint of :meth:`conv_fwd` for ``weight``: ``out`` (kh, kw, c_in, c_out) =
        ``Σ_{b, i, j} xpad[b, i·stride + a, j·stride + c, k] · grad[b, i, j, o]``."""


__all__ = [
    "Array",
    "DeviceModule",
    "BINARY_METHODS",
    "UNARY_METHODS",
    "REDUCE_METHODS",
    "BINARY_OPS",
    "UNARY_OPS",
    "REDUCE_OPS",
    "OP_METHODS",
    "COURSE_BINARY",
    "COURSE_SCALAR",
    "COURSE_UNARY",
    "COURSE_PARAMS",
    "MAX_ELEMENTS",
    "module_functions",
]
