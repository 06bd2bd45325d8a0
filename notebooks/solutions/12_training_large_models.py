"""Reference answers to the exercises of notebooks/12_training_large_models (try them first)."""
import math

import numpy as np


def ffn_forward_bytes(batch, width, n_blocks, bias):
    """Bytes kept by the forward pass of n_blocks FFN blocks (the input not counted)."""
    # Linear(w, 4w): x W (4w) [+ bias sum (4w)]; ReLU: 4w; Linear(4w, w): h W (w) [+ sum (w)]
    per_row = 4 * width + 4 * width + width
    if bias:
        per_row += 4 * width + width
    return n_blocks * batch * per_row * 4


def checkpointed_forward_bytes(batch, width, n_blocks, bias, every):
    """Bytes kept by the checkpointed forward pass (the input not counted)."""
    # only each segment's output (the next one's input, and the final output) is kept:
    # one (batch, width) array per segment, whatever the blocks hold inside
    return math.ceil(n_blocks / every) * batch * width * 4


def ring_allreduce(vectors, ring):
    """The sum of the K vectors (length n, divisible by K), as each of the K workers has it."""
    K = len(vectors)
    chunks = [np.split(np.asarray(v, dtype=np.float64).copy(), K) for v in vectors]
    # reduce-scatter: at step s worker i sends chunk (i - s) mod K, the receiver adds it
    for s in range(K - 1):
        messages = [(i, (i - s) % K, ring.send(i, chunks[i][(i - s) % K])) for i in range(K)]
        for i, c, data in messages:
            chunks[(i + 1) % K][c] = chunks[(i + 1) % K][c] + data
    # now worker i holds the full sum of chunk (i + 1) mod K; all-gather passes them on
    for s in range(K - 1):
        messages = [(i, (i + 1 - s) % K, ring.send(i, chunks[i][(i + 1 - s) % K]))
                    for i in range(K)]
        for i, c, data in messages:
            chunks[(i + 1) % K][c] = data
    return [np.concatenate(c) for c in chunks]


def combine_shard_gradients(shard_grads, shard_sizes):
    """shard_grads[i] is the list of parameter gradients on shard i (of shard_sizes[i]
    samples); returns the list of full-batch gradients."""
    total = sum(shard_sizes)
    return [sum(n / total * np.asarray(grads[j]) for grads, n in zip(shard_grads, shard_sizes))
            for j in range(len(shard_grads[0]))]
