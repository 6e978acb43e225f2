"""Interception of pyopencl's launch, argument, transfer and sync entry points during a capture.

The hooks are installed while at least one capture records and removed (the exact original
objects put back) when the last one ends, so launches outside a capture pay nothing.

Interrupt safety: the original objects are read once, at import, and the hooks are made once, so
installing and removing are idempotent assignments of fixed objects. ``reconcile()`` makes
pyopencl match the set of live recordings (patched if any is live, exactly original otherwise);
every begin/end/reset calls it, so whatever a KeyboardInterrupt interrupted, the next call of
any of them repairs it. Hooks never stack: a hook is only ever replaced by an original.

A hook finds the recording of its thread in a ``threading.local``: a thread that exits takes
its slot with it, so a capture begun in a dead thread never records another thread (thread
ids are reused by the OS, ``threading.local`` slots are not).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pyopencl as cl
import pyopencl._cl as _cl
import pyopencl.invoker as _invoker

from netcl.runtime.capture._recording import Recording, note_setter

__all__ = ["capture_disabled", "install", "is_patched", "reconcile", "uninstall"]

# pyopencl's buffer/image transfer primitives and the position of their ``wait_for`` argument
# (checked against pyopencl's own signatures by the tests).
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
    # ordering only: recorded so that replay keeps the dependencies they express
    "_enqueue_marker_with_wait_list": 1,
    "_enqueue_barrier_with_wait_list": 1,
}

# Every kernel argument setter: the public ones and those pyopencl's generated invokers call
# (``self._set_arg_multi(...)`` etc.).
ARG_SETTERS = (
    "set_arg", "_set_arg_multi", "_set_arg_buf_multi", "_set_arg_buf_pack_multi",
    "_set_arg_null", "_set_arg_buf", "_set_arg_svm",
)

_tls = threading.local()
_lock = threading.RLock()
# every recording begun and not yet stopped (its thread may have exited)
_live: set[Recording] = set()


def _originals() -> dict[tuple[Any, str], Any]:
    found: dict[tuple[Any, str], Any] = {
        (cl.Kernel, "__call__"): cl.Kernel.__dict__["__call__"],
        # one object under two names: ``cl.`` for applications, ``_cl.`` for the invokers
        (cl, "enqueue_nd_range_kernel"): cl.__dict__["enqueue_nd_range_kernel"],
        (_cl, "enqueue_nd_range_kernel"): _cl.__dict__["enqueue_nd_range_kernel"],
        (cl.CommandQueue, "finish"): cl.CommandQueue.__dict__["finish"],
        # host-side waits: they order the commands issued after them (see Recording.add_wait)
        (cl, "wait_for_events"): cl.__dict__["wait_for_events"],
        (_cl, "wait_for_events"): _cl.__dict__["wait_for_events"],
        (cl.Event, "wait"): cl.Event.__dict__["wait"],
        (_invoker, "generate_enqueue_and_set_args"):
            _invoker.__dict__["generate_enqueue_and_set_args"],
    }
    for name in ARG_SETTERS:
        found[(cl.Kernel, name)] = cl.Kernel.__dict__[name]
    for name in TRANSFERS:
        if name in _cl.__dict__:  # images may be missing from some builds
            found[(_cl, name)] = _cl.__dict__[name]
    return found


# (owner, attribute) -> pyopencl's own object, read once at import
ORIGINALS: dict[tuple[Any, str], Any] = _originals()


def _make_hook(
    orig: Callable[..., Any], note: Callable[[Recording, tuple[Any, ...], Any, Any], None]
) -> Callable[..., Any]:
    """A stand-in for ``orig`` that, on a recording thread, calls it and then
    ``note(recording, args, kwargs, result)``; other threads go straight to ``orig``.

    ``rec.busy`` counts hooks between "orig may have run" and "noted": if anything (a
    KeyboardInterrupt) escapes in between, it stays non-zero and ``end()`` refuses to freeze a
    recording that may have missed a command. An ``Exception`` from ``orig`` itself means the
    command was not issued, so it is not counted.
    """

    def hook(*args: Any, **kwargs: Any) -> Any:
        rec = getattr(_tls, "rec", None)
        if rec is None or not rec.live:
            return orig(*args, **kwargs)
        rec.busy += 1
        try:
            result = orig(*args, **kwargs)
        except Exception:
            rec.busy -= 1
            raise
        note(rec, args, kwargs, result)
        rec.busy -= 1
        return result

    hook.__name__ = hook.__qualname__ = getattr(orig, "__name__", "hook")
    hook.__wrapped__ = orig  # type: ignore[attr-defined]
    return hook


def _call_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Kernel.__call__``: lends its arguments to the launch the invoker then enqueues
    (recorded by the ``enqueue_nd_range_kernel`` hook, which also sees the wait list the
    invoker adds for array arguments)."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        rec = getattr(_tls, "rec", None)
        if rec is None or not rec.live:
            return orig(*args, **kwargs)
        outer, rec.call_args = rec.call_args, args
        try:
            return orig(*args, **kwargs)
        finally:
            rec.call_args = outer

    hook.__name__ = hook.__qualname__ = "__call__"
    hook.__wrapped__ = orig  # type: ignore[attr-defined]
    return hook


_invoker_memo: dict[Any, Any] = {}


def _memo_invoker(*args: Any, **kwargs: Any) -> Any:
    """pyopencl builds an invoker for every new Kernel object (a hash and an sqlite query,
    ~1 ms); while a capture records, identical requests get the first answer (the generated
    functions are pure code), so cloning kernels for replay costs microseconds."""
    orig = ORIGINALS[(_invoker, "generate_enqueue_and_set_args")]
    try:
        key = (args, tuple(sorted(
            (k, tuple(d.int_ptr for d in v) if k == "devs" else v) for k, v in kwargs.items()
        )))
        found = _invoker_memo.get(key)
    except TypeError:  # an unhashable argument type: no memo
        return orig(*args, **kwargs)
    if found is None:
        found = _invoker_memo[key] = orig(*args, **kwargs)
    return found


def _note_finish(rec: Recording, args: tuple[Any, ...], kwargs: Any, _: Any) -> None:
    rec.add_finish(args[0])


def _note_event_wait(rec: Recording, args: tuple[Any, ...], kwargs: Any, _: Any) -> None:
    rec.add_wait((args[0],))


def _note_events_wait(rec: Recording, args: tuple[Any, ...], kwargs: Any, _: Any) -> None:
    rec.add_wait(args[0])  # its one parameter (a sequence) is positional-only


def _setter_note(name: str) -> Callable[[Recording, tuple[Any, ...], Any, Any], None]:
    return partial(note_setter, name, ORIGINALS[(cl.Kernel, name)])


def _transfer_note(
    name: str, wait_pos: int
) -> Callable[[Recording, tuple[Any, ...], Any, Any], None]:
    fn = ORIGINALS[(_cl, name)]

    def note(rec: Recording, args: tuple[Any, ...], kwargs: Any, event: Any) -> None:
        rec.add_transfer(name, fn, wait_pos, args, kwargs, event)

    return note


def _hooks() -> dict[tuple[Any, str], Callable[..., Any]]:
    notes: dict[tuple[Any, str], Callable[[Recording, tuple[Any, ...], Any, Any], None]] = {
        (cl.CommandQueue, "finish"): _note_finish,
        (cl.Event, "wait"): _note_event_wait,
    }
    for name in ARG_SETTERS:
        notes[(cl.Kernel, name)] = _setter_note(name)
    for name, wait_pos in TRANSFERS.items():
        if (_cl, name) in ORIGINALS:
            notes[(_cl, name)] = _transfer_note(name, wait_pos)
    hooks = {key: _make_hook(ORIGINALS[key], note) for key, note in notes.items()}
    enqueue = _make_hook(ORIGINALS[(_cl, "enqueue_nd_range_kernel")], Recording.add_enqueue)
    hooks[(cl, "enqueue_nd_range_kernel")] = hooks[(_cl, "enqueue_nd_range_kernel")] = enqueue
    # one object under two names, like enqueue_nd_range_kernel
    waits = _make_hook(ORIGINALS[(_cl, "wait_for_events")], _note_events_wait)
    hooks[(cl, "wait_for_events")] = hooks[(_cl, "wait_for_events")] = waits
    hooks[(cl.Kernel, "__call__")] = _call_hook(ORIGINALS[(cl.Kernel, "__call__")])
    hooks[(_invoker, "generate_enqueue_and_set_args")] = _memo_invoker
    return hooks


# made once: installing is assigning these, removing is assigning ORIGINALS
HOOKS: dict[tuple[Any, str], Callable[..., Any]] = _hooks()


def install(rec: Recording) -> None:
    """Start feeding ``rec`` with the commands of the calling thread (patching pyopencl)."""
    with _lock:
        other = getattr(_tls, "owner", None)
        if other is not None and other.live and other is not rec:
            raise RuntimeError(
                "KernelCapture.begin: this thread is already recording into another "
                "KernelCapture; end() that one first (captures of one thread do not nest)"
            )
        rec.live = True
        _live.add(rec)
        _tls.owner = rec
        # what the hooks read: the owner, unless inside capture_disabled()
        _tls.rec = None if getattr(_tls, "depth", 0) else rec
        reconcile()
        rec.started = True


def uninstall(rec: Recording) -> None:
    """Stop feeding ``rec``; the last one out restores pyopencl exactly. Idempotent."""
    rec.live = False  # first: from here on no hook records into it
    rec.pinned = False
    with _lock:
        _live.discard(rec)
        reconcile()


def reconcile() -> None:
    """Make pyopencl match the live recordings: hooked if any, exactly original otherwise.

    Idempotent, and safe to interrupt: a later call finishes the job.
    """
    with _lock:
        for rec in [r for r in _live if not (r.live or r.pinned)]:
            _live.discard(rec)
        table = HOOKS if _live else ORIGINALS
        for (owner, name), obj in table.items():
            if owner.__dict__.get(name) is not obj:
                setattr(owner, name, obj)


def is_patched() -> bool:
    """Whether any pyopencl entry point is not its original now (for tests and diagnostics)."""
    return any(owner.__dict__.get(name) is not obj for (owner, name), obj in ORIGINALS.items())


@contextlib.contextmanager
def capture_disabled() -> Iterator[None]:
    """Run the block without recording: launches, copies and fills in it execute but are not
    captured. Nestable; affects only the calling thread; also usable as a decorator."""
    # the hooks read one attribute: the thread's recording, or None inside this block
    _tls.depth = getattr(_tls, "depth", 0) + 1
    _tls.rec = None
    try:
        yield
    finally:
        _tls.depth -= 1
        if not _tls.depth:
            _tls.rec = getattr(_tls, "owner", None)
