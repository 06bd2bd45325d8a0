"""The lectures as a website: Sphinx configuration (conf.py) and the table of contents (toc.py)."""
