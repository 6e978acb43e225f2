"""One deadline for a whole Redis call: connecting (TCP and TLS), authenticating, sending and
receiving, however the server paces its bytes.

redis-py's timeouts bound each socket operation, so a server that trickles a byte before every
read timeout never times out. Here the connection classes wrap their socket: before every
blocking operation its timeout is cut to what is left of the caller's deadline (set per thread
with :func:`deadline`), and past it the operation fails as a socket timeout, which redis-py
turns into ``redis.TimeoutError`` and a dropped connection. Imported only with redis-py.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from redis.connection import Connection, SSLConnection

__all__ = ["BoundedConnection", "BoundedSSLConnection", "deadline"]

_local = threading.local()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every Redis call of this thread inside the block ends within ``seconds`` in total."""
    _local.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _local.at = None


def _bounded(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of this thread's deadline (none: unchanged)."""
    at: float | None = getattr(_local, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise TimeoutError("the remote call ran past its deadline")
    return left if timeout is None else min(timeout, left)


class _Socket:
    """A connected socket whose blocking calls end by the deadline; ``settimeout`` records the
    timeout redis-py asks for, each call applies it cut to the deadline."""

    __slots__ = ("_sock", "_timeout")

    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        self._sock = sock
        self._timeout = timeout

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def recv(self, *args: Any) -> bytes:
        self._sock.settimeout(_bounded(self._timeout))
        return self._sock.recv(*args)

    def recv_into(self, *args: Any) -> int:
        self._sock.settimeout(_bounded(self._timeout))
        return self._sock.recv_into(*args)

    def sendall(self, *args: Any) -> None:
        self._sock.settimeout(_bounded(self._timeout))  # sendall: one timeout for all of it
        self._sock.sendall(*args)

    def __getattr__(self, name: str) -> Any:  # close, shutdown, fileno, pending, ...
        return getattr(self._sock, name)


def _connect(conn: Any, connect: Callable[[], socket.socket]) -> _Socket:
    # the TCP connect and the TLS handshake use the connection's two timeouts: cut both
    keep = conn.socket_connect_timeout, conn.socket_timeout
    conn.socket_connect_timeout = _bounded(keep[0])
    conn.socket_timeout = _bounded(keep[1])
    try:
        sock = connect()
    finally:
        conn.socket_connect_timeout, conn.socket_timeout = keep
    return _Socket(sock, keep[1])


class BoundedConnection(Connection):
    """``redis://``: a TCP connection bounded by the caller's deadline."""

    def _connect(self) -> Any:
        return _connect(self, super()._connect)


class BoundedSSLConnection(SSLConnection):
    """``rediss://``: a TLS connection bounded by the caller's deadline."""

    def _connect(self) -> Any:
        return _connect(self, super()._connect)
