"""The built site read as a reader sees it: defects that must not come back.

Each test reads `_build/html` (CI builds the book before pytest runs) and looks
for one kind of defect the book has had: a table left as raw pipe text, a stray
return value printed under a cell, words we use among ourselves, a reference to
a chapter that does not exist, a script that breaks in every page's console, and
a measured number typed into the prose beside the glue that should carry it.
"""

from __future__ import annotations

import html
import re
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"


def _pages() -> dict[str, str]:
    pages = sorted((SITE / "book").rglob("*.html"))
    if not pages:
        pytest.skip("the book is not built: run `make book` (CI builds it before "
                    "the tests)")
    return {str(p.relative_to(SITE)): p.read_text(errors="replace") for p in pages}


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return _pages()


def _main(page: str) -> str:
    """The article only: no navigation, scripts or styles."""
    m = re.search(r'<article class="bd-article".*?</article>', page, re.S)
    body = m.group(0) if m else page
    return re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.S)


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _prose(page: str) -> str:
    """Rendered text outside code and outputs (pre blocks and code cells)."""
    body = re.sub(r"<pre\b.*?</pre>", " ", _main(page), flags=re.S)
    return _text(body)


def test_the_build_is_present_and_covers_the_toc(pages):
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    missing = [f for f in files if f"{f}.html" not in pages]
    assert missing == [], f"toc entries with no built page: {missing}"


def test_no_table_is_left_as_raw_pipe_text(pages):
    raw = {name: m.group(0) for name, page in pages.items()
           if (m := re.search(r"\|\s*:?(?:-{3,}|[—–]+-*):?\s*\|", _prose(page)))}
    assert raw == {}, f"markdown tables rendered as text: {raw}"


def test_no_cell_prints_a_stray_return_value(pages):
    # An output box whose whole text is a repr: `{}`, `{'stream': ...}`, `None`.
    stray = {}
    for name, page in pages.items():
        for out in re.findall(r'<div class="cell_output docutils container">(.*?)'
                              r"</div>\s*</div>", _main(page), re.S):
            text = _text(out).strip()
            if re.fullmatch(r"\{.*\}|\[\]|None|\(\)|<[\w.]+ object at 0x\w+>", text,
                            re.S) and len(text) < 400:
                stray.setdefault(name, []).append(text[:80])
    assert stray == {}, f"stray reprs under cells: {stray}"


AUTHORING = re.compile(r"\bthe seed(?:'s|’s)?\b(?! (?:is|was|=|of the))|"
                       r"\boriginal page\b", re.I)


def test_no_authoring_vocabulary_in_the_prose(pages):
    hits = {name: [m.group(0) for m in AUTHORING.finditer(_prose(page))]
            for name, page in pages.items()}
    hits = {k: v for k, v in hits.items() if v}
    assert hits == {}, f"words a reader cannot know: {hits}"


def test_no_reference_to_a_chapter_that_does_not_exist(pages):
    toc = (ROOT / "_toc.yml").read_text()
    known = set(re.findall(r"\bc(\d\d)_", toc))
    dangling = {}
    for name, page in pages.items():
        for m in re.finditer(r"(?<!#)\bc(\d\d)(?:'s|’s)?\b", _text(_main(page))):
            if m.group(1) not in known:
                dangling.setdefault(name, set()).add(m.group(0))
    assert dangling == {}, f"chapter ids not in the toc: {dangling}"


def test_no_page_declares_the_same_script_constant_twice(pages):
    # The cause of a SyntaxError in every page's console: an inline script block
    # (sphinx-thebe's `const THEBE_JS_URL = ...`) written into the page twice.
    doubled = {}
    for name, page in pages.items():
        consts = re.findall(r"<script>[^<]*?\bconst\s+(\w+)\s*=", page)
        if len(consts) != len(set(consts)):
            doubled[name] = sorted({c for c in consts if consts.count(c) > 1})
        if "THEBE_JS_URL" in page:
            doubled.setdefault(name, []).append("THEBE_JS_URL present")
    assert doubled == {}, doubled


# Numbers worth guarding: with a thousands separator, a decimal point, or three
# digits or more (a 2 or a 10 is as often a setting as a measurement).
_NUM = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])|"
                  r"(?<![\w.,])\d+\.\d+(?![\w.])|(?<![\w.,])\d{3,}(?![\w.,])")


