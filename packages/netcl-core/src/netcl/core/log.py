"""Structured logging: structlog loggers over stdlib ``logging``, silent until configured.

A library never configures logging. :func:`get_logger` returns a structlog logger that hands its
events to the stdlib logger of the same name, so nothing is printed unless the application adds
handlers; :func:`configure_logging` is the opt-in helper that does so, with console or JSON
rendering and the current span's trace_id/span_id on every event.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from opentelemetry import trace

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


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger for module ``name`` (e.g. ``netcl.runtime.cache``)."""
    return structlog.wrap_logger(  # type: ignore[no-any-return]
        logging.getLogger(name),
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[
            structlog.stdlib.filter_by_level,
            add_trace_context,
            structlog.stdlib.render_to_log_kwargs,
        ],
        cache_logger_on_first_use=True,
    )


def configure_logging(
    level: int | str = logging.INFO, *, json: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """Opt-in for applications: print netcl's events (console or JSON lines) to ``stream``."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
                structlog.processors.TimeStamper(fmt="iso"),
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    logger = logging.getLogger("netcl")
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
