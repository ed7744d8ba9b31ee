"""The documentation site builds with `mkdocs build --strict`: no broken link or anchor between
its pages (mkdocs.yml turns every link check into a warning, and --strict fails on a warning).
The README's links into docs/ are checked here too, against the built pages, since the README is
not one of the site's pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A relative link in the README: a repository path, and maybe an anchor.
README_LINK = re.compile(r"\]\((?!https?:|mailto:)([^)#\s]+)(?:#([^)\s]+))?\)")


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def built_page(site: Path, page: str) -> Path:
    """Where mkdocs writes docs/<page>.md with its default directory URLs."""
    stem = page.removeprefix("docs/").removesuffix(".md")
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def test_the_site_builds_strict_and_the_readme_links_land(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = build(site)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "WARNING" not in done.stderr, done.stderr

    links = README_LINK.findall((ROOT / "README.md").read_text())
    assert any(path.startswith("docs/") for path, _ in links), "the README links to no docs/ page"
    broken = []
    for path, anchor in links:
        if not (ROOT / path).exists():
            broken.append(path)
        elif anchor and not (path.startswith("docs/") and f'id="{anchor}"' in built_page(site, path).read_text()):
            broken.append(f"{path}#{anchor}")
    assert not broken, f"README links with no page or anchor on the site: {broken}"
