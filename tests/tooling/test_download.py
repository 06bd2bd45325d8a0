"""companion.data.download, offline: files the tests write, served over file:// and a local HTTP
server."""

import hashlib
import http.server
import io
import socket
import tarfile
import threading
import time

import pytest
from conftest import SHARED_DATA

from companion.data import download as dl

pytestmark = pytest.mark.data


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files`` (path -> bytes), honouring ``Range: bytes=N-`` unless told not to."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        body = srv.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        if rng and srv.honour_range:
            start = int(rng.split("=")[1].rstrip("-"))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.end_headers()
                return
            chunk = body[start:]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            chunk = body
            self.send_response(200)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        srv.bytes_sent += len(chunk)
        step = 16_384
        for i in range(0, len(chunk), step):  # srv.delay seconds between pieces: a slow mirror
            self.wfile.write(chunk[i : i + step])
            time.sleep(srv.delay)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.files, srv.requests, srv.bytes_sent, srv.honour_range = {}, [], 0, True
    srv.delay = 0.0
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _payload(n=200_000):
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


def _md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def _quiet(*args):
    pass


def test_http_download_verifies_and_renames(server, tmp_path):
    body = _payload()
    server.files["/f.bin"] = body
    out = dl.download_file(
        [server.url + "/f.bin"], tmp_path / "sub" / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert out.read_bytes() == body
    assert not (tmp_path / "sub" / "f.bin.part").exists()


def test_http_resume_sends_range_and_fetches_only_the_rest(server, tmp_path):
    body = _payload()
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(body[:123_456])
    dl.download_file(
        [server.url + "/f.bin"], tmp_path / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert (tmp_path / "f.bin").read_bytes() == body
    assert server.requests == [("/f.bin", "bytes=123456-")]
    assert server.bytes_sent == len(body) - 123_456


def test_http_resume_when_server_ignores_range(server, tmp_path):
    body = _payload()
    server.files["/f.bin"] = body
    server.honour_range = False
    (tmp_path / "f.bin.part").write_bytes(b"stale bytes")
    dl.download_file(
        [server.url + "/f.bin"], tmp_path / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert (tmp_path / "f.bin").read_bytes() == body


def test_complete_part_gets_416_then_verifies(server, tmp_path):
    body = _payload(1000)
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(body)
    dl.download_file(
        [server.url + "/f.bin"], tmp_path / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert (tmp_path / "f.bin").read_bytes() == body and server.bytes_sent == 0


def test_corrupt_part_is_refetched_whole(server, tmp_path):
    body = _payload(5000)
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(b"X" * 100)  # wrong prefix: resumed file fails the MD5
    dl.download_file(
        [server.url + "/f.bin"], tmp_path / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert (tmp_path / "f.bin").read_bytes() == body
    assert [r[1] for r in server.requests] == ["bytes=100-", None]


def test_mirror_fallback(server, tmp_path):
    body = _payload(3000)
    server.files["/good/f.bin"] = body
    server.files["/bad/f.bin"] = b"not the file"
    urls = [server.url + "/missing/f.bin", server.url + "/bad/f.bin", server.url + "/good/f.bin"]
    dl.download_file(urls, tmp_path / "f.bin", _md5(body), progress=False, log=_quiet)
    assert (tmp_path / "f.bin").read_bytes() == body
    assert [r[0] for r in server.requests] == ["/missing/f.bin", "/bad/f.bin", "/good/f.bin"]


def test_all_mirrors_fail_with_checksum_error(server, tmp_path):
    server.files["/f.bin"] = b"corrupted"
    with pytest.raises(dl.DownloadError) as err:
        dl.download_file(
            [server.url + "/f.bin", server.url + "/g.bin"],
            tmp_path / "f.bin",
            "0" * 32,
            progress=False,
            log=_quiet,
        )
    msg = str(err.value)
    assert "MD5 mismatch" in msg and "HTTP 404" in msg and "0" * 32 in msg
    assert not (tmp_path / "f.bin").exists() and not (tmp_path / "f.bin.part").exists()


def test_offline_error_is_clear(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now
    with pytest.raises(dl.DownloadError, match="cannot reach the host.*offline") as err:
        dl.download_file(
            [f"http://127.0.0.1:{port}/x.gz"],
            tmp_path / "x.gz",
            "0" * 32,
            progress=False,
            timeout=5,
            log=_quiet,
        )
    assert "place it at" in str(err.value)


def test_file_urls_resume(tmp_path):
    body = _payload(50_000)
    src = tmp_path / "src.bin"
    src.write_bytes(body)
    (tmp_path / "dst.bin.part").write_bytes(body[:20_000])
    dl.download_file([src.as_uri()], tmp_path / "dst.bin", _md5(body), progress=False, log=_quiet)
    assert (tmp_path / "dst.bin").read_bytes() == body


def test_unknown_md5_is_reported_unverified(tmp_path):
    body = b"some text\n"
    src = tmp_path / "t.txt"
    src.write_bytes(body)
    lines = []
    dl.download_file(
        [src.as_uri()], tmp_path / "out" / "t.txt", None, progress=False, log=lines.append
    )
    assert _md5(body) in lines[0] and "NOT verified" in lines[0]


def test_a_part_without_a_checksum_is_never_resumed(server, tmp_path):
    """With no MD5 nothing can tell a mix of two mirrors' bytes: the .part left by an
    interrupted run (from another mirror) used to be completed and accepted."""
    body = b"line one\nline two\n" * 1000
    server.files["/b/t.txt"] = body
    (tmp_path / "t.txt.part").write_bytes(b"line one\r\nline two\r\n" * 300)  # mirror A's
    dl.download_file(
        [server.url + "/b/t.txt"], tmp_path / "t.txt", None, progress=False, log=_quiet
    )
    assert (tmp_path / "t.txt").read_bytes() == body
    assert server.requests == [("/b/t.txt", None)]  # fetched whole: no Range


def test_two_downloads_of_one_file_at_once_both_succeed(server, tmp_path):
    """Two runs at once used to share the .part: the first renamed it, the second crashed with
    FileNotFoundError. Now the second waits on the lock, then finds the file present."""
    body = _payload(200_000)
    server.files["/f.bin"] = body
    server.delay = 0.01  # about 0.1 s per download: the two overlap
    results, lines = [], []

    def run():
        try:
            dl.download_file(
                [server.url + "/f.bin"],
                tmp_path / "f.bin",
                _md5(body),
                progress=False,
                log=lines.append,
            )
            results.append("ok")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results.append(repr(exc))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(60)
    assert results == ["ok", "ok"]
    assert (tmp_path / "f.bin").read_bytes() == body
    assert len(server.requests) == 1  # the second found the file present


def test_a_destination_that_cannot_be_written_is_a_download_error(server, tmp_path, capsys):
    """A read-only or impossible --root gave a raw OSError traceback. (The tests run as root,
    which writes anywhere, so the folder here is impossible: under a regular file.)"""
    (tmp_path / "a_file").write_text("x")
    root = tmp_path / "a_file" / "data"
    with pytest.raises(dl.DownloadError, match=r"cannot write f\.bin into .*a_file/data"):
        dl.download_file([server.url + "/f.bin"], root / "f.bin", "0" * 32, log=_quiet)
    assert dl.main(["mnist", "--root", str(root), "--no-progress"]) == 1
    assert "cannot write train-images-idx3-ubyte.gz into" in capsys.readouterr().err
    assert server.requests == []


def test_present_file_with_right_md5_is_not_fetched(server, tmp_path):
    body = _payload(100)
    (tmp_path / "f.bin").write_bytes(body)
    dl.download_file(
        [server.url + "/f.bin"], tmp_path / "f.bin", _md5(body), progress=False, log=_quiet
    )
    assert server.requests == []


def test_progress_bar_shows(tmp_path, capsys):
    body = _payload(10_000)
    (tmp_path / "s.bin").write_bytes(body)
    dl.download_file(
        [(tmp_path / "s.bin").as_uri()], tmp_path / "d.bin", _md5(body), progress=True, log=_quiet
    )
    assert "d.bin" in capsys.readouterr().err


# ---- the registry and the command line ---------------------------------------------------------


def test_registry_matches_the_course_layout():
    mnist = {r.filename: r.md5 for r in dl.DATASETS["mnist"]}
    assert mnist == {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }
    (cifar,) = dl.DATASETS["cifar10"]
    assert (cifar.filename, cifar.md5, cifar.extract_to) == (
        "cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        "cifar-10-batches-py",
    )
    assert [r.filename for r in dl.DATASETS["ptb"]] == [
        "ptb/train.txt",
        "ptb/valid.txt",
        "ptb/test.txt",
    ]
    for resources in dl.DATASETS.values():
        for r in resources:
            assert len(r.urls) >= 2, f"{r.filename} needs a fallback mirror"


def test_every_file_of_the_registry_has_a_checksum():
    """PTB's train.txt had none: a .part begun from one mirror and completed from another was
    accepted. (The value is torchtext's, whose valid and test hashes equal ours.)"""
    for resources in dl.DATASETS.values():
        for r in resources:
            assert isinstance(r.md5, str) and len(r.md5) == 32, r.filename
            int(r.md5, 16)


@pytest.mark.parametrize("split", ["train", "valid", "test"])
def test_ptb_checksums_match_the_real_files(split):
    path = SHARED_DATA / "ptb" / f"{split}.txt"
    if not path.is_file():
        pytest.skip("no real Penn Treebank beside the checkout")
    (res,) = [r for r in dl.DATASETS["ptb"] if r.filename == f"ptb/{split}.txt"]
    assert dl.md5_file(path) == res.md5


def _tar_gz(members: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _fake_cifar(monkeypatch, server, members):
    archive = _tar_gz(members)
    server.files["/cifar-10-python.tar.gz"] = archive
    res = dl.Resource(
        "cifar-10-python.tar.gz",
        _md5(archive),
        (server.url + "/cifar-10-python.tar.gz",),
        extract_to="cifar-10-batches-py",
        expected_members=("data_batch_1", "test_batch"),
    )
    monkeypatch.setitem(dl.DATASETS, "cifar10", [res])


def test_cli_downloads_and_extracts(server, tmp_path, monkeypatch, capsys):
    _fake_cifar(
        monkeypatch,
        server,
        {"cifar-10-batches-py/data_batch_1": b"a", "cifar-10-batches-py/test_batch": b"b"},
    )
    root = tmp_path / "data"
    assert dl.main(["cifar10", "--root", str(root), "--no-progress"]) == 0
    assert (root / "cifar-10-batches-py" / "test_batch").read_bytes() == b"b"
    assert "extracted" in capsys.readouterr().out
    assert dl.main(["cifar10", "--root", str(root), "--no-progress"]) == 0  # second run: no fetch
    assert len(server.requests) == 1


def test_unsafe_archive_is_refused(server, tmp_path, monkeypatch):
    _fake_cifar(monkeypatch, server, {"../evil": b"x", "cifar-10-batches-py/test_batch": b"b"})
    with pytest.raises(dl.DownloadError, match="unsafe archive member"):
        dl.download_dataset("cifar10", tmp_path / "data", progress=False, log=_quiet)
    assert not (tmp_path / "evil").exists()


def test_cli_mirror_option_and_failure_exit_code(server, tmp_path, monkeypatch, capsys):
    body = _payload(500)
    server.files["/m/ptb.valid.txt"] = body
    res = dl.Resource("ptb/valid.txt", _md5(body), ("http://127.0.0.1:9/ptb.valid.txt",))
    monkeypatch.setitem(dl.DATASETS, "ptb", [res])
    assert (
        dl.main(["ptb", "--root", str(tmp_path), "--mirror", server.url + "/m", "--no-progress"])
        == 0
    )
    assert (tmp_path / "ptb" / "valid.txt").read_bytes() == body
    monkeypatch.setitem(
        dl.DATASETS, "ptb", [dl.Resource("ptb/x.txt", "0" * 32, (server.url + "/none",))]
    )
    assert dl.main(["ptb", "--root", str(tmp_path), "--no-progress"]) == 1
    assert "could not download x.txt" in capsys.readouterr().err


def test_cli_rejects_unknown_names():
    with pytest.raises(SystemExit):
        dl.main(["imagenet"])
    with pytest.raises(SystemExit):
        dl.main([])
    with pytest.raises(ValueError, match="unknown data set"):
        dl.download_dataset("imagenet")
