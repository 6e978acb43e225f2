"""A failed run's message in full, as a user reads it in a log: which op of which plan did
what, then either that nothing was left unrun or which plans were and how to run them."""

from __future__ import annotations

import re

import pyopencl as cl
import pytest

from netcl.runtime.scheduler import ExecutionPlan, Scheduler
from netcl.runtime.scheduler._errors import describe_op


def boom() -> None:
    raise ValueError("bad input shape")


LINE = boom.__code__.co_firstlineno


def test_the_message_when_nothing_was_left_unrun() -> None:
    sched = Scheduler()
    sched.submit(print)
    sched.submit(boom, plan=ExecutionPlan(description="last"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert str(info.value) == (
        f"Scheduler.run: op 0 (boom (test_error_text.py:{LINE})) of plan 1 'last' raised "
        "ValueError: bad input shape; no plan was left unrun"
    )


def test_the_message_names_the_plans_left_unrun_and_how_to_resubmit_them() -> None:
    sched = Scheduler()
    sched.submit(boom, plan=ExecutionPlan(description="first"))
    sched.submit(print, plan=ExecutionPlan(description="second"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert re.fullmatch(
        r"Scheduler\.run: op 0 \(boom \(test_error_text\.py:\d+\)\) of plan 0 'first' raised "
        r"ValueError: bad input shape; 1 later plan\(s\) not run: plan 1 'second' \(on the "
        r"error's \.unrun_plans; resubmit with scheduler\.submit\(plan\)\)",
        str(info.value),
    ), str(info.value)


def test_a_plan_with_a_queue_that_is_not_one_names_what_it_got() -> None:
    with pytest.raises(TypeError) as info:
        ExecutionPlan(description="copy", queue="the default")  # type: ignore[arg-type]
    assert str(info.value) == (
        "ExecutionPlan 'copy': queue must be a pyopencl.CommandQueue or None, got 'the default' "
        "(str)"
    )


class _Op:
    """A callable object without a ``__qualname__`` of its own: named by its repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self) -> None: ...

    def __repr__(self) -> str:
        return self.text


def test_an_op_is_named_by_function_builtin_or_repr_cut_to_100_characters() -> None:
    assert describe_op(print) == "print"  # a builtin: no code to point at
    assert describe_op(_Op("x" * 100)) == "x" * 100
    assert describe_op(_Op("y" * 101)) == "y" * 97 + "..."
    assert describe_op(_Op("z" * 300)) == "z" * 97 + "..."


def test_the_message_of_an_op_that_returned_a_non_event() -> None:
    def answer() -> int:
        return 42

    sched = Scheduler()
    sched.submit(answer, plan=ExecutionPlan(description="bad return"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    line = answer.__code__.co_firstlineno
    assert str(info.value) == (
        f"Scheduler.run: op 0 (test_the_message_of_an_op_that_returned_a_non_event.<locals>."
        f"answer (test_error_text.py:{line})) of plan 0 'bad return' returned 42 (int); an op "
        "must return None, an event (an object with wait()) or a list/tuple of events; no plan "
        "was left unrun"
    )


def test_submitting_a_plan_into_another_plan_names_the_mistake() -> None:
    sched = Scheduler()
    plan = ExecutionPlan(description="a")
    with pytest.raises(TypeError) as info:
        sched.submit(plan, plan=ExecutionPlan(description="b"))
    assert str(info.value) == (
        "Scheduler.submit: an ExecutionPlan given as op is scheduled as it is; plan must then "
        "be None, got ExecutionPlan(ops=[], description='b', queue=None) (ExecutionPlan)"
    )
    assert sched.plans == ()


def test_an_op_that_is_neither_callable_nor_an_event_is_named_with_its_type() -> None:
    """A value put in ``plan.ops`` by hand that is no op: the message names it and its type."""
    plan = ExecutionPlan(ops=[print, 7], description="hand made")  # type: ignore[list-item]
    sched = Scheduler()
    sched.submit(plan)
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    assert str(info.value) == (
        "Scheduler.run: op 1 (7) of plan 0 'hand made' is neither callable nor an event-like "
        "object with a wait() method (it is 7 (int)); no plan was left unrun"
    )


def test_an_after_that_holds_no_plans_is_named_with_its_type() -> None:
    """``after=`` given something other than plans, at construction or reassigned before a run:
    the message names the plan, what it got and its type."""
    with pytest.raises(TypeError) as info:
        ExecutionPlan(description="z", after=5)  # type: ignore[arg-type]
    assert str(info.value) == (
        "ExecutionPlan 'z': after must be an ExecutionPlan or a sequence of them, got 5 (int)"
    )
    with pytest.raises(TypeError) as info:
        ExecutionPlan(description="y", after=[ExecutionPlan(), 3])  # type: ignore[list-item]
    assert str(info.value) == "ExecutionPlan 'y': after must hold ExecutionPlans, got 3 (int) in it"
    plan = ExecutionPlan(description="later")
    plan.after = "oops"  # type: ignore[assignment]
    sched = Scheduler()
    sched.submit(plan)
    with pytest.raises(TypeError) as info:
        sched.run()
    assert str(info.value) == (
        "ExecutionPlan 'later': after must be an ExecutionPlan or a sequence of them, got 'oops' "
        "(str)"
    )
    plan.after = (ExecutionPlan(), b"x")  # type: ignore[assignment]
    with pytest.raises(TypeError) as info:
        sched.run()
    assert str(info.value) == (
        "ExecutionPlan 'later': after must hold ExecutionPlans, got b'x' (bytes) in it"
    )
    assert sched.plans == (plan,)  # refused before anything was taken


def test_the_message_when_a_plan_follows_an_event_that_already_failed(
    ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    """Async mode: a plan ordered on the device after an event known to have failed is not
    issued; the message names the op that returned the event and the plans left unrun."""
    failed = cl.UserEvent(ctx)
    failed.set_status(-5)

    def upload() -> cl.UserEvent:
        return failed

    ran: list[str] = []
    first = ExecutionPlan([upload], "upload", queue=queue)
    sched = Scheduler(async_mode=True)
    sched.submit(first)
    sched.submit(ExecutionPlan([lambda: ran.append("x")], "compute", queue=queue, after=first))
    sched.submit(lambda: ran.append("y"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    line = upload.__code__.co_firstlineno
    assert str(info.value) == (
        "Scheduler.run: op 0 (test_the_message_when_a_plan_follows_an_event_that_already_failed."
        f"<locals>.upload (test_error_text.py:{line})) of plan 0 'upload' returned an event "
        "(pyopencl.UserEvent(USER)) that failed (command status -5); 2 later plan(s) not run: "
        "plan 1 'compute', plan 2 (no description) (on the error's .unrun_plans; resubmit with "
        "scheduler.submit(plan))"
    )
    assert info.value.event is failed and ran == []


@pytest.mark.parametrize("later", [5, 6])
def test_the_message_names_at_most_five_unrun_plans_and_counts_the_rest(later: int) -> None:
    """Five plans left unrun are all named; from the sixth on, the message names five and says
    how many more the error's ``unrun_plans`` holds."""
    sched = Scheduler()
    sched.submit(boom, plan=ExecutionPlan(description="first"))
    for i in range(1, later + 1):
        sched.submit(print, plan=ExecutionPlan(description=f"p{i}"))
    with pytest.raises(Scheduler.Error) as info:
        sched.run()
    names = ", ".join(f"plan {i} 'p{i}'" for i in range(1, 6))
    more = ", ... (1 more)" if later == 6 else ""
    assert str(info.value).endswith(
        f"; {later} later plan(s) not run: {names}{more} (on the error's .unrun_plans; "
        "resubmit with scheduler.submit(plan))"
    ), str(info.value)
    assert len(info.value.unrun_plans) == later


def test_submitting_no_op_or_no_plan_names_what_it_got_in_full() -> None:
    """``submit`` refuses an op that is neither callable nor event-like, and a ``plan`` that is
    no ExecutionPlan, with the whole message a user reads; nothing is scheduled."""
    sched = Scheduler()
    with pytest.raises(TypeError) as info:
        sched.submit(42)  # type: ignore[arg-type]
    assert str(info.value) == (
        "Scheduler.submit: op must be a callable or an event-like object with a wait() method, "
        "got 42 (int)"
    )
    with pytest.raises(TypeError) as info:
        sched.submit(print, plan="p")  # type: ignore[arg-type]
    assert str(info.value) == (
        "Scheduler.submit: plan must be an ExecutionPlan or None, got 'p' (str)"
    )
    assert sched.plans == ()
