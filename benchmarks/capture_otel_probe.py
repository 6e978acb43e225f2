"""Replay with a configured OpenTelemetry SDK against replay with none, in one process.

Run by bench_capture.py in a subprocess, because a global tracer provider can be set only once
per process and would leak into every later benchmark. The SDK (TracerProvider with a
BatchSpanProcessor, MeterProvider with a periodic reader) is installed once; the two conditions
are then alternated round by round by clearing and restoring the API's global provider slots,
which are exactly what the replay path consults before any telemetry work (so a cleared slot is
indistinguishable, for that path, from an application that never installed an SDK). Prints one
JSON object: median seconds per replay for each condition and their ratio.
"""

from __future__ import annotations

import json
import statistics
import sys

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from capture_workloads import AddLoop, interleaved, interleaved_times

from netcl.core import device


class DropExporter(SpanExporter):
    """Receives batches like a real exporter would, sends them nowhere."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: tuple[ReadableSpan, ...]) -> SpanExportResult:  # type: ignore[override]
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def main(rounds: int) -> None:
    queue = device.default_queue()
    loop = AddLoop(queue)
    exporter = DropExporter()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(tp)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    sdk_slots = (trace._TRACER_PROVIDER, metrics_internal._METER_PROVIDER)

    def sdk_on() -> None:
        queue.finish()
        trace._TRACER_PROVIDER, metrics_internal._METER_PROVIDER = sdk_slots

    def sdk_off() -> None:
        queue.finish()
        trace._TRACER_PROVIDER = None
        metrics_internal._METER_PROVIDER = None

    def e2e() -> None:
        loop.replay()
        queue.finish()

    for _ in range(3):  # warm both paths
        sdk_off()
        e2e()
        sdk_on()
        e2e()
    # host: the replay call alone, queue drained before; e2e: replay + finish. The conditions
    # alternate every call (interleaved() calls flip() before each timed call).
    calls = [0]

    def flip() -> None:
        (sdk_off if calls[0] % 2 == 0 else sdk_on)()
        calls[0] += 1

    host = interleaved({"none": loop.replay, "sdk": loop.replay}, rounds, setup=flip)
    e2e_times = interleaved_times({"none": e2e, "sdk": e2e}, rounds, setup=flip)
    end_to_end = {k: statistics.median(v) for k, v in e2e_times.items()}
    sdk_on()
    tp.force_flush()
    loop.check()
    print(
        json.dumps(
            {
                "none_s": host["none"],
                "sdk_s": host["sdk"],
                "sdk_over_none": host["sdk"] / host["none"],
                "none_e2e_s": end_to_end["none"],
                "sdk_e2e_s": end_to_end["sdk"],
                "sdk_over_none_e2e": end_to_end["sdk"] / end_to_end["none"],
                # fastest rounds: what the gate reads (load only adds time)
                "sdk_over_none_e2e_min": min(e2e_times["sdk"]) / min(e2e_times["none"]),
                "spans_exported": exporter.spans,
                "launches_per_replay": loop.capture.num_launches,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
