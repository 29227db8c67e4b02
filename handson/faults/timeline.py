"""A witness job's life drawn as an SVG: one lane per process, the run's clock
across, each attempt's lease, every claim, ack, kill and pause where it happened.

The same drawing serves the grader's feedback page, the notebook's check cell
and the chapters' chaos reports. It is made from `Judge.timeline` data (the
engine's own records), never from anything a learner's process reports. A
contract check's failing schedule (`handson.queues.interleave.schedule`) is
drawn the same way, its steps in the order the grader made them happen.
"""

from __future__ import annotations

import textwrap
from html import escape

LANE_H, LEFT, RIGHT, TOP, WIDTH = 30, 120, 20, 58, 900

# kind -> (shape, colour, legend)
STYLE = {
    "enqueue": ("dot", "#555", "enqueued"),
    "claim": ("dot", "#1f77b4", "claimed"),
    "ack": ("tri", "#2ca02c", "ack accepted"),
    "ack_refused": ("tri", "#aaa", "ack refused"),
    "fail": ("tri", "#ff7f0e", "fail"),
    "extend": ("tick", "#9467bd", "heartbeat"),
    "extend_refused": ("tick", "#aaa", "heartbeat refused"),
    "commit": ("square", "#8c564b", "commit (no effect)"),
    "apply": ("diamond", "#000", "effect applied"),
    "abandoned": ("cross", "#aaa", "abandoned"),
    "kill": ("cross", "#d62728", "SIGKILL"),
    "crash": ("cross", "#d62728", "killed at a crash point"),
    "pause": ("bar", "#9467bd", "SIGSTOP .. SIGCONT"),
    "reply": ("tick", "#555", "a Redis reply read"),
    "stop": ("bar", "#9467bd", "the call held between two replies"),
    "rival": ("dot", "#ff7f0e", "another client's call"),
    "returned": ("square", "#1f77b4", "the call returned"),
}
AXIS = "seconds since the run started (the engine's clock)"
WRAP = 130          # characters of the sentence per line


def _bar(kind: str) -> bool:
    return STYLE.get(kind, ("dot",))[0] == "bar"


def _shape(kind: str, x: float, y: float) -> str:
    shape, colour, _ = STYLE.get(kind, ("dot", "#555", kind))
    if shape == "dot":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>'
    if shape == "tri":
        return (f'<path d="M{x - 6:.1f},{y + 5:.1f} L{x + 6:.1f},{y + 5:.1f} '
                f'L{x:.1f},{y - 6:.1f} Z" fill="{colour}"/>')
    if shape == "square":
        return (f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" '
                f'fill="{colour}"/>')
    if shape == "diamond":
        return (f'<path d="M{x:.1f},{y - 7:.1f} L{x + 6:.1f},{y:.1f} '
                f'L{x:.1f},{y + 7:.1f} L{x - 6:.1f},{y:.1f} Z" fill="{colour}"/>')
    if shape == "tick":
        return (f'<line x1="{x:.1f}" y1="{y - 7:.1f}" x2="{x:.1f}" y2="{y + 7:.1f}" '
                f'stroke="{colour}" stroke-width="2"/>')
    return (f'<path d="M{x - 6:.1f},{y - 6:.1f} L{x + 6:.1f},{y + 6:.1f} '
            f'M{x - 6:.1f},{y + 6:.1f} L{x + 6:.1f},{y - 6:.1f}" '
            f'stroke="{colour}" stroke-width="3"/>')


def _ticks(lo: float, hi: float, whole: bool = False) -> list[float]:
    span = max(hi - lo, 1e-3)
    steps = (1, 2, 5, 10, 20) if whole else (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1,
                                             2, 5, 10, 20, 60)
    step = next((s for s in steps if span / s <= 10), steps[-1])
    first = int(lo / step) * step
    return [round(first + i * step, 6) for i in range(int(span / step) + 2)
            if lo <= first + i * step <= hi]


