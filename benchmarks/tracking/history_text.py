"""``history.py compare`` as text: the findings first, then the table (within 120 columns)."""

from __future__ import annotations

import textwrap
from typing import Any

import gate
import history_stats as hs
from history_runs import Comparison, Run, change_doc, gated

NAME_W = 46
WIDTH = 120
MARK = {
    "regression": "REGRESSION",
    "improvement": "improved",
    "unchanged": "",
    "history too short": "?",
}


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


def loops(bench: dict[str, Any]) -> str:
    """Loops per round: pytest-benchmark's iterations, times the calls a round makes itself."""
    inner = bench.get("extra_info", {}).get("calls_per_round")
    n = int(bench["stats"]["iterations"])
    return f"{n}x{inner}" if inner else str(n)


def _band(c: hs.Change) -> str:
    band = c.noise.ratio_band
    return f"noise {band[0]:.2f}-{band[1]:.2f}" if band else "noise unknown"


def _began(doc: dict[str, Any]) -> str:
    began = doc["began"]
    if not began:
        return "no step in the history"
    return f"began at {began['id']} {began['commit']} {began['date']}"


def _findings(cmp: Comparison) -> None:
    for verdict, title in (("regression", "REGRESSIONS"), ("improvement", "improvements")):
        found = cmp.of(verdict)
        print(f"{title}: {len(found) or 'none'}")
        for c in found:
            doc = change_doc(c, cmp.began.get(c.name))
            paired = ", against its paired floor" if c.paired else ""
            print(f"  {c.name[:40]:40} x{c.ratio:.3f} ({_band(c)}{paired}), {_began(doc)}")
    print(f"unchanged (within their noise): {len(cmp.of('unchanged'))}")
    short = cmp.of("history too short")
    if short:
        _say(
            f"history too short to know the noise: {len(short)} (fewer than "
            f"{hs.MIN_HISTORY} earlier clean runs of this machine; marked ? below)"
        )


def _say(text: str) -> None:
    print(textwrap.fill(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False))


def print_comparison(cmp: Comparison, runs: list[Run], note: str) -> int:
    """The findings (regressions, improvements, unchanged, each with its noise band), then
    each benchmark's fastest round per run and the gated figures."""
    for r in runs:
        injected = f" [injected: {', '.join(r.injected)}]" if r.injected else ""
        _say(f"run {r.label} {r.date} {r.machine}{injected}")
    if note:
        _say(f"compare: {note}")
    spread = f", machine spread {cmp.machine_spread:.1%} a run" if cmp.machine_spread else ""
    if cmp.paired_spread:
        spread += f" ({cmp.paired_spread:.1%} for paired benchmarks)"
    _say(
        f"noise: {len(cmp.history)} earlier clean run(s) of this machine "
        f"({', '.join(r.id for r in cmp.history) or 'none'}){spread}; changes of "
        f"{cmp.new.id} against {cmp.old.id}"
    )
    print()
    _findings(cmp)
    _table(cmp, runs)
    return 0


def _table(cmp: Comparison, runs: list[Run]) -> None:
    head = (
        f"\n{'benchmark (fastest round)':{NAME_W}} {'loops':>7}"
        + "".join(f" {r.id:>11}" for r in runs)
        + f" {'change':>8}"
    )
    print(head)
    by_name = {c.name: c for c in cmp.changes}
    for name in dict.fromkeys(n for r in runs for n in r.benchmarks):
        times = [r.fastest(name) for r in runs]
        last = next(r.benchmarks[name] for r in reversed(runs) if name in r.benchmarks)
        c = by_name.get(name)
        change = f"{c.ratio - 1:+.1%}" if c else ""
        cells = "".join(f" {fmt_time(t) if t is not None else '-':>11}" for t in times)
        mark = f" {MARK[c.verdict]}" if c and MARK[c.verdict] else ""
        print(f"{name[:NAME_W]:{NAME_W}} {loops(last):>7}{cells} {change:>8}{mark}")
    print(
        f"\n{'gated figure (as the gate judged it)':{NAME_W}} {'limit':>7}"
        + "".join(f" {r.id:>11}" for r in runs)
    )
    figs = [gated(r) for r in runs]
    for check in gate.CHECKS:
        vals = [f.get(check.name) for f in figs]
        limit = next((v["limit"] for v in vals if v and v["limit"]), None) or ""
        texts = [
            "-" if not v or v["value"] is None else f"{v['value']:.3f}{'' if v['ok'] else '!'}"
            for v in vals
        ]
        print(f"{check.name[:NAME_W]:{NAME_W}} {limit:>7}" + "".join(f" {t:>11}" for t in texts))
    print()
    _say(
        "! marks a gated figure outside its limit; a benchmark is marked only when its change "
        "is outside its noise band"
    )
