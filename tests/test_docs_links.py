"""Every relative link in the README and the documents points to a file that exists, and to a heading of it that
exists when the link names one (GitHub's anchors), so each moved section stays one link from the README."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", "docs/*.md", "bench/*.md", "dags/README.md", "spark_apps/README.md"]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped but hyphens and underscores,
    spaces made hyphens; a repeated heading's anchor gets -1, -2, ..."""
    found: set[str] = set()
    for line in _prose_lines(text):
        heading = _HEADING.match(line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def broken_links(document: Path) -> list[str]:
    """The relative links of `document` whose file, or whose anchor in that file, does not exist."""
    text = document.read_text()
    broken = []
    for line in _prose_lines(text):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            linked = (document.parent / path).resolve() if path else document
            if not linked.exists():
                broken.append(f"{document.name}: {target}: no file {linked}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{document.name}: {target}: no heading #{anchor} in {linked.name}")
    return broken


def test_every_relative_link_resolves() -> None:
    documents = sorted({p for pattern in DOCUMENTS for p in ROOT.glob(pattern)})
    assert len(documents) >= 10
    broken = [b for d in documents for b in broken_links(d)]
    assert broken == []


def test_broken_files_and_anchors_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# The guide\n\n## Backups: how, and when\n\n## Backups: how, and when\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "See [the guide](docs/guide.md), [backups](docs/guide.md#backups-how-and-when) and\n"
        "[again](docs/guide.md#backups-how-and-when-1), [top](#read-me), [web](https://example.com/x.md).\n"
        "# Read me\n"
        "Gone: [old](docs/old.md), [nowhere](docs/guide.md#restores), `[code](docs/none.md)`.\n"
        "```\n[fenced](docs/none.md)\n```\n"
    )
    assert broken_links(readme) == [
        f"README.md: docs/old.md: no file {tmp_path / 'docs' / 'old.md'}",
        "README.md: docs/guide.md#restores: no heading #restores in guide.md",
    ]
