"""What a captured step returns: checking a result's shape, replay results, copies, and the
comparison of check mode."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from netcl.core.tensor import Tensor
from netcl.runtime.capture._step_plan import Capture

__all__ = [
    "StepCheckError", "check_error", "compare", "copies", "finish", "outputs_of",
]

_Array = cla.Array


class StepCheckError(RuntimeError):
    """Check mode: the first replay of a capture differed from running the step normally.

    ``output`` is the index of the first differing output (0 for a single output) and
    ``max_abs_diff`` the largest absolute difference in it (``inf`` for a shape or NaN
    mismatch, or a different number of outputs).
    """

    def __init__(self, message: str, *, output: int, max_abs_diff: float) -> None:
        super().__init__(message)
        self.output = output
        self.max_abs_diff = max_abs_diff


def check_error(step: str, reason: str, result: Any, index: int, diff: float,
                atol: float) -> StepCheckError:
    """The error of a failed check: which output of ``result`` differs, and by how much."""
    what = "the output" if not isinstance(result, (tuple, list)) else f"output {index}"
    return StepCheckError(
        f"captured step {step}: check failed on the first replay of a capture ({reason}): "
        f"{what} differs from running the step normally (max abs diff {diff:.6g}, "
        f"tolerance {atol:g}). The step depends on something its guards do not see (a global "
        "or closure value that changed, a host-side decision): pass it as an argument. The "
        "capture was dropped; the next call with these arguments records again.",
        output=index, max_abs_diff=diff,
    )


def outputs_of(result: Any, step: str) -> tuple[Any, ...]:
    """The Tensors and Arrays a step returned, in order; ``TypeError`` for anything else."""
    if result is None:
        return ()
    items = result if isinstance(result, (tuple, list)) else (result,)
    for i, item in enumerate(items):
        if not isinstance(item, (Tensor, _Array)):
            where = "" if items is not result else f" (item {i} of the {type(result).__name__})"
            raise TypeError(
                f"captured step {step}: returned {type(item).__name__}{where}; a captured step "
                "must return None, a Tensor, a pyopencl Array, or a tuple or list of them (a "
                "host value computed inside the step would not be recomputed by a replay)"
            )
    return tuple(items)


def finish(entry: Capture, flat: tuple[Any, ...], bufs: list[Any], event: Any,
            copy: bool) -> Any:
    """A replay's result: the recorded outputs (rebuilt where they were arguments), or copies."""
    result = entry.outputs(flat, bufs, event)
    return copies(result, event) if copy else result


def copies(result: Any, event: Any) -> Any:
    """Copies of a result's Tensors and Arrays (in the same tuple, list or alone)."""
    if result is None:
        return None
    if isinstance(result, (tuple, list)):
        return type(result)(copy_output(item, event) for item in result)
    return copy_output(result, event)


def compare(
    mine: tuple[Any, ...], theirs: tuple[Any, ...], atol: float
) -> tuple[int, float] | None:
    """The first output (index, max abs diff) where a replay's outputs differ from a normal
    run's by more than ``atol``; None when none does."""
    if len(mine) != len(theirs):
        return min(len(mine), len(theirs)), math.inf
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        x, y = host_value(a), host_value(b)
        diff = max_abs_diff(x, y) if x.shape == y.shape else math.inf
        if not diff <= atol:
            return i, diff
    return None


def copy_output(item: Any, event: Any) -> Any:
    """A new Tensor or Array holding a copy of ``item`` (enqueued after ``event``)."""
    if isinstance(item, _Array):
        return item.copy()  # waits for the array's events (the replay's, see outputs())
    new = Tensor.empty(item.shape, item.dtype, item.queue)
    if item.nbytes:
        cl.enqueue_copy(item.queue, new.buffer, item.buffer, byte_count=item.nbytes,
                        wait_for=None if event is None else [event])
    return new


def host_value(item: Any) -> np.ndarray[Any, Any]:
    return np.asarray(item.get() if isinstance(item, _Array) else item.to_numpy())


def max_abs_diff(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """Largest ``|a - b|`` (NaN in both places counts as equal, in one as infinite)."""
    if a.size == 0:
        return 0.0
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64
    x, y = a.astype(wide), b.astype(wide)
    diff = np.abs(x - y)
    diff[np.isnan(x) & np.isnan(y)] = 0.0
    diff[np.isnan(diff)] = np.inf
    return float(diff.max())
