"""The one way netcl packages emit OpenTelemetry: a :class:`Scope` per package (its tracer, meter
and instruments), spans opened through :meth:`Scope.span` (a shared do-nothing span while
:func:`tracing` is False), one ``error.type``, and one failure policy: an SDK that raises is
caught, logged once per kind of failure on the ``netcl.core.telemetry`` logger, and the call
goes on. :func:`configure` and the rest of the application side come from ``netcl.core._sdk``.

The OpenTelemetry API loads on first use, not at import (it is about a third of what importing a
netcl package costs): while it is not loaded no provider can have been installed, so nothing
could record. Instruments are made when it is, or when the application loads it later
(:func:`netcl.core._sdk.metrics_loaded`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from netcl.core import _sdk
from netcl.core._sdk import ConfigError, configure, export_failures, flush, shutdown, tracing
from netcl.core._sdk import _switch as _switch  # tests/conftest.py clears it
from netcl.core.log import get_logger, warn_once

__all__ = [
    "DURATION_BUCKETS_S",
    "ERROR_TYPE",
    "NO_SPAN",
    "ConfigError",
    "Counts",
    "Scope",
    "Span",
    "configure",
    "current_span",
    "error_type",
    "export_failures",
    "flush",
    "shutdown",
    "tracing",
]

#: The semantic-conventions attribute every netcl failure (span or metric point) carries: the
#: exception's fully qualified class name (:func:`error_type`), or a short reason such as
#: ``discarded``.
ERROR_TYPE = "error.type"

#: Histogram buckets for durations in seconds, 10 µs to 30 s: 1, 2.5 and 5 per decade up to 5 s,
#: then 10 and 30 (made from decimal text: each is the float its literal would be). The SDK's
#: defaults (0 to 10000) suit milliseconds and would put every host duration in the first bucket.
DURATION_BUCKETS_S: tuple[float, ...] = (
    *(float(f"{m}e{e}") for e in range(-5, 1) for m in (1, 2.5, 5)),
    10.0,
    30.0,
)

if TYPE_CHECKING:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.util.types import AttributeValue

_log = get_logger(__name__)
_Attrs = Mapping[str, "AttributeValue"]


def error_type(why: BaseException | str) -> str:
    """The ``error.type`` of a failure: an exception's fully qualified class name (builtins
    unqualified: ``ValueError``, ``netcl.runtime.cache.ProgramBuildError``), or a reason as is."""
    if isinstance(why, str):
        return why
    cls = type(why)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


# -- the failure policy -----------------------------------------------------------------------
def _sdk_failed(stage: str, exc: Exception) -> None:
    """An SDK call raised: log it the first time this stage fails with this type, never raise."""
    warn_once(
        _log,
        ("telemetry_failed", stage, type(exc)),
        "telemetry_failed",
        stage=stage,
        error=repr(exc),
        note="an OpenTelemetry SDK error, ignored; logged once",
    )


# -- spans ------------------------------------------------------------------------------------
class Span:
    """A span opened by :meth:`Scope.span`; a context manager that ends it (recording the
    exception that left the block, if any). Every method is safe against a failing SDK."""

    __slots__ = ("_failed", "_span", "_token")

    #: True: a real span (the do-nothing span says False).
    recording = True

    def __init__(self, span: trace.Span, token: object | None) -> None:
        self._span = span
        self._token = token
        self._failed = False

    @property
    def context(self) -> trace.SpanContext | None:
        """The span's context (a parent for spans recorded later), None for the no-op span."""
        return self._span.get_span_context()

    def set(self, key: str, value: AttributeValue) -> None:
        """Set one attribute."""
        self.set_many({key: value})

    def set_many(self, attributes: _Attrs) -> None:
        """Set several attributes."""
        try:
            self._span.set_attributes(attributes)
        except Exception as exc:
            _sdk_failed("set_attribute", exc)

    def fail(self, why: BaseException | str, message: str | None = None) -> None:
        """Mark the span failed: status ERROR, ``error.type`` from :func:`error_type`, and the
        exception as an event. Later failures (e.g. the one leaving the ``with``) are ignored."""
        if self._failed:
            return
        self._failed = True
        try:
            from opentelemetry.trace import Status, StatusCode  # loaded: a span records

            if isinstance(why, BaseException):
                self._span.record_exception(why)
                message = message or f"{type(why).__name__}: {why}"
            self._span.set_attribute(ERROR_TYPE, error_type(why))
            self._span.set_status(Status(StatusCode.ERROR, message or why))  # type: ignore[arg-type]
        except Exception as exc:
            _sdk_failed("fail", exc)

    def end(self, exc: BaseException | None = None, *, end_time: int | None = None) -> None:
        """End the span (``end_time`` in ns since the epoch, default now), failed with ``exc``
        when given. Ending twice is harmless."""
        token, self._token = self._token, None
        if token is not None:
            from opentelemetry import context

            context.detach(token)  # type: ignore[arg-type]
        if exc is not None:
            self.fail(exc)
        try:
            self._span.end(end_time=end_time)
        except Exception as failure:
            _sdk_failed("end", failure)

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(ev)


