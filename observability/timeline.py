"""Draw a window of a Chrome trace-event file (what ``OTEL_TRACES_EXPORTER=chrome_trace`` writes)
as a static HTML page with one SVG timeline: a stand-in for Perfetto UI where it cannot be
reached, and how ``observability/timeline.png`` is made:

    python observability/timeline.py netcl-trace.json timeline.html --span netcl.scheduler.run
    chromium --headless --screenshot=timeline.png --window-size=1400,560 file://$PWD/timeline.html

The window is the slice named ``--span`` (the ``--index``-th one, default the last) with a margin.
Slices nest by depth within their row, as the trace viewers draw them; arrows are the file's
flow events (host span -> its device work).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
from pathlib import Path
from typing import Any

WIDTH, ROW, LABEL_W = 1360, 22, 190


def _colour(name: str) -> str:
    hue = int(hashlib.sha256(name.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue},55%,72%)"


def _depths(slices: list[dict[str, Any]]) -> dict[int, int]:
    """Nesting depth of each slice (by id()) within its (pid, tid) row; the slices come in the
    order netcl's exporter writes them (by start, longest first, parents first)."""
    depth: dict[int, int] = {}
    rows: dict[tuple[int, int], list[float]] = {}
    for s in slices:  # the exporter writes them in nesting order
        stack = rows.setdefault((s["pid"], s["tid"]), [])
        while stack and stack[-1] <= s["ts"]:
            stack.pop()
        depth[id(s)] = len(stack)
        stack.append(s["ts"] + s["dur"])
    return depth


def render(doc: dict[str, Any], span: str, index: int, pad: float) -> str:
    events = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    slices = [e for e in events if e["ph"] == "X"]
    anchor = [s for s in slices if s["name"] == span][index]
    t0, t1 = anchor["ts"] - pad, anchor["ts"] + anchor["dur"] + pad
    shown = [s for s in slices if s["ts"] < t1 and s["ts"] + s["dur"] > t0]
    depth = _depths(shown)
    scale = (WIDTH - LABEL_W - 10) / (t1 - t0)
    rows: dict[tuple[int, int], int] = {}
    for s in shown:
        key = (s["pid"], s["tid"])
        rows[key] = max(rows.get(key, 0), depth[id(s)] + 1)
    top, y_of, parts = 30, {}, []
    for pid, tid in sorted(rows):
        y_of[(pid, tid)] = top
        parts.append(f'<text x="4" y="{top + 15}" class="track">{html.escape(names[pid])}</text>')
        parts.append(f'<line x1="0" x2="{WIDTH}" y1="{top - 4}" y2="{top - 4}" class="sep"/>')
        top += rows[(pid, tid)] * ROW + 14
    for s in shown:
        x0 = LABEL_W + max(s["ts"] - t0, 0) * scale
        x1 = LABEL_W + min(s["ts"] + s["dur"] - t0, t1 - t0) * scale
        y = y_of[(s["pid"], s["tid"])] + depth[id(s)] * ROW
        w = max(x1 - x0, 1.0)
        label = html.escape(s["name"]) if w > 7 * len(s["name"]) else ""
        parts.append(
            f'<g><title>{html.escape(s["name"])} {s["dur"]:.1f} µs</title>'
            f'<rect x="{x0:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 3}" '
            f'fill="{_colour(s["name"])}"/><text x="{x0 + 3:.1f}" y="{y + 14}">{label}</text></g>'
        )
    parts += _arrows(events, y_of, t0, t1, scale)
    ticks = []
    step = _tick(t1 - t0)
    t = (t0 // step + 1) * step
    while t < t1:
        x = LABEL_W + (t - t0) * scale
        label = f'<text x="{x + 2:.1f}" y="14" class="axis">{t / 1e3:.2f} ms</text>'
        ticks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="18" y2="{top}" class="tick"/>{label}')
        t += step
    return _page(top, ticks + parts, f"{span} #{index}, {anchor['dur'] / 1e3:.3f} ms")


def _arrows(events: list[dict[str, Any]], y_of: dict[tuple[int, int], int], t0: float,
            t1: float, scale: float) -> list[str]:  # fmt: skip
    out = []
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for f in (e for e in events if e["ph"] == "f"):
        s = starts.get(f["id"])
        if s is None or not (t0 <= s["ts"] <= t1 and t0 <= f["ts"] <= t1):
            continue
        if (s["pid"], s["tid"]) not in y_of or (f["pid"], f["tid"]) not in y_of:
            continue
        x0, x1 = (LABEL_W + (e["ts"] - t0) * scale for e in (s, f))
        y0, y1 = y_of[(s["pid"], s["tid"])] + 10, y_of[(f["pid"], f["tid"])] + 4
        out.append(f'<line x1="{x0:.1f}" y1="{y0}" x2="{x1:.1f}" y2="{y1}" class="flow" '
                   'marker-end="url(#head)"/>')  # fmt: skip
    return out


def _tick(span_us: float) -> float:
    for step in (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000):
        if span_us / step <= 12:
            return float(step)
    return 100000.0


def _page(height: int, parts: list[str], title: str) -> str:
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 8px; font: 12px "Liberation Sans", sans-serif; }}
svg text {{ font-size: 11px; }} .track {{ font-weight: bold; }} .axis {{ fill: #555; }}
.tick {{ stroke: #ddd; }} .sep {{ stroke: #999; }} rect {{ stroke: #555; stroke-width: .5; }}
.flow {{ stroke: #c33; stroke-width: 1; }}
</style></head><body><div>netcl timeline: {html.escape(title)}</div>
<svg width="{WIDTH}" height="{height}"><defs><marker id="head" markerWidth="6"
markerHeight="6" refX="5" refY="3" orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#c33"/>
</marker></defs>{"".join(parts)}</svg></body></html>
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--span", default="netcl.scheduler.run")
    parser.add_argument("--index", type=int, default=-1)
    parser.add_argument("--pad-us", type=float, default=150.0)
    args = parser.parse_args()
    doc = json.loads(args.trace.read_text())
    args.out.write_text(render(doc, args.span, args.index, args.pad_us))


if __name__ == "__main__":
    main()
