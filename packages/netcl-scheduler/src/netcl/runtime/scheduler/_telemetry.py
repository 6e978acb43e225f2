"""The scheduler's tracer and instruments (names are API: the README's telemetry table)."""

from __future__ import annotations

from netcl.core import telemetry
from netcl.runtime.scheduler.version import __version__

__all__ = ["OPS", "OPS_ATTRS", "RUNS", "RUN_ATTRS", "TRACER", "tracing"]

tracing = telemetry.tracing

TRACER = telemetry.tracer("netcl.runtime.scheduler", __version__)
_meter = telemetry.meter("netcl.runtime.scheduler", __version__)

OPS = _meter.create_counter(
    "netcl.scheduler.ops",
    unit="{op}",
    description="Ops run by Scheduler.run (callables called and events collected)",
)
RUNS = _meter.create_counter(
    "netcl.scheduler.runs",
    unit="{run}",
    description="Scheduler.run calls, by mode and result (ok / error)",
)

# Attribute sets built once: a run pays two counter adds and no allocation for them.
OPS_ATTRS = {mode: {"netcl.scheduler.async": mode} for mode in (False, True)}
RUN_ATTRS = {
    (mode, ok): {"netcl.scheduler.async": mode, "netcl.scheduler.result": "ok" if ok else "error"}
    for mode in (False, True)
    for ok in (False, True)
}
