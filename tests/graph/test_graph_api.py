"""Graph construction, validation and DOT output (no run needed for most of these)."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.memory import BufferPool
from netcl.core.tensor import Tensor
from netcl.runtime.graph import Graph, GraphExecutor, TensorRef


def _noop(inputs: list[Tensor], out: Tensor) -> None:
    pass


def test_public_names() -> None:
    import netcl.runtime.graph as g

    assert sorted(g.__all__) == ["Graph", "GraphExecutor", "TensorRef"]


def test_add_op_returns_ref_and_records_op(queue: cl.CommandQueue) -> None:
    x = Tensor.empty((4,), np.float32, queue)
    g = Graph()
    ref = g.add_op("a", _noop, [x], shape=(4,), dtype="float32")
    assert ref == TensorRef("a")
    assert "a" in g and ref in g and len(g) == 1
    op = g.op("a")
    assert op.shape == (4,) and op.dtype == np.float32 and op.inputs == (x,)
    v = g.version
    g.add_op("b", _noop, [ref], shape=4, dtype=np.float32)
    assert g.version > v and [o.name for o in g.ops] == ["a", "b"]


def test_duplicate_name_is_rejected_and_graph_unchanged(queue: cl.CommandQueue) -> None:
    g = Graph()
    g.add_op("a", _noop, [], shape=(1,), dtype="float32")
    with pytest.raises(ValueError, match="duplicate op name 'a'"):
        g.add_op("a", _noop, [], shape=(2,), dtype="float32")
    assert len(g) == 1 and g.op("a").shape == (1,)


@pytest.mark.parametrize(
    ("shape", "dtype", "match"),
    [
        ((4, -1), "float32", r"bad shape.*-1"),
        ((4.5,), "float32", r"bad shape.*4\.5"),
        ("abc", "float32", r"bad shape"),
        ((4,), "not_a_dtype", r"bad dtype 'not_a_dtype'"),
        ((4,), object, r"fixed-size numeric dtype .*got object"),
        ((4,), None, r"dtype is required, got None"),
        ((4,), "U4", r"fixed-size numeric dtype .*got <U4"),
        ((4,), "S8", r"fixed-size numeric dtype .*got \|S8"),
        ((4,), [("a", "f4"), ("b", "i4")], r"fixed-size numeric dtype .*got \[\('a'"),
        ((4,), ("f4", (2,)), r"fixed-size numeric dtype .*got \('<f4', \(2,\)\)"),
        ((4,), "datetime64[s]", r"fixed-size numeric dtype .*got datetime64\[s\]"),
        ((4,), "V8", r"fixed-size numeric dtype .*got \|V8"),
    ],
)
def test_bad_shape_or_dtype(shape: object, dtype: object, match: str) -> None:
    g = Graph()
    with pytest.raises(ValueError, match=match):
        g.add_op("bad", _noop, [], shape=shape, dtype=dtype)  # type: ignore[arg-type]
    assert len(g) == 0


@pytest.mark.parametrize("dtype", ["float32", np.int8, "uint64", "complex64", bool, "f2"])
def test_numeric_dtypes_are_accepted(dtype: object) -> None:
    g = Graph()
    g.add_op("ok", _noop, [], shape=(2,), dtype=dtype)  # type: ignore[arg-type]
    assert g.op("ok").dtype == np.dtype(dtype)  # type: ignore[call-overload]


def test_bad_inputs_name_and_fn() -> None:
    g = Graph()
    with pytest.raises(TypeError, match=r"'x'.*input 1 must be a Tensor or TensorRef, got str"):
        g.add_op("x", _noop, [TensorRef("a"), "a"], (1,), "float32")  # type: ignore[list-item]
    with pytest.raises(TypeError, match="inputs must be a sequence"):
        g.add_op("x", _noop, TensorRef("a"), (1,), "float32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fn must be callable"):
        g.add_op("x", 3, [], (1,), "float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty str"):
        g.add_op("", _noop, [], (1,), "float32")
    with pytest.raises(ValueError, match="non-empty str"):
        TensorRef("")
    assert len(g) == 0


def test_unknown_ref_names_op_and_ref(pool: BufferPool) -> None:
    g = Graph()
    g.add_op("a", _noop, [], (4,), "float32")
    g.add_op("b", _noop, [TensorRef("a"), TensorRef("ghost")], (4,), "float32")
    before = pool.stats.bytes_in_use
    with pytest.raises(ValueError, match=r"op 'b': input 1 refers to unknown op 'ghost'"):
        GraphExecutor(pool).run(g)
    assert pool.stats.bytes_in_use == before


def test_cycle_is_reported_with_its_ops(pool: BufferPool) -> None:
    g = Graph()
    g.add_op("src", _noop, [], (4,), "float32")
    g.add_op("a", _noop, [TensorRef("src"), TensorRef("c")], (4,), "float32")
    g.add_op("b", _noop, [TensorRef("a")], (4,), "float32")
    g.add_op("c", _noop, [TensorRef("b")], (4,), "float32")
    g.add_op("sink", _noop, [TensorRef("c")], (4,), "float32")
    with pytest.raises(ValueError, match="cycle") as info:
        GraphExecutor(pool).run(g)
    msg = str(info.value)
    cycle = msg.split("cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]
    assert "src" not in cycle and "sink" not in cycle
    # the order printed follows the data flow
    i = cycle.index("a")
    assert cycle[i + 1] == "b"


def test_self_loop_is_a_cycle(pool: BufferPool) -> None:
    g = Graph()
    g.add_op("loop", _noop, [TensorRef("loop")], (4,), "float32")
    with pytest.raises(ValueError, match="cycle: loop -> loop"):
        GraphExecutor(pool).run(g)


def test_empty_graph_and_bad_outputs(pool: BufferPool) -> None:
    ex = GraphExecutor(pool)
    with pytest.raises(ValueError, match="no ops"):
        ex.run(Graph())
    g = Graph()
    a = g.add_op("a", _noop, [], (4,), "float32")
    with pytest.raises(ValueError, match="output 'zz' is not an op"):
        ex.run(g, outputs=["zz"])
    with pytest.raises(ValueError, match=r"\['a'\] requested more than once"):
        ex.run(g, outputs=[a, "a"])
    with pytest.raises(TypeError, match="outputs must be a sequence"):
        ex.run(g, outputs=a)  # type: ignore[call-overload]
    for bad in ("a", {"a"}):  # a name alone, a set: refused, not read name by name
        with pytest.raises(TypeError, match=r"outputs must be a sequence of TensorRef or op"):
            ex.run(g, outputs=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        ex.run(g, outputs=[])
    assert str(info.value) == "GraphExecutor: outputs must name at least one op"
    with pytest.raises(TypeError, match="pool must be a BufferPool"):
        GraphExecutor(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError) as wrong:
        ex.run([g])  # type: ignore[call-overload]
    assert str(wrong.value) == f"GraphExecutor: graph must be a Graph, got {[g]!r}"
    with pytest.raises(KeyError) as missing:
        g.op("zz")
    assert missing.value.args == ("Graph has no op 'zz'",)
    assert pool.stats.bytes_in_use == 0


def test_what_planning_refuses_is_named_in_full(pool: BufferPool) -> None:
    """The whole message of each graph or ``outputs`` that cannot be planned: an empty graph,
    a ref to an op the graph lacks (with the ops it has), an output that is no op, one asked
    for twice."""
    ex = GraphExecutor(pool)
    with pytest.raises(ValueError) as info:
        ex.run(Graph())
    assert str(info.value) == "GraphExecutor: the graph has no ops"
    g = Graph()
    g.add_op("b", _noop, [], (4,), "float32")
    g.add_op("a", _noop, [TensorRef("b"), TensorRef("ghost")], (4,), "float32")
    with pytest.raises(ValueError) as info:
        ex.run(g)
    assert str(info.value) == (
        "graph op 'a': input 1 refers to unknown op 'ghost' (known ops: a, b)"
    )
    g = Graph()
    a = g.add_op("a", _noop, [], (4,), "float32")
    with pytest.raises(ValueError) as info:
        ex.run(g, outputs=["zz"])
    assert str(info.value) == "GraphExecutor: requested output 'zz' is not an op of the graph"
    with pytest.raises(ValueError) as info:
        ex.run(g, outputs=[a, "a"])
    assert str(info.value) == "GraphExecutor: output(s) ['a'] requested more than once"
    assert pool.stats.bytes_in_use == 0


def test_a_graph_counts_its_changes_from_version_0() -> None:
    """``version`` starts at 0 for a new graph and each op added moves it up by one: a caller
    holding a version can tell whether, and how often, the graph changed since."""
    g = Graph()
    assert g.version == 0
    a = g.add_op("a", _noop, [], (4,), "float32")
    g.add_op("b", _noop, [a], (4,), "float32")
    assert g.version == 2


def test_input_from_another_context_is_rejected(pool: BufferPool, ctx: cl.Context) -> None:
    other_ctx = cl.Context(ctx.devices)
    other_q = cl.CommandQueue(other_ctx)
    x = Tensor.empty((4,), np.float32, other_q)
    g = Graph()
    g.add_op("a", _noop, [x], (4,), "float32")
    executor = GraphExecutor(pool)
    with pytest.raises(ValueError, match=r"op 'a': input 0 .* another OpenCL context"):
        executor.run(g)
    # refused by plan() too, every time: a graph refused once is not cached as planned
    for _ in range(2):
        with pytest.raises(ValueError, match=r"op 'a': input 0 .* another OpenCL context"):
            executor.plan(g)
    assert pool.stats.bytes_in_use == 0


def test_to_dot(queue: cl.CommandQueue) -> None:
    x = Tensor.empty((2, 3), np.float32, queue)
    g = Graph()
    a = g.add_op("a", _noop, [x, x], (2, 3), "float32")
    g.add_op('say "hi"', _noop, [a, TensorRef("later")], (6,), "int32")
    dot = g.to_dot()
    assert dot.startswith("digraph netcl_graph {") and dot.rstrip().endswith("}")
    assert '"op:a" [shape=box, label="a\\n(2, 3) float32"];' in dot
    assert '"input0" [shape=ellipse' in dot and "input1" not in dot  # one node per tensor
    assert '"input0" -> "op:a" [label="0"];' in dot and '"input0" -> "op:a" [label="1"];' in dot
    assert '"op:say \\"hi\\""' in dot and "(6,) int32" in dot
    assert '"op:later" [shape=box, style=dashed, color=red, label="missing: later"];' in dot
    assert '"op:a" -> "op:say \\"hi\\"" [label="0"];' in dot
