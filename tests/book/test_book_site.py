"""The lectures' website (make book): it builds, and every page works offline in a browser.

The browser tests open the built site, served on 127.0.0.1, in headless Chromium with every
other host blocked, and check what a reader sees: pages load without missing resources,
figures decode, math is typeset (no TeX left in the text), internal links and anchors resolve,
search finds a word.
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from book_fixtures import (  # noqa: F401 (the fixtures this module's tests use)
    browser,
    new_offline_page,
    offline_page,
    server,
    site,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Every page a reader can reach, derived from the sources (the root index.html only forwards).
PAGES = [
    "book/index.html",
    "search.html",
    "genindex.html",
    *[f"docs/{md.stem}.html" for md in sorted((ROOT / "docs").glob("*.md"))],
    *[f"notebooks/{nb.stem}.html" for nb in NOTEBOOKS],
]
# TeX that MathJax would have replaced: display/inline delimiters and common commands.
RAW_TEX = re.compile(
    r"\$\$|\\[([]|\\(frac|mathbf|mathbb|mathcal|mathrm|sum|nabla|sqrt|theta|"
    r"alpha|cdot|top|partial|begin|left|right|log|exp|in)\b"
)


def _pages(site: Path) -> list[str]:
    """Every HTML page of the site, relative to it (theme templates under _static excluded)."""
    return sorted(
        str(p.relative_to(site))
        for p in site.rglob("*.html")
        if p.relative_to(site).parts[0] != "_static"
    )


# ---- the build ------------------------------------------------------------------------------


def test_every_lecture_notebook_has_a_page(site):
    assert NOTEBOOKS
    missing = [
        nb.name for nb in NOTEBOOKS if not (site / "notebooks" / f"{nb.stem}.html").is_file()
    ]
    assert not missing, f"no page for {missing}"


def test_the_pages_carry_the_committed_outputs_unexecuted(site):
    # The text of a notebook's first stream output is on its page.
    import json

    nb = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    stream = next(
        o
        for c in nb["cells"]
        if c["cell_type"] == "code"
        for o in c["outputs"]
        if o["output_type"] == "stream"
    )
    first_line = "".join(stream["text"]).strip().splitlines()[0].strip()
    page = (site / "notebooks" / f"{NOTEBOOKS[0].stem}.html").read_text(encoding="utf-8")
    assert html.escape(first_line, quote=False) in page


def test_the_site_uses_the_local_mathjax(site):
    assert (site / "_static" / "mathjax" / "tex-mml-chtml.js").is_file()
    page = (site / "notebooks" / f"{NOTEBOOKS[0].stem}.html").read_text(encoding="utf-8")
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page)
    assert "../_static/mathjax/tex-mml-chtml.js" in scripts
    assert not [s for s in scripts if "://" in s], f"remote scripts: {scripts}"


def test_the_root_forwards_to_the_landing_page(site):
    assert "url=book/index.html" in (site / "index.html").read_text(encoding="utf-8")
    assert (site / "book" / "index.html").is_file()


def test_each_lecture_page_has_its_launch_links(site):
    from book import toc

    repo = toc.repository(ROOT)
    for lecture in toc.lectures(ROOT):
        page = (site / "notebooks" / f"{lecture.stem}.html").read_text(encoding="utf-8")
        assert f'href="{toc.colab_url(repo, lecture)}"' in page, lecture.stem
        assert f'href="{toc.source_url(repo, lecture)}"' in page, lecture.stem
        # The navigation names the lecture by its header's number and title.
        assert f"{lecture.number} · {html.escape(lecture.title, quote=False)}" in page


# ---- in the browser -------------------------------------------------------------------------


@cache
def _ids(path: Path) -> frozenset[str]:
    """The element ids of an HTML file (the anchors a link may name)."""
    return frozenset(
        html.unescape(i) for i in re.findall(r'\sid="([^"]*)"', path.read_text(encoding="utf-8"))
    )


def _broken(site: Path, base: str, hrefs: list[str]) -> list[str]:
    """The on-site links among ``hrefs`` (absolute URLs) whose file or anchor does not exist."""
    broken = []
    for href in hrefs:
        parts = urlsplit(href)
        if not href.startswith(base) or parts.scheme not in ("http", "https"):
            continue
        rel = unquote(parts.path)[len(urlsplit(base).path) :]
        target = site / rel
        if rel == "" or rel.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            broken.append(href)
        elif (
            parts.fragment
            and target.suffix == ".html"
            and unquote(parts.fragment) not in _ids(target)
        ):
            broken.append(href)
    return broken


def _visible_text_outside_code(page) -> str:
    """The article's visible text, without code blocks, outputs and typeset math."""
    return page.evaluate("""() => {
        const main = document.querySelector('main') || document.body;
        const copy = main.cloneNode(true);
        copy.querySelectorAll('pre, code, .highlight, .cell_output, mjx-container, script, '
                              + 'style, mjx-assistive-mml').forEach(e => e.remove());
        document.body.appendChild(copy);
        const text = copy.innerText;
        copy.remove();
        return text;
    }""")


