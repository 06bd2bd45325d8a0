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
* the ops (``needle.ops.ops_fused``) reach the kernels through the array-level functions.

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


@dataclass(frozen=True)
class FusedKernel:
    """A fused kernel: ``name`` is the device function (None when no device kernel exists),
    ``api_name`` the array-level function; ``dims`` names the sizes read off the input
    ``source`` (a 2-D matrix), then off the inputs ``more_sources`` (each axis in turn: the
    embedding gather reads (vocab, cols) off its weight and rows off its ids), then the
    ``given`` sizes, which the caller passes (the vocabulary of the embedding scatter-add,
    read off no input); ``dims`` is empty for the element-wise in-place updates, whose source
    may have any shape. The device call takes the inputs, the sizes, the ``scalars`` and the
    outputs, in that order; the numpy kernel takes the inputs, the given sizes and the
    scalars. ``check_sizes(fn, dims, scalars)`` holds any further check."""

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
        naming ``name``, the buffer and both sizes). With no ``dims`` (the in-place updates)
        the source buffer's size is the size. Returns the sizes."""
        fn = self.name or self.api_name  # only kernels with a device function get here
        if not self.dims:
            dims = (buffers[self.source].size,)
        elif any(d < 0 for d in dims):
            raise ValueError(f"{fn}: negative size in {dict(zip(self.dims, dims))}")
        if self.check_sizes is not None:
            self.check_sizes(fn, dims, scalars)
        for op in self.inputs + self.outputs:
            want = math.prod(op.shape(*dims))
            have = buffers[op.name].size
            if have != want:
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

SOFTMAX_XENT_BWD = _kernel(
    None,
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

__all__ = ["Operand", "FusedKernel", "KERNELS"] + [
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
    "SGD_UPDATE",
    "ADAM_UPDATE",
    "EMBEDDING_GATHER",
    "EMBEDDING_SCATTER_ADD",
]
