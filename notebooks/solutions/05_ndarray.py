"""Reference answers to the exercises of notebooks/05_ndarray (try them first)."""


def compact_strides(shape):
    """Row-major strides, in elements, of a compact array of this shape."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def permuted(shape, strides, axes):
    """(new shape, new strides) of the permuted view."""
    return tuple(shape[a] for a in axes), tuple(strides[a] for a in axes)


def sliced_view():
    """(shape, strides, offset) of A[1:3, ::2, 1:5:3] for a compact A of shape (3, 4, 5)."""
    # strides of A are (20, 5, 1); each slice keeps its axis: len(range(start, stop, step))
    shape = (len(range(1, 3)), len(range(0, 4, 2)), len(range(1, 5, 3)))
    strides = (20 * 1, 5 * 2, 1 * 3)
    offset = 1 * 20 + 0 * 5 + 1 * 1
    return shape, strides, offset


def broadcast_strides(shape, strides, new_shape):
    """Strides of the broadcast view (0 along every broadcast axis)."""
    return tuple(0 if old == 1 and new != 1 else st
                 for old, new, st in zip(shape, new_shape, strides))
