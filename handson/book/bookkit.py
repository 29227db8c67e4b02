"""What chapters use to show lab code and to ask for predictions.

Predictions are plain HTML with a few lines of script that keep the reader's
guesses in the browser's localStorage, so the same cell works in JupyterLab and
in the built static site, offline, with no kernel.
"""

from __future__ import annotations

import html
import inspect
import json
import re
import textwrap
from pathlib import Path

from IPython.display import HTML, Markdown, display


def source(obj) -> str:
    """The source text of a function, class or module from the lab."""
    return inspect.getsource(obj)


def show(obj, start: str | None = None, end: str | None = None) -> None:
    """Display the lab's own code, optionally sliced from line `start` to `end`."""
    text = source(obj)
    if start is not None:
        lines = text.splitlines()
        i = next(n for n, line in enumerate(lines) if start in line)
        j = len(lines) if end is None else next(
            n for n, line in enumerate(lines[i + 1:], i + 1) if end in line) + 1
        text = textwrap.dedent("\n".join(lines[i:j]))
    display(Markdown(f"```python\n{text.rstrip()}\n```"))


def _key(chapter: str, i: int) -> str:
    return f"effectively-once:{chapter}:{i}"


def predictions(chapter: str, questions: list[str]) -> None:
    """Boxes for the reader's guesses, kept in the browser between visits."""
    rows = []
    for i, q in enumerate(questions, 1):
        key = _key(chapter, i)
        rows.append(
            f'<li><p>{html.escape(q)}</p>'
            f'<textarea rows="2" style="width:100%" data-eo-key="{key}" '
            f'placeholder="your guess, before reading on"></textarea></li>')
    script = """
<script>
document.querySelectorAll('textarea[data-eo-key]').forEach(function (t) {
  try { t.value = localStorage.getItem(t.dataset.eoKey) || ''; } catch (e) {}
  t.addEventListener('input', function () {
    try { localStorage.setItem(t.dataset.eoKey, t.value); } catch (e) {}
  });
});
</script>"""
    display(HTML(f'<ol class="eo-predictions">{"".join(rows)}</ol>{script}'))


def compare(chapter: str, measured: list[str]) -> None:
    """Each guess the reader wrote beside what the run measured."""
    cells = []
    for i, value in enumerate(measured, 1):
        key = _key(chapter, i)
        cells.append(f'<tr><td>{i}</td><td data-eo-guess="{key}"><em>(none written)'
                     f'</em></td><td>{html.escape(value)}</td></tr>')
    keys = json.dumps([_key(chapter, i) for i in range(1, len(measured) + 1)])
    script = f"""
<script>
{keys}.forEach(function (k) {{
  var v = null; try {{ v = localStorage.getItem(k); }} catch (e) {{}}
  if (v) document.querySelectorAll('[data-eo-guess="' + k + '"]').forEach(
    function (td) {{ td.textContent = v; }});
}});
</script>"""
    display(HTML('<table class="eo-compare"><thead><tr><th>#</th><th>your guess'
                 '</th><th>measured</th></tr></thead><tbody>'
                 + "".join(cells) + "</tbody></table>" + script))


WORDS_PER_MINUTE = 200      # a careful technical read, not a skim


def reading_minutes(page: str) -> int:
    """Minutes to read a chapter's prose (code cells and directives left out).

    Counted from the page's own source when it builds, so the estimate at the
    top of a chapter follows its text. `page` is the file name under book/.
    """
    text = (Path(__file__).resolve().parents[2] / "book" / page).read_text()
    text = re.sub(r"^---\n.*?\n---\n", "", text, count=1, flags=re.S)
    text = re.sub(r"^```.*?^```", " ", text, flags=re.S | re.M)
    words = re.findall(r"[A-Za-z][A-Za-z'’-]*", text)
    return max(1, round(len(words) / WORDS_PER_MINUTE))
