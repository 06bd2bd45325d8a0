"""Sphinx configuration of the lectures' website (``make book``).

The source directory is the repository root (``sphinx-build -c book . build/book``) so the
site's pages keep the repository's paths: ``book/index`` (the landing page, which includes
README.md), ``notebooks/NN_topic`` (each executed notebook, rendered with its committed outputs
and never re-executed: nbval already runs them) and ``docs/*`` (the guides the README points to:
student mode, Colab, the locked environment, extensions, backends, benchmarks; the array layer).
MathJax comes from the django-static-mathjax package, copied into ``_static/mathjax``: the site
needs no network.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.fileutil import copy_asset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from book import toc  # noqa: E402  (the repository root is on sys.path only from here on)

REPO = toc.repository(ROOT)
LECTURES = {f"notebooks/{lec.stem}": lec for lec in toc.lectures(ROOT)}

project = "needle course companion"
author = "needle course companion"
copyright = "the needle course companion's authors"
root_doc = "book/index"
# The lectures by name: a notebook that is not one (a JupyterLab "Duplicate") gets no page.
include_patterns = ["book/index.md", *(f"{name}.ipynb" for name in LECTURES), "docs/*.md"]
exclude_patterns = [".*", "build", "_build", "data"]

extensions = ["myst_nb"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # the committed outputs are the checked ones
nb_merge_streams = True

html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_extra_path = ["root"]  # /index.html forwards to the landing page, book/index.html
html_context = {"default_mode": "auto"}  # light or dark as the reader's system prefers
html_theme_options = {
    "repository_url": REPO,
    "repository_branch": toc.BRANCH,
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
}
# Sphinx's default MathJax is a CDN address; this one is relative to _static.
mathjax_path = "mathjax/tex-mml-chtml.js"


def mathjax_dir() -> Path:
    """MathJax 3's browser bundle (es5/) as the django-static-mathjax package ships it."""
    es5 = Path(str(files("mathjax"))) / "static" / "mathjax" / "es5"
    if not (es5 / "tex-mml-chtml.js").is_file():
        raise RuntimeError(
            f"no MathJax bundle at {es5}: install the book extra "
            "(pip install django-static-mathjax)"
        )
    return es5


def copy_mathjax(app, exception) -> None:
    """After a successful build, copy MathJax into the site's _static/mathjax."""
    if exception is None and app.builder.format == "html":
        copy_asset(mathjax_dir(), Path(app.outdir) / "_static" / "mathjax")


def badge_bar(lecture: toc.Lecture) -> str:
    """HTML of a lecture page's launch links: Colab and the Jupytext source on the repository."""
    return (
        f'<p class="nb-badges">'
        f'<a class="nb-badge nb-colab" href="{toc.colab_url(REPO, lecture)}">'
        f"Open in Colab</a> "
        f'<a class="nb-badge nb-source" href="{toc.source_url(REPO, lecture)}">'
        f"view source (.py)</a></p>"
    )


def add_badges(app, doctree) -> None:
    """Put the launch links under each lecture page's title."""
    lecture = LECTURES.get(app.env.docname)
    if lecture is None:
        return
    title = next(iter(doctree.findall(nodes.title)), None)
    if title is None:
        raise ValueError(f"{app.env.docname}: the notebook has no title to put the badges under")
    title.parent.insert(
        title.parent.index(title) + 1, nodes.raw("", badge_bar(lecture), format="html")
    )
    # The notebook's own badge (an image from Colab's site) gives way to the bar: the site loads
    # nothing from other hosts.
    for image in list(doctree.findall(nodes.image)):
        if image["uri"] == toc.COLAB_BADGE:
            badge = image.parent if isinstance(image.parent, nodes.reference) else image
            holder = badge.parent
            holder.remove(badge)
            if isinstance(holder, nodes.paragraph) and not holder.astext().strip():
                holder.parent.remove(holder)


class LectureTable(SphinxDirective):
    """``{lecture-table}``: the README's lectures table, linking to this site's own pages."""

    def run(self) -> list[nodes.Node]:
        rel = "../" * self.env.docname.count("/")
        rows = toc.table(
            list(LECTURES.values()),
            REPO,
            page_link=lambda lec: f"{rel}notebooks/{lec.stem}.ipynb",
            colab=lambda url: f'<a class="nb-badge nb-colab" href="{url}">Colab</a>',
        )
        container = nodes.container(classes=["lecture-table"])
        self.state.nested_parse(StringList(rows, self.env.docname), self.content_offset, container)
        return [container]


def setup(app) -> dict:
    """The site's own pieces: launch badges, the lecture table, the offline MathJax."""
    app.add_directive("lecture-table", LectureTable)
    app.connect("doctree-read", add_badges)
    app.connect("build-finished", copy_mathjax)
    return {"parallel_read_safe": True}