class _NoSpan(Span):
    """What :meth:`Scope.span` hands out when nothing records: every method does nothing."""

    __slots__ = ()
    recording = False

    def __init__(self) -> None: ...

    @property
    def context(self) -> trace.SpanContext | None:
        return None

    def set_many(self, attributes: _Attrs) -> None: ...

    def fail(self, why: BaseException | str, message: str | None = None) -> None: ...

    def end(self, exc: BaseException | None = None, *, end_time: int | None = None) -> None: ...


NO_SPAN: Span = _NoSpan()


# -- instruments ------------------------------------------------------------------------------
_making = threading.Lock()


class _Safe:
    """A histogram whose ``record`` never raises into the caller, made by ``make`` on the first
    value recorded while OpenTelemetry is loaded (before, a value has no provider to go to: the
    API's own proxy instrument would drop it too). Counts are ``Counts``, read by observable
    instruments: one pattern for every package's numbers."""

    __slots__ = ("_instrument", "_make", "_stage")

    def __init__(self, make: Callable[[], Any], name: str) -> None:
        self._instrument: Any = None
        self._make = make
        self._stage = f"metric:{name}"

    def record(self, amount: float, attributes: _Attrs | None = None) -> None:
        try:
            if self._instrument is None:
                if not _sdk.metrics_loaded():
                    return
                with _making:  # made once: a second instrument of a name would be a warning
                    if self._instrument is None:
                        self._instrument = self._make()
            self._instrument.record(amount, attributes)
        except Exception as exc:
            _sdk_failed(self._stage, exc)


class Counts:
    """Numbers a package keeps for its observable instruments, one per value of one attribute
    (``attribute``; None: a single unlabelled number). The hot path only adds to a number here
    (under a lock: tens of nanoseconds, where a synchronous ``Counter.add`` with an SDK costs
    microseconds); a metric reader reads them when it collects, first calling ``refresh`` (which
    sets them: gauges whose exact figure is too dear to keep current on a hot path)."""

    __slots__ = ("_lock", "_refresh", "_values", "attribute")

    def __init__(
        self, attribute: str | None = None, refresh: Callable[[], object] | None = None
    ) -> None:
        self.attribute = attribute
        self._values: dict[AttributeValue, float] = {}
        self._lock = threading.Lock()
        self._refresh = refresh

    def add(self, amount: float = 1, label: AttributeValue = "") -> None:
        """Add ``amount`` to the number of ``label`` (a counter, or a gauge that moves)."""
        # `with`, not acquire() then try (~100 ns less): a Ctrl-C landing between those two
        # would leave the lock held for good (the scheduler's interrupt test hung on it)
        with self._lock:
            self._values[label] = self._values.get(label, 0) + amount

    def set(self, value: float, label: AttributeValue = "") -> None:
        """Set the number of ``label`` (a gauge)."""
        with self._lock:
            self._values[label] = value

    def discard(self, label: AttributeValue) -> None:
        """Forget ``label`` (a gauge of an object that is gone)."""
        with self._lock:
            self._values.pop(label, None)

    def get(self, label: AttributeValue = "") -> float:
        """The number of ``label`` (0 when never added to)."""
        return self._values.get(label, 0)

    def points(self) -> list[tuple[float, _Attrs]]:
        """``(value, attributes)`` for every label, as the observable instruments report them."""
        if self._refresh is not None:
            self._refresh()
        with self._lock:
            items = list(self._values.items())
        if self.attribute is None:
            return [(value, {}) for _, value in items]
        return [(value, {self.attribute: label}) for label, value in items]


Observe = Callable[[], Iterable[tuple[float, _Attrs]]]


