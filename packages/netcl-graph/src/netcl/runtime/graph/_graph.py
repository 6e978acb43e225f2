"""Graph and TensorRef: a static description of named ops; nothing runs until an executor does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from netcl.core.tensor import Shape, Tensor, normalize_shape

__all__ = ["Graph", "Op", "OpFn", "TensorRef"]


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A placeholder for the output of the op called ``name``.

    ``Graph.add_op`` returns one; build one yourself (``TensorRef("later")``) to name an op that
    is added afterwards. Refs are resolved when a graph runs, so an unknown name is reported then.
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TensorRef: name must be a non-empty str, got {self.name!r}")


OpFn = Callable[[list[Tensor], Tensor], Any]
"""``fn(inputs, out)``: enqueue work that fills ``out`` from ``inputs`` (its return is ignored)."""

OpInput = Tensor | TensorRef


@dataclass(frozen=True, slots=True)
class Op:
    """One node of a graph: its output is ``shape`` x ``dtype``, computed by ``fn``."""

    name: str
    fn: OpFn
    inputs: tuple[OpInput, ...]
    shape: Shape
    dtype: np.dtype[Any]
    index: int  # insertion order: the tie-break of the topological order

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Graph:
    """A set of named ops whose inputs are external Tensors or other ops' outputs (TensorRefs).

    Ops are only described here; :class:`GraphExecutor` runs them. A graph may be extended after it
    has run: executors notice the change (``version``) and plan again.
    """

    def __init__(self) -> None:
        self._ops: dict[str, Op] = {}
        self._version = 0

    def add_op(
        self,
        name: str,
        fn: OpFn,
        inputs: Sequence[Tensor | TensorRef],
        shape: int | Sequence[int],
        dtype: npt.DTypeLike,
    ) -> TensorRef:
        """Add op ``name`` computing a ``shape`` x ``dtype`` output with ``fn(inputs, out)``.

        ``inputs`` are Tensors (external: the executor never releases them) or TensorRefs to
        other ops, possibly ones added later. Returns the TensorRef of this op's output.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"Graph.add_op: name must be a non-empty str, got {name!r}")
        if name in self._ops:
            raise ValueError(f"Graph.add_op: duplicate op name {name!r}: names must be unique")
        if not callable(fn):
            raise TypeError(f"Graph.add_op({name!r}): fn must be callable, got {fn!r}")
        if isinstance(inputs, (Tensor, TensorRef, str)) or not isinstance(inputs, Sequence):
            raise TypeError(
                f"Graph.add_op({name!r}): inputs must be a sequence of Tensor or TensorRef, "
                f"got {inputs!r}"
            )
        for i, x in enumerate(inputs):
            if not isinstance(x, (Tensor, TensorRef)):
                raise TypeError(
                    f"Graph.add_op({name!r}): input {i} must be a Tensor or TensorRef, "
                    f"got {type(x).__name__}: {x!r}"
                )
        try:
            dims = normalize_shape(shape)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Graph.add_op({name!r}): bad shape: {exc}") from None
        if dtype is None:  # np.dtype(None) would silently be float64
            raise ValueError(f"Graph.add_op({name!r}): dtype is required, got None")
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise ValueError(f"Graph.add_op({name!r}): bad dtype {dtype!r}: {exc}") from None
        if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
            raise ValueError(
                f"Graph.add_op({name!r}): dtype must be a fixed-size numeric dtype (bool, int, "
                f"uint, float or complex), got {dt} ({dtype!r})"
            )
        self._ops[name] = Op(name, fn, tuple(inputs), dims, dt, len(self._ops))
        self._version += 1
        return TensorRef(name)

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops in the order they were added."""
        return tuple(self._ops.values())

    @property
    def version(self) -> int:
        """Grows with every change; executors re-plan when it differs from the planned one."""
        return self._version

    def op(self, name: str) -> Op:
        """The op called ``name`` (``KeyError`` naming it when there is none)."""
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"Graph has no op {name!r}") from None

    def __contains__(self, name: object) -> bool:
        if isinstance(name, TensorRef):
            name = name.name
        return name in self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"Graph({len(self._ops)} ops: {', '.join(self._ops)})"

    def to_dot(self) -> str:
        """Graphviz (DOT) text: ops as boxes, external inputs as ellipses, unknown refs in red."""
        lines = ["digraph netcl_graph {", "  rankdir=TB;", '  node [fontname="monospace"];']
        externals: dict[int, str] = {}
        missing: set[str] = set()
        for op in self._ops.values():
            label = _label(op.name, f"{op.shape} {op.dtype}")
            lines.append(f"  {_q('op:' + op.name)} [shape=box, label={label}];")
        for op in self._ops.values():
            for pos, x in enumerate(op.inputs):
                if isinstance(x, TensorRef):
                    src = "op:" + x.name
                    if x.name not in self._ops and x.name not in missing:
                        missing.add(x.name)
                        lines.append(
                            f"  {_q(src)} [shape=box, style=dashed, color=red, "
                            f"label={_q('missing: ' + x.name)}];"
                        )
                else:
                    if (key := id(x)) not in externals:
                        externals[key] = src = f"input{len(externals)}"
                        label = _label(f"input {len(externals) - 1}", f"{x.shape} {x.dtype}")
                        lines.append(f"  {_q(src)} [shape=ellipse, label={label}];")
                    src = externals[key]
                lines.append(f"  {_q(src)} -> {_q('op:' + op.name)} [label={_q(str(pos))}];")
        lines.append("}")
        return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    """A DOT quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(*lines: str) -> str:
    """A DOT quoted label of several lines."""
    return "\\n".join(_q(line)[1:-1] for line in lines).join('""')
