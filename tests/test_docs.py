"""The README is a short front door, and every page of the docs site is reachable."""

from __future__ import annotations

import re

from replag.docs_gen import run
from tests.helpers.docs import DOCS, ROOT


def test_readme_is_a_front_door_whose_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []


def test_every_docs_page_is_in_the_nav() -> None:
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert pages - nav == set(), "pages under docs/ missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


def test_generated_reference_pages_are_current() -> None:
    # Settings, CLI help, metric families and JSON schemas are generated from the code:
    # `python -m replag.docs_gen` rewrites them.
    assert [str(p.relative_to(ROOT)) for p in run(DOCS, check=True)] == []