class Scope:
    """The telemetry of one instrumented package: instrumentation scope ``name`` (a module name)
    at ``version``, its tracer and meter, and the one way its code opens spans and makes
    instruments (which follow a provider set later). Its tracer and meter are made on first use
    (importing the OpenTelemetry API then)."""

    __slots__ = ("_meter", "_tracer", "name", "version")

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._tracer: trace.Tracer | None = None
        self._meter: metrics.Meter | None = None

    @property
    def tracer(self) -> trace.Tracer:
        """The scope's tracer (the API's proxy until a provider is set)."""
        if self._tracer is None:
            from opentelemetry import trace

            self._tracer = trace.get_tracer(self.name, self.version)
        return self._tracer

    @property
    def meter(self) -> metrics.Meter:
        """The scope's meter (the API's proxy until a provider is set)."""
        if self._meter is None:
            from opentelemetry import metrics

            self._meter = metrics.get_meter(self.name, self.version)
        return self._meter

    def span(
        self,
        name: str,
        attributes: _Attrs | None = None,
        *,
        start_time: int | None = None,
        current: bool = True,
        parent: Span | None = None,
    ) -> Span:
        """Start span ``name`` (the do-nothing span when nothing records). ``current`` makes it
        the current span until it ends (use it with ``with``; a span that outlives the call that
        opened it passes False); ``start_time`` (ns since the epoch) backdates it; ``parent`` puts
        it under a span other than the current one."""
        if not tracing():
            return NO_SPAN
        from opentelemetry import context, trace  # loaded: something records

        try:
            ctx = trace.set_span_in_context(parent._span) if parent and parent.recording else None
            span = self.tracer.start_span(
                name, context=ctx, attributes=attributes, start_time=start_time
            )
        except Exception as exc:
            _sdk_failed("start", exc)
            return NO_SPAN
        return Span(span, context.attach(trace.set_span_in_context(span)) if current else None)

    def record_span(
        self,
        name: str,
        start_time: int,
        end_time: int,
        attributes: _Attrs | None = None,
        *,
        parent: Span | None = None,
    ) -> None:
        """Record a span that already happened (e.g. device time), from ``start_time`` to
        ``end_time`` (ns since the epoch), under ``parent`` or the current span."""
        span = self.span(name, attributes, start_time=start_time, current=False, parent=parent)
        span.end(end_time=end_time)

    # instruments: the API's own, wrapped so that recording a value never raises
    def histogram(
        self,
        name: str,
        unit: str,
        description: str,
        buckets: tuple[float, ...] | None = DURATION_BUCKETS_S,
    ) -> _Safe:
        """A histogram; durations (seconds) get :data:`DURATION_BUCKETS_S` by default."""
        return _Safe(
            lambda: self.meter.create_histogram(
                name,
                unit=unit,
                description=description,
                explicit_bucket_boundaries_advisory=list(buckets) if buckets else None,
            ),
            name,
        )

    def observable_counter(self, name: str, observe: Observe, unit: str, description: str) -> None:
        """A counter read when a metric reader collects: ``observe()`` returns
        ``(value, attributes)`` pairs (process totals kept by the package)."""
        self._observable("create_observable_counter", name, observe, unit, description)

    def observable_gauge(self, name: str, observe: Observe, unit: str, description: str) -> None:
        """A gauge read when a metric reader collects, as :meth:`observable_counter`."""
        self._observable("create_observable_gauge", name, observe, unit, description)

    def _observable(
        self, create: str, name: str, observe: Observe, unit: str, description: str
    ) -> None:
        """An observable instrument made by the meter's method ``create``, reading
        ``observe()``: now if OpenTelemetry is loaded, else once it is (a reader can only
        collect from then on, and ``observe`` reports totals)."""

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            from opentelemetry.metrics import Observation

            return [Observation(value, attributes) for value, attributes in observe()]

        def make() -> None:
            try:
                getattr(self.meter, create)(name, [callback], unit=unit, description=description)
            except Exception as exc:
                _sdk_failed(f"metric:{name}", exc)

        _sdk.when_metrics_loaded(make)


def current_span() -> Span:
    """The span current in this thread as a :class:`Span`, to pass as ``parent=`` to spans
    recorded later or from another thread; the do-nothing span when nothing records or no span
    is current. It still belongs to whoever opened it: never end it."""
    if not tracing():
        return NO_SPAN
    from opentelemetry import trace  # loaded: something records

    try:
        span = trace.get_current_span()
        if not span.get_span_context().is_valid:
            return NO_SPAN
    except Exception as exc:
        _sdk_failed("current_span", exc)
        return NO_SPAN
    return Span(span, None)
