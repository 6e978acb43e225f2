"""Saved benchmark runs and the comparison of two of them (the model of
benchmarks/tracking/history.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import gate
import history_stats as hs

WINDOW = 20  # the newest clean runs that make a benchmark's history


@dataclass(frozen=True)
class Run:
    path: Path
    doc: dict[str, Any] = field(hash=False, compare=False)

    @property
    def id(self) -> str:
        return self.path.stem.split("_", 1)[0]

    @property
    def commit(self) -> str:
        info = self.doc.get("commit_info", {})
        return str(info.get("id") or "?")[:8] + ("+" if info.get("dirty") else "")

    @property
    def date(self) -> str:
        return str(self.doc.get("datetime", ""))[:16].replace("T", " ")

    @property
    def label(self) -> str:
        return f"{self.id} {self.commit}"

    @property
    def machine(self) -> str:
        m = self.doc.get("machine_info", {})
        dev = (m.get("opencl") or {}).get("device", "unrecorded OpenCL device")
        return f"{m.get('node', '?')} / {dev}"

    @property
    def injected(self) -> list[str]:
        """Slowdowns injected on purpose (NETCL_BENCH_SLOWDOWN): such a run is no history."""
        return list(self.doc.get("machine_info", {}).get("netcl_slowdown_injected") or [])

    @cached_property
    def benchmarks(self) -> dict[str, dict[str, Any]]:
        return {b["name"]: b for b in self.doc.get("benchmarks", [])}

    def fastest(self, name: str) -> float | None:
        bench = self.benchmarks.get(name)
        return float(bench["stats"]["min"]) if bench else None

    def floor(self, name: str) -> float | None:
        """The fastest round of the floor a paired benchmark timed right before each of its
        own rounds (``extra_info["paired_floor_s"]``, benchmarks/paired.py), if it did."""
        return self._positive_info(name, "paired_floor_s")

    def paired_ratio(self, name: str) -> float | None:
        """A paired benchmark's median ratio of each round to the floor timed right before it
        (``extra_info["paired_ratio_median"]``, benchmarks/paired.py), if it was recorded."""
        return self._positive_info(name, "paired_ratio_median")

    def _positive_info(self, name: str, key: str) -> float | None:
        value = self.benchmarks.get(name, {}).get("extra_info", {}).get(key)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "commit": self.commit,
            "date": self.date,
            "path": str(self.path),
            "injected": self.injected,
        }


def _read(path: Path) -> Run:
    return Run(path, json.loads(path.read_text()))


def saved_runs(storage: Path) -> list[Run]:
    """Every autosaved run under ``storage``, oldest first."""
    runs = [_read(p) for p in storage.glob("*/[0-9][0-9][0-9][0-9]_*.json")]
    return sorted(runs, key=lambda r: (str(r.doc.get("datetime", "")), r.path.name))


def fail(message: str) -> SystemExit:
    """SystemExit(2) after ``message`` on stderr."""
    print(f"compare: {message}", file=sys.stderr)
    return SystemExit(2)


def resolve(storage: Path, ids: list[str]) -> list[Run]:
    """The runs named by id (``0001``) or path; SystemExit(2) naming an id that is not saved."""
    runs = saved_runs(storage)
    chosen = []
    for run_id in ids:
        if Path(run_id).is_file():
            chosen.append(_read(Path(run_id)))
            continue
        found = [r for r in runs if r.path.name.startswith(run_id)]
        if len(found) != 1:
            have = ", ".join(r.id for r in runs) or "none"
            why = "no saved run" if not found else f"{len(found)} saved runs match"
            raise fail(f"{why} {run_id!r} under {storage} (saved: {have})")
        chosen.extend(found)
    return chosen


# -- comparing two runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    old: Run
    new: Run
    history: list[Run]  # the clean runs of the machine before ``new`` the noise comes from
    machine_spread: float | None  # of lone fastest rounds
    paired_spread: float | None  # of paired benchmarks' ratios to their floors
    changes: list[hs.Change]
    began: dict[str, Run | None]  # regression/improvement -> the run where its step began
    only_in_one: list[str]

    def of(self, verdict: str) -> list[hs.Change]:
        return [c for c in self.changes if c.verdict == verdict]


def machine_runs(saved: list[Run], run: Run) -> list[Run]:
    """The saved runs of ``run``'s machine up to and including ``run``, oldest first."""
    same = [r for r in saved if r.machine == run.machine]
    if run.path not in {r.path for r in same}:
        same.append(run)
    key = (str(run.doc.get("datetime", "")), run.path.name)
    return [r for r in same if (str(r.doc.get("datetime", "")), r.path.name) <= key]


def _began(series_runs: list[Run], name: str, old: Run, band: float, ref: Run) -> Run | None:
    at = hs.step_start([_compared(r, name, ref) for r in series_runs], band)
    if at is None:
        return None
    start = series_runs[at]
    old_at = next((i for i, r in enumerate(series_runs) if r.path == old.path), -1)
    return start if at > old_at else None  # a step before ``old`` is not this change


