"""Feedback a learner can look at: the grade as one self-contained HTML page.

Score, checks, problems, and for each failed chaos check a picture of its
witness jobs (`handson.faults.timeline`): the lanes of the processes, each
attempt's lease, the kills and pauses, the step that broke the rule ringed.
For a queue, what it cost the server per job beside the reference queue in
the same run (`handson.queues.cost`): shown, never graded.
The page has no external links (inline SVG and CSS only), so it opens from a
mail attachment or an LMS as it is. The notebook's check cell and nbgrader's
feedback show the same pictures (`figures`).
"""

from __future__ import annotations

from html import escape

from autograder.judges.results import GradeResult, Outcome
from handson.faults import timeline
from handson.queues.cost import PER_JOB, advice

CSS = """
body { font-family: sans-serif; max-width: 960px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; text-align: left; }
.pass { color: #2ca02c; } .fail { color: #d62728; font-weight: bold; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
.eo-legend { font-size: 12px; margin: 4px 0 18px; }
.eo-legend svg { vertical-align: middle; }
.eo-cost td:not(:first-child), .eo-cost th:not(:first-child) { text-align: right; }
"""
YOURS, REFERENCE = "#1f77b4", "#bbb"
BAR_W, ROW_H = 420, 22


def figures(outcomes: list[Outcome]) -> str:
    """The pictures of every failed check that has witness timelines or a
    failing schedule ('' if none)."""
    parts, kinds, leases = [], set(), False
    for o in outcomes:
        if o.ok or not o.timelines:
            continue
        parts.append(f"<h3>{escape(o.name)}: {escape(o.title)}</h3>")
        for tl in o.timelines:
            parts.append(timeline.svg(tl))
            kinds |= {m["kind"] for m in tl["marks"]}
            leases = leases or bool(tl["leases"])
    if not parts:
        return ""
    return "\n".join(parts) + timeline.legend(kinds, leases)


def _bars(cost: dict) -> str:
    """Round trips per call, yours and the reference's, as paired bars."""
    fns = [*PER_JOB, "reap"]
    most = max(cost[w][f]["round_trips"] for w in ("yours", "reference")
               for f in fns) or 1
    height = ROW_H * 2 * len(fns) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="eo-cost-bars" '
           f'width="{BAR_W + 200}" height="{height}" font-family="sans-serif" '
           'font-size="12">']
    for i, fn in enumerate(fns):
        for j, (who, colour) in enumerate((("yours", YOURS),
                                           ("reference", REFERENCE))):
            n = cost[who][fn]["round_trips"]
            y = ROW_H * (2 * i + j) + 4
            w = max(n / most * BAR_W, 1)
            label = (fn if fn != "reap" else "reap (idle)") if j == 0 else ""
            out.append(f'<text x="0" y="{y + 14}">{escape(label)}</text>'
                       f'<rect class="bar" data-fn="{escape(fn)}" '
                       f'data-who="{who}" data-round-trips="{n:g}" x="70" y="{y}" '
                       f'width="{w:.1f}" height="{ROW_H - 6}" fill="{colour}"/>'
                       f'<text x="{76 + w:.1f}" y="{y + 14}">{n:g} '
                       f'({"yours" if j == 0 else "reference"})</text>')
    out.append(f'<text x="0" y="{height - 6}" fill="#555">Redis round trips per '
               "call</text></svg>")
    return "\n".join(out)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def efficiency(cost: dict, correct: bool) -> str:
    """What the queue cost the server, beside the reference ('' if not measured)."""
    if not cost.get("yours"):
        return ""
    rows = "".join(
        f"<tr><th>{who}</th><td>{c['round_trips']:g}</td><td>{c['commands']:g}</td>"
        f"<td>{c['cpu_us']:.0f}</td></tr>"
        for who, c in (("your queue", cost["yours"]["per_job"]),
                       ("the reference", cost["reference"]["per_job"])))
    first = ("" if correct else "<p><b>Your queue fails checks above: make it "
             "correct first; a cheaper wrong queue is still wrong.</b></p>")
    return (f'<div class="eo-cost">{first}<p>{cost["jobs"]} jobs, each enqueued, '
            "claimed and acked (and reap called with nothing due), counted by "
            "the Redis server itself (its "
            "<code>INFO</code> counters, read by the grader), then the same for "
            "the reference queue on the same server. Shown, not graded.</p>"
            "<table><tr><th>per job</th><th>round trips</th><th>commands</th>"
            f"<th>server CPU µs</th></tr>{rows}</table>{_bars(cost)}"
            f"<p>{escape(_sentence(advice(cost)))}</p><p><small>Round trips and "
            "commands are the same on every run; CPU time depends on how busy the "
            "machine was.</small></p></div>")


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
    cost = efficiency(result.efficiency, result.score == result.max_score)
    servers = "; ".join(
        f"the run's {escape(name)} server: {escape(held or '?')}" for name, held in
        (result.servers or {"Redis": result.server_isolation}).items())
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
{"<h2>What your queue costs</h2>" + cost if cost else ""}
{f"<p>Replay the chaos run: <code>{escape(result.replay)}</code></p>"
 if result.replay else ""}
<p><small>isolation: {escape(result.isolation or "?")}; {servers}</small></p>
</body></html>
"""
