"""Structured logging: structlog loggers over stdlib ``logging``, silent until an application
configures it (:func:`configure_logging`). The package's guide says how events reach ``logging``,
and why structlog loads on first use."""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Hashable, MutableMapping
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import structlog

__all__ = ["LazyLogger", "add_trace_context", "configure_logging", "get_logger", "warn_once"]

# The library convention: a NullHandler on the top logger keeps Python's last-resort handler from
# printing netcl warnings to stderr when the application configured nothing.
logging.getLogger("netcl").addHandler(logging.NullHandler())


def add_trace_context(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: add ``trace_id`` and ``span_id`` of the current span, if any."""
    if (trace := sys.modules.get("opentelemetry.trace")) is None:
        return event_dict  # not loaded: no span can be current
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


def _value(v: object) -> str:
    """One token of a key=value line: quoted (JSON, newlines escaped) when it has to be."""
    s = v if isinstance(v, str) else str(v)
    if not s or any(c.isspace() or c in '"=' for c in s):
        import json  # loaded here: only an event or span with such a value needs it

        return json.dumps(s)
    return s


def _to_stdlib(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Last processor: stdlib keyword arguments whose message is the whole event, one line."""
    import structlog

    event = event_dict["event"]
    kwargs = structlog.stdlib.render_to_log_kwargs(logger, method, event_dict)  # type: ignore[arg-type]
    fields = kwargs["extra"]
    kwargs["msg"] = " ".join([str(event), *(f"{k}={_value(v)}" for k, v in fields.items())])
    fields["event"] = event
    return kwargs


class LazyLogger:
    """What :func:`get_logger` returns: structlog's stdlib bound logger, made on the first event
    that passes the stdlib level check. ``debug`` / ``info`` / ``warning`` / ``error`` /
    ``critical`` / ``exception(event, **fields)`` and ``bind(**fields)`` work without loading
    structlog; anything else of structlog's ``BoundLogger`` loads it and is passed through."""

    __slots__ = ("_context", "_logger", "_name", "_stdlib")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._stdlib = logging.getLogger(name)
        self._context = context or {}
        self._logger: structlog.stdlib.BoundLogger | None = None

    def _structlog(self) -> structlog.stdlib.BoundLogger:
        if self._logger is None:
            import structlog

            logger = structlog.wrap_logger(
                self._stdlib,
                wrapper_class=structlog.stdlib.BoundLogger,
                processors=[structlog.stdlib.filter_by_level, add_trace_context, _to_stdlib],
                cache_logger_on_first_use=True,
            )
            self._logger = logger.bind(**self._context) if self._context else logger
        return self._logger

    def _emit(self, level: int, method: str, event: str, **fields: Any) -> Any:
        if not self._stdlib.isEnabledFor(level):  # what structlog's filter_by_level asks
            return None
        return getattr(self._structlog(), method)(event, **fields)

    # log(event, **fields) at each level; exception() adds the exception being handled
    debug = functools.partialmethod(_emit, logging.DEBUG, "debug")
    info = functools.partialmethod(_emit, logging.INFO, "info")
    warning = functools.partialmethod(_emit, logging.WARNING, "warning")
    error = functools.partialmethod(_emit, logging.ERROR, "error")
    critical = functools.partialmethod(_emit, logging.CRITICAL, "critical")
    exception = functools.partialmethod(_emit, logging.ERROR, "exception")

    def bind(self, **fields: Any) -> LazyLogger:
        """A logger that adds ``fields`` to every event."""
        return LazyLogger(self._name, {**self._context, **fields})

    def __getattr__(self, name: str) -> Any:
        # the rest of structlog's BoundLogger API (new, unbind, log, ...): loads structlog
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._structlog(), name)

    def __repr__(self) -> str:
        return f"<LazyLogger {self._name} context={self._context!r}>"


def get_logger(name: str) -> LazyLogger:
    """A structured logger for module ``name`` (e.g. ``netcl.runtime.cache``)."""
    return LazyLogger(name)


_warned: set[Hashable] = set()
_warned_lock = threading.Lock()


def warn_once(logger: LazyLogger, key: Hashable, event: str, **fields: Any) -> bool:
    """Log warning ``event`` the first time this process sees ``key`` (e.g.
    ``("cache_config_invalid", variable, value)``); later calls with an equal key do nothing.
    Returns whether it logged. The one warn-once of every netcl package."""
    with _warned_lock:
        if key in _warned:
            return False
        _warned.add(key)
    logger.warning(event, **fields)
    return True


_handler: list[logging.Handler] = []  # the handler configure_logging() installed, if any


def configure_logging(
    level: int | str = logging.INFO, *, json: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Opt-in for applications: print netcl's events (console or JSON lines) to ``stream``
    (stderr); calling it again replaces the handler it installed."""
    import structlog

    renderer: Any = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                # the event's fields, kept as record attributes by get_logger's loggers
                structlog.stdlib.ExtraAdder(),
                structlog.processors.TimeStamper(fmt="iso"),
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    logger = logging.getLogger("netcl")
    while _handler:
        logger.removeHandler(_handler.pop())
    logger.addHandler(handler)
    _handler.append(handler)
    logger.setLevel(level)
    return handler
