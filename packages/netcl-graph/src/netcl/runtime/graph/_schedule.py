"""What a run executes: the plan turned into steps over a table of values (private to the
executor; immutable, made once per plan)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from netcl.core.tensor import Shape, Tensor
from netcl.runtime.graph._graph import Op, OpFn, TensorRef
from netcl.runtime.graph._telemetry import NODE_DTYPE, NODE_NAME, NODE_SHAPE

if TYPE_CHECKING:
    from netcl.runtime.graph._plan import GraphPlan

__all__ = ["Schedule", "make_schedule"]


@dataclass(frozen=True, slots=True)
class Step:
    """One op of a run: take ``allocs`` blocks, call ``fn`` on the ``inputs`` slots of the value
    table writing slot ``slot``, then release ``frees`` blocks."""

    name: str
    fn: OpFn
    inputs: tuple[int, ...]
    slot: int
    allocs: tuple[int, ...]
    frees: tuple[int, ...]
    attrs: Mapping[str, Any]  # attributes of its span


@dataclass(frozen=True, slots=True)
class View:
    """A value that lives inside a block at ``offset`` (a sub-buffer of ``size`` bytes)."""

    offset: int
    size: int
    shape: Shape
    dtype: np.dtype[Any]


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """How a run takes one block from the pool, and which values it holds."""

    nbytes: int
    shape: Shape  # of the Tensor the pool hands out: the owner's, or (nbytes,) uint8
    dtype: np.dtype[Any]
    owner: int  # value slot of the owning output, -1 for a block of intermediates
    views: tuple[View, ...]  # the values in slots first_view, first_view + 1, ...
    first_view: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """What a run executes: steps over a value table that starts as ``template`` (the external
    inputs, then a slot per op); the outputs are in ``out_slots``."""

    steps: tuple[Step, ...]
    blocks: tuple[BlockSpec, ...]
    template: tuple[Any, ...]
    out_slots: tuple[int, ...]


def make_schedule(
    order: Sequence[Op], plan: GraphPlan, ext_slot: Mapping[int, int], externals: list[Tensor]
) -> Schedule:
    """The steps of ``plan`` (ops in execution ``order``); external input ``x`` is in slot
    ``ext_slot[id(x)]``."""
    # a slot per value, grouped by block (its owner, then its views), so that a run puts a
    # block's views into the value table with one slice assignment
    members: list[list[Op]] = [[] for _ in plan.blocks]
    for op in order:
        members[plan.lifetimes[op.name].block].append(op)
    slot_of: dict[str, int] = {}
    specs = []
    for k, b in enumerate(plan.blocks):
        shape: Shape = (b.nbytes,)
        dtype = np.dtype(np.uint8)
        owner = -1
        if b.owner is not None:
            op = next(op for op in members[k] if op.name == b.owner)
            shape, dtype, owner = op.shape, op.dtype, len(externals) + len(slot_of)
            slot_of[op.name] = owner
        first_view = len(externals) + len(slot_of)
        views = []
        for op in members[k]:
            if op.name != b.owner:
                slot_of[op.name] = len(externals) + len(slot_of)
                lt = plan.lifetimes[op.name]
                views.append(View(lt.offset, lt.size, op.shape, op.dtype))
        specs.append(BlockSpec(b.nbytes, shape, dtype, owner, tuple(views), first_view))
    return Schedule(
        _steps(order, plan, slot_of, ext_slot),
        tuple(specs),
        (*externals, *([None] * len(order))),
        tuple(slot_of[n] for n in plan.outputs),
    )


def _steps(
    order: Sequence[Op], plan: GraphPlan, slot_of: Mapping[str, int], ext_slot: Mapping[int, int]
) -> tuple[Step, ...]:
    allocs: list[list[int]] = [[] for _ in order]
    frees: list[list[int]] = [[] for _ in order]
    for k, b in enumerate(plan.blocks):
        allocs[b.first].append(k)
        if b.last is not None:
            frees[b.last].append(k)
    dtype_names: dict[np.dtype[Any], str] = {}  # dtype.name takes microseconds
    steps = []
    for i, op in enumerate(order):
        if op.dtype not in dtype_names:
            dtype_names[op.dtype] = op.dtype.name
        attrs = {NODE_NAME: op.name, NODE_SHAPE: op.shape, NODE_DTYPE: dtype_names[op.dtype]}
        inputs = [
            slot_of[x.name] if isinstance(x, TensorRef) else ext_slot[id(x)] for x in op.inputs
        ]
        steps.append(
            Step(op.name, op.fn, tuple(inputs), slot_of[op.name], tuple(allocs[i]),
                 tuple(frees[i]), MappingProxyType(attrs))
        )  # fmt: skip
    return tuple(steps)
