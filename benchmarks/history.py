"""Benchmark history: saved pytest-benchmark runs compared and plotted across commits.

Runs are the files ``bench:run`` saves (``--benchmark-autosave``):
``.benchmarks/<os-python-bits>/NNNN_<commit>_<date>[_uncommitted-changes].json``; each holds
the commit and the machine (host, CPU, and the OpenCL device the benchmarks' conftest records).
Runs are grouped by machine (host + OpenCL device) and ordered by time. Times are each
benchmark's fastest round, as the gate uses; gated figures are computed by the gate's own code.

    python3 benchmarks/history.py compare ID [ID ...]   # e.g. 0001 0003; exits 2 on an unknown id
    python3 benchmarks/history.py report [--out .benchmarks/report.html]
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate  # a sibling script, not a package

SLOWER = 0.10  # latest vs previous: a fastest round slower by more than this is marked


@dataclass(frozen=True)
class Run:
    path: Path
    doc: dict[str, Any]

    @property
    def id(self) -> str:
        return self.path.stem.split("_", 1)[0]

    @property
    def commit(self) -> str:
        info = self.doc.get("commit_info", {})
        return str(info.get("id") or "?")[:8] + ("+" if info.get("dirty") else "")

    @property
    def label(self) -> str:
        return f"{self.id} {self.commit}"

    @property
    def machine(self) -> str:
        m = self.doc.get("machine_info", {})
        ocl = m.get("opencl") or {}
        dev = ocl.get("device", "unrecorded OpenCL device")
        return f"{m.get('node', '?')} / {dev}"

    @property
    def benchmarks(self) -> dict[str, dict[str, Any]]:
        return {b["name"]: b for b in self.doc.get("benchmarks", [])}


def saved_runs(storage: Path) -> list[Run]:
    """Every autosaved run under ``storage``, oldest first."""
    files = storage.glob("*/[0-9][0-9][0-9][0-9]_*.json")
    runs = [Run(p, json.loads(p.read_text())) for p in files]
    return sorted(runs, key=lambda r: (str(r.doc.get("datetime", "")), r.path.name))


def resolve(storage: Path, ids: list[str]) -> list[Run]:
    """The runs named by id (``0001``) or path; SystemExit(2) naming an id that is not saved."""
    runs = saved_runs(storage)
    chosen = []
    for run_id in ids:
        if Path(run_id).is_file():
            chosen.append(Run(Path(run_id), json.loads(Path(run_id).read_text())))
            continue
        found = [r for r in runs if r.path.name.startswith(run_id)]
        if len(found) != 1:
            have = ", ".join(r.id for r in runs) or "none"
            why = "no saved run" if not found else f"{len(found)} saved runs match"
            print(f"compare: {why} {run_id!r} under {storage} (saved: {have})", file=sys.stderr)
            raise SystemExit(2)
        chosen.extend(found)
    return chosen


def _fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.3f} µs"


def _loops(bench: dict[str, Any]) -> str:
    """Loops per round: pytest-benchmark's iterations, times the calls a round makes itself."""
    inner = bench.get("extra_info", {}).get("calls_per_round")
    loops = int(bench["stats"]["iterations"])
    return f"{loops}x{inner}" if inner else str(loops)


def _figures(run: Run, device: str | None) -> dict[str, tuple[float | None, bool, str | None]]:
    results = {name: [b] for name, b in run.benchmarks.items()}
    cls = device or gate.device_class(run.doc.get("machine_info", {})) or "pocl"
    return {v.check.name: (v.value, v.ok, v.limit)
            for v in gate.judge(results, gate.CHECKS, cls)}


def _change(old: float | None, new: float | None) -> str:
    if old is None or new is None or old == 0:
        return ""
    return f"{new / old - 1:+.1%}"


def compare(runs: list[Run]) -> int:
    """A table within 120 columns: each benchmark's fastest round per run, loops per round,
    the change of the last run against the first; then the gated figures."""
    name_w = 46
    head = f"{'benchmark (fastest round)':{name_w}} {'loops':>7}" + "".join(
        f" {r.label:>13}" for r in runs) + f" {'change':>8}"
    print("runs: " + "; ".join(f"{r.label} {r.doc.get('datetime', '')[:16]} {r.machine}"
                               for r in runs))
    print(head)
    names = list(dict.fromkeys(n for r in runs for n in r.benchmarks))
    for name in names:
        benches = [r.benchmarks.get(name) for r in runs]
        mins = [float(b["stats"]["min"]) if b else None for b in benches]
        last = next(b for b in reversed(benches) if b)
        ch = _change(mins[0], mins[-1])
        mark = " !" if ch and mins[0] and mins[-1] and mins[-1] > mins[0] * (1 + SLOWER) else ""
        cells = "".join(f" {_fmt_time(m) if m is not None else '-':>13}" for m in mins)
        print(f"{name[:name_w]:{name_w}} {_loops(last):>7}{cells} {ch:>8}{mark}")
    print(f"\n{'gated figure':{name_w}} {'limit':>7}" + "".join(f" {r.label:>13}" for r in runs))
    figs = [_figures(r, None) for r in runs]
    for check in gate.CHECKS:
        vals = [f[check.name] for f in figs]
        limit = next((v[2] for v in vals if v[2]), "") or ""
        texts = [("-" if v[0] is None else f"{v[0]:.3f}") + ("" if v[1] else "!") for v in vals]
        cells = "".join(f" {t:>13}" for t in texts)
        print(f"{check.name[:name_w]:{name_w}} {limit:>7}{cells}")
    print(f"\n! marks a fastest round more than {SLOWER:.0%} slower than in the first run, or a "
          "gated figure outside its limit")
    return 0


