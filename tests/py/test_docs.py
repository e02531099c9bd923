"""docs/ as a site and as pages: MkDocs' strict build (pages, links, anchors), each page's opening, the README's size.

The command and flag check of the code blocks is tests/py/test_skills.py's; the settings page's is
tests/py/test_docs_settings.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README_MAX_LINES = 200


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the project at ROOT into SITE (the venv's mkdocs, as the README says)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
        check=False,
    )


def test_the_site_builds_strict_with_every_page_link_and_anchor_resolved(tmp_path):
    result = mkdocs_build(REPO, tmp_path / "site")
    warnings = [line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0 and not warnings, result.stderr[-3000:]
    # every page became a page of the site: getting-started.md -> getting-started/index.html
    unbuilt = [p.name for p in PAGES if p.stem != "index" and not (tmp_path / "site" / p.stem / "index.html").exists()]
    assert not unbuilt and (tmp_path / "site" / "index.html").exists(), f"pages not built: {unbuilt}"


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("[a](operations.md#no-such-heading)", "does not contain an anchor '#no-such-heading'"),
        ("[a](no-such-page.md)", "not found among documentation files"),
    ],
)
def test_the_strict_build_fails_on_a_broken_anchor_or_page(tmp_path, breakage, expected):
    # The check above is only worth something if MkDocs really refuses these: prove it on a copy.
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "index.md").open("a") as index:
        index.write(f"\n{breakage}\n")
    result = mkdocs_build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert expected in result.stderr


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.M))
    assert {p.name for p in PAGES} == listed, "mkdocs.yml's nav and docs/*.md differ"


def opening(text: str) -> tuple[str, str]:
    """A page's title line and what stands between it and its second heading."""
    lines = text.splitlines()
    rest = "\n".join(lines[1:])
    match = re.search(r"^## ", rest, re.M)
    return lines[0] if lines else "", rest[: match.start()] if match else rest


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_opens_with_who_it_is_for_and_a_runnable_example(page):
    title, intro = opening(page.read_text())
    assert re.match(r"^# \S", title), f"{page.name}: the first line must be the page's '# Title'"
    prose = intro.split("```")[0].strip()
    assert len(prose) >= 60, f"{page.name}: say who the page is for in a sentence or two under the title"
    assert re.search(r"```(bash|sh)\n.*\S.*\n```", intro, re.S), (
        f"{page.name}: give a runnable example (a ```bash block) before the first ## heading"
    )


def test_the_opening_check_catches_a_page_without_an_example():
    title, intro = opening(
        "# T\n\nFor people who read things and want a sentence of sixty chars.\n\n## Next\n```bash\nx\n```\n"
    )
    assert title == "# T"
    assert "```bash" not in intro


def test_the_readme_is_short_and_points_at_every_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, (
        f"README.md is over {README_MAX_LINES} lines: move detail to docs/"
    )
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)(?:#[\w-]+)?\)", readme))
    missing = {p.name for p in PAGES} - linked - {"index.md"}
    assert not missing, f"README.md links no page for {sorted(missing)}"
