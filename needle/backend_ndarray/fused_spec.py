"""The fused kernels' specification, once for every backend: operands, shapes and checks.

Each fused kernel (the last section of ``protocol.py``) is one :class:`FusedKernel` in the
table below: its inputs and their shapes, its scalar arguments, its outputs and their shapes,
all as functions of the kernel's sizes (``rows, cols`` or ``batch, hidden``), which are read
off one input, the *source*. Three places use it:

* the array-level functions — ``needle.backend_ndarray.fused`` (NDArrays) and
  ``needle.backend_numpy`` (``NEEDLE_BACKEND=np``) — call :meth:`FusedKernel.check` on their
  arrays' shapes (ValueError naming the function, the operand and the shapes) and allocate
  :meth:`FusedKernel.output_shapes`;
* the numpy device module (``cpu_numpy()``) calls :meth:`FusedKernel.check_buffers` on its flat
  buffers, the numpy twin of the compiled modules' checks in ``src/common/ndarray_checks.h``;
* the ops (``needle.fast.ops``) reach the kernels through the array-level functions.

This module imports nothing but the standard library.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Protocol, Sequence, Tuple

Dims = Tuple[int, ...]


class Sized(Protocol):
    """A buffer as :meth:`FusedKernel.check_buffers` sees it: its number of elements."""

    @property
    def size(self) -> int: ...


# Every fused kernel, by array-level name (filled by _kernel below).
KERNELS: Dict[str, "FusedKernel"] = {}


@dataclass(frozen=True)
class Operand:
    """One array argument or result of a fused kernel.

    ``shape`` gives its shape from the kernel's sizes. ``match`` says how an input is checked:
    ``"shape"`` exactly that shape; ``"size"`` that many elements in any shape (a (1, C) bias
    for C features); ``"shape or ()"`` that shape or a 0-d array; ``"source"`` the source's own
    shape (the in-place updates, whose parameter may have any shape).
    """

    name: str
    shape: Callable[..., Dims]
    match: str = "shape"

    def shared(self, size: int) -> bool:
        """Whether a device buffer of ``size`` elements is this operand's 0-d form: one element
        shared by every row (a ``"shape or ()"`` operand may be either)."""
        return self.match == "shape or ()" and size == 1


# eq=False: compared and hashed by identity (each kernel is one module-level object), so the
# cached shape checks below hash a kernel in one step, not field by field
@dataclass(frozen=True, eq=False)
class FusedKernel:
    """A fused kernel: ``name`` is the device function (None when no device kernel exists),
    ``api_name`` the array-level function; ``dims`` names the sizes read off the input
    ``source`` (a 2-D matrix), then off the inputs ``more_sources`` (each axis in turn: the
    embedding gather reads (vocab, cols) off its weight and rows off its ids), then the
    ``given`` sizes, which the caller passes (the vocabulary of the embedding scatter-add,
    read off no input; the LSTM layer's number of steps); ``dims`` is empty for the
    element-wise in-place updates, whose source may have any shape. The device call takes
    the inputs, the sizes, the ``scalars`` and the outputs, in that order; the numpy kernel
    takes the inputs, the given sizes and the scalars. ``check_sizes(fn, dims, scalars)``
    holds any further check; ``check_dims(fn, dims)`` checks the sizes alone, before any
    operand's shape is computed from them (the convolutions' output size divides by the
    stride). ``updates`` names the inputs the device call writes in place (the optimizer
    updates' parameter and state)."""

    name: Optional[str]
    api_name: str
    source: str
    dims: Tuple[str, ...]
    inputs: Tuple[Operand, ...]
    scalars: Tuple[str, ...] = ()
    outputs: Tuple[Operand, ...] = ()
    check_sizes: Optional[Callable[[str, Dims, Mapping[str, float]], None]] = None
    more_sources: Tuple[str, ...] = ()
    given: Tuple[str, ...] = ()
    check_dims: Optional[Callable[[str, Dims], None]] = None
    updates: Tuple[str, ...] = ()

    @property
    def sources(self) -> Tuple[str, ...]:
        """The inputs whose shapes give the sizes, in order."""
        return (self.source,) + self.more_sources

    def check(
        self,
        shapes: Sequence[Tuple[int, ...]],
        scalars: Optional[Mapping[str, float]] = None,
        given: Sequence[int] = (),
    ) -> Dims:
        """The kernel's sizes, after checking the inputs' ``shapes`` (tuples, in the order of
        ``inputs``) against this specification (ValueError naming ``api_name``, the operand and
        both shapes), the ``given`` sizes (non-negative ints: TypeError, ValueError) and
        ``scalars`` (name -> value) with ``check_sizes``. The shape check is cached: a training
        step repeats the same shapes."""
        dims = _sizes(self, tuple(shapes), _given(self, given))
        if self.check_sizes is not None:
            self.check_sizes(self.api_name, dims, scalars or {})
        return dims

    def output_shapes(self, dims: Dims) -> Tuple[Dims, ...]:
        """The shapes of the outputs for the sizes ``dims``."""
        return _output_shapes(self, dims)

    def check_buffers(
        self, buffers: Mapping[str, Sized], dims: Dims, scalars: Mapping[str, float] = {}
    ) -> Dims:
        """The device-level check: every buffer (name -> an object with ``.size``), inputs and
        outputs, holds exactly the elements its shape needs for the sizes ``dims`` (ValueError
        naming ``name``, the buffer and both sizes); an operand matched as ``"shape or ()"``
        may also hold one element. With no ``dims`` (the in-place updates) the source buffer's
        size is the size. Returns the sizes."""
        fn = self.name or self.api_name  # only kernels with a device function get here
        if not self.dims:
            dims = (buffers[self.source].size,)
        elif any(d < 0 for d in dims):
            raise ValueError(f"{fn}: negative size in {dict(zip(self.dims, dims))}")
        if self.check_dims is not None:
            self.check_dims(fn, dims)
        if self.check_sizes is not None:
            self.check_sizes(fn, dims, scalars)
        for op in self.inputs + self.outputs:
            want = math.prod(op.shape(*dims))
            have = buffers[op.name].size
            if have != want and not op.shared(have):
                raise ValueError(f"{fn}: {op.name} has {have} elements, expected {want}")
        return dims


def _given(kernel: FusedKernel, given: Sequence[int]) -> Dims:
    """The caller's ``given`` sizes of ``kernel``, checked: as many as it names, each an int
    (TypeError) that is not negative (ValueError)."""
    fn = kernel.api_name
    if len(given) != len(kernel.given):
        raise TypeError(f"{fn}: expected the sizes ({', '.join(kernel.given)}), got {tuple(given)}")
    for name, value in zip(kernel.given, given):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{fn}: {name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{fn}: {name} must be >= 0, got {value}")
    return tuple(int(v) for v in given)


def _ndim(kernel: FusedKernel, name: str) -> int:
    """The number of axes of ``kernel``'s input ``name`` (it has one per size it gives)."""
    op = next(op for op in kernel.inputs if op.name == name)
    return len(op.shape(*(0,) * len(kernel.dims)))


@functools.lru_cache(maxsize=1024)
def _sizes(kernel: FusedKernel, shapes: Tuple[Tuple[int, ...], ...], given: Dims = ()) -> Dims:
    """The sizes ``kernel`` reads off its sources (then ``given``), after checking every
    input's shape."""
    fn = kernel.api_name
    names = [op.name for op in kernel.inputs]
    source = shapes[names.index(kernel.source)]
    if kernel.dims:
        read: list[int] = []
        for name in kernel.sources:
            ndim, shape = _ndim(kernel, name), shapes[names.index(name)]
            if len(shape) != ndim:
                axes = kernel.dims[len(read) : len(read) + ndim]
                raise ValueError(
                    f"{fn}: {name} must be {ndim}-D ({', '.join(axes)}), got shape {shape}"
                )
            read.extend(shape)
        dims = tuple(read) + given
    else:
        dims = (math.prod(source),)
    if kernel.check_dims is not None:
        kernel.check_dims(fn, dims)
    for op, got in zip(kernel.inputs, shapes):
        want = source if op.match == "source" else op.shape(*dims)
        if op.match == "size":
            if math.prod(got) != math.prod(want):
                raise ValueError(
                    f"{fn}: {op.name} must have {math.prod(want)} elements, got shape {got}"
                )
        elif got != want and not (op.match == "shape or ()" and got == ()):
            alt = " or ()" if op.match == "shape or ()" else ""
            raise ValueError(f"{fn}: {op.name} must have shape {want}{alt}, got {got}")
    return dims


@functools.lru_cache(maxsize=1024)
def _output_shapes(kernel: FusedKernel, dims: Dims) -> Tuple[Dims, ...]:
    return tuple(op.shape(*dims) for op in kernel.outputs)


def _kernel(*args: Any, **kwargs: Any) -> FusedKernel:
    """A new :class:`FusedKernel`, entered in :data:`KERNELS`, after checking that its sources
    and given sizes name each of its sizes once, in order."""
    kernel = FusedKernel(*args, **kwargs)
    if kernel.dims:
        probe = tuple(range(2, 2 + len(kernel.dims)))
        names = {op.name: op for op in kernel.inputs}
        read = sum((names[s].shape(*probe) for s in kernel.sources), ())
        if read + probe[len(read) :] != probe or len(read) + len(kernel.given) != len(probe):
            raise AssertionError(
                f"{kernel.api_name}: the sources {kernel.sources} and given "
                f"{kernel.given} do not give the sizes {kernel.dims} in order"
            )
    KERNELS[kernel.api_name] = kernel
    return kernel


def _at_least_one_row(fn: str, dims: Dims, scalars: Mapping[str, float]) -> None:
    if dims[0] < 1:
        raise ValueError(f"{fn}: an empty batch (rows={dims[0]}) has no statistics")


def _step_from_one(fn: str, dims: Dims, scalars: Mapping[str, float]) -> None:
    if int(scalars["step"]) < 1:
        raise ValueError(f"{fn}: step must be >= 1, got {scalars['step']}")


def _rows_cols(rows: int, cols: int) -> Dims:
    return (rows, cols)


def _rows(rows: int, cols: int) -> Dims:
    return (rows,)


def _cols(rows: int, cols: int) -> Dims:
    return (cols,)


def _gates(batch: int, hidden: int) -> Dims:
    return (batch, 4 * hidden)


# the LSTM layer's sizes (batch, hidden, steps): read off c0, steps given (xw's first axis)
def _state(batch: int, hidden: int, steps: int) -> Dims:
    return (batch, hidden)


def _sequence(batch: int, hidden: int, steps: int) -> Dims:
    return (steps, batch, hidden)


def _sequence_gates(batch: int, hidden: int, steps: int) -> Dims:
    return (steps, batch, 4 * hidden)


def _recurrent_weight(batch: int, hidden: int, steps: int) -> Dims:
    return (hidden, 4 * hidden)


def _elements(size: int) -> Dims:
    return (size,)


# the embedding kernels' sizes: (vocab, cols, rows) for the gather (weight, then ids) and
# (rows, cols, vocab) for the scatter-add (grad, then the given vocabulary)
def _table(vocab: int, cols: int, rows: int) -> Dims:
    return (vocab, cols)


def _looked_up(vocab: int, cols: int, rows: int) -> Dims:
    return (rows, cols)


def _ids_of_gather(vocab: int, cols: int, rows: int) -> Dims:
    return (rows,)


def _grad_rows(rows: int, cols: int, vocab: int) -> Dims:
    return (rows, cols)


def _ids_of_scatter(rows: int, cols: int, vocab: int) -> Dims:
    return (rows,)


def _scattered(rows: int, cols: int, vocab: int) -> Dims:
    return (vocab, cols)


def _causal_blocks(fn: str, dims: Dims, scalars: Mapping[str, float]) -> None:
    """softmax_fwd's ``queries``: a whole number >= 0 (0: no mask) whose blocks tile the rows."""
    queries = scalars["queries"]
    if isinstance(queries, (str, bytes)) or not hasattr(queries, "__float__"):
        raise TypeError(f"{fn}: queries must be a whole number, got {type(queries).__name__}")
    if not (math.isfinite(queries) and queries == int(queries) and queries >= 0):
        raise ValueError(f"{fn}: queries must be a whole number >= 0 (0: no mask), got {queries}")
    if queries and dims[0] % int(queries):
        raise ValueError(
            f"{fn}: rows={dims[0]} is not a whole number of blocks of queries={int(queries)}"
        )


# the convolutions' sizes (n, h, w, c_in, kh, kw, c_out, stride, padding): NHWC input, weight
# (kh, kw, c_in, c_out), output (n, h_out, w_out, c_out). The forward pass and the weight
# gradient read (n, h, w, c_in) off the input x and are given the rest; the input gradient
# reads (kh, kw, c_in, c_out) off the weight and is given (n, h, w, stride, padding).
# protocol.MAX_ELEMENTS (src/common/ndarray_checks.h: kMaxElements), which bounds the im2col
# matrix too; restated because this module imports no part of needle
_MAX_ELEMENTS = 1 << 50
_CONV = ("n", "h", "w", "c_in", "kh", "kw", "c_out", "stride", "padding")
_CONV_WEIGHT_FIRST = ("kh", "kw", "c_in", "c_out", "n", "h", "w", "stride", "padding")


def conv_out_hw(h: int, w: int, kh: int, kw: int, stride: int, padding: int) -> Tuple[int, int]:
    """(h_out, w_out) of a convolution: (h + 2·padding - kh) // stride + 1, likewise w."""
    return (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1


def _conv_geometry(fn: str, dims: Dims) -> None:
    """ValueError unless stride ≥ 1, the kernel is at least 1x1 and fits the padded input, and
    the im2col matrix (n·h_out·w_out, kh·kw·c_in) stays below _MAX_ELEMENTS (as the compiled
    modules' ``conv_geometry``)."""
    n, h, w, c_in, kh, kw, c_out, stride, padding = dims
    if stride < 1:
        raise ValueError(f"{fn}: stride must be >= 1, got {stride}")
    if kh < 1 or kw < 1:
        raise ValueError(f"{fn}: the kernel must be at least 1x1, got {kh}x{kw}")
    hp, wp = h + 2 * padding, w + 2 * padding
    if hp < kh or wp < kw:
        raise ValueError(f"{fn}: kernel {kh}x{kw} is larger than the padded input {hp}x{wp}")
    ho, wo = conv_out_hw(h, w, kh, kw, stride, padding)
    if max(n * h * w * c_in, n * ho * wo * max(c_out, kh * kw * c_in)) > _MAX_ELEMENTS:
        raise ValueError(f"{fn}: the convolution of {dict(zip(_CONV, dims))} is too large")


def _conv_in(n: int, h: int, w: int, c_in: int, kh: int, kw: int, c_out: int, *sp: int) -> Dims:
    return (n, h, w, c_in)


def _conv_weight(n: int, h: int, w: int, c_in: int, kh: int, kw: int, c_out: int, *sp: int) -> Dims:
    return (kh, kw, c_in, c_out)


def _conv_out(
    n: int, h: int, w: int, c_in: int, kh: int, kw: int, c_out: int, stride: int, padding: int
) -> Dims:
    return (n, *conv_out_hw(h, w, kh, kw, stride, padding), c_out)


def _weight_first(shape: Callable[..., Dims]) -> Callable[..., Dims]:
    """``shape`` (a function of the sizes in _CONV order) taking them in _CONV_WEIGHT_FIRST
    order."""

    def reordered(
        kh: int, kw: int, c_in: int, c_out: int, n: int, h: int, w: int, *sp: int
    ) -> Dims:
        return shape(n, h, w, c_in, kh, kw, c_out, *sp)

    return reordered


def _conv_geometry_weight_first(fn: str, dims: Dims) -> None:
    kh, kw, c_in, c_out, n, h, w, stride, padding = dims
    _conv_geometry(fn, (n, h, w, c_in, kh, kw, c_out, stride, padding))


def _four_d(fn: str, name: str, shape: Tuple[int, ...], axes: str) -> Tuple[int, ...]:
    if len(shape) != 4:
        raise ValueError(f"{fn}: {name} must be 4-D ({axes}), got shape {tuple(shape)}")
    return tuple(shape)


def _pair(fn: str, name: str, value: Any) -> Tuple[int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{fn}: {name} must be a pair of ints, got {value!r}")
    return (value[0], value[1])


def conv_fwd_given(weight: Tuple[int, ...], stride: int, padding: int) -> Tuple[Any, ...]:
    """The given sizes of :data:`CONV_FWD` for a ``weight`` of that shape."""
    kh, kw, _, c_out = _four_d("conv_fwd", "weight", weight, "kh, kw, c_in, c_out")
    return (kh, kw, c_out, stride, padding)


def conv_input_grad_given(
    grad: Tuple[int, ...], in_hw: Any, stride: int, padding: int
) -> Tuple[Any, ...]:
    """The given sizes of :data:`CONV_INPUT_GRAD` for an adjoint ``grad`` of that shape and an
    input of size ``in_hw`` = (h, w)."""
    n = _four_d("conv_input_grad", "grad", grad, "n, h_out, w_out, c_out")[0]
    return (n, *_pair("conv_input_grad", "in_hw", in_hw), stride, padding)


def conv_weight_grad_given(
    grad: Tuple[int, ...], kernel: Any, stride: int, padding: int
) -> Tuple[Any, ...]:
    """The given sizes of :data:`CONV_WEIGHT_GRAD` for an adjoint ``grad`` of that shape and a
    ``kernel`` = (kh, kw)."""
    c_out = _four_d("conv_weight_grad", "grad", grad, "n, h_out, w_out, c_out")[3]
    return (*_pair("conv_weight_grad", "kernel", kernel), c_out, stride, padding)


_RC = ("rows", "cols")
_BH = ("batch", "hidden")

SOFTMAX_XENT = _kernel(
    "softmax_xent",
    "softmax_xent",
    "logits",
    _RC,
    inputs=(Operand("logits", _rows_cols), Operand("labels", _rows)),
    outputs=(Operand("loss", _rows), Operand("probs", _rows_cols)),
)

# dlogits may be probs' own buffer (each element reads only the same element of probs); dloss
# holds rows elements or one shared by every row
SOFTMAX_XENT_BWD = _kernel(
    "softmax_xent_bwd",
    "softmax_xent_bwd",
    "probs",
    _RC,
    inputs=(
        Operand("probs", _rows_cols),
        Operand("labels", _rows),
        Operand("dloss", _rows, "shape or ()"),
    ),
    scalars=("scale",),
    outputs=(Operand("dlogits", _rows_cols),),
)

# softmax over rows of scale·x, causal over blocks of ``queries`` rows (attention's logits)
SOFTMAX_FWD = _kernel(
    "softmax_fwd",
    "softmax_fwd",
    "x",
    _RC,
    inputs=(Operand("x", _rows_cols),),
    scalars=("scale", "queries"),
    outputs=(Operand("y", _rows_cols),),
    check_sizes=_causal_blocks,
)

SOFTMAX_BWD = _kernel(
    "softmax_bwd",
    "softmax_bwd",
    "y",
    _RC,
    inputs=(Operand("y", _rows_cols), Operand("dy", _rows_cols)),
    scalars=("scale",),
    outputs=(Operand("dx", _rows_cols),),
)

# attention per head: q (heads, queries, dim), k and v (heads, keys, dim); keys given
_HQDK = ("heads", "queries", "dim", "keys")


def _queries(heads: int, queries: int, dim: int, keys: int) -> Dims:
    return (heads, queries, dim)


def _keys(heads: int, queries: int, dim: int, keys: int) -> Dims:
    return (heads, keys, dim)


def _weights(heads: int, queries: int, dim: int, keys: int) -> Dims:
    return (heads, queries, keys)


def attention_keys(fn: str, k: Any) -> int:
    """The number of keys of attention's ``k`` (heads, keys, dim), the kernels' given size:
    ValueError unless k is 3-D (an object without a shape is left to the kernel's type check,
    which names it)."""
    shape = tuple(getattr(k, "shape", (0, 0, 0)))
    if len(shape) != 3:
        raise ValueError(f"{fn}: k must be 3-D (heads, keys, dim), got shape {shape}")
    return int(shape[1])


def _causal_flag(fn: str, dims: Dims, scalars: Mapping[str, float]) -> None:
    """attention_fwd's ``causal``: 0 (no mask) or 1."""
    causal = scalars["causal"]
    if isinstance(causal, (str, bytes)) or not hasattr(causal, "__float__"):
        raise TypeError(f"{fn}: causal must be 0 or 1, got {type(causal).__name__}")
    if causal not in (0, 1):
        raise ValueError(f"{fn}: causal must be 0 or 1, got {causal}")


ATTENTION_FWD = _kernel(
    "attention_fwd",
    "attention_fwd",
    "q",
    _HQDK,
    inputs=(Operand("q", _queries), Operand("k", _keys), Operand("v", _keys)),
    scalars=("scale", "causal"),
    outputs=(Operand("out", _queries), Operand("probs", _weights)),
    check_sizes=_causal_flag,
    given=("keys",),
)

ATTENTION_BWD = _kernel(
    "attention_bwd",
    "attention_bwd",
    "q",
    _HQDK,
    inputs=(
        Operand("d_out", _queries),
        Operand("d_probs", _weights),
        Operand("probs", _weights),
        Operand("q", _queries),
        Operand("k", _keys),
        Operand("v", _keys),
    ),
    scalars=("scale",),
    outputs=(Operand("dq", _queries), Operand("dk", _keys), Operand("dv", _keys)),
    given=("keys",),
)

LAYERNORM_FWD = _kernel(
    "layernorm_fwd",
    "layernorm_fwd",
    "x",
    _RC,
    inputs=(Operand("x", _rows_cols), Operand("w", _cols, "size"), Operand("b", _cols, "size")),
    scalars=("eps",),
    outputs=(Operand("y", _rows_cols), Operand("xhat", _rows_cols), Operand("rstd", _rows)),
)

LAYERNORM_BWD = _kernel(
    "layernorm_bwd",
    "layernorm_bwd",
    "dy",
    _RC,
    inputs=(
        Operand("dy", _rows_cols),
        Operand("xhat", _rows_cols),
        Operand("rstd", _rows, "size"),
        Operand("w", _cols, "size"),
    ),
    outputs=(Operand("dx", _rows_cols), Operand("dw", _cols), Operand("db", _cols)),
)

BATCHNORM_FWD = _kernel(
    "batchnorm_fwd",
    "batchnorm_fwd",
    "x",
    _RC,
    inputs=(Operand("x", _rows_cols), Operand("w", _cols, "size"), Operand("b", _cols, "size")),
    scalars=("eps",),
    outputs=(
        Operand("y", _rows_cols),
        Operand("xhat", _rows_cols),
        Operand("rstd", _cols),
        Operand("mean", _cols),
        Operand("var", _cols),
    ),
    check_sizes=_at_least_one_row,
)

BATCHNORM_BWD = _kernel(
    "batchnorm_bwd",
    "batchnorm_bwd",
    "dy",
    _RC,
    inputs=(
        Operand("dy", _rows_cols),
        Operand("xhat", _rows_cols),
        Operand("rstd", _cols, "size"),
        Operand("w", _cols, "size"),
    ),
    outputs=(Operand("dx", _rows_cols), Operand("dw", _cols), Operand("db", _cols)),
)

LSTM_CELL_FWD = _kernel(
    "lstm_cell_fwd",
    "lstm_cell_fwd",
    "c_prev",
    _BH,
    inputs=(Operand("gates", _gates), Operand("c_prev", _rows_cols)),
    outputs=(
        Operand("h", _rows_cols),
        Operand("c", _rows_cols),
        Operand("act", _gates),
        Operand("tanh_c", _rows_cols),
    ),
)

LSTM_CELL_BWD = _kernel(
    "lstm_cell_bwd",
    "lstm_cell_bwd",
    "c_prev",
    _BH,
    inputs=(
        Operand("dh", _rows_cols),
        Operand("dc", _rows_cols),
        Operand("act", _gates),
        Operand("c_prev", _rows_cols),
        Operand("tanh_c", _rows_cols),
    ),
    outputs=(Operand("dgates", _gates), Operand("dc_prev", _rows_cols)),
)

# an LSTM layer over a sequence: lstm_cell_fwd after xw[t] + h_{t-1} @ w_hh at every step
_BHT = ("batch", "hidden", "steps")

LSTM_LAYER_FWD = _kernel(
    "lstm_layer_fwd",
    "lstm_layer_fwd",
    "c0",
    _BHT,
    inputs=(
        Operand("xw", _sequence_gates),
        Operand("h0", _state),
        Operand("c0", _state),
        Operand("w_hh", _recurrent_weight),
    ),
    outputs=(
        Operand("out", _sequence),
        Operand("h", _state),
        Operand("c", _state),
        Operand("act", _sequence_gates),
    ),
    given=("steps",),
)

LSTM_LAYER_BWD = _kernel(
    "lstm_layer_bwd",
    "lstm_layer_bwd",
    "c0",
    _BHT,
    inputs=(
        Operand("d_out", _sequence),
        Operand("dh", _state),
        Operand("dc", _state),
        Operand("act", _sequence_gates),
        Operand("out", _sequence),
        Operand("h0", _state),
        Operand("c0", _state),
        Operand("w_hh", _recurrent_weight),
    ),
    outputs=(
        Operand("dxw", _sequence_gates),
        Operand("dh0", _state),
        Operand("dc0", _state),
        Operand("dw_hh", _recurrent_weight),
    ),
    given=("steps",),
)

SGD_UPDATE = _kernel(
    "sgd_update",
    "sgd_update_",
    "param",
    (),
    inputs=(
        Operand("param", _elements, "source"),
        Operand("grad", _elements, "source"),
        Operand("buf", _elements, "source"),
    ),
    scalars=("lr", "momentum", "weight_decay"),
    updates=("param", "buf"),
)

ADAM_UPDATE = _kernel(
    "adam_update",
    "adam_update_",
    "param",
    (),
    inputs=(
        Operand("param", _elements, "source"),
        Operand("grad", _elements, "source"),
        Operand("m", _elements, "source"),
        Operand("v", _elements, "source"),
    ),
    scalars=("lr", "beta1", "beta2", "eps", "weight_decay", "step"),
    check_sizes=_step_from_one,
    updates=("param", "m", "v"),
)

# ids: float32 holding whole numbers in [0, vocab); the kernels check the values (IndexError)
EMBEDDING_GATHER = _kernel(
    "embedding_gather",
    "embedding_gather",
    "weight",
    ("vocab", "cols", "rows"),
    inputs=(Operand("weight", _table), Operand("ids", _ids_of_gather)),
    outputs=(Operand("out", _looked_up),),
    more_sources=("ids",),
)

EMBEDDING_SCATTER_ADD = _kernel(
    "embedding_scatter_add",
    "embedding_scatter_add",
    "grad",
    ("rows", "cols", "vocab"),
    inputs=(Operand("grad", _grad_rows), Operand("ids", _ids_of_scatter)),
    outputs=(Operand("out", _scattered),),
    given=("vocab",),
)

CONV_FWD = _kernel(
    "conv_fwd",
    "conv_fwd",
    "x",
    _CONV,
    inputs=(Operand("x", _conv_in), Operand("weight", _conv_weight)),
    outputs=(Operand("out", _conv_out),),
    given=_CONV[4:],
    check_dims=_conv_geometry,
)

CONV_INPUT_GRAD = _kernel(
    "conv_input_grad",
    "conv_input_grad",
    "weight",
    _CONV_WEIGHT_FIRST,
    inputs=(
        Operand("grad", _weight_first(_conv_out)),
        Operand("weight", _weight_first(_conv_weight)),
    ),
    outputs=(Operand("out", _weight_first(_conv_in)),),
    given=_CONV_WEIGHT_FIRST[4:],
    check_dims=_conv_geometry_weight_first,
)

CONV_WEIGHT_GRAD = _kernel(
    "conv_weight_grad",
    "conv_weight_grad",
    "x",
    _CONV,
    inputs=(Operand("x", _conv_in), Operand("grad", _conv_out)),
    outputs=(Operand("out", _conv_weight),),
    given=_CONV[4:],
    check_dims=_conv_geometry,
)

__all__ = ["Operand", "FusedKernel", "KERNELS", "conv_out_hw"] + [
    "conv_fwd_given",
    "conv_input_grad_given",
    "conv_weight_grad_given",
    "SOFTMAX_XENT",
    "SOFTMAX_XENT_BWD",
    "SOFTMAX_FWD",
    "SOFTMAX_BWD",
    "LAYERNORM_FWD",
    "LAYERNORM_BWD",
    "BATCHNORM_FWD",
    "BATCHNORM_BWD",
    "LSTM_CELL_FWD",
    "LSTM_CELL_BWD",
    "LSTM_LAYER_FWD",
    "LSTM_LAYER_BWD",
    "ATTENTION_FWD",
    "ATTENTION_BWD",
    "SGD_UPDATE",
    "ADAM_UPDATE",
    "EMBEDDING_GATHER",
    "EMBEDDING_SCATTER_ADD",
    "CONV_FWD",
    "CONV_INPUT_GRAD",
    "CONV_WEIGHT_GRAD",
]
