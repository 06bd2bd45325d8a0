"""Data parallelism over MPI (mpi4py): rank, world size, broadcast and all-reduce of gradients.

Each process (rank) holds a full copy of the model, computes gradients on its shard of the
global batch, and :func:`allreduce_gradients` replaces every ``p.grad`` by the average over the
ranks. With equal shards and a loss that is a mean over the batch, that average is the gradient
of the full batch, so every rank takes the same optimizer step as one process would.

Run under ``mpiexec -n K python script.py``; without ``mpiexec`` the world has one rank and every
function here is the identity. ``mpi4py`` (and an MPI, e.g. the ``mpich`` wheel) is needed only
for this module: importing it fails with an ImportError saying what to install.
"""
from __future__ import annotations

import time
from typing import Dict, List, Sequence

import numpy as np

from needle.autograd import Tensor

try:
    from mpi4py import MPI
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("needle.distributed needs mpi4py and an MPI library: "
                      "pip install mpi4py mpich (or the needle[lectures] extra)") from error

# Seconds spent inside Allreduce/Bcast and bytes sent, since the last reset_comm_stats().
_STATS: Dict[str, float] = {"seconds": 0.0, "bytes": 0, "calls": 0}


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
    """{'seconds', 'bytes', 'calls'}: time in collectives, bytes each rank contributed, calls."""
    return dict(_STATS)


def reset_comm_stats() -> None:
    """Zero the counters of :func:`comm_stats`."""
    _STATS.update(seconds=0.0, bytes=0, calls=0)


def _flat(tensors: Sequence[Tensor], what: str) -> np.ndarray:
    """All of ``tensors`` packed into one contiguous float32/float64 numpy buffer."""
    arrays = []
    for i, t in enumerate(tensors):
        if t is None:
            raise ValueError(f"{what}: entry {i} is None (a parameter without a gradient?)")
        arrays.append(np.ascontiguousarray(t.numpy()).ravel())
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
        out.append(Tensor(flat[start:start + n].reshape(t.shape), device=t.device, dtype=t.dtype,
                          requires_grad=False))
        start += n
    return out


def allreduce_gradients(params: Sequence[Tensor], average: bool = True) -> None:
    """Replace each ``p.grad`` by its sum over the ranks (divided by world_size() if average).

    All gradients travel in one buffer (one Allreduce per call), as frameworks bucket them.
    Every rank must call this with the same parameters in the same order.
    """
    params = list(params)
    if not params:
        raise ValueError("allreduce_gradients: no parameters given")
    grads = [p.grad for p in params]
    send = _flat(grads, "allreduce_gradients")
    recv = np.empty_like(send)
    comm = MPI.COMM_WORLD
    _collective(lambda: comm.Allreduce(send, recv, op=MPI.SUM), send)
    if average:
        recv /= comm.Get_size()
    for p, g in zip(params, _unflat(recv, grads)):
        p.grad = g


def broadcast_parameters(params: Sequence[Tensor], root: int = 0) -> None:
    """Copy the values of ``params`` on rank ``root`` to every rank (call on every rank)."""
    params = list(params)
    if not params:
        raise ValueError("broadcast_parameters: no parameters given")
    comm = MPI.COMM_WORLD
    if not 0 <= root < comm.Get_size():
        raise ValueError(f"broadcast_parameters: root {root} is not a rank of a world of "
                         f"{comm.Get_size()}")
    flat = _flat(params, "broadcast_parameters")
    _collective(lambda: comm.Bcast(flat, root=root), flat)
    for p, value in zip(params, _unflat(flat, params)):
        p.data = value


def allreduce_mean(value: float) -> float:
    """The mean of a Python number over the ranks (e.g. each shard's loss)."""
    return MPI.COMM_WORLD.allreduce(float(value), op=MPI.SUM) / MPI.COMM_WORLD.Get_size()
