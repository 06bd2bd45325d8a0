"""A malformed-file corpus, generated in tmp_path: every bad file gets a clear error naming it.

MNIST IDX files (raw and gzipped: empty, wrong or malformed magic numbers, truncated headers,
wrapped sizes, truncated or surplus data, cut or corrupted gzip streams, image/label count
mismatches), CIFAR-10 pickle batches that would run code when loaded, and Penn Treebank text
that is not UTF-8. The oracle for each case is the file's construction: we know what is wrong
with it, so the error must say which file it is.
"""

import gzip
import io
import os
import pickle
import pickletools
import struct
import tracemalloc

import numpy as np
import pytest

import needle as ndl

pytestmark = pytest.mark.data


# ---- MNIST IDX -------------------------------------------------------------------------------
def idx_bytes(magic: int, dims, payload: bytes = b"") -> bytes:
    """An IDX file's bytes: big-endian magic, then each size, then the payload."""
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


IMAGES = idx_bytes(2051, (3, 4, 5), bytes(range(60)))
LABELS = idx_bytes(2049, (3,), bytes([1, 2, 3]))


def corrupt_deflate(blob: bytes) -> bytes:
    """``blob`` gzipped, with bytes in the middle of the deflate stream inverted."""
    z = bytearray(gzip.compress(blob, mtime=0))
    for i in range(12, len(z) - 8):
        z[i] ^= 0xFF
    return bytes(z)


def bad_crc(blob: bytes) -> bytes:
    """``blob`` gzipped, with the CRC-32 in the gzip trailer changed."""
    z = bytearray(gzip.compress(blob, mtime=0))
    z[-8] ^= 0x01
    return bytes(z)


# (case id, file bytes given as the images file, what the error must say)
IDX_CASES = [
    ("empty", b"", "empty"),
    ("empty-gzip", gzip.compress(b""), "empty"),
    ("three-bytes", b"\x00\x00\x08", "only 3 byte"),
    ("junk-magic", b"\x12\x34\x56\x78" + bytes(20), "bad IDX magic"),
    ("zero-dims", b"\x00\x00\x08\x00", "bad IDX magic"),
    ("unknown-type", idx_bytes(0x0000_0703, (3, 4, 5), bytes(60)), "bad IDX magic"),
    ("labels-as-images", LABELS, "expected 2051"),
    ("labels-as-images-gz", gzip.compress(LABELS), "expected 2051"),
    ("truncated-header", IMAGES[:9], "truncated header"),
    ("truncated-header-gz", gzip.compress(IMAGES[:9]), "truncated header"),
    ("truncated-data", IMAGES[:-7], "truncated"),
    ("truncated-data-gz", gzip.compress(IMAGES[:-7]), "truncated"),
    ("surplus-data", IMAGES + b"\x00", "longer than its header"),
    ("surplus-data-gz", gzip.compress(IMAGES + b"\x00"), "longer than its header"),
    # 2^31 * 2^31 * 4 bytes wraps to 0 in int64: a reader using int64 sizes accepts it
    ("wrapped-size", idx_bytes(2051, (2**31, 2**31, 4)), "18446744073709551616"),
    ("wrapped-size-gz", gzip.compress(idx_bytes(2051, (2**31, 2**31, 4))), "18446744073709551616"),
    (
        "huge-header-gz",
        gzip.compress(idx_bytes(2051, (60000, 28, 28), bytes(10))),
        "more than the file can hold",
    ),
    ("cut-gzip", gzip.compress(IMAGES)[:-30], "not a valid gzip file"),
    ("corrupt-deflate", corrupt_deflate(IMAGES), "not a valid gzip file"),
    ("bad-crc", bad_crc(IMAGES), "not a valid gzip file"),
]


@pytest.mark.parametrize("name,blob,message", IDX_CASES, ids=[c[0] for c in IDX_CASES])
def test_malformed_idx_images_named_in_error(tmp_path, name, blob, message):
    bad = tmp_path / f"{name}-idx3-ubyte"
    bad.write_bytes(blob)
    good = tmp_path / "labels-idx1-ubyte"
    good.write_bytes(LABELS)
    for load in (ndl.data.parse_mnist, ndl.data.MNISTDataset):
        with pytest.raises(ValueError) as info:
            load(str(bad), str(good))
        assert str(bad) in str(info.value)
        assert message in str(info.value)


