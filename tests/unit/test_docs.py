"""The documents stand alone: every relative link in the README and docs/ points into the
repository, at a file that exists, and at a heading that exists when it names one.

A user has only the repository, so a link to a file outside it (or a mention of the project's
old shared folder) is broken for them. Links are read with markdown-it (the parser `rich`
already brings), so links inside code are not links; anchors follow GitHub's heading slugs
(lowercase, punctuation dropped, each space a '-', '-1', '-2', ... for repeated headings).
"""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
#: Text no document may contain: the folder outside the repository the design once lived in.
FORBIDDEN = ("../shared",)


def documents(root: Path) -> list[Path]:
    """The Markdown documents a user reads: those at the top of the repository and in docs/."""
    found = sorted(root.glob("*.md")) + sorted((root / "docs").glob("**/*.md"))
    return [path for path in found if path.is_file()]


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text: lowercase, every character that is not a letter,
    a mark, a digit, '-', '_' or a space dropped, and each space made a '-'."""
    kept = [
        c
        for c in text.lower()
        if c in "-_ " or unicodedata.category(c)[0] in "LMN"  # letters, marks, numbers
    ]
    return "".join(kept).replace(" ", "-")


def _inline_text(token: Token) -> str:
    """The text a heading renders to (code spans and link texts included, markup left out)."""
    parts = [
        child.content
        for child in token.children or []
        if child.type in ("text", "code_inline", "softbreak")
    ]
    return "".join(parts)


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text, repeats numbered as GitHub numbers them."""
    tokens = MarkdownIt("commonmark").parse(text)
    seen: dict[str, int] = {}
    found: set[str] = set()
    for opening, inline in itertools.pairwise(tokens):
        if opening.type != "heading_open":
            continue
        base = slug(_inline_text(inline))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of every link and image of a Markdown text (code spans and blocks hold
    none), reference-style ones resolved."""
    targets: list[str] = []
    pending = MarkdownIt("commonmark").parse(text)
    while pending:
        token = pending.pop(0)
        if token.type == "link_open":
            targets.append(str(token.attrGet("href") or ""))
        elif token.type == "image":
            targets.append(str(token.attrGet("src") or ""))
        pending[:0] = token.children or []
    return targets


@dataclass(frozen=True)
class Broken:
    document: str
    target: str
    why: str


def _check_target(root: Path, document: Path, target: str) -> str | None:
    """Why a link from `document` to `target` is broken, or None."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or target.startswith("mailto:"):
        return None  # not a path in the repository
    path, fragment = unquote(parts.path), unquote(parts.fragment)
    if not path:
        resolved = document
    elif path.startswith("/"):
        resolved = (root / path.lstrip("/")).resolve()
    else:
        resolved = (document.parent / path).resolve()
    if not resolved.is_relative_to(root.resolve()):
        return "points outside the repository"
    if not resolved.exists():
        return "no such file in the repository"
    if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text()):
        return f"no heading with the anchor #{fragment}"
    return None


def broken_links(root: Path, document: Path) -> list[Broken]:
    """The broken links of one document, and its mentions of folders outside the repository."""
    text = document.read_text()
    name = str(document.relative_to(root))
    broken = [Broken(name, word, "mentions a folder outside the repository")
              for word in FORBIDDEN if word in text]  # fmt: skip
    for target in links(text):
        why = _check_target(root, document, target)
        if why is not None:
            broken.append(Broken(name, target, why))
    return broken


@pytest.mark.parametrize("document", documents(ROOT), ids=lambda path: path.name)
def test_links_point_into_the_repository(document: Path) -> None:
    assert broken_links(ROOT, document) == []


def test_the_readme_links_the_design() -> None:
    targets = links((ROOT / "README.md").read_text())
    assert "docs/design.md" in targets
    assert (ROOT / "docs" / "design.md").is_file()


def test_slugs_follow_github() -> None:
    assert slug("Set-up: two commands") == "set-up-two-commands"
    assert slug("prq — a Redis-backed queue") == "prq--a-redis-backed-queue"
    assert slug("Delivery: at most once or at least once") == (
        "delivery-at-most-once-or-at-least-once"
    )
    text = "# A `code` title\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n"
    assert anchors(text) == {"a-code-title", "same", "same-1"}


def _repository(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Data-loss detection\n")
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


@pytest.mark.parametrize(
    ("readme", "why"),
    [
        ("[g](docs/missing.md)", "no such file in the repository"),
        ("[g](docs/guide.md#data-loss)", "no heading with the anchor #data-loss"),
        ("[g](#nowhere)\n\n# Here\n", "no heading with the anchor #nowhere"),
        ("[g](../outside.md)", "points outside the repository"),
        ("[ref]\n\n[ref]: docs/gone.md\n", "no such file in the repository"),
        ("see ../shared/DESIGN.md", "mentions a folder outside the repository"),
    ],
)
def test_a_broken_link_is_found(tmp_path: Path, readme: str, why: str) -> None:
    root = _repository(tmp_path, readme)
    assert [b.why for b in broken_links(root, root / "README.md")] == [why]


def test_sound_links_pass(tmp_path: Path) -> None:
    readme = (
        "# Top\n\n[g](docs/guide.md#data-loss-detection) [t](#top) [d](docs/) "
        "[w](https://example.com/x.md#y) `[c](nowhere.md)`\n\n```\n[c](nowhere.md)\n```\n"
    )
    root = _repository(tmp_path, readme)
    assert broken_links(root, root / "README.md") == []