def _typed_copies(page: str) -> list[tuple[str, str]]:
    """Numbers typed in a paragraph that equal a value glued into the same page.

    Glued values render as `pasted-text` spans. A typed copy of one of them is a
    measurement that will not follow the next run: the claim guard.
    """
    main = _main(page)
    glued = {_text(g).strip() for g in re.findall(
        r'<span class="pasted-text">(.*?)</span>', main, re.S)}
    glued = {g for g in glued if _NUM.fullmatch(g)}
    out = []
    for para in re.findall(r"<p>(.*?)</p>", main, re.S):
        if "pasted-text" not in para:
            continue
        typed = re.sub(r'<span class="pasted-text">.*?</span>|<code\b.*?</code>|'
                       r'<span class="math.*?</span>', " ", para, flags=re.S)
        for m in _NUM.finditer(_text(typed)):
            if m.group(0) in glued:
                out.append((m.group(0), _text(para)[:120]))
    return out


def test_no_measured_number_is_typed_beside_its_glue(pages):
    typed = {name: hits for name, page in pages.items()
             if (hits := _typed_copies(page))}
    assert typed == {}, f"numbers typed where the page glues them: {typed}"


def test_the_claim_guard_catches_a_typed_copy():
    # The guard itself can fail: a paragraph that glues 398 and also types it.
    page = ('<article class="bd-article"><p>Acking first lost <span class='
            '"pasted-text">398</span> jobs; that is 398 jobs gone.</p></article>')
    assert _typed_copies(page) == [("398", "Acking first lost 398 jobs; that is "
                                    "398 jobs gone.")]
    assert _typed_copies(page.replace("that is 398", "that is all")) == []


def test_the_glossary_has_index_entries_and_chapters_link_to_it(pages):
    index = (SITE / "genindex.html").read_text(errors="replace")
    assert "glossary.html#term-lease" in index, "the index has no glossary terms"
    linking = [n for n, p in pages.items()
               if "glossary.html#term-" in p and not n.endswith("glossary.html")]
    assert len(linking) >= 4, f"few chapters link the glossary: {linking}"


def test_every_chapter_ends_with_a_review_and_its_assignment(pages):
    for name in ("queues_and_logs", "lab_queue", "replay_matrix", "outbox"):
        text = _prose(pages[f"book/{name}.html"])
        for heading in ("Explain it back", "Your turn"):
            assert heading in text, f"{name}: no '{heading}' section"
        assert "exercises.html#ex-" in pages[f"book/{name}.html"], (
            f"{name}: 'Your turn' does not link its assignment")


CHAPTERS = ("c01_delivery_semantics", "queues_and_logs", "lab_queue", "cluster",
            "replay_matrix", "outbox", "pg_queue")


def test_every_chapter_is_whole(pages):
    """Objectives and a reading time on top, a summary, Explain it back, sources."""
    missing = {}
    for name in CHAPTERS:
        text = _prose(pages[f"book/{name}.html"])
        want = {"objectives": "After this chapter you can",
                "reading time": re.compile(r"About \d+ minutes to read"),
                "summary": re.compile(r"What (this (chapter|page)|was) measured"),
                "Explain it back": "Explain it back",
                "sources": re.compile(r"(Primary sources|Go deeper|Sources)\W*\n")}
        gaps = [k for k, w in want.items()
                if not (w.search(text) if isinstance(w, re.Pattern) else w in text)]
        if gaps:
            missing[name] = gaps
    assert missing == {}, f"chapters missing parts: {missing}"


def test_the_glossary_defines_the_retry_terms(pages):
    glossary = pages["book/review/glossary.html"]
    for term in ("backoff", "jitter", "retry-budget"):
        assert f'id="term-{term}"' in glossary, f"the glossary lacks {term}"
    c01 = pages["book/c01_delivery_semantics.html"]
    for term in ("lease", "heartbeat", "zombie", "fencing-token",
                 "dead-letter-queue", "retry-budget"):
        assert f"glossary.html#term-{term}" in c01, f"c01 does not link {term}"