def svg(tl: dict) -> str:
    """One witness as a self-contained <svg> element."""
    lanes = tl["lanes"]
    times = [m["t"] for m in tl["marks"]] + [le["end"] for le in tl["leases"]]
    times += [m["t"] + m.get("seconds", 0) for m in tl["marks"]]
    lo, hi = (min(times), max(times)) if times else (0.0, 1.0)
    pad = max((hi - lo) * 0.04, 0.01)
    lo, hi = lo - pad, hi + pad
    said = textwrap.wrap(tl["sentence"], WRAP) or [""]
    top = TOP + 16 * (len(said) - 1)
    notes = tl.get("notes", [])       # lines under the axis (a schedule's steps)
    height = top + LANE_H * len(lanes) + 46 + 16 * len(notes)

    def x(t: float) -> float:
        return LEFT + (t - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    def y(lane: str) -> float:
        return top + LANE_H * lanes.index(lane) + LANE_H / 2

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="eo-timeline" '
           f'data-job="{escape(tl["job"])}" data-invariant="{escape(tl["invariant"])}"'
           f' width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
           'font-family="sans-serif" font-size="12">',
           '<text x="8" y="18" font-weight="bold">'
           + escape(tl.get("title") or f'job {tl["job"]} ({tl["invariant"]})')
           + "</text>"]
    out += [f'<text x="8" y="{38 + 16 * i}" fill="#d62728">{escape(line)}</text>'
            for i, line in enumerate(said)]
    for i, lane in enumerate(lanes):
        ly = y(lane)
        if i % 2:
            out.append(f'<rect x="0" y="{ly - LANE_H / 2:.1f}" width="{WIDTH}" '
                       f'height="{LANE_H}" fill="#f6f6f6"/>')
        out.append(f'<text x="8" y="{ly + 4:.1f}">{escape(lane)}</text>')
    for le in tl["leases"]:
        x0, x1 = x(le["start"]), x(le["end"])
        ly = y(le["lane"])
        out.append(f'<rect class="lease" x="{x0:.1f}" y="{ly - 9:.1f}" '
                   f'width="{max(x1 - x0, 1):.1f}" height="18" fill="#1f77b4" '
                   f'fill-opacity="0.12" stroke="#1f77b4" stroke-opacity="0.4">'
                   f'<title>attempt {le["attempt"]}: its lease ({tl["lease_s"]:g} s)'
                   '</title></rect>')
    for m in tl["marks"]:
        mx, my = x(m["t"]), y(m["lane"])
        if _bar(m["kind"]):
            w = max(x(m["t"] + m.get("seconds", 0)) - mx, 2)
            shape = (f'<rect x="{mx:.1f}" y="{my - 3:.1f}" width="{w:.1f}" '
                     f'height="6" fill="{STYLE[m["kind"]][1]}"/>')
        else:
            shape = _shape(m["kind"], mx, my)
        bad = ' data-bad="1"' if m["bad"] else ""
        ring = (f'<circle cx="{mx:.1f}" cy="{my:.1f}" r="11" fill="none" '
                'stroke="#d62728" stroke-width="2.5"/>' if m["bad"] else "")
        out.append(f'<g class="mark" data-kind="{escape(m["kind"])}" '
                   f'data-t="{m["t"]}" data-lane="{escape(m["lane"])}"{bad}>'
                   f'<title>+{m["t"]:.3f} s  {escape(m["text"])}</title>'
                   f'{shape}{ring}</g>')
    axis_y = top + LANE_H * len(lanes) + 6
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" '
               f'y2="{axis_y}" stroke="#333"/>')
    for t in _ticks(lo, hi, whole=bool(tl.get("ordinal"))):   # steps, not time
        out.append(f'<line x1="{x(t):.1f}" y1="{axis_y}" x2="{x(t):.1f}" '
                   f'y2="{axis_y + 4}" stroke="#333"/><text x="{x(t):.1f}" '
                   f'y="{axis_y + 16}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{WIDTH - RIGHT}" y="{axis_y + 32}" text-anchor="end" '
               f'fill="#555">{escape(tl.get("axis", AXIS))}</text>')
    if tl.get("ending"):
        out.append(f'<text x="{LEFT}" y="{axis_y + 32}" fill="#555">at the end: '
                   f'{escape(tl["ending"])}</text>')
    out += [f'<text class="note" x="{LEFT}" y="{axis_y + 50 + 16 * i}">'
            f"{escape(line)}</text>" for i, line in enumerate(notes)]
    out.append("</svg>")
    return "\n".join(out)


def legend(kinds: set[str], leases: bool = True) -> str:
    """The marks that appear, as a small HTML legend (`leases`: drawn too)."""
    items = []
    for kind, (_, _, label) in STYLE.items():
        if kind in kinds:
            icon = ('<svg width="16" height="16" viewBox="0 0 16 16">'
                    + (f'<rect x="1" y="5" width="14" height="6" '
                       f'fill="{STYLE[kind][1]}"/>' if _bar(kind)
                       else _shape(kind, 8, 8))
                    + "</svg>")
            items.append(f"<span>{icon} {escape(label)}</span>")
    if leases:
        items.append('<span><svg width="16" height="16"><rect x="1" y="3" '
                     'width="14" height="10" fill="#1f77b4" fill-opacity="0.12" '
                     "stroke=\"#1f77b4\"/></svg> an attempt's lease</span>")
    items.append('<span><svg width="16" height="16"><circle cx="8" cy="8" r="6" '
                 'fill="none" stroke="#d62728" stroke-width="2.5"/></svg> '
                 "the step that broke the rule</span>")
    return ('<div class="eo-legend" style="font-family: sans-serif; font-size: 12px">'
            + " &nbsp; ".join(items) + "</div>")
