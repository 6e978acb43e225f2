"""Interception of pyopencl's launch, argument and transfer entry points during a capture.

The hooks are installed while at least one capture records and removed (the exact original
objects put back) when the last one ends, so launches outside a capture pay nothing. A hook asks
one dict lookup, keyed by the calling thread, whether that thread records; other threads pass
straight through to pyopencl.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import pyopencl as cl
import pyopencl._cl as _cl

if TYPE_CHECKING:
    from netcl.runtime.capture._recording import Recording

__all__ = ["capture_disabled", "install", "uninstall"]

_lock = threading.Lock()
# thread ident -> the recording that thread feeds
_active: dict[int, Recording] = {}
_tls = threading.local()
_get_ident = threading.get_ident

# pyopencl's buffer/image transfer primitives and the position of their ``wait_for`` argument.
# ``cl.enqueue_copy``, ``cl.enqueue_fill_buffer`` and pyopencl.array's get/set all end here.
TRANSFERS: dict[str, int] = {
    "_enqueue_read_buffer": 4,
    "_enqueue_write_buffer": 4,
    "_enqueue_copy_buffer": 6,
    "_enqueue_read_buffer_rect": 8,
    "_enqueue_write_buffer_rect": 8,
    "_enqueue_copy_buffer_rect": 8,
    "_enqueue_fill_buffer": 5,
    "_enqueue_read_image": 7,
    "_enqueue_write_image": 7,
    "_enqueue_copy_image": 6,
    "_enqueue_copy_image_to_buffer": 6,
    "_enqueue_copy_buffer_to_image": 6,
}

# The argument setters pyopencl's generated invokers call (``self._set_arg_multi(...)`` etc.).
ARG_SETTERS = ("_set_arg_multi", "_set_arg_buf_multi", "_set_arg_buf_pack_multi")

# (owner, attribute) -> the object that was there before patching
_saved: dict[tuple[Any, str], Any] = {}


def install(rec: Recording) -> None:
    """Start feeding ``rec`` with the launches of its thread (patching pyopencl if first)."""
    with _lock:
        other = _active.get(rec.thread)
        if other is not None:
            raise RuntimeError(
                "KernelCapture.begin: this thread is already recording into another "
                "KernelCapture; end() that one first (captures of one thread do not nest)"
            )
        if not _active:
            _patch()
        _active[rec.thread] = rec


def uninstall(rec: Recording) -> None:
    """Stop feeding ``rec``; the last one out restores pyopencl exactly. Idempotent."""
    with _lock:
        if _active.get(rec.thread) is rec:
            del _active[rec.thread]
            if not _active:
                _unpatch()


def is_patched() -> bool:
    """Whether pyopencl is patched now (for tests and diagnostics)."""
    return bool(_saved)


def _patch() -> None:
    orig_call = cl.Kernel.__dict__["__call__"]
    orig_enqueue = cl.enqueue_nd_range_kernel
    patches: list[tuple[Any, str, Callable[..., Any]]] = [
        (cl.Kernel, "__call__", _make_hook("__call__", orig_call, _note_call)),
        (cl, "enqueue_nd_range_kernel",
         _make_hook("enqueue_nd_range_kernel", orig_enqueue, _note_enqueue)),
    ]
    for name in ("set_arg", *ARG_SETTERS):
        orig = cl.Kernel.__dict__[name]
        patches.append((cl.Kernel, name, _make_hook(name, orig, partial(_note_setter, name, orig))))
    for name, wait_pos in TRANSFERS.items():
        orig = getattr(_cl, name, None)
        if orig is not None:  # images may be missing from some builds
            note = partial(_note_transfer, name, orig, wait_pos)
            patches.append((_cl, name, _make_hook(name, orig, note)))
    try:
        for owner, name, hook in patches:
            _saved[(owner, name)] = owner.__dict__[name]
            setattr(owner, name, hook)
    except BaseException:
        _unpatch()  # never leave pyopencl half patched
        raise


def _unpatch() -> None:
    for (owner, name), orig in _saved.items():
        setattr(owner, name, orig)
    _saved.clear()


def _make_hook(
    name: str, orig: Callable[..., Any], note: Callable[[Recording, tuple[Any, ...], Any], None]
) -> Callable[..., Any]:
    """A stand-in for ``orig`` that, on a recording thread, calls it and then
    ``note(recording, args, kwargs)``; other threads go straight to ``orig``."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        rec = _active.get(_get_ident())
        if rec is None or getattr(_tls, "depth", 0) > 0:
            return orig(*args, **kwargs)
        result = orig(*args, **kwargs)
        note(rec, args, kwargs)
        return result

    hook.__name__ = hook.__qualname__ = name
    hook.__wrapped__ = orig  # type: ignore[attr-defined]
    return hook


def _note_call(rec: Recording, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    rec.add_call(args[0], args[1:], kwargs)


def _note_enqueue(rec: Recording, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    rec.add_enqueue(args, kwargs)


def _note_setter(
    name: str, orig: Callable[..., Any], rec: Recording, args: tuple[Any, ...], _: Any
) -> None:
    rec.note_args(args[0], name, orig, args[1:])


def _note_transfer(
    name: str,
    orig: Callable[..., Any],
    wait_pos: int,
    rec: Recording,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    rec.add_transfer(name, orig, wait_pos, args, kwargs)


@contextlib.contextmanager
def capture_disabled() -> Iterator[None]:
    """Run the block without recording: launches, copies and fills in it execute but are not
    captured. Nestable; affects only the calling thread; also usable as a decorator."""
    _tls.depth = getattr(_tls, "depth", 0) + 1
    try:
        yield
    finally:
        _tls.depth -= 1
