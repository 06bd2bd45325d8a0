"""Data parallelism over MPI (mpi4py): rank, world size, broadcast and all-reduce of gradients.

Each process (rank) holds a full copy of the model, computes gradients on its shard of the
global batch, and :func:`allreduce_gradients` replaces every ``p.grad`` by the average over the
ranks. With equal shards and a loss that is a mean over the batch, that average is the gradient
of the full batch, so every rank takes the same optimizer step as one process would.

Run under ``mpiexec -n K python script.py``; without ``mpiexec`` the world has one rank and every
function here is the identity. ``mpi4py`` (and an MPI, e.g. the ``mpich`` wheel) is needed only
for this module: importing it fails with an ImportError saying what to install.

Failing fast. A rank that stops while the others wait in a collective would leave them waiting
forever, so with more than one rank, importing this module installs an excepthook (as
``python -m mpi4py`` does) that prints the uncaught exception and calls
``MPI.COMM_WORLD.Abort(1)``: the whole job ends with a non-zero status. The abort waits (at most
a few seconds) until mpiexec has read the whole message from the rank's output pipes, so the
job's output always holds it (it used to be cut off by the abort under load). Before each
collective, the ranks check together that they hold parameters of the same shapes and dtypes in
the same order and (for gradients) that every rank has every gradient; otherwise every rank
raises the same ValueError naming the first difference, instead of summing unrelated numbers
element-wise.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import struct
import sys
import termios
import time
from typing import Dict, List, Optional, Sequence, cast

import numpy as np

from needle.autograd import Tensor

try:
    from mpi4py import MPI
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "needle.distributed needs mpi4py and an MPI library: "
        "pip install mpi4py mpich (or the needle[lectures] extra)"
    ) from error

# Seconds spent inside Allreduce/Bcast and bytes sent, since the last reset_comm_stats().
_STATS: Dict[str, float] = {"seconds": 0.0, "bytes": 0, "calls": 0}


_OUTPUT_FDS = (1, 2)  # stdout and stderr: mpiexec reads them through pipes


def _abort_on_uncaught_exception(previous_hook):
    def hook(kind, value, traceback) -> None:
        previous_hook(kind, value, traceback)  # print the traceback first
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken: nothing more to deliver
                pass
        _wait_until_read(_OUTPUT_FDS)
        MPI.COMM_WORLD.Abort(1)

    return hook


def _wait_until_read(fds: Sequence[int], limit: float = 5.0) -> None:
    """Wait, at most ``limit`` seconds, until the reader of each pipe among ``fds`` (mpiexec's
    proxy) has taken every byte written to it: once read, the output travels to mpiexec ahead
    of the abort, which otherwise can overtake it and cut the rank's message short."""
    deadline = time.monotonic() + limit
    for fd in fds:
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue  # a file or a terminal: written already
        except OSError:
            continue
        while time.monotonic() < deadline:
            try:
                unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
            except OSError:
                break
            if unread == 0:
                break
            time.sleep(0.005)


if MPI.COMM_WORLD.Get_size() > 1:
    sys.excepthook = _abort_on_uncaught_exception(sys.excepthook)


def init() -> "MPI.Intracomm":
    """The MPI communicator of all processes (MPI is initialised on import of mpi4py)."""
    return MPI.COMM_WORLD


def rank() -> int:
    """This process's index in 0 .. world_size() - 1."""
    return MPI.COMM_WORLD.Get_rank()


def world_size() -> int:
    """The number of processes started by mpiexec (1 without it)."""
    return MPI.COMM_WORLD.Get_size()


def comm_stats() -> Dict[str, float]:
    """{'seconds', 'bytes', 'calls'}: time in the Allreduce/Bcast of values, bytes each rank
    contributed, calls (the small agreement check before each is not counted)."""
    return dict(_STATS)


def reset_comm_stats() -> None:
    """Zero the counters of :func:`comm_stats`."""
    _STATS.update(seconds=0.0, bytes=0, calls=0)


def _describe(entry) -> str:
    shape, dtype = entry
    return f"{shape} {dtype}"


def _param_list(params: Sequence[Tensor], what: str) -> List[Tensor]:
    """``params`` as a non-empty list of Tensors (the same check on every rank)."""
    params = list(params)
    if not params:
        raise ValueError(f"{what}: no parameters given")
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{what}: parameter {i} is a {type(p).__name__}, not a Tensor")
    return params


