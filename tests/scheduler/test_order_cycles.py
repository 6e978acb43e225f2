"""The cycle message of ``Scheduler.run``, where a plan stuck behind a cycle is not part of it
(found by the mutation run: the walk back and the rotation of the cycle were unchecked)."""

from __future__ import annotations

import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler


def test_a_plan_waiting_on_a_cycle_is_not_named_in_it() -> None:
    calls: list[str] = []
    tail = ExecutionPlan(ops=[lambda: calls.append("tail")], description="tail")
    x = ExecutionPlan(ops=[lambda: calls.append("x")], description="x")
    y = ExecutionPlan(ops=[lambda: calls.append("y")], description="y", after=x)
    z = ExecutionPlan(ops=[lambda: calls.append("z")], description="z", after=y)
    x.after = (z,)
    tail.after = (y,)  # stuck too, submitted first, but outside the cycle x -> y -> z -> x
    sched = Scheduler()
    for p in (tail, x, y, z):
        sched.submit(p)
    with pytest.raises(ValueError) as info:
        sched.run()
    assert str(info.value) == (
        "Scheduler.run: the plans' after= fields form a cycle: plan 1 'x' -> plan 2 'y' -> "
        "plan 3 'z' -> plan 1 'x' (each comes after the one before it); nothing was run and "
        "the plans stay scheduled"
    )
    assert calls == [] and sched.plans == (tail, x, y, z)
