"""``history.py report``: one HTML page per storage, built from a Mako template
(benchmarks/tracking/templates/history_report.html.mako).

Per machine: a summary first (the latest run against the one before it: regressions,
improvements and unchanged benchmarks, each with its ratio, noise band and the run where its
step began), then the gated figures as the gate finally judged them, then one small plot per
gated figure and per benchmark over the runs. Plots are inline SVG drawn by the template
(a page of ~70 plots stays well under 200 kB): y from zero, a unit per benchmark, the noise
band shaded around the level of the clean history, injected slowdowns marked.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gate
from history_runs import Comparison, Run, change_doc, compare_runs, gated, machine_runs
from history_text import fmt_time
from mako.lookup import TemplateLookup

TEMPLATES = Path(__file__).with_name("templates")
UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


@dataclass(frozen=True)
class Point:
    label: str  # the run's id
    value: float | None
    injected: bool
    bad: bool = False  # a gated figure outside its limit


@dataclass(frozen=True)
class Plot:
    title: str
    unit: str
    points: list[Point]
    top: float  # the y axis runs from 0 to here
    ticks: list[float]
    band: tuple[float, float] | None = None  # noise band, in the plot's unit
    limit: float | None = None


def unit_for(seconds: list[float]) -> tuple[str, float]:
    """The unit that writes the typical value of ``seconds`` with 1-3 digits before the point."""
    typical = statistics.median(seconds) if seconds else 1.0
    return next(((u, s) for u, s in UNITS if typical >= s), UNITS[-1])


def nice_ticks(high: float) -> tuple[float, list[float]]:
    """An axis top of at least ``high`` and 3-5 round ticks from 0 to it."""
    if high <= 0 or not math.isfinite(high):
        return 1.0, [0.0, 0.5, 1.0]
    exp = 10 ** math.floor(math.log10(high / 4))
    step = next(m * exp for m in (1, 2, 2.5, 5, 10) if high / (m * exp) <= 4)
    top = step * math.ceil(high / step - 1e-9)
    return top, [i * step for i in range(round(top / step) + 1)]


def _plot(
    title: str,
    unit: str,
    points: list[Point],
    band: tuple[float, float] | None = None,
    limit: float | None = None,
) -> Plot:
    values = [p.value for p in points if p.value is not None]
    high = max([*values, *(band or ()), limit or 0.0, 0.0]) * 1.05
    top, ticks = nice_ticks(high)
    return Plot(title, unit, points, top, ticks, band, limit)


def benchmark_plot(name: str, runs: list[Run], cmp: Comparison | None) -> Plot:
    """Fastest round per run, in a unit fitting this benchmark; the noise band around the
    median of the clean history, as the latest comparison judged it."""
    times = [r.fastest(name) for r in runs]
    unit, scale = unit_for([t for t in times if t is not None])
    points = [
        Point(r.id, None if t is None else t / scale, bool(r.injected))
        for r, t in zip(runs, times, strict=True)
    ]
    band = None
    change = next((c for c in cmp.changes if c.name == name), None) if cmp else None
    if cmp and change and change.noise.ratio_band:
        level = [t for r in cmp.history if (t := r.fastest(name)) is not None]
        mid = statistics.median(level) / scale if level else change.old / scale
        lo, hi = change.noise.ratio_band
        band = (mid * lo, mid * hi)
    return _plot(name, unit, points, band)


def gated_plot(
    check: gate.Check, runs: list[Run], figs: list[dict[str, Any]], device: str | None
) -> Plot:
    points = [
        Point(
            r.id,
            (f.get(check.name) or {}).get("value"),
            bool(r.injected),
            not (f.get(check.name) or {}).get("ok", True),
        )
        for r, f in zip(runs, figs, strict=True)
    ]
    limit = check.limit(device or "pocl")
    return _plot(
        check.name,
        check.figure.unit.strip() or "ratio",
        points,
        limit=limit.bound if limit else None,
    )


def _machine(runs: list[Run], all_runs: list[Run]) -> dict[str, Any]:
    latest = runs[-1]
    series = machine_runs(all_runs, latest)
    cmp = compare_runs(series[-2], latest, all_runs) if len(series) > 1 else None
    device = gate.device_class(latest.doc.get("machine_info", {}))
    figs = [gated(r) for r in runs]
    lists = {}
    if cmp:
        lists = {
            v: [change_doc(c, cmp.began.get(c.name)) for c in cmp.of(v)]
            for v in ("regression", "improvement", "unchanged", "history too short")
        }
    return {
        "machine": latest.machine,
        "runs": runs,
        "latest": latest,
        "device": device,
        "cmp": cmp,
        "lists": lists,
        "gated_latest": figs[-1],
        "gated_previous": figs[-2] if len(figs) > 1 else {},
        "gated_plots": [gated_plot(c, runs, figs, device) for c in gate.CHECKS],
        "bench_plots": [
            benchmark_plot(n, runs, cmp)
            for n in dict.fromkeys(n for r in runs for n in r.benchmarks)
        ],
    }


def render(runs: list[Run]) -> str:
    """The report page for ``runs`` (every saved run, oldest first)."""
    machines = list(dict.fromkeys(r.machine for r in runs))
    sections = [_machine([r for r in runs if r.machine == m], runs) for m in machines]
    lookup = TemplateLookup(
        directories=[str(TEMPLATES)], default_filters=["h"], strict_undefined=True
    )
    page = lookup.get_template("history_report.html.mako")
    return str(page.render(sections=sections, checks=gate.CHECKS, fmt=_fmt, fmt_time=fmt_time))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write(runs: list[Run], out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(runs))
    machines = len({r.machine for r in runs})
    print(
        f"report: {out} ({len(runs)} run(s), {machines} machine(s), "
        f"{out.stat().st_size // 1024} kB)"
    )
    return 0
