"""The documentation as tests read it: every page of the MkDocs site under docs/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def docs_text() -> str:
    """Every docs page, concatenated: where a test checks that something is documented."""
    return "\n".join(page.read_text() for page in sorted(DOCS.rglob("*.md")))
