"""The gate's checks as data: benchmarks/tracking/gate_checks.toml read once into typed checks.

A check names a figure (how a number is computed from pytest-benchmark's JSON) and a limit per
device class. Everything that reads limits (the gate, the history report, the results README,
the tests) reads the :class:`Limit` objects built here; nothing parses a limit again.

Figure kinds (``figure =`` in the table):

- ``ratio``: the fastest round of ``of[0]`` over that of ``of[1]`` (two benchmarks of a group);
- ``paired``: the fastest round of ``of[0]`` over the fastest of the floor it timed right before
  each of its rounds (``extra_info[key]``, seconds; benchmarks/paired.py): both in one window;
  an ``of[1]``, where given, is that floor's own benchmark, whose fastest round stands in for it
  in runs saved before the floor was paired (the figure as it was judged then);
- ``paired_median``: the median of the ratios of each round of ``of[0]`` to the floor timed right
  before it (``extra_info["paired_ratio_median"]``; for a ``key`` other than ``paired_floor_s``,
  the key's ``_floor_s`` made ``_ratio_median``), for a benchmark whose fastest rounds are rare
  outliers or whose two fastest rounds can fall in different spells of a loaded machine; in runs
  saved before that median was stored, the ``paired`` figure;
- ``paired_speedup``: the inverse of ``paired``, how many times faster ``of[0]`` is;
- ``paired_per_unit_us``: ``(fastest round - paired floor) / extra_info[per]`` in µs, the cost
  per unit (node, op) of ``of[0]`` over the same work by hand timed in the same window;
- ``per_unit_us``: ``(min(of[0]) - min(of[1])) / per`` in µs, per op over a by-hand twin;
- ``time_us``: the fastest round of ``of[0]`` per call in µs (a round making
  ``extra_info["calls_per_round"]`` calls is divided by them), for absolute targets;
- ``info``: a deterministic value from ``extra_info[key]`` (bytes, counts) of the latest run;
- ``timed_info``: a timing the benchmark measured itself, the smallest over re-measurements.

No figure can be negative: every kind is a time, a ratio of times or of bytes, or an overhead
of work that includes its floor; a negative value is a broken measurement, and the gate fails it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

Results = dict[str, list[dict[str, Any]]]  # benchmark name -> its entries, one per run

DEVICE_CLASSES = ("pocl", "nvidia")
TABLE = Path(__file__).with_name("gate_checks.toml")


@dataclass(frozen=True)
class Limit:
    """A bound on a figure: ``<= bound`` (lower is better) or ``>= bound``."""

    bound: float
    upper: bool = True  # True: the figure must stay at or under the bound

    def ok(self, value: float) -> bool:
        return value <= self.bound if self.upper else value >= self.bound

    def __str__(self) -> str:
        return f"{'<=' if self.upper else '>='} {self.bound:g}"


@dataclass(frozen=True)
class Figure:
    """How one checked number is computed from the stored results."""

    kind: str
    needs: tuple[str, ...]  # benchmark names
    compute: Callable[[Results], float]
    timed: bool  # a timing: re-measuring can change it
    unit: str = ""
    per_run: bool = False  # paired: judged run by run (the best run counts), never across runs
    keys: tuple[str, ...] = ()  # extra_info it reads from every run of its first benchmark

    def unrecorded(self, results: Results) -> list[str]:
        """The ``keys`` a run of the first benchmark lacks (one saved before they were recorded)."""
        runs = results.get(self.needs[0], [])
        return [k for k in self.keys if not all(k in e.get("extra_info", {}) for e in runs)]

    def measured(self, results: Results) -> bool:
        """Whether ``results`` hold what the figure reads: its benchmarks and their ``keys``."""
        return all(n in results for n in self.needs) and not self.unrecorded(results)


def _min(results: Results, name: str) -> float:
    return min(float(entry["stats"]["min"]) for entry in results[name])


def _smallest(results: Results, name: str, key: str) -> float:
    """The smallest ``extra_info[key]`` of benchmark ``name`` over the runs."""
    return min(float(entry["extra_info"][key]) for entry in results[name])


def _latest(results: Results, name: str, key: str) -> float:
    return float(results[name][-1]["extra_info"][key])


def _floor(results: Results, name: str, key: str, fallback: str | None) -> float:
    """The paired floor of ``name`` (its smallest ``extra_info[key]`` over the runs that have
    one), or in runs saved before it was paired, the fastest round of ``fallback``."""
    floors = [float(e["extra_info"][key]) for e in results[name] if key in e.get("extra_info", {})]
    if floors:
        return min(floors)
    if fallback is None:
        raise KeyError(key)
    return _min(results, fallback)


def _calls(results: Results, name: str) -> float:
    """Calls a round makes itself (``extra_info["calls_per_round"]``), 1 when it loops not."""
    return float(results[name][-1].get("extra_info", {}).get("calls_per_round", 1))


def _figure(kind: str, of: tuple[str, ...], key: str, per: Any) -> Figure:
    a, b = of[0], of[-1]
    fallback = of[1] if len(of) > 1 else None
    if kind == "ratio":
        return Figure(kind, of, lambda r: _min(r, a) / _min(r, b), True)
    floor = () if fallback else (key,)  # without a fallback every run needs its floor
    if kind == "paired":
        return Figure(
            kind,
            of,
            lambda r: _min(r, a) / _floor(r, a, key, fallback),
            True,
            per_run=True,
            keys=floor,
        )
    if kind == "paired_median":
        return Figure(
            kind, of, lambda r: _paired_median(r, a, key, fallback), True, per_run=True, keys=floor
        )
    if kind == "paired_speedup":
        return Figure(
            kind,
            of,
            lambda r: _floor(r, a, key, fallback) / _min(r, a),
            True,
            per_run=True,
            keys=floor,
        )
    if kind == "paired_per_unit_us":
        return Figure(
            kind,
            of,
            lambda r: (_min(r, a) - _floor(r, a, key, fallback)) / _latest(r, a, str(per)) * 1e6,
            True,
            " µs",
            per_run=True,
            keys=(*floor, str(per)),
        )
    if kind == "per_unit_us":
        return Figure(kind, of, lambda r: (_min(r, a) - _min(r, b)) / float(per) * 1e6, True, " µs")
    if kind == "time_us":
        return Figure(kind, of, lambda r: _min(r, a) / _calls(r, a) * 1e6, True, " µs")
    if kind == "info":
        return Figure(kind, of, lambda r: _latest(r, a, key), False, keys=(key,))
    return Figure(kind, of, lambda r: _smallest(r, a, key), True, keys=(key,))  # timed_info


def _paired_median(results: Results, name: str, key: str, fallback: str | None) -> float:
    median_key = key.removesuffix("_floor_s") + "_ratio_median"  # paired_floor_s: paired_...
    medians = [
        float(e["extra_info"][median_key])
        for e in results[name]
        if median_key in e.get("extra_info", {})
    ]
    return min(medians) if medians else _min(results, name) / _floor(results, name, key, fallback)


# kind -> (how many benchmarks it reads, what it needs besides: "key" / "per")
KINDS: Mapping[str, tuple[tuple[int, ...], frozenset[str]]] = {
    "ratio": ((2,), frozenset()),
    "paired": ((1, 2), frozenset()),
    "paired_median": ((1, 2), frozenset()),
    "paired_speedup": ((1, 2), frozenset()),
    "paired_per_unit_us": ((1, 2), frozenset({"per"})),
    "per_unit_us": ((2,), frozenset({"per"})),
    "time_us": ((1,), frozenset()),
    "info": ((1,), frozenset({"key"})),
    "timed_info": ((1,), frozenset({"key"})),
}
_KEYS = {"name", "figure", "of", "key", "per", "better", "target", "note", "quick", *DEVICE_CLASSES}


@dataclass(frozen=True)
class Check:
    name: str
    figure: Figure
    limits: Mapping[str, Limit] = field(default_factory=dict)  # device class -> limit
    target: str = ""
    note: str = ""  # why a limit is looser than the target, where it is
    quick: bool = True  # part of the short pass (--run); False: only judged on full runs

    def limit(self, device_class: str) -> Limit | None:
        return self.limits.get(device_class)


def _bad(where: str, what: str, got: object) -> ValueError:
    return ValueError(f"{TABLE.name}: {where}: expected {what}, got {got!r}")


def _check(entry: dict[str, Any], index: int) -> Check:
    where = f"check {index} ({entry.get('name', 'unnamed')!r})"
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise _bad(where, f"keys among {sorted(_KEYS)}", unknown)
    kind = str(entry.get("figure"))
    if kind not in KINDS:
        raise _bad(where, f"figure one of {sorted(KINDS)}", kind)
    counts, extra = KINDS[kind]
    of = entry.get("of")
    if not isinstance(of, list) or len(of) not in counts or not all(isinstance(n, str) for n in of):
        raise _bad(where, f"of = a list of {' or '.join(map(str, counts))} benchmark name(s)", of)
    for needed in extra:
        if needed not in entry:
            raise _bad(where, f"{needed!r} for figure {kind!r}", None)
    better = entry.get("better", "lower")
    if better not in ("lower", "higher"):
        raise _bad(where, "better = 'lower' or 'higher'", better)
    limits = {}
    for cls in DEVICE_CLASSES:
        bound = entry.get(cls)
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int | float) or bound < 0:
            raise _bad(where, f"{cls} = a number >= 0 (the limit)", bound)
        limits[cls] = Limit(float(bound), upper=better == "lower")
    figure = _figure(kind, tuple(of), str(entry.get("key", "paired_floor_s")), entry.get("per"))
    return Check(
        str(entry["name"]),
        figure,
        limits,
        str(entry.get("target", "")),
        " ".join(str(entry.get("note", "")).split()),
        bool(entry.get("quick", True)),
    )


def load_checks(path: Path = TABLE) -> tuple[Check, ...]:
    """The table's checks, validated: a malformed entry is a ValueError naming it."""
    with path.open("rb") as f:
        entries = tomllib.load(f).get("check", [])
    checks = tuple(_check(entry, i) for i, entry in enumerate(entries, 1))
    names = [c.name for c in checks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _bad("checks", "unique names", dupes)
    return checks
