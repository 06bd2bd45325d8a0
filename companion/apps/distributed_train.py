"""Data-parallel training of an MLP on the 8x8 digits: ``mpiexec -n K python -m
companion.apps.distributed_train --out result.npz``.

Every rank builds the same model (same seed, then a broadcast from rank 0 to be sure), draws the
same global batch indices, trains on its 1/K slice, and averages gradients with
``needle.distributed.allreduce_gradients`` before each SGD step. Run without mpiexec (K = 1) it
is plain full-batch training, so the two runs' parameters must agree to float rounding.

Rank 0 writes ``--out`` (npz): the final parameters (``param_0`` ...), the global loss per step,
and the seconds and bytes of computation and communication.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _arguments(argv) -> argparse.Namespace:
    """The command line: steps, global batch, hidden size, learning rate, seed, output."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="global batch (all ranks)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    """Parse arguments, train, and write the result file on rank 0."""
    args = _arguments(argv)

    from sklearn.datasets import load_digits

    import needle as ndl
    import needle.nn as nn
    from needle import distributed as dist

    world, me = dist.world_size(), dist.rank()
    if args.batch % world:
        raise ValueError(f"global batch {args.batch} is not divisible by {world} ranks")
    shard = args.batch // world

    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.float32)
    np.random.seed(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    params = model.parameters()
    dist.broadcast_parameters(params, root=0)
    opt = ndl.optim.SGD(params, lr=args.lr)
    loss_fn = nn.SoftmaxLoss()
    order = np.random.default_rng(args.seed)  # the same global batches on every rank

    dist.reset_comm_stats()
    losses, compute_s = [], 0.0
    for _ in range(args.steps):
        idx = order.choice(len(X), args.batch, replace=False)[me * shard : (me + 1) * shard]
        start = time.perf_counter()
        opt.reset_grad()
        loss = loss_fn(
            model(ndl.Tensor(X[idx], requires_grad=False)), ndl.Tensor(y[idx], requires_grad=False)
        )
        loss.backward()
        compute_s += time.perf_counter() - start
        dist.allreduce_gradients(params)
        start = time.perf_counter()
        opt.step()
        compute_s += time.perf_counter() - start
        losses.append(dist.allreduce_mean(float(loss.numpy())))

    if me == 0:
        stats = dist.comm_stats()
        np.savez(
            args.out,
            losses=np.array(losses),
            world=world,
            compute_seconds=compute_s,
            comm_seconds=stats["seconds"],
            comm_bytes=stats["bytes"],
            comm_calls=stats["calls"],
            **{f"param_{i}": p.numpy() for i, p in enumerate(params)},
        )


if __name__ == "__main__":
    main()
