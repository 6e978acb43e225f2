"""Real pyopencl workloads under capture: each is recorded once, then replayed with new inputs
written in place, and every result is checked against numpy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.clmath as clmath
import pytest

from netcl.runtime.capture import KernelCapture

pytest.importorskip("mako", reason="pyopencl's reductions and scans need mako: pip install mako")

N = 1000
Arrays = dict[str, Any]
# (inputs on the device, the captured step returning device results, numpy reference)
Workload = tuple[Arrays, Callable[[], Arrays], Callable[[Arrays], Arrays]]


def _rand(rng: np.random.Generator, n: int = N, dtype: Any = np.float32) -> np.ndarray:  # type: ignore[type-arg]
    return rng.uniform(-2, 2, n).astype(dtype)


def arithmetic(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    a, b = cla.to_device(q, _rand(rng)), cla.to_device(q, _rand(rng))
    return (
        {"a": a, "b": b},
        lambda: {
            "lin": (a * 2 + b) / 3,
            "sq": a * a - b,
            "mx": cla.maximum(a, b),
            "abs": abs(a),
            "sin": clmath.sin(b),
            "where": cla.if_positive(a, a, b),
        },
        lambda h: {
            "lin": (h["a"] * 2 + h["b"]) / 3,
            "sq": h["a"] * h["a"] - h["b"],
            "mx": np.maximum(h["a"], h["b"]),
            "abs": np.abs(h["a"]),
            "sin": np.sin(h["b"]),
            "where": np.where(h["a"] > 0, h["a"], h["b"]),
        },
    )


def zero_size(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    e = cla.zeros(q, 0, np.float32)
    a = cla.to_device(q, _rand(rng))
    return (
        {"a": a, "e": e},
        lambda: {"inc": e + 1, "prod": e * e, "sum": cla.sum(e), "a2": a * 2},
        lambda h: {
            "inc": h["e"] + 1,
            "prod": h["e"] * h["e"],
            "sum": np.float32(0),
            "a2": h["a"] * 2,
        },
    )


def reductions(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    a, b = cla.to_device(q, _rand(rng)), cla.to_device(q, _rand(rng))
    return (
        {"a": a, "b": b},
        lambda: {"sum": cla.sum(a), "max": cla.max(a), "min": cla.min(b), "dot": cla.dot(a, b)},
        lambda h: {
            "sum": h["a"].sum(),
            "max": h["a"].max(),
            "min": h["b"].min(),
            "dot": np.dot(h["a"], h["b"]),
        },
    )


def scans(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    from pyopencl.scan import ExclusiveScanKernel, InclusiveScanKernel

    inc = InclusiveScanKernel(q.context, np.int32, "a+b", "0")
    exc = ExclusiveScanKernel(q.context, np.int32, "a+b", "0")
    a = cla.to_device(q, rng.integers(0, 10, N).astype(np.int32))

    def step() -> Arrays:
        i, e = a.copy(), a.copy()
        inc(i)
        exc(e)
        return {"inc": i, "exc": e}

    return (
        {"a": a},
        step,
        lambda h: {"inc": np.cumsum(h["a"]), "exc": np.cumsum(h["a"]) - h["a"]},
    )


def sorts(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    from pyopencl.bitonic_sort import BitonicSort

    sorter = BitonicSort(q.context)
    a = cla.to_device(q, rng.integers(0, 1 << 20, 1024).astype(np.int32))

    def step() -> Arrays:
        s = a.copy()
        sorter(s)
        return {"sorted": s}

    return {"a": a}, step, lambda h: {"sorted": np.sort(h["a"])}


def struct_dtype(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    from pyopencl.elementwise import ElementwiseKernel
    from pyopencl.tools import get_or_register_dtype, match_dtype_to_c_struct

    pair = np.dtype([("x", np.float32), ("y", np.float32)])
    pair, decl = match_dtype_to_c_struct(q.device, "pair_t", pair)
    pair = get_or_register_dtype("pair_t", pair)
    knl = ElementwiseKernel(
        q.context, "pair_t *p, float *out", "out[i] = p[i].x * p[i].y", preamble=decl
    )
    host = np.empty(N, pair)
    host["x"], host["y"] = _rand(rng), _rand(rng)
    p = cla.to_device(q, host)

    def step() -> Arrays:
        out = cla.empty(q, N, np.float32)
        knl(p, out)
        return {"out": out}

    return {"p": p}, step, lambda h: {"out": h["p"]["x"] * h["p"]["y"]}


def copies_and_fills(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    a = cla.to_device(q, _rand(rng))

    def step() -> Arrays:
        filled = cla.empty(q, N, np.float32)
        filled.fill(3.0)
        dup = a.copy()
        dst = cla.zeros(q, N, np.float32)
        cl.enqueue_copy(q, dst.data, a.data, byte_count=a.nbytes // 2)
        part = cla.zeros(q, N, np.float32)
        part[: N // 2] = a[N // 2 :]
        return {"filled": filled + dup, "dst": dst, "part": part}

    def ref(h: Arrays) -> Arrays:
        half = np.zeros(N, np.float32)
        half[: N // 2] = h["a"][: N // 2]
        part = np.zeros(N, np.float32)
        part[: N // 2] = h["a"][N // 2 :]
        return {"filled": 3 + h["a"], "dst": half, "part": part}

    return {"a": a}, step, ref


def several_queues(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    q2 = cl.CommandQueue(q.context)
    a = cla.to_device(q, _rand(rng))

    def step() -> Arrays:
        b = a * 2  # on q
        b.finish()
        c = b.with_queue(q2) + 1  # on q2, after b
        return {"c": c.with_queue(q)}

    return {"a": a}, step, lambda h: {"c": h["a"] * 2 + 1}


def out_of_order(q: cl.CommandQueue, rng: np.random.Generator) -> Workload:
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    oq = cl.CommandQueue(q.context, properties=props)
    a, b = cla.to_device(oq, _rand(rng)), cla.to_device(oq, _rand(rng))

    def step() -> Arrays:
        c = a + b
        d = c * c
        e = d - a
        return {"e": e, "s": cla.sum(e)}

    return (
        {"a": a, "b": b},
        step,
        lambda h: {
            "e": (h["a"] + h["b"]) ** 2 - h["a"],
            "s": ((h["a"] + h["b"]) ** 2 - h["a"]).sum(),
        },
    )


WORKLOADS = [
    arithmetic,
    zero_size,
    reductions,
    scans,
    sorts,
    struct_dtype,
    copies_and_fills,
    several_queues,
    out_of_order,
]


def _check(outs: Arrays, expected: Arrays) -> None:
    for name, dev in outs.items():
        dev.finish()
        got = dev.get()
        want = np.asarray(expected[name])
        assert got.shape == want.shape, name
        if got.dtype.kind in "iu":
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=name)


@pytest.mark.parametrize("make", WORKLOADS, ids=[w.__name__ for w in WORKLOADS])
def test_workload_replays_with_new_inputs(queue: cl.CommandQueue, make: Any) -> None:
    rng = np.random.default_rng(1)
    inputs, step, reference = make(queue, rng)
    cap = KernelCapture()
    with cap:
        outs = step()
    assert cap.num_launches > 0 or make is zero_size
    _check(outs, reference({k: v.get() for k, v in inputs.items()}))
    for _ in range(3):
        new = {}
        for name, dev in inputs.items():
            host = dev.get()
            if host.size == 0:
                new[name] = host
                continue
            if host.dtype.names:
                for field in host.dtype.names:
                    host[field] = _rand(rng, host.size)
            elif host.dtype.kind in "iu":
                host = rng.integers(0, 1 << 10, host.size).astype(host.dtype)
            else:
                host = _rand(rng, host.size, host.dtype)
            dev.set(host)
            dev.finish()
            new[name] = host
        done = cap.replay()  # completes when every replayed command has
        if done is not None:
            done.wait()
        _check(outs, reference(new))
    cap.reset()