@pytest.mark.parametrize("gz", [False, True])
def test_malformed_idx_labels_named_in_error(tmp_path, gz):
    pack = gzip.compress if gz else (lambda b: b)
    images = tmp_path / "images"
    images.write_bytes(pack(IMAGES))
    for name, blob, message in [
        ("short", LABELS[:-1], "truncated"),
        ("images-as-labels", IMAGES, "expected 2049"),
    ]:
        bad = tmp_path / name
        bad.write_bytes(pack(blob))
        with pytest.raises(ValueError) as info:
            ndl.data.parse_mnist(str(images), str(bad))
        assert str(bad) in str(info.value) and message in str(info.value)


def test_idx_count_mismatch_names_both_files(tmp_path):
    images, labels = tmp_path / "img.gz", tmp_path / "lbl.gz"
    images.write_bytes(gzip.compress(IMAGES))
    labels.write_bytes(gzip.compress(idx_bytes(2049, (2,), bytes(2))))
    with pytest.raises(ValueError) as info:
        ndl.data.parse_mnist(str(images), str(labels))
    message = str(info.value)
    assert str(images) in message and str(labels) in message
    assert "3 images" in message and "2 labels" in message


def test_wrong_magic_is_refused_before_decompressing(tmp_path):
    """A small gzip of a bad header and 32 MiB of zeros: the reader stops at the header.

    tracemalloc sees every Python buffer the reader allocates; decompressing the whole file
    first (as a reader that checks the header afterwards does) needs 32 MiB at once.
    """
    bomb = tmp_path / "bomb-idx3-ubyte.gz"
    bomb.write_bytes(gzip.compress(b"\x12\x34\x56\x78" + bytes(32 << 20), compresslevel=1))
    assert bomb.stat().st_size < 1 << 20
    labels = tmp_path / "labels"
    labels.write_bytes(LABELS)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="bad IDX magic") as info:
            ndl.data.parse_mnist(str(bomb), str(labels))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(bomb) in str(info.value)
    assert peak < 4 << 20, f"peak {peak} bytes while rejecting a bad header"


def test_idx_reader_still_reads_what_the_header_declares(tmp_path):
    """The streaming reader against numpy's own parse of the same bytes, raw and gzipped."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(37, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=37, dtype=np.uint8)
    for gz in (False, True):
        pack = gzip.compress if gz else (lambda b: b)
        ip, lp = tmp_path / f"i{gz}", tmp_path / f"l{gz}"
        ip.write_bytes(pack(idx_bytes(2051, images.shape, images.tobytes())))
        lp.write_bytes(pack(idx_bytes(2049, labels.shape, labels.tobytes())))
        X, y = ndl.data.parse_mnist(str(ip), str(lp))
        np.testing.assert_array_equal(X, images.reshape(37, -1) / np.float32(255))
        np.testing.assert_array_equal(y, labels)


# ---- CIFAR-10 pickles ------------------------------------------------------------------------
def cifar_batch(n: int = 2) -> dict:
    """A valid CIFAR-10 batch dict of ``n`` images."""
    data = (np.arange(n * 3072) % 251).astype(np.uint8).reshape(n, 3072)
    return {
        b"batch_label": b"testing batch 1 of 1",
        b"data": data,
        b"labels": [i % 10 for i in range(n)],
        b"filenames": [b"img%d.png" % i for i in range(n)],
    }


class Shell:
    """Pickles as a call of os.system(command): loading it with pickle.load runs the command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Exec:
    """Pickles as a call of builtins.exec(source)."""

    def __init__(self, source: str):
        self.source = source

    def __reduce__(self):
        return (exec, (self.source,))


class Innocent:
    """A plain object: pickled by reference to this module's class, which a batch never holds."""

    def __init__(self):
        self.value = 1


def write_cifar_folder(folder, batch: dict, protocol: int) -> None:
    """``folder/test_batch`` holding ``batch`` (the file CIFAR10Dataset(train=False) reads)."""
    folder.mkdir(exist_ok=True)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch, f, protocol=protocol)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("payload", ["system", "exec"])
def test_malicious_cifar_batch_does_not_run_and_raises(tmp_path, protocol, payload):
    marker = tmp_path / "marker"
    evil = (
        Shell(f"touch '{marker}'")
        if payload == "system"
        else Exec(f"open({str(marker)!r}, 'w').close()")
    )
    batch = cifar_batch()
    batch[b"filenames"] = [evil, b"img1.png"]
    folder = tmp_path / "cifar"
    write_cifar_folder(folder, batch, protocol)
    with pytest.raises(ValueError) as info:
        ndl.data.CIFAR10Dataset(str(folder), train=False)
    assert not marker.exists(), "the pickle's payload ran"
    message = str(info.value)
    assert str(folder / "test_batch") in message
    assert f".{payload}" in message  # the refused global, e.g. posix.system or builtins.exec


