"""The documents of the repository (issue 30, item 5): docs/ builds into a site with MkDocs in
strict mode, as .ci/run builds it, with every page in the nav; a broken link between pages fails
the build; the README is one page that starts with the two commands and links every page."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
TWO_COMMANDS = ["bash .ci/quickstart",
                "bash .ci/setup && python3 -m pytest tests/unit tests/integration tests/cluster tests/node"]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of ``root``'s mkdocs.yml, as .ci/run runs it (not --quiet: that
    silences the warnings strict counts)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=120)


def nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_in_strict_mode(tmp_path):
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert not (REPO / "site").exists()  # the build wrote nothing into the repository


def test_every_page_is_in_the_nav_and_the_build_is_strict():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["docs_dir"] == "docs"
    pages = nav_pages(config["nav"])
    assert sorted(pages) == sorted(p.name for p in DOCS.glob("*.md")), pages
    assert len(pages) == len(set(pages))
    checks = config["validation"]
    assert set(checks["links"].values()) == {"warn"} and set(checks["nav"].values()) == {"warn"}, checks


def test_a_broken_link_between_pages_fails_the_build(tmp_path):
    """A copy of the site with one broken link, then one broken anchor: each fails strict."""
    for broken in ("[a page](no-such-page.md)", "[a heading](design.md#no-such-heading)"):
        root = tmp_path / f"copy{len(broken)}"
        shutil.copytree(DOCS, root / "docs")
        shutil.copy(REPO / "mkdocs.yml", root)
        with open(root / "docs" / "index.md", "a") as f:
            f.write(f"\n{broken}\n")
        done = build(root, root / "site")
        assert done.returncode != 0, done.stderr
        assert "WARNING" in done.stderr and broken.split("(")[1].rstrip(")") in done.stderr, done.stderr


def test_the_readme_is_one_page_that_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    first = re.search(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)
    assert first and text.index(first.group(0)) == len("# probe-runner\n\n"), "the two commands come first"
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in first.group(1).splitlines()]
    assert commands == TWO_COMMANDS
    assert TWO_COMMANDS[1].split("&& ", 1)[1] + "\n" in (REPO / ".ci/run").read_text()  # CI runs the README's test command
    assert re.findall(r"^## (.*)$", text, flags=re.M) == ["Where to read next"]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert all((REPO / link).is_file() for link in links if "://" not in link), links
    assert sorted(f"docs/{p.name}" for p in DOCS.glob("*.md") if p.name != "index.md") == sorted(
        link for link in links if link.startswith("docs/"))  # every page linked once (index.md is the site's own)


def test_the_index_links_every_page():
    text = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([a-z-]+\.md)(?:#[^)]*)?\)", text))
    assert linked == {p.name for p in DOCS.glob("*.md")} - {"index.md"}