def test_the_intro_links_every_chapter(pages):
    intro = _main(pages["book/intro.html"])
    for name in ("queues_and_logs", "lab_queue", "cluster", "replay_matrix", "outbox",
                 "pg_queue", "exercises"):
        assert f'href="{name}.html"' in intro, f"the intro does not link {name}"


def test_the_real_systems_page_is_in_the_toc_linked_and_sourced(pages):
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "book/review/real_systems" in files
    for name in ("book/c01_delivery_semantics.html", "book/review/cheat_sheet.html"):
        assert "real_systems.html" in _main(pages[name]), f"{name} does not link it"
    page = _main(pages["book/review/real_systems.html"])
    for host in ("docs.aws.amazon.com", "kafka.apache.org", "rabbitmq.com",
                 "cloud.google.com/pubsub", "docs.celeryq.dev", "sidekiq",
                 "docs.bullmq.io", "docs.nats.io"):
        at = rf'href="https://(www\.)?(github\.com/)?{re.escape(host)}'
        assert re.search(at, page), f"no source from {host}"
    local = re.findall(r'href="(?!https?:|#|mailto:)([^"#]+)', page)
    missing = [h for h in local
               if not (SITE / "book" / "review" / h).resolve().exists()]
    assert local and missing == [], f"links that do not resolve: {missing}"


def test_the_glossary_defines_the_log_and_storage_terms(pages):
    glossary = pages["book/review/glossary.html"].lower()
    for term in ("visibility-timeout", "offset", "consumer-group", "hash-slot",
                 "vacuum"):
        assert f'id="term-{term}"' in glossary, f"the glossary lacks {term}"


def _leaks(page: str, roots: tuple[str, ...]) -> list[str]:
    """A traceback, or an absolute path of the machine that built the page.

    `roots` are that machine's own folders (the repository, its home, its
    temporary directory). A reader cannot use them, and a traceback printed
    under a cell is a cell that failed, not a lesson.
    """
    text = _text(_main(page))
    found = ["a traceback"] if "Traceback (most recent call last)" in text else []
    for root in roots:
        at = re.search(rf"(?<![\w./-]){re.escape(root.rstrip('/'))}(?=/)", text)
        if at:
            found.append(text[at.start():at.start() + 60].split()[0])
    return found


def _machine_roots() -> tuple[str, ...]:
    roots = {str(ROOT), str(Path.home()), tempfile.gettempdir(), "/tmp"}
    return tuple(sorted(r for r in roots if r not in ("", "/")))


def test_no_page_prints_a_traceback_or_a_path_of_the_build_machine(pages):
    roots = _machine_roots()
    leaks = {name: hits for name, page in pages.items()
             if (hits := _leaks(page, roots))}
    assert leaks == {}, f"pages printing tracebacks or build paths: {leaks}"


def test_the_leak_guard_catches_a_traceback_and_a_path():
    page = ('<article class="bd-article"><pre>Traceback (most recent call last):\n'
            '  File "/home/b/repo/handson/x.py", line 3</pre></article>')
    assert _leaks(page, ("/home/b",)) == ["a traceback", "/home/b/repo/handson/x.py\","]
    clean = '<article class="bd-article"><p>run <code>/tmp</code> alone</p></article>'
    assert _leaks(clean, ("/tmp",)) == []
    assert _leaks(clean.replace("/tmp", "/tmp/replay-1/x"), ("/tmp",)) == [
        "/tmp/replay-1/x"]


def test_a_glued_one_takes_the_singular():
    from handson.book.plurals import SINGULAR, singular_after_one

    assert singular_after_one(" duplicate rows in") == " duplicate row in"
    assert singular_after_one(" commits whose worker") == " commit whose worker"
    assert singular_after_one(" of the jobs") == " of the jobs"   # third word
    assert singular_after_one(" s on") == " s on"
    assert all(p != s for p, s in SINGULAR.items())


def test_no_page_says_one_with_a_plural(pages):
    from handson.book.plurals import SINGULAR

    wrong = {}
    for name, page in pages.items():
        for m in re.finditer(r'<span class="pasted-text">1</span>((?:\s+[\w-]+){1,2})',
                             _main(page)):
            words = m.group(1).split()
            if any(w in SINGULAR for w in words):
                wrong.setdefault(name, []).append("1" + m.group(1))
    assert wrong == {}, f"a count of 1 with a plural noun: {wrong}"
