"""The recovery recipe of the scheduler guide (docs/guides/scheduler.md) runs as written: a failed
run's unrun plans, resubmitted, still come after the plans of the failed run (a copy waits for a
long kernel still running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "scheduler.md"
HEADING = "### Recovering from a failed run"


def _recipe() -> str:
    """The first ```python block after the recipe's heading."""
    text = GUIDE.read_text(encoding="utf-8")
    after = text[text.index(HEADING) :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("\n```", start)]


def test_the_guide_recovery_recipe_reads_what_the_failed_run_wrote() -> None:
    code = _recipe()
    assert "for plan in e.unrun_plans:" in code and "assert (out == 42).all()" in code
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "plan 1 'check' raised ValueError: input not ready" in proc.stdout
