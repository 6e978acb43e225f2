"""Names and instruments of netcl.core.profiling, and what a collected unit of work records:
its histogram points and (when tracing) its device spans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from opentelemetry.util.types import AttributeValue

from netcl.core import telemetry
from netcl.core._profiling_io import DeviceInfo
from netcl.core.version import __version__

if TYPE_CHECKING:
    from netcl.core._collector import DeviceTime

#: Histogram buckets for device durations in seconds, 1 µs to 10 s.
DEVICE_BUCKETS_S: tuple[float, ...] = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: Kinds of watched work (the first argument of :func:`watch`).
REPLAY = "replay"
GRAPH_NODE = "graph.node"
SCHEDULER_PLAN = "scheduler.plan"
COMMANDS = "commands"

TEL = telemetry.Scope("netcl.core.profiling", __version__)
_KERNEL_DURATION = TEL.histogram(
    "netcl.kernel.duration", "s", "Device time of kernel commands, by kernel name", DEVICE_BUCKETS_S
)


class _Histogram(Protocol):
    def record(
        self, amount: float, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None: ...


@dataclass(frozen=True)
class _Kind:
    span: str
    histogram: _Histogram | None
    name_attribute: str


def _kind_histogram(name: str, what: str) -> _Histogram:
    return TEL.histogram(name, "s", f"Device time of {what}", DEVICE_BUCKETS_S)


KINDS: dict[str, _Kind] = {
    REPLAY: _Kind("netcl.device.replay",
                  _kind_histogram("netcl.capture.replay.device_duration", "capture replays"),
                  "netcl.capture.name"),
    GRAPH_NODE: _Kind("netcl.device.node",
                      _kind_histogram("netcl.graph.node.device_duration", "graph nodes"),
                      "netcl.node.name"),
    SCHEDULER_PLAN: _Kind("netcl.device.plan",
                          _kind_histogram("netcl.scheduler.plan.device_duration",
                                          "scheduler plans"),
                          "netcl.plan.description"),
    COMMANDS: _Kind("netcl.device.commands", None, "netcl.device.label"),
}  # fmt: skip


def emit(unit: DeviceTime, info: DeviceInfo, command_spans: bool) -> None:
    """The unit's histogram points and (when tracing) its spans: the envelope, and one span per
    command when ``command_spans``."""
    kind = KINDS[unit.kind]
    dev = {"netcl.device.name": info.name}
    named = {**dev, kind.name_attribute: unit.name} if unit.name is not None else dev
    if kind.histogram is not None:
        kind.histogram.record(unit.duration or 0.0, named)
    for c in unit.commands:
        if c.kernel:
            _KERNEL_DURATION.record((c.end_ns - c.start_ns) / 1e9,
                                    {"netcl.kernel.name": c.name, **dev})  # fmt: skip
    if not telemetry.tracing():
        return
    attrs: dict[str, AttributeValue] = {**named, "netcl.device.duration": unit.duration or 0.0}
    if unit.commands and not command_spans:
        attrs["netcl.device.commands_skipped"] = len(unit.commands)
    if unit.attributes:
        attrs.update(unit.attributes)
    envelope = TEL.span(kind.span, attrs, start_time=unit.start_ns, current=False,
                        parent=unit.parent)  # fmt: skip
    for c in unit.commands if command_spans else ():
        TEL.record_span(c.span_name, c.start_ns, c.end_ns, {**c.attributes, **dev},
                        parent=envelope)  # fmt: skip
    envelope.end(end_time=unit.end_ns)
