"""The hand-judged mutants of the mutation sample (benchmarks/tracking/mutation_equivalent.toml)
load, so a sample's report does not fail at its end after a 40-minute run, and name mutants the
way mutmut does; the rules judge what they say."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "tracking"))
import mutation  # noqa: E402

NAME = re.compile(r"netcl(\.\w+)+\.(x_\w+|xǁ\w+ǁ\w+)__mutmut_\d+")


def test_every_judged_mutant_loads_with_its_change_and_reason() -> None:
    judged, rules = mutation.equivalents()  # tomllib refuses a mutant judged twice
    assert len(judged) > 50 and rules
    for name, entry in judged.items():
        assert NAME.fullmatch(name), name
        assert entry.change.strip() and len(entry.why) > 20, name
        assert not entry.killed_by or entry.killed_by.startswith("tests/"), name


def test_the_zip_rule_judges_only_a_changed_strict() -> None:
    _, rules = mutation.equivalents()
    weakened = "-    for a, b in zip(x, y, strict=True):\n+    for a, b in zip(x, y, strict=False):"
    dropped = "-    for a, b in zip(x, y, strict=True):\n+    for a, b in zip(x, y):"
    other = "-    for a, b in zip(x, y, strict=True):\n+    for a, b in zip(y, x, strict=True):"
    assert mutation.by_rule(weakened, rules) == mutation.by_rule(dropped, rules) == "zip-strict"
    assert mutation.by_rule(other, rules) is None


def test_the_interval_holds_the_score() -> None:
    low, high = mutation.wilson(135, 150)
    assert 0.84 < low < 0.9 < high < 0.95
    assert mutation.wilson(0, 0) == (0.0, 1.0)
