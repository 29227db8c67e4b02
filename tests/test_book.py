"""The built book: every page in the table of contents rendered, with its outputs.

`make test` builds the book first (with -W and raise-on-error, so a failing cell
already failed the build); these tests check what a reader then opens.
"""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"


def toc_files() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


@pytest.fixture(scope="module")
def built():
    if not (HTML / "index.html").exists():
        pytest.fail("The book is not built: run `make book` (or `make test`) first.")
    return HTML


@pytest.mark.parametrize("page", toc_files())
def test_every_toc_page_is_built_and_newer_than_its_source(built, page):
    html = built / f"{page}.html"
    assert html.exists(), f"{page} is in _toc.yml but {html} was not built"
    source = next(ROOT.glob(f"{page}.*"))
    assert html.stat().st_mtime >= source.stat().st_mtime, (
        f"{html} is older than {source}: rebuild the book")


HOW_TO_PAGES = {"book/exercises"}   # instructions, not a chapter to predict
REVIEW = "book/review/"              # review pages: glued prose, no shown output


@pytest.mark.parametrize("page", toc_files()[1:])
def test_chapters_show_outputs_and_only_intended_tracebacks(built, page):
    text = (built / f"{page}.html").read_text()
    source = next(ROOT.glob(f"{page}.md")).read_text()
    review = page.startswith(REVIEW)
    assert review or "cell_output" in text, f"{page} shows no executed output"
    tracebacks = text.count("Traceback (most recent call last)")
    meant = source.count("raises-exception")
    assert tracebacks <= meant, (
        f"{page} shows {tracebacks} tracebacks but tags only {meant} cells "
        "raises-exception")
    if page not in HOW_TO_PAGES and not review:
        assert "eo-predictions" in text, f"{page} does not open with predictions"