def _compared(run: Run, name: str, ref: Run) -> float | None:
    """The time compared: the fastest round, and for a benchmark paired with its floor in
    both runs, its ratio to the floor times ``ref``'s floor: the time it would take under
    ``ref``'s machine state. The ratio is the median of the per-round ratios where both runs
    recorded it, else the ratio of the fastest rounds. A shared machine flips between states
    1.5-2x apart for seconds at a time, moving a lone fastest round as much as a real
    regression would; the floor, timed in the same window, moves with it."""
    t, floor, ref_floor = run.fastest(name), run.floor(name), ref.floor(name)
    if t is None or floor is None or ref_floor is None:
        return t
    ratio, ref_ratio = run.paired_ratio(name), ref.paired_ratio(name)
    if ratio is not None and ref_ratio is not None:
        return ratio * ref_floor
    return t * ref_floor / floor


def compare_runs(old: Run, new: Run, saved: list[Run]) -> Comparison:
    """Each benchmark of both runs: the change of its fastest round (against its paired floor
    where it timed one) against its noise band, and for a change, the run where its step
    began."""
    series = machine_runs(saved, new)
    history = [r for r in series[:-1] if not r.injected and r.path != new.path][-WINDOW:]
    names = [n for n in new.benchmarks if n in old.benchmarks]
    histories = {n: [t for r in history if (t := _compared(r, n, new)) is not None] for n in names}
    is_paired = {n: old.floor(n) is not None and new.floor(n) is not None for n in names}
    # the prior a short unpaired history borrows: the typical spread of the machine's other
    # unpaired benchmarks (a lone fastest round can move 2x where a paired ratio moves a few
    # percent); a paired benchmark borrows none, and its kind's typical spread is only reported
    machine, paired_machine = (
        hs.machine_spread({n: h for n, h in histories.items() if is_paired[n] == kind})
        for kind in (False, True)
    )
    changes, began = [], {}
    for n in names:
        paired = is_paired[n]
        # a paired floor saw the same load as the rounds, so the rounds' spread says nothing
        # about the ratio (measured: rounds' median 2x their fastest, ratio within 4% run to run)
        u_old, u_new = (
            (0.0, 0.0)
            if paired
            else (
                hs.rounds_precision(old.benchmarks[n]["stats"]),
                hs.rounds_precision(new.benchmarks[n]["stats"]),
            )
        )
        noise = hs.noise(
            histories[n], None if paired else machine, u_old, u_new, len(names), own_only=paired
        )
        change = hs.classify(
            n, float(_compared(old, n, new) or 0), float(_compared(new, n, new) or 0), noise, paired
        )
        changes.append(change)
        if change.verdict in ("regression", "improvement") and noise.band is not None:
            began[n] = _began(series, n, old, noise.band, new)
    only = sorted(set(old.benchmarks) ^ set(new.benchmarks))
    return Comparison(old, new, history, machine, paired_machine, changes, began, only)


def gated(run: Run) -> dict[str, dict[str, Any]]:
    """The gated figures as the gate finally judged them (``gate.py --record``: re-measured
    figures included); for a run the gate did not record, computed from its own benchmarks
    (``"recorded": False``)."""
    record = run.doc.get("netcl_gate")
    if record:
        return {name: {**v, "recorded": True} for name, v in record["checks"].items()}
    results = {name: [b] for name, b in run.benchmarks.items()}
    cls = gate.device_class(run.doc.get("machine_info", {})) or "pocl"
    return {
        v.check.name: {
            "value": v.value,
            "first": None,
            "ok": v.ok,
            "recorded": False,
            "limit": str(v.limit) if v.limit else None,
            "unit": v.check.figure.unit.strip(),
        }
        for v in gate.judge(results, gate.CHECKS, cls)
    }


def change_doc(c: hs.Change, began: Run | None) -> dict[str, Any]:
    band = c.noise.ratio_band
    return {
        "name": c.name,
        "old_s": c.old,
        "new_s": c.new,
        "ratio": round(c.ratio, 4),
        "against_paired_floor": c.paired,
        "noise_band": [round(band[0], 4), round(band[1], 4)] if band else None,
        "noise": {
            "history_runs": c.noise.history_runs,
            "history_spread": c.noise.history_spread,
            "machine_spread": c.noise.machine_spread,
            "rounds": c.noise.rounds,
        },
        "began": began.summary() if began else None,
    }


def comparison_doc(cmp: Comparison, note: str = "") -> dict[str, Any]:
    """The comparison as one JSON document: the lists of regressions, improvements, unchanged
    and history-too-short benchmarks, and the gated figures of both runs."""
    lists = {
        key: [change_doc(c, cmp.began.get(c.name)) for c in cmp.of(verdict)]
        for key, verdict in (
            ("regressions", "regression"),
            ("improvements", "improvement"),
            ("unchanged", "unchanged"),
            ("history_too_short", "history too short"),
        )
    }
    old_g, new_g = gated(cmp.old), gated(cmp.new)
    return {
        "old": cmp.old.summary(),
        "new": cmp.new.summary(),
        "note": note,
        "history": {
            "runs": [r.id for r in cmp.history],
            "min_runs": hs.MIN_HISTORY,
            "machine_spread": cmp.machine_spread,
            "paired_spread": cmp.paired_spread,
        },
        **lists,
        "only_in_one_run": cmp.only_in_one,
        "gated": [
            {
                "name": name,
                "limit": fig["limit"],
                "old": old_g.get(name, {}).get("value"),
                "new": fig["value"],
                "ok": fig["ok"],
                "recorded": fig["recorded"],
            }
            for name, fig in new_g.items()
        ],
    }
