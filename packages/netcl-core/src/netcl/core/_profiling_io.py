"""Reading completed profiling events into host-clock command times (for netcl.core.profiling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import pyopencl as cl
from opentelemetry.util.types import AttributeValue

from netcl.core._device_clock import DeviceClock

_START = cl.profiling_info.START
_END = cl.profiling_info.END
_TRANSFER_WORDS = ("BUFFER", "IMAGE", "MAP", "SVM", "MIGRATE")
_type_names: dict[int, str] = {}


class CommandFailedError(Exception):
    """A watched command ended in an error status: it has no device time."""


class DeviceInfo(NamedTuple):
    key: int  # the device's int_ptr
    name: str
    context: cl.Context
    device: cl.Device


class Command(NamedTuple):
    """One profiled command on the host clock: ``name`` (its label, e.g. the kernel's function
    name, else the command type), ``command`` (the OpenCL command type in lower case, e.g.
    ``ndrange_kernel``, ``read_buffer``), ``start_ns``/``end_ns`` (ns since the epoch)."""

    name: str
    command: str
    start_ns: int
    end_ns: int

    @property
    def kernel(self) -> bool:
        """A kernel command with a label."""
        return self.command in ("ndrange_kernel", "task") and self.name != self.command

    @property
    def span_name(self) -> str:
        """``netcl.device.kernel``, ``netcl.device.transfer`` or ``netcl.device.command``."""
        if self.command in ("ndrange_kernel", "task"):
            return "netcl.device.kernel"
        if any(w.lower() in self.command for w in _TRANSFER_WORDS):
            return "netcl.device.transfer"
        return "netcl.device.command"

    @property
    def attributes(self) -> dict[str, AttributeValue]:
        """The command's span attributes."""
        if self.kernel:
            return {"netcl.kernel.name": self.name}
        return {"netcl.device.command": self.command}


def _type_name(code: int) -> str:
    name = _type_names.get(code)
    if name is None:
        try:
            name = cl.command_type.to_string(code).lower()
        except ValueError:
            name = f"command_{code:#x}"
        _type_names[code] = name
    return name


def read_commands(
    events: Sequence[cl.Event],
    labels: Sequence[str],
    device_of: Callable[[cl.Event], DeviceInfo],
    clock_of: Callable[[DeviceInfo], DeviceClock],
) -> tuple[DeviceInfo, list[Command]]:
    """The commands behind completed ``events`` with host-clock times. Raises ``cl.Error`` for
    an event without profiling information (its queue has no profiling) and
    :class:`CommandFailedError` for a command that ended in an error."""
    info = device_of(events[0])
    clock = clock_of(info)
    commands = []
    for i, event in enumerate(events):
        if event.command_execution_status < 0:
            raise CommandFailedError(f"command {i} failed: status {event.command_execution_status}")
        start = event.get_profiling_info(_START)
        end = event.get_profiling_info(_END)
        kind = _type_name(event.command_type)
        label = labels[i] if i < len(labels) else kind
        commands.append(Command(label, kind, clock.to_host(start), clock.to_host(max(end, start))))
    return info, commands


def union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of ``[start, end]`` intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total