def _agree(
    what: str, params: Sequence[Tensor], grads: Optional[Sequence[Optional[Tensor]]] = None
) -> None:
    """Raise the same ValueError on every rank unless all ranks pass parameters of the same
    shapes and dtypes in the same order and, given ``grads``, every rank has a gradient of its
    parameter's shape for every parameter. One small allgather (two when signatures differ)."""
    comm = MPI.COMM_WORLD
    signature = [(tuple(p.shape), str(p.dtype)) for p in params]
    digest = hashlib.sha256(repr(signature).encode()).hexdigest()
    grads = (
        []
        if grads is None
        else [None if g is None else (tuple(g.shape), str(g.dtype)) for g in grads]
    )
    missing = [i for i, g in enumerate(grads) if g is None]
    misfit = [(i, g) for i, g in enumerate(grads) if g is not None and g != signature[i]]
    views = comm.allgather((digest, missing, misfit))
    if any(view[0] != digest for view in views):
        signatures = comm.allgather(signature)
        first = signatures[0]
        for r, other in enumerate(signatures[1:], start=1):
            for i, (a, b) in enumerate(zip(first, other)):
                if a != b:
                    raise ValueError(
                        f"{what}: parameter {i} is {_describe(a)} on rank 0 but "
                        f"{_describe(b)} on rank {r}: every rank must pass the same "
                        f"parameters in the same order"
                    )
            if len(first) != len(other):
                raise ValueError(
                    f"{what}: rank 0 passes {len(first)} parameters, rank {r} "
                    f"passes {len(other)}: every rank must pass the same parameters "
                    f"in the same order"
                )
    for r, (_, rank_missing, rank_misfit) in enumerate(views):
        if rank_missing:
            i = rank_missing[0]
            raise ValueError(
                f"{what}: parameter {i} ({_describe(signature[i])}) has no gradient "
                f"on rank {r} (it did not take part in that rank's loss?): every "
                f"rank must have every gradient"
            )
        if rank_misfit:
            i, grad = rank_misfit[0]
            raise ValueError(
                f"{what}: the gradient of parameter {i} is {_describe(grad)} on "
                f"rank {r}, the parameter {_describe(signature[i])}"
            )


def _flat(tensors: Sequence[Tensor], what: str) -> np.ndarray:
    """All of ``tensors`` packed into one contiguous float32/float64 numpy buffer."""
    arrays = [np.ascontiguousarray(t.numpy()).ravel() for t in tensors]
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1:
        raise TypeError(f"{what}: mixed dtypes {sorted(map(str, dtypes))}")
    return np.concatenate(arrays)


def _collective(call, buffer: np.ndarray) -> None:
    start = time.perf_counter()
    call()
    _STATS["seconds"] += time.perf_counter() - start
    _STATS["bytes"] += buffer.nbytes
    _STATS["calls"] += 1


def _unflat(flat: np.ndarray, like: Sequence[Tensor]) -> List[Tensor]:
    out, start = [], 0
    for t in like:
        n = int(np.prod(t.shape))
        out.append(
            Tensor(
                flat[start : start + n].reshape(t.shape),
                device=t.device,
                dtype=t.dtype,
                requires_grad=False,
            )
        )
        start += n
    return out


def allreduce_gradients(params: Sequence[Tensor], average: bool = True) -> None:
    """Replace each ``p.grad`` by its sum over the ranks (divided by world_size() if average).

    All gradients travel in one buffer (one Allreduce per call), as frameworks bucket them.
    Every rank must call this with the same parameters in the same order, each with a gradient
    of its shape; otherwise every rank raises the same ValueError naming the first difference.
    """
    params = _param_list(params, "allreduce_gradients")
    grads = [p.grad for p in params]
    _agree("allreduce_gradients", params, grads)
    present = cast(List[Tensor], grads)  # _agree raised on every rank unless all are there
    send = _flat(present, "allreduce_gradients")
    recv = np.empty_like(send)
    comm = MPI.COMM_WORLD
    _collective(lambda: comm.Allreduce(send, recv, op=MPI.SUM), send)
    if average:
        recv /= comm.Get_size()
    for p, g in zip(params, _unflat(recv, present)):
        p.grad = g


def broadcast_parameters(params: Sequence[Tensor], root: int = 0) -> None:
    """Copy the values of ``params`` on rank ``root`` to every rank (call on every rank)."""
    params = _param_list(params, "broadcast_parameters")
    comm = MPI.COMM_WORLD
    if not 0 <= root < comm.Get_size():
        raise ValueError(
            f"broadcast_parameters: root {root} is not a rank of a world of {comm.Get_size()}"
        )
    _agree("broadcast_parameters", params)
    flat = _flat(params, "broadcast_parameters")
    _collective(lambda: comm.Bcast(flat, root=root), flat)
    for p, value in zip(params, _unflat(flat, params)):
        p.data = value


def allreduce_mean(value: float) -> float:
    """The mean of a Python number over the ranks (e.g. each shard's loss)."""
    return MPI.COMM_WORLD.allreduce(float(value), op=MPI.SUM) / MPI.COMM_WORLD.Get_size()
