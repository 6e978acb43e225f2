"""Structured logging: structlog loggers over stdlib ``logging``, silent until configured.

A library never configures logging. :func:`get_logger` returns a structlog logger that hands its
events to the stdlib logger of the same name, so nothing is printed unless the application adds
handlers; :func:`configure_logging` is the opt-in helper that does so, with console or JSON
rendering and the current span's trace_id/span_id on every event.

Each event reaches stdlib ``logging`` as a one-line message ``event key=value ...`` (values
quoted when they contain spaces, newlines or quotes), so any handler, even a plain
``logging.basicConfig()``, shows every field; the fields are also record attributes (``event``
holds the event name) for handlers and filters that want them one by one.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from opentelemetry import trace

from netcl.core._otel_setup import _value

__all__ = ["add_trace_context", "configure_logging", "get_logger"]

# The library convention: a NullHandler on the top logger keeps Python's last-resort handler from
# printing netcl warnings to stderr when the application configured nothing.
logging.getLogger("netcl").addHandler(logging.NullHandler())


def add_trace_context(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: add ``trace_id`` and ``span_id`` of the current span, if any."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = format(ctx.trace_id, "032x")
        event_dict["span_id"] = format(ctx.span_id, "016x")
    return event_dict


def _to_stdlib(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Last processor: stdlib keyword arguments whose message is the whole event, one line."""
    event = event_dict["event"]
    kwargs = structlog.stdlib.render_to_log_kwargs(logger, method, event_dict)  # type: ignore[arg-type]
    fields = kwargs["extra"]
    kwargs["msg"] = " ".join([str(event), *(f"{k}={_value(v)}" for k, v in fields.items())])
    fields["event"] = event
    return kwargs


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger for module ``name`` (e.g. ``netcl.runtime.cache``)."""
    return structlog.wrap_logger(  # type: ignore[no-any-return]
        logging.getLogger(name),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[
            structlog.stdlib.filter_by_level,
            add_trace_context,
            _to_stdlib,
        ],
        cache_logger_on_first_use=True,
    )


_handler: list[logging.Handler] = []  # the handler configure_logging() installed, if any


def configure_logging(
    level: int | str = logging.INFO, *, json: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Opt-in for applications: print netcl's events (console or JSON lines) to ``stream``.

    Calling it again replaces the handler it installed (each event is still printed once).
    """
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
