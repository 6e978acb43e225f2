"""The execution order of a graph: Kahn's algorithm, ties broken by insertion order."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from netcl.runtime.graph._graph import Graph, Op, TensorRef

__all__ = ["topological_order"]


def topological_order(graph: Graph) -> list[Op]:
    """The ops in execution order (an acyclic graph added in dependency order runs in that
    order). Raises ValueError naming an input ref to an unknown op, or the ops of a cycle."""
    ops = graph.ops
    by_name = {op.name: op for op in ops}
    indegree = {op.name: 0 for op in ops}
    users: dict[str, list[Op]] = {op.name: [] for op in ops}
    for op in ops:
        preds = {x.name for x in op.inputs if isinstance(x, TensorRef)}
        for pos, x in enumerate(op.inputs):
            if isinstance(x, TensorRef) and x.name not in by_name:
                raise ValueError(
                    f"graph op {op.name!r}: input {pos} refers to unknown op {x.name!r} "
                    f"(known ops: {', '.join(sorted(by_name)) or 'none'})"
                )
        indegree[op.name] = len(preds)
        for p in preds:
            users[p].append(op)
    ready = [(op.index, op.name) for op in ops if indegree[op.name] == 0]
    heapq.heapify(ready)
    order: list[Op] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(by_name[name])
        for user in users[name]:
            indegree[user.name] -= 1
            if indegree[user.name] == 0:
                heapq.heappush(ready, (user.index, user.name))
    if len(order) < len(ops):
        raise ValueError(f"graph has a cycle: {' -> '.join(_find_cycle(graph, indegree))}")
    return order


def _find_cycle(graph: Graph, indegree: Mapping[str, int]) -> list[str]:
    """One cycle among the ops Kahn's algorithm could not order (each has an unordered input)."""
    stuck = [op for op in graph.ops if indegree[op.name] > 0]
    seen: dict[str, int] = {}
    path: list[str] = []
    name = stuck[0].name
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        op = graph.op(name)
        # follow the first input that is itself stuck: one always exists
        name = next(
            x.name for x in op.inputs if isinstance(x, TensorRef) and indegree[x.name] > 0
        )
    cycle = path[seen[name] :]
    cycle.reverse()  # we walked from readers to producers; report in data-flow order
    return [*cycle, cycle[0]]
