"""Change detection that knows the noise, and where a change began (benchmarks/tracking/history.py).

The statistic is each benchmark's fastest round, as the gate's, compared on a log scale (a
change is a ratio). A benchmark that times its floor right before each of its rounds (paired,
benchmarks/paired.py) is compared against that floor: the median of its per-round ratios to it
(the ratio of the fastest rounds for runs saved without it), which a machine-wide change of
speed between runs leaves in place (benchmarks/tracking/history_runs.py). A change between two runs
counts only when it is outside the benchmark's noise band; everything inside it is "unchanged".

The noise band of a benchmark, as a log-ratio half-width::

    band = max(FLOOR, sqrt((z * sqrt(2) * s_b)**2 + u_old**2 + u_new**2))

- ``s_b``, the run-to-run spread of the fastest round, from the saved history: the clean runs
  (no injected slowdown) of the same machine before the newer run. Per benchmark it is the
  root mean square of successive differences over sqrt(2) (a step inside the history inflates it
  less than a standard deviation would), shrunk towards the machine's typical spread (the median
  over its unpaired benchmarks; paired ones: below) with the weight of ``PRIOR_RUNS`` runs:
  with a short history a benchmark borrows the machine's noise level, with a long one it has its
  own. Fewer than ``MIN_HISTORY``
  earlier clean runs: the spread is unknown and the benchmark is reported as "history too
  short", never guessed.
- ``u``, what the run's own rounds say: ``ln(median / fastest)``, how far load pushed the typical
  round away from the fastest (for fewer than 8 rounds the third quartile, as the median of a
  handful says little). A fastest round that rests on a few undisturbed rounds among many slow
  ones moves more from run to run; with tight rounds it is stable. A paired benchmark has no
  such term: its floor was timed in the same windows as its rounds, so what load does to the
  rounds it does to the floor too, and the ratio's own run-to-run spread is what the history
  measures. Paired benchmarks differ too much in that spread (0.5% for the replay's ratio,
  10-20% for a step's) to borrow one another's: a paired benchmark's band rests on its own
  spread alone, from at least ``MIN_HISTORY + 1`` earlier clean runs (Student's t with their
  degrees of freedom); before that its history is "too short".
- ``z``: the quantile for a 5% chance of one false alarm over all benchmarks compared
  (Bonferroni), so a clean pair of runs flags nothing nineteen times in twenty: Student's t with
  ``PRIOR_RUNS + runs - 2`` degrees of freedom, as the spread is itself estimated from few runs
  (the band narrows towards the normal's as the history grows).

Where a change began: as asv does, a piecewise-constant fit (L1, one penalty per step) over the
log fastest rounds of all the machine's saved runs (asv's own solver, ``asv.step_detect``), with
the penalty set to the benchmark's noise band, so a step must stand out of the noise to count;
the change began at the first run of the newest segment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

FLOOR = math.log(1.05)  # never report a change under 5%, however quiet the benchmark
MIN_HISTORY = 2  # earlier clean runs needed to know a benchmark's run-to-run spread
PRIOR_RUNS = 3  # the machine-wide spread weighs as much as this many runs of one benchmark
FAMILY_ALPHA = 0.05  # chance of one false alarm over all the benchmarks of a comparison
FEW_ROUNDS = 8  # under this many rounds, a run's spread is read at its third quartile


@dataclass(frozen=True)
class Noise:
    """What is known about one benchmark's noise: ``band`` is a log-ratio half-width, None
    when the history is too short."""

    band: float | None
    history_runs: int
    history_spread: float | None  # s_b, log units, before shrinking
    machine_spread: float | None
    rounds: float  # u_old and u_new in quadrature, log units

    @property
    def ratio_band(self) -> tuple[float, float] | None:
        """The band as ratios new/old: inside it a change is noise."""
        return None if self.band is None else (math.exp(-self.band), math.exp(self.band))


@dataclass(frozen=True)
class Change:
    name: str
    old: float  # fastest round, seconds
    new: float
    noise: Noise
    verdict: str  # "regression", "improvement", "unchanged", "history too short"
    paired: bool = False  # old and new: ratio to the floor, times the newer run's floor

    @property
    def ratio(self) -> float:
        return self.new / self.old


def rounds_precision(stats: Mapping[str, Any]) -> float:
    """``ln(median / fastest)`` of a run's rounds (pytest-benchmark's ``stats``), the third
    quartile in place of the median under ``FEW_ROUNDS`` rounds."""
    fastest = float(stats.get("min") or 0)
    typical = stats.get("median" if int(stats.get("rounds", 0)) >= FEW_ROUNDS else "q3")
    if fastest <= 0 or not typical:
        return 0.0
    return max(0.0, math.log(float(typical) / fastest))


def spread(history: Sequence[float]) -> float | None:
    """Run-to-run spread (log units) of a benchmark's fastest rounds over its history, oldest
    first: RMS of successive log differences over sqrt(2); None under two runs."""
    logs = np.log(np.asarray(history, dtype=float))
    if logs.size < 2:
        return None
    return float(np.sqrt(np.mean(np.diff(logs) ** 2) / 2))


def machine_spread(histories: Mapping[str, Sequence[float]]) -> float | None:
    """The machine's typical run-to-run spread: the median of its benchmarks' spreads."""
    spreads = [s for s in (spread(h) for h in histories.values()) if s is not None]
    return float(np.median(spreads)) if spreads else None


def z_quantile(compared: int, dof: float = math.inf) -> float:
    """Two-sided quantile for FAMILY_ALPHA shared by ``compared`` benchmarks: Student's t with
    ``dof`` degrees of freedom (the normal's when the spread is known exactly)."""
    tail = FAMILY_ALPHA / (2 * max(compared, 1))
    return float(stats.norm.isf(tail) if math.isinf(dof) else stats.t.isf(tail, dof))


def noise(
    history: Sequence[float],
    machine: float | None,
    u_old: float,
    u_new: float,
    compared: int,
    own_only: bool = False,
) -> Noise:
    """A benchmark's noise band from its history (earlier clean runs' fastest rounds, oldest
    first), the machine's spread, and the two runs' own precision. ``own_only`` (a paired
    benchmark): the spread is the benchmark's own, from at least ``MIN_HISTORY + 1`` runs."""
    rounds = math.hypot(u_old, u_new)
    own = spread(history)
    prior = 0 if own_only else PRIOR_RUNS
    if (
        len(history) < MIN_HISTORY + (1 if own_only else 0)
        or own is None
        or (machine is None and not own_only)
    ):
        return Noise(None, len(history), own, machine, rounds)
    dof = len(history) - 1
    shrunk = math.sqrt((prior * (machine or 0.0) ** 2 + dof * own**2) / (prior + dof))
    # a spread known from few runs is uncertain itself: Student's t with the runs (and the
    # prior's weight) as degrees of freedom widens the band while the history is short
    z = z_quantile(compared, prior + dof)
    band = max(FLOOR, math.hypot(z * math.sqrt(2) * shrunk, rounds))
    return Noise(band, len(history), own, machine, rounds)


def classify(name: str, old: float, new: float, band: Noise, paired: bool = False) -> Change:
    if band.band is None:
        return Change(name, old, new, band, "history too short", paired)
    step = math.log(new / old)
    verdict = (
        "regression" if step > band.band else "improvement" if step < -band.band else "unchanged"
    )
    return Change(name, old, new, band, verdict, paired)


def step_start(series: Sequence[float | None], band: float) -> int | None:
    """Index of the run where the newest level of ``series`` (fastest rounds, oldest first;
    None where a run lacks the benchmark) began, or None when the fit finds no step: asv's L1
    Potts fit with the noise band as the price of a step."""
    from asv.step_detect import solve_potts  # asv is heavy to import; only reports need it

    index = [i for i, v in enumerate(series) if v is not None and v > 0]
    if len(index) < 2:
        return None
    logs = [math.log(float(series[i])) for i in index]  # type: ignore[arg-type]
    right: list[int] = solve_potts(logs, [1.0] * len(logs), gamma=band)[0]
    if len(right) < 2:
        return None
    return index[right[-2]]  # the newest segment starts where the one before it ends
