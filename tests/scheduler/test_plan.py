"""ExecutionPlan and Scheduler.submit: defaults, order of plans, validation."""

from __future__ import annotations

import dataclasses

import pyopencl as cl
import pytest

from netcl.runtime import scheduler as scheduler_pkg
from netcl.runtime.scheduler import ExecutionPlan, Scheduler


def test_public_names_are_the_specs() -> None:
    assert sorted(scheduler_pkg.__all__) == ["ExecutionPlan", "Scheduler"]
    assert issubclass(Scheduler.Error, RuntimeError)


def test_plan_is_a_dataclass_with_spec_defaults() -> None:
    plan = ExecutionPlan()
    assert dataclasses.is_dataclass(plan)
    assert plan.ops == []
    assert plan.description == ""
    assert [f.name for f in dataclasses.fields(ExecutionPlan)] == [
        "ops",
        "description",
        "queue",
        "after",
    ]


def test_plans_never_share_their_op_list() -> None:
    a, b = ExecutionPlan(), ExecutionPlan()
    a.ops.append(print)
    assert b.ops == []
    assert a.ops is not b.ops
    sched = Scheduler()
    p1 = sched.submit(print)
    p2 = sched.submit(print)
    assert p1 is not p2 and p1.ops is not p2.ops
    assert p1.ops == [print] and p2.ops == [print]


def test_plan_keeps_a_given_list_and_copies_other_iterables() -> None:
    ops: list[object] = [print]
    assert ExecutionPlan(ops=ops).ops is ops  # type: ignore[arg-type]
    from_tuple = ExecutionPlan(ops=(print, len))  # type: ignore[arg-type]
    assert from_tuple.ops == [print, len] and isinstance(from_tuple.ops, list)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"description": 3}, r"description must be a str, got 3 \(int\)"),
        ({"ops": "abc"}, r"ops must be a list of callables or events, got 'abc' \(str\)"),
        ({"ops": 5}, r"ops must be a list .* got 5 \(int\)"),
    ],
)
def test_plan_rejects_bad_fields(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        ExecutionPlan(**kwargs)  # type: ignore[arg-type]


def test_submit_without_plan_makes_a_new_plan_each_time() -> None:
    sched = Scheduler()
    plans = [sched.submit(print) for _ in range(3)]
    assert len({id(p) for p in plans}) == 3
    assert sched.plans == tuple(plans)
    # the plan submit builds for one op is the plan the constructor builds, attribute for attribute
    assert all(vars(p) == vars(ExecutionPlan([print])) for p in plans)
    assert all(p.after == () and type(p.after) is tuple for p in plans)


def test_existing_plan_keeps_its_first_submission_position() -> None:
    sched = Scheduler()
    a = ExecutionPlan(description="a")
    b = ExecutionPlan(description="b")
    sched.submit(print, plan=b)
    sched.submit(len, plan=a)
    sched.submit(repr, plan=b)  # b already scheduled: stays first
    sched.submit(str, plan=a)
    assert [p.description for p in sched.plans] == ["b", "a"]
    assert b.ops == [print, repr] and a.ops == [len, str]


def test_equal_plans_are_still_distinct_plans() -> None:
    # two empty plans with the same label compare equal (a plain dataclass), yet are two plans
    sched = Scheduler()
    a, b = ExecutionPlan(description="x"), ExecutionPlan(description="x")
    assert a == b
    sched.submit(print, plan=a)
    sched.submit(print, plan=b)
    assert len(sched.plans) == 2


def test_submit_a_plan_schedules_it_as_it_is() -> None:
    calls: list[str] = []
    plan = ExecutionPlan(ops=[lambda: calls.append("x")], description="prebuilt")
    sched = Scheduler()
    assert sched.submit(plan) is plan
    assert sched.submit(plan, plan=plan) is plan
    assert len(plan.ops) == 1 and sched.plans == (plan,)
    sched.run()
    assert calls == ["x"]


def test_submit_accepts_events(ctx: cl.Context) -> None:
    ev = cl.UserEvent(ctx)
    ev.set_status(cl.command_execution_status.COMPLETE)
    sched = Scheduler()
    plan = sched.submit(ev)
    assert plan.ops == [ev]


@pytest.mark.parametrize(
    ("op", "match"),
    [
        (42, r"op must be a callable or an event-like object with a wait\(\) method, got 42 "),
        ("wait", r"got 'wait' \(str\)"),
        (type("NotEvent", (), {"wait": 3})(), r"got <.*NotEvent object at .*> \(NotEvent\)"),
    ],
)
def test_submit_rejects_what_is_neither_callable_nor_event(op: object, match: str) -> None:
    sched = Scheduler()
    with pytest.raises(TypeError, match=match):
        sched.submit(op)  # type: ignore[arg-type]
    assert sched.plans == ()


def test_submit_rejects_a_bad_plan() -> None:
    sched = Scheduler()
    with pytest.raises(TypeError, match=r"plan must be an ExecutionPlan or None, got 'p' \(str\)"):
        sched.submit(print, plan="p")  # type: ignore[arg-type]
    other = ExecutionPlan()
    with pytest.raises(TypeError, match="plan must then be None"):
        sched.submit(ExecutionPlan(), plan=other)
    assert sched.plans == () and other.ops == []


def test_constructor_and_run_check_their_flags() -> None:
    with pytest.raises(TypeError, match=r"async_mode must be a bool, got 'yes' \(str\)"):
        Scheduler(async_mode="yes")  # type: ignore[arg-type]
    sched = Scheduler()
    sched.submit(print)
    with pytest.raises(TypeError, match=r"wait must be a bool, got 1 \(int\)"):
        sched.run(wait=1)  # type: ignore[arg-type]
    assert len(sched.plans) == 1  # nothing consumed by the refused call


def test_repr_counts_plans_and_ops() -> None:
    sched = Scheduler(async_mode=True)
    p = sched.submit(print)
    sched.submit(len, plan=p)
    sched.submit(str)
    assert repr(sched) == "Scheduler(async_mode=True, plans=2, ops=3)"
