"""The docs' tables stay readable: no table row over 600 characters on any page (history lives in git log)."""

from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_no_docs_table_row_over_600_characters():
    long = [f"{p.relative_to(ROOT)}:{i}: {len(line)}" for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for i, line in enumerate(p.read_text().splitlines(), 1) if line.startswith("|") and len(line) > 600]
    assert long == []
