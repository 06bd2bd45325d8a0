"""Fixtures of the website's tests: the built site, served on 127.0.0.1, and a headless
Chromium that may reach nothing else.

A module, not a conftest.py: the suites in tests/ import their shared conftest by name, which
a second conftest.py here would shadow. test_book_site.py imports these fixtures.

The site is built once per test session, even under pytest-xdist: the first worker builds it
into the session's shared temporary folder under a lock, the others wait and reuse it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


def _build_error() -> str | None:
    """Why the site cannot be built here (a missing package of the book extra), or None."""
    for module in ("sphinx", "myst_nb", "sphinx_book_theme", "mathjax"):
        try:
            __import__(module)
        except ImportError as err:
            return (
                f"{err}: the book extra is not installed; `make book` (or `make test`) installs it"
            )
    return None


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The directory of the built site (book/build.py into the session's shared tmp folder)."""
    missing = _build_error()
    if missing:
        pytest.fail(missing)
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder every worker of this session shares
    out, log = shared / "book-site" / "html", shared / "book-site.log"
    with open(shared / "book-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").is_file() and not log.is_file():
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir()
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "book.build", str(out)],
                cwd=ROOT,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                capture_output=True,
                text=True,
                check=False,
            )
            log.write_text(
                f"exit {done.returncode} after {time.perf_counter() - started:.1f} s\n"
                f"{done.stdout}{done.stderr}"
            )
    if not (out / "index.html").is_file():
        pytest.fail(f"the site did not build:\n{log.read_text()}")
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def server(site):
    """The site served by ``python -m http.server`` on 127.0.0.1; yields its base URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(site),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"http.server did not start on 127.0.0.1:{port}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium, driven by playwright (never a browser playwright downloads)."""
    if not CHROMIUM.is_file():
        message = f"no {CHROMIUM}: apt-get install chromium (the site's browser test needs it)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs it before make test")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM))
        yield chromium
        chromium.close()


class OfflinePage:
    """A browser page that records console errors, failed loads and every off-site request.

    Requests to any host other than 127.0.0.1 are aborted and listed in ``offsite``.
    """

    def __init__(self, browser, **context_args):
        self.context = browser.new_context(**context_args)
        self.offsite: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on(
            "console",
            lambda msg: (
                msg.type == "error"
                and self.errors.append(f"console: {msg.text} ({msg.location.get('url')})")
            ),
        )
        self.page.on("pageerror", lambda exc: self.errors.append(f"script error: {exc}"))
        self.page.on(
            "requestfailed", lambda req: self.errors.append(f"failed: {req.url} ({req.failure})")
        )
        self.page.on(
            "response",
            lambda resp: (
                resp.status >= 400 and self.errors.append(f"HTTP {resp.status}: {resp.url}")
            ),
        )

    def _route(self, route):
        url = route.request.url
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.offsite.append(url)
            route.abort()

    def close(self):
        self.context.close()


@pytest.fixture
def new_offline_page(browser):
    """A factory of OfflinePages (keyword arguments go to the browser context); all are closed
    after the test."""
    made = []

    def new(**context_args) -> OfflinePage:
        made.append(OfflinePage(browser, **context_args))
        return made[-1]

    yield new
    for page in made:
        page.close()


@pytest.fixture
def offline_page(new_offline_page) -> OfflinePage:
    """An OfflinePage at a desktop size."""
    return new_offline_page(viewport={"width": 1280, "height": 900})
