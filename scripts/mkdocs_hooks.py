"""mkdocs hooks: the site's home page and contributing page are README.md and CONTRIBUTING.md.

The two files live at the repository's top level, where GitHub and PyPI show them, and their links
point into ``docs/`` from there (``docs/method.md``). The site is built from ``docs/``, so each is
added as a generated page with those links made relative to ``docs/`` (``method.md``), and the
other top-level page linked under its site name (so are the links of ``docs/`` pages to them,
``../README.md#models``); CITATION.cff and LICENSE are served as they are. Anything else a link points to must be a page of
the site: ``mkdocs build --strict`` fails on a link or an anchor it cannot resolve.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
COPIED = ("CITATION.cff", "LICENSE")  # top-level files the pages link to, served as they are


def rewrite_links(text: str) -> str:
    """Links written from the repository root, made relative to docs/ (the site's root)."""
    text = re.sub(r"\]\(docs/", "](", text)
    for source, page in PAGES.items():
        text = re.sub(rf"\]\({re.escape(source)}(#[^)]*)?\)", lambda m, p=page: f"]({p}{m.group(1) or ''})", text)
    return text


def on_page_markdown(markdown, page, config, files):
    """docs/ pages link to README.md and CONTRIBUTING.md as GitHub shows them (``../README.md``)."""
    depth = page.file.src_uri.count("/")
    for source, target in PAGES.items():
        markdown = markdown.replace(f"]({'../' * (depth + 1)}{source}", f"]({'../' * depth}{target}")
    return markdown


def on_files(files, config):
    for source, page in PAGES.items():
        text = rewrite_links((ROOT / source).read_text(encoding="utf-8"))
        files.append(File.generated(config, page, content=text))
    for name in COPIED:
        files.append(File.generated(config, name, abs_src_path=str(ROOT / name)))
    return files