def _open(offline, url: str):
    """Load ``url``, let MathJax finish and every image decode."""
    offline.page.goto(url, wait_until="load")
    offline.page.evaluate("""async () => {
        if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
            await MathJax.startup.promise;
        }
        await Promise.all(Array.from(document.images).map(img => {
            img.loading = 'eager';
            return img.decode().catch(() => null);
        }));
    }""")


def test_the_browser_tests_open_every_page_the_site_has(site):
    assert sorted(_pages(site)) == sorted([*PAGES, "index.html"])


@pytest.mark.parametrize("which", PAGES)
def test_page_works_offline(which, site, server, offline_page):
    assert (site / which).is_file(), f"{which} was not built"
    _open(offline_page, server + which)
    page = offline_page.page
    assert not offline_page.errors, f"{which}: " + "\n".join(offline_page.errors)
    assert not offline_page.offsite, f"{which} asked other hosts for {offline_page.offsite}"

    undecoded = page.evaluate(
        "Array.from(document.images)"
        ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)"
    )
    assert not undecoded, f"{which}: images that did not decode: {undecoded}"

    text = _visible_text_outside_code(page)
    raw = sorted({m.group(0) for m in RAW_TEX.finditer(text)})
    assert not raw, f"{which}: TeX left untypeset in the text: {raw}"

    hrefs = page.evaluate("Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    broken = _broken(site, server, hrefs)
    assert not broken, f"{which}: broken links: {broken}"


def test_the_site_root_opens_the_landing_page(server, offline_page):
    offline_page.page.goto(server)
    offline_page.page.wait_for_url("**/book/index.html")
    assert offline_page.page.title().startswith("needle course companion")
    assert not offline_page.offsite and not offline_page.errors, offline_page.errors


def test_lecture_page_shows_math_figures_and_outputs(site, server, offline_page):
    _open(offline_page, server + f"notebooks/{NOTEBOOKS[0].stem}.html")
    page = offline_page.page
    assert page.locator("mjx-container").count() > 10  # MathJax typeset the formulas
    assert page.locator("div.cell_output img").count() >= 1  # a figure from the outputs
    assert page.locator("div.cell_output pre").count() >= 1  # text outputs kept
    assert page.locator("a.nb-colab").first.is_visible()
    # Long outputs scroll inside their cell.
    overflow = page.evaluate(
        "getComputedStyle(document.querySelector('div.cell_output pre')).overflowY"
    )
    assert overflow == "auto"


def test_search_finds_a_word_typed_into_the_search_box(server, offline_page):
    page = offline_page.page
    _open(offline_page, server + "book/index.html")
    page.keyboard.press("Control+k")
    # pydata-sphinx-theme >= 0.16 opens a <dialog>; 0.15 (what Python 3.10 resolves) shows a form
    box = page.locator(
        "#pst-search-dialog input[type=search], .search-button__wrapper.show input[type=search]"
    )
    box.fill("topological")
    box.press("Enter")
    page.wait_for_url("**/search.html?q=topological*")
    results = page.locator("#search-results ul.search li")
    results.first.wait_for(timeout=20_000)
    links = results.locator("a").evaluate_all("els => els.map(a => a.getAttribute('href'))")
    assert any("02_automatic_differentiation" in h for h in links), links
    assert not offline_page.offsite and not offline_page.errors, offline_page.errors


def test_the_tex_check_sees_math_that_mathjax_did_not_typeset(site, server, offline_page):
    # The same page with MathJax blocked: the raw-TeX check must notice.
    offline_page.context.route("**/_static/mathjax/**", lambda route: route.abort())
    _open(offline_page, server + f"notebooks/{NOTEBOOKS[0].stem}.html")
    assert RAW_TEX.search(_visible_text_outside_code(offline_page.page))


def test_screenshots_of_the_landing_and_a_lecture_page(new_offline_page, server, tmp_path_factory):
    """Screenshots for a person to look at: the landing page, a lecture's top and its first
    figure at a desktop size, and the lecture's top on a phone."""
    shots = tmp_path_factory.mktemp("book-screenshots")
    lecture = f"notebooks/{NOTEBOOKS[1].stem}.html"
    for name, url, viewport, figure in [
        ("landing", "book/index.html", {"width": 1280, "height": 900}, False),
        ("lecture", lecture, {"width": 1280, "height": 900}, False),
        ("lecture-figure", lecture, {"width": 1280, "height": 900}, True),
        ("lecture-phone", lecture, {"width": 390, "height": 844}, False),
    ]:
        offline = new_offline_page(viewport=viewport)
        _open(offline, server + url)
        if figure:
            offline.page.locator("div.cell_output img").first.scroll_into_view_if_needed()
        path = shots / f"{name}.png"
        offline.page.screenshot(path=str(path))
        assert path.stat().st_size > 10_000, f"{path} looks empty"
        assert not offline.offsite and not offline.errors, offline.errors
        print(f"screenshot: {path}")