def test_cifar_batch_with_a_foreign_class_is_refused(tmp_path):
    batch = cifar_batch()
    batch[b"extra"] = Innocent()
    folder = tmp_path / "cifar"
    write_cifar_folder(folder, batch, pickle.DEFAULT_PROTOCOL)
    with pytest.raises(ValueError) as info:
        ndl.data.CIFAR10Dataset(str(folder), train=False)
    assert str(folder / "test_batch") in str(info.value)
    assert f"{__name__}.Innocent" in str(info.value)


class Py2Pickler(pickle._Pickler):
    """Writes str and bytes as Python 2 ``str`` (BINSTRING), as cPickle did for CIFAR-10."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_str8(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        n = len(raw)
        self.write(
            pickle.SHORT_BINSTRING + bytes([n]) + raw
            if n < 256
            else pickle.BINSTRING + struct.pack("<i", n) + raw
        )
        self.memoize(obj)

    dispatch[bytes] = save_str8
    dispatch[str] = save_str8


def py2_numpy1_pickle(obj) -> bytes:
    """``obj`` pickled as Python 2 with numpy 1.x wrote the CIFAR-10 batches (protocol 2)."""
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def numpy1_pickle(obj, protocol: int) -> bytes:
    """``obj`` pickled by Python 3 with numpy 1.x's module names (``numpy.core``)."""
    raw = pickle.dumps(obj, protocol=protocol)
    # Frames (protocol >= 4) record their lengths: drop them (they are optional) before
    # renaming; protocol >= 4 stores names as length-prefixed strings, so fix that byte too.
    ops = [(op.name, pos) for op, _, pos in pickletools.genops(raw)] + [("END", len(raw))]
    raw = b"".join(raw[pos:nxt] for (name, pos), (_, nxt) in zip(ops, ops[1:]) if name != "FRAME")
    for new, old in (
        (b"numpy.core.multiarray", b"numpy._core.multiarray"),
        (b"numpy.core.numeric", b"numpy._core.numeric"),
    ):
        raw = raw.replace(bytes([0x8C, len(old)]) + old, bytes([0x8C, len(new)]) + new)
        raw = raw.replace(b"c" + old + b"\n", b"c" + new + b"\n")
    return raw


@pytest.mark.parametrize(
    "writer", ["py2-numpy1", "numpy1-p2", "numpy1-p5", "numpy2-p2", "numpy2-p5"]
)
def test_cifar_batches_from_every_numpy_load(tmp_path, writer):
    """The admitted globals suffice for the real batches and for numpy 1.x/2.x re-pickles."""
    batch = cifar_batch(3)
    if writer == "py2-numpy1":
        blob = py2_numpy1_pickle(batch)
    elif writer.startswith("numpy1"):
        blob = numpy1_pickle(batch, int(writer[-1]))
        assert b"numpy.core." in blob and b"numpy._core" not in blob
    else:
        blob = pickle.dumps(batch, protocol=int(writer[-1]))
    folder = tmp_path / "cifar"
    folder.mkdir()
    (folder / "test_batch").write_bytes(blob)
    ds = ndl.data.CIFAR10Dataset(str(folder), train=False)
    np.testing.assert_array_equal(ds.y, [0, 1, 2])
    np.testing.assert_allclose(ds.X.reshape(3, 3072), batch[b"data"] / np.float32(255))


# ---- Penn Treebank text ----------------------------------------------------------------------
@pytest.mark.parametrize("bad_file", ["train.txt", "test.txt"])
def test_non_utf8_corpus_names_the_file_and_line(tmp_path, bad_file):
    for name in ("train.txt", "test.txt"):
        (tmp_path / name).write_text("the cat sat\non the mat\n", encoding="utf-8")
    # Latin-1 "café" on line 2: 0xE9 followed by a space is not UTF-8
    (tmp_path / bad_file).write_bytes("a line\nun café noir\n".encode("latin-1"))
    with pytest.raises(ValueError) as info:
        ndl.data.Corpus(str(tmp_path))
    message = str(info.value)
    assert str(tmp_path / bad_file) in message
    assert "UTF-8" in message and "line 2" in message


def test_non_utf8_bytes_past_max_lines_are_never_read(tmp_path):
    """Only the lines asked for are decoded: a bad byte after them does not matter."""
    (tmp_path / "train.txt").write_bytes(b"a b\nc\n" + "caf\u00e9\n".encode("latin-1"))
    (tmp_path / "test.txt").write_bytes(b"d\n")
    corpus = ndl.data.Corpus(str(tmp_path), max_lines=2)
    assert [corpus.dictionary.idx2word[i] for i in corpus.train] == [
        "a",
        "b",
        "<eos>",
        "c",
        "<eos>",
    ]
