"""The run order of plans: submission order, with each plan moved after the plans it follows."""

from __future__ import annotations

import heapq

from netcl.runtime.scheduler._describe import describe_plan
from netcl.runtime.scheduler._plan import ExecutionPlan, after_of

__all__ = ["run_order"]


def run_order(plans: list[ExecutionPlan]) -> list[ExecutionPlan]:
    """The plans in run order.

    Plans keep their submission order unless a plan follows (``after``) one submitted later;
    then the order is the stable topological order (the earliest submitted ready plan first).
    Plans named in ``after`` that are not part of this run do not move anything. Returns
    ``plans`` itself when nothing moves. Raises ``ValueError`` naming a cycle, ``TypeError``
    naming a plan whose ``after`` holds something else than plans.
    """
    if not any(p.after for p in plans):
        return plans
    position = {id(p): k for k, p in enumerate(plans)}
    preds: list[tuple[int, ...]] = []
    in_order = True
    for k, plan in enumerate(plans):
        ks = tuple(dict.fromkeys(position[id(q)] for q in after_of(plan) if id(q) in position))
        in_order = in_order and all(j < k for j in ks)
        preds.append(ks)
    if in_order:
        return plans
    # Kahn's algorithm, taking the ready plan submitted first
    waiting = [len(ks) for ks in preds]
    followers: list[list[int]] = [[] for _ in plans]
    for k, ks in enumerate(preds):
        for j in ks:
            followers[j].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for f in followers[k]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, f)
    if len(order) < len(plans):
        raise ValueError(_cycle_message(plans, preds, {k for k, w in enumerate(waiting) if w}))
    return [plans[k] for k in order]


def _cycle_message(
    plans: list[ExecutionPlan], preds: list[tuple[int, ...]], stuck: set[int]
) -> str:
    # every stuck plan waits on another stuck plan: walking back from one must meet itself again
    k = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while k not in seen:
        seen[k] = len(path)
        path.append(k)
        k = next(j for j in preds[k] if j in stuck)
    cycle = path[seen[k] :]
    cycle.reverse()  # walked backwards (plan -> the plan it follows); show the run direction
    start = cycle.index(min(cycle))  # from the plan submitted first: the same text every time
    cycle = cycle[start:] + cycle[: start + 1]
    names = " -> ".join(describe_plan(plans[j], j) for j in cycle)
    return (
        f"Scheduler.run: the plans' after= fields form a cycle: {names} (each comes after the "
        "one before it); nothing was run and the plans stay scheduled"
    )