def _plot(title: str, labels: list[str], series: dict[str, list[float | None]],
          ylabel: str, limit: float | None = None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 2.6), dpi=80)
    xs = list(range(len(labels)))
    for name, ys in series.items():
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if limit is not None:
        ax.axhline(limit, color="red", linestyle="--", label="limit")
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return f'<img alt="{html.escape(title)}" src="data:image/png;base64,' \
           f'{base64.b64encode(buf.getvalue()).decode()}">'


def _limit_value(limit: str | None) -> float | None:
    return float(limit.split()[-1]) if limit else None


def report(runs: list[Run], out: Path) -> int:
    """One HTML page: per machine, a table of the latest run against the previous one with
    regressions marked, a plot per gated figure and per benchmark over the runs."""
    esc = html.escape
    parts = ["<!doctype html><meta charset='utf-8'><title>netcl benchmark history</title>",
             "<style>body{font-family:sans-serif} td,th{padding:2px 8px;text-align:right}"
             " td:first-child{text-align:left} .bad{background:#fcc}</style>",
             "<h1>netcl benchmark history</h1>"]
    machines = list(dict.fromkeys(r.machine for r in runs))
    for machine in machines:
        mr = [r for r in runs if r.machine == machine]
        labels = [r.label for r in mr]
        device = gate.device_class(mr[-1].doc.get("machine_info", {}))
        figs = [_figures(r, device) for r in mr]
        parts.append(f"<h2>{esc(machine)}</h2><p>{len(mr)} run(s), device class "
                     f"{esc(device or 'unknown (judged as pocl)')}</p>")
        prev, last = (mr[-2] if len(mr) > 1 else None), mr[-1]
        parts.append(f"<h3>Latest ({esc(last.label)}) against previous "
                     f"({esc(prev.label) if prev else 'none'})</h3><table><tr><th>gated figure"
                     "<th>limit<th>previous<th>latest<th>change</tr>")
        for check in gate.CHECKS:
            value, ok, limit = figs[-1][check.name]
            old = figs[-2][check.name][0] if prev else None
            bad = value is not None and not ok  # a missing figure is not a regression
            parts.append(f"<tr{' class=bad' if bad else ''}><td>{esc(check.name)}"
                         f"<td>{esc(limit or '')}<td>{'' if old is None else f'{old:.3f}'}"
                         f"<td>{'not measured' if value is None else f'{value:.3f}'}"
                         f"<td>{_change(old, value)}{' REGRESSION' if bad else ''}</tr>")
        parts.append("</table><table><tr><th>benchmark (fastest round)<th>loops<th>previous"
                     "<th>latest<th>change</tr>")
        for name, bench in last.benchmarks.items():
            new = float(bench["stats"]["min"])
            old_b = prev.benchmarks.get(name) if prev else None
            old = float(old_b["stats"]["min"]) if old_b else None
            bad = old is not None and new > old * (1 + SLOWER)
            parts.append(f"<tr{' class=bad' if bad else ''}><td>{esc(name)}<td>{_loops(bench)}"
                         f"<td>{'' if old is None else _fmt_time(old)}<td>{_fmt_time(new)}"
                         f"<td>{_change(old, new)}{' slower' if bad else ''}</tr>")
        parts.append(f"</table><p>Marked: a gated figure outside its limit, or a fastest round "
                     f"more than {SLOWER:.0%} slower than the previous run.</p>")
        parts.append("<h3>Gated figures over runs</h3>")
        for check in gate.CHECKS:
            ys = [f[check.name][0] for f in figs]
            parts.append(_plot(check.name, labels, {"value": ys}, check.figure.unit.strip() or
                               "ratio", _limit_value(figs[-1][check.name][2])))
        parts.append("<h3>Benchmarks over runs (fastest round and median, µs)</h3>")
        names = list(dict.fromkeys(n for r in mr for n in r.benchmarks))
        for name in names:
            stats = [r.benchmarks[name]["stats"] if name in r.benchmarks else None for r in mr]
            parts.append(_plot(name, labels, {
                "fastest": [s["min"] * 1e6 if s else None for s in stats],
                "median": [s["median"] * 1e6 if s else None for s in stats],
            }, "µs"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts))
    print(f"report: {out} ({len(runs)} run(s), {len(machines)} machine(s))")
    return 0


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--storage", type=Path, default=Path(".benchmarks"),
                        help="pytest-benchmark's storage folder")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", parents=[common], help="compare saved runs by id")
    cmp.add_argument("ids", nargs="+")
    rep = sub.add_parser("report", parents=[common], help="write the HTML history report")
    rep.add_argument("--out", type=Path, default=Path(".benchmarks/report.html"))
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare(resolve(args.storage, args.ids))
    runs = saved_runs(args.storage)
    if not runs:
        print(f"report: no saved runs under {args.storage}; run `hatch run bench:run` first",
              file=sys.stderr)
        return 2
    return report(runs, args.out)


if __name__ == "__main__":
    sys.exit(main())
