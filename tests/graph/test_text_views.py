"""The text a user reads of a graph and its plan, in full: ``Graph.to_dot`` (pasted into
Graphviz, so every character counts) and ``GraphPlan.describe`` (one line per block and per op)."""

from __future__ import annotations

import re

import numpy as np
import pyopencl as cl
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef


def _noop(inputs: list[Tensor], out: Tensor) -> None:
    pass


def test_dot_text_in_full(queue: cl.CommandQueue) -> None:
    x = Tensor.empty((2,), np.float32, queue)
    g = Graph()
    # a backslash and a quote in a name are escaped; a missing ref used twice is drawn once
    g.add_op('p\\q"', _noop, [x, TensorRef("m"), TensorRef("m")], (2,), "float32")
    assert g.to_dot() == (
        "digraph netcl_graph {\n"
        "  rankdir=TB;\n"
        '  node [fontname="monospace"];\n'
        '  "op:p\\\\q\\"" [shape=box, label="p\\\\q\\"\\n(2,) float32"];\n'
        '  "input0" [shape=ellipse, label="input 0\\n(2,) float32"];\n'
        '  "input0" -> "op:p\\\\q\\"" [label="0"];\n'
        '  "op:m" [shape=box, style=dashed, color=red, label="missing: m"];\n'
        '  "op:m" -> "op:p\\\\q\\"" [label="1"];\n'
        '  "op:m" -> "op:p\\\\q\\"" [label="2"];\n'
        "}\n"
    )


def test_dot_draws_each_external_input_once(queue: cl.CommandQueue) -> None:
    """Distinct tensors are distinct ellipses, numbered in order of first use; a tensor used
    twice is one ellipse with two edges."""
    x, y = (Tensor.empty((n,), np.float32, queue) for n in (2, 3))
    g = Graph()
    g.add_op("a", _noop, [x, y, x], (2,), "float32")
    lines = g.to_dot().splitlines()
    assert [line for line in lines if "input" in line] == [
        '  "input0" [shape=ellipse, label="input 0\\n(2,) float32"];',
        '  "input0" -> "op:a" [label="0"];',
        '  "input1" [shape=ellipse, label="input 1\\n(3,) float32"];',
        '  "input1" -> "op:a" [label="1"];',
        '  "input0" -> "op:a" [label="2"];',
    ]


def test_describe_has_a_line_per_block_and_per_op(queue: cl.CommandQueue) -> None:
    g = Graph()
    a = g.add_op("a", _noop, [], (64,), np.float32)
    b = g.add_op("b", _noop, [a], (64,), np.float32)
    g.add_op("c", _noop, [b], (16,), np.float32)
    plan = GraphExecutor(BufferPool(queue)).plan(g, outputs=["c"])
    lines = plan.describe().split("\n")
    assert lines[0] == f"plan: 3 ops, {len(plan.blocks)} pool block(s), strategy {plan.strategy}"
    assert lines[1] == f"  why: {plan.strategy_reason}"
    assert lines[2].startswith(f"  pool peak {plan.pool_peak_bytes} B, device ")
    ratio = plan.pool_device_bytes / plan.lower_bound
    assert f"bound {plan.lower_bound} B (ratio {ratio:.3f}); " in lines[2]
    blocks, ops = lines[3 : 3 + len(plan.blocks)], lines[3 + len(plan.blocks) :]
    assert len(ops) == 3
    for k, (line, block) in enumerate(zip(blocks, plan.blocks, strict=True)):
        until = "caller" if block.last is None else f"{block.last:>3}"
        kind = f"output {block.owner}" if block.last is None else (block.owner or "intermediates")
        assert line == f"  block {k}: {block.nbytes} B [{block.first:>3}..{until}] {kind}"
    # the output's block is held for the caller and named after it
    assert any(line.endswith("..caller] output c") for line in blocks)
    assert re.fullmatch(r"  \[  0\.\.  1\] a: 256 B \(\d+ B\) block \d+@\d+", ops[0])
    assert re.fullmatch(r"  \[  2\.\.  2\] c: 64 B \(\d+ B\) block \d+@\d+ \(output\)", ops[2])


def test_an_unallocatable_block_is_named_with_every_tensor_it_holds(queue: cl.CommandQueue) -> None:
    x = Tensor.from_numpy(np.ones(64, np.float32), queue)
    g = Graph()
    a = g.add_op("small", _noop, [x], (64,), np.float32)
    g.add_op("huge", _noop, [a], (2**40,), np.float32)  # more than any device allocates
    g.add_op("after", _noop, [TensorRef("huge")], (64,), np.float32)
    pool = BufferPool(queue)
    with pytest.raises(MemoryError) as info:
        GraphExecutor(pool).run(g, outputs=["after"])
    # one block for the whole run: the output's, which small and huge use before it
    assert re.match(
        r"GraphExecutor\.run: op 'small' needs a block of \d+ bytes \(the block of output "
        r"'after', also holding small, huge before it\) that cannot be allocated: ",
        str(info.value),
    ), str(info.value)
    assert pool.stats.bytes_in_use == 0


def test_an_unallocatable_arena_is_named_with_its_intermediates(queue: cl.CommandQueue) -> None:
    """A block holding only intermediates (the arena) that cannot be allocated is named by every
    tensor in it, in op order."""
    unit = 2**36  # floats: every block is more than any device allocates
    g = Graph()
    a = g.add_op("a", _noop, [], (2 * unit,), np.float32)
    b = g.add_op("b", _noop, [a], (unit,), np.float32)
    g.add_op("c", _noop, [b, a], (3 * unit,), np.float32)
    pool = BufferPool(queue)
    executor = GraphExecutor(pool)
    assert executor.plan(g).strategy == "arena"
    with pytest.raises(MemoryError) as info:
        executor.run(g)
    assert re.match(
        r"GraphExecutor\.run: op 'a' needs a block of \d+ bytes \(the block of a, b\) "
        r"that cannot be allocated: ",
        str(info.value),
    ), str(info.value)
    assert pool.stats.bytes_in_use == 0


