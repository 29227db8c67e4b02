"""Feedback a learner can look at: the grade as one self-contained HTML page.

Score, checks, problems, and for each failed chaos check a picture of its
witness jobs (`handson.faults.timeline`): the lanes of the processes, each
attempt's lease, the kills and pauses, the step that broke the rule ringed.
The page has no external links (inline SVG and CSS only), so it opens from a
mail attachment or an LMS as it is. The notebook's check cell and nbgrader's
feedback show the same pictures (`figures`).
"""

from __future__ import annotations

from html import escape

from autograder.checks import GradeResult, Outcome
from handson.faults import timeline

CSS = """
body { font-family: sans-serif; max-width: 960px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
.pass { color: #2ca02c; } .fail { color: #d62728; font-weight: bold; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
.eo-legend { font-size: 12px; margin: 4px 0 18px; }
.eo-legend svg { vertical-align: middle; }
"""


def figures(outcomes: list[Outcome]) -> str:
    """The pictures of every failed check that has witness timelines ('' if none)."""
    parts, kinds = [], set()
    for o in outcomes:
        if o.ok or not o.timelines:
            continue
        parts.append(f"<h3>{escape(o.name)}: {escape(o.title)}</h3>")
        for tl in o.timelines:
            parts.append(timeline.svg(tl))
            kinds |= {m["kind"] for m in tl["marks"]}
    if not parts:
        return ""
    return "\n".join(parts) + timeline.legend(kinds)


def page(result: GradeResult) -> str:
    """The whole grade as an HTML document."""
    rows = "\n".join(
        f'<tr><td class="{"pass" if o.ok else "fail"}">'
        f'{"PASS" if o.ok else "FAIL"}</td><td>{escape(o.name)}</td>'
        f"<td>{o.points}/{o.max_points}</td><td>{escape(o.title)}</td></tr>"
        for o in result.outcomes)
    problems = "".join(f"<li>{escape(p)}</li>" for p in result.problems)
    notes = "".join(f"<li>{escape(n)}</li>" for n in result.notes)
    failures = "\n".join(f"<pre>{escape(o.explain())}</pre>"
                         for o in result.outcomes if not o.ok)
    pictures = figures(result.outcomes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{escape(result.assignment)}: {result.score}/{result.max_score}</title>
<style>{CSS}</style></head><body>
<h1>{escape(result.assignment)}: {result.score}/{result.max_score}</h1>
<p>{escape(result.submission)} &middot; graded in {result.elapsed_s:.1f} s
{" &middot; quick run" if result.quick else ""}</p>
{f"<h2>Problems</h2><ul>{problems}</ul>" if problems else ""}
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
<h2>Checks</h2><table>{rows}</table>
{"<h2>What the failing runs did</h2>" + pictures if pictures else ""}
{"<h2>Failures in full</h2>" + failures if failures else ""}
{f"<p>Replay the chaos run: <code>{escape(result.replay)}</code></p>"
 if result.replay else ""}
<p><small>isolation: {escape(result.isolation or "?")}; the run's Redis server:
{escape(result.server_isolation or "?")}</small></p>
</body></html>
"""