def test_an_unallocatable_intermediate_block_is_named_after_its_tensor(
    queue: cl.CommandQueue,
) -> None:
    """An intermediate's own block (a block per tensor) that cannot be allocated is named by
    that tensor alone."""
    g = Graph()
    a = g.add_op("big0", _noop, [], (2**38,), np.float32)
    b = g.add_op("big1", _noop, [a], (2**38,), np.float32)
    g.add_op("out", _noop, [b], (64,), np.float32)
    executor = GraphExecutor(BufferPool(queue))
    assert executor.plan(g).strategy.startswith("block_per_tensor")
    with pytest.raises(
        MemoryError,
        match=r"^GraphExecutor\.run: op 'big0' needs a block of "
        r"\d+ bytes \(the block of big0\) that cannot be allocated: ",
    ):
        executor.run(g)


def test_an_interrupt_in_an_op_fails_the_run_span_with_its_own_type(
    queue: cl.CommandQueue, spans: InMemorySpanExporter
) -> None:
    def interrupted(inputs: list[Tensor], out: Tensor) -> None:
        raise KeyboardInterrupt  # not wrapped: it reaches the caller as it is

    g = Graph()
    g.add_op("a", interrupted, [], (4,), np.float32)
    with pytest.raises(KeyboardInterrupt):
        GraphExecutor(BufferPool(queue)).run(g)
    (run,) = [s for s in spans.get_finished_spans() if s.name == "netcl.graph.run"]
    assert run.attributes is not None and run.attributes["error.type"] == "KeyboardInterrupt"


def test_repr_names_the_ops_in_order() -> None:
    g = Graph()
    a = g.add_op("a", _noop, [], (4,), np.float32)
    g.add_op("b", _noop, [a], (4,), np.float32)
    assert repr(g) == "Graph(2 ops: a, b)"


def test_describe_names_a_block_of_intermediates(queue: cl.CommandQueue) -> None:
    g = Graph()
    prev = g.add_op("t0", _noop, [], (64,), np.float32)
    for k in range(1, 4):
        prev = g.add_op(f"t{k}", _noop, [prev], (64,), np.float32)
    plan = GraphExecutor(BufferPool(queue)).plan(g, outputs=["t3"])
    shared = [b for b in plan.blocks if b.owner is None]
    if not shared:
        pytest.skip(f"{plan.strategy} keeps no block of intermediates on this device")
    text = plan.describe()
    assert re.search(r"^  block \d+: \d+ B \[ +\d+\.\. +\d+\] intermediates$", text, re.M), text


def test_every_layout_is_a_candidate_by_its_name(queue: cl.CommandQueue) -> None:
    g = Graph()
    a = g.add_op("a", _noop, [], (64,), np.float32)
    g.add_op("b", _noop, [a], (16,), np.float32)
    plan = GraphExecutor(BufferPool(queue)).plan(g)
    assert set(plan.candidates) == {
        "arena",
        "arena_in_output_blocks",
        "block_per_tensor",
        "block_per_tensor_best_fit",
        "one_block",
    }
    assert plan.strategy in plan.candidates


def test_a_tie_between_layouts_says_how_it_was_broken(queue: cl.CommandQueue) -> None:
    g = Graph()
    g.add_op("a", _noop, [], (64,), np.float32)  # one block: every layout needs the same
    plan = GraphExecutor(BufferPool(queue)).plan(g)
    assert re.fullmatch(
        r"least device memory for a run from an empty pool \((\d+) B; (\w+ \1 B, ){3}\w+ \1 B\); "
        r"tie with \w+ broken by bytes left with the caller, then pool peak, then fewer blocks",
        plan.strategy_reason,
    ), plan.strategy_reason


def test_the_reason_names_the_layout_that_needs_least_and_every_other_figure(
    queue: cl.CommandQueue,
) -> None:
    """Where one layout needs strictly less device memory than every other, ``why:`` gives its
    figure first, then each other layout with its figure in rank order, and no tie."""
    g = Graph()
    prev = None
    for k, n in enumerate((1000, 3000, 2000, 5000)):  # sizes that no two layouts share
        prev = g.add_op(f"t{k}", _noop, [prev] if prev else [], (n,), np.float32)
    plan = GraphExecutor(BufferPool(queue)).plan(g)
    (best, least), *others = plan.candidates.items()  # in rank order
    if others[0][1] == least:
        pytest.skip(f"{best} and {others[0][0]} need the same on this device")
    assert best == plan.strategy and least < min(b for _, b in others)
    figures = ", ".join(f"{name} {b} B" for name, b in others)
    assert plan.strategy_reason == (
        f"least device memory for a run from an empty pool ({least} B; {figures})"
    )
    assert f"  why: {plan.strategy_reason}\n" in plan.describe()


def test_a_newline_in_a_name_stays_inside_its_dot_string(queue: cl.CommandQueue) -> None:
    g = Graph()
    g.add_op("a", _noop, [TensorRef("two\nlines")], (2,), "float32")
    dot = g.to_dot()
    missing = '"op:two\\nlines" [shape=box, style=dashed, color=red, label="missing: two\\nlines"];'
    assert f"  {missing}\n" in dot
    assert "two\nlines" not in dot  # a raw newline would end the DOT line
