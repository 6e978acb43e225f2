"""Interception of pyopencl's entry points (``_contract.ENTRY_POINTS``) while captures record
(guide, "How it works": Interception, Interrupts, Threads).

The hooks are made once, at import, from the originals read then: installing and removing are
idempotent assignments of fixed objects, and ``reconcile()`` (every begin/end/reset calls it)
makes pyopencl match the live recordings whatever an interrupt cut short. A hook finds its
thread's recording in a ``threading.local``, calls pyopencl's function, then notes it;
``rec.busy`` counts hooks between the two, so ``end()`` refuses a recording that may have
missed a command. The two hooks every ``knl(...)`` goes through (the invoker's pair-wise
argument setter and the driver's enqueue) are written out (a frame saved per launch recorded);
the rest share ``_make_hook``. ``Kernel.__call__`` itself is not hooked: its hook, frame and
note, was a tenth of what recording a launch cost.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from netcl.core.contract import BOUND, ORIGINALS, EntryPoint, mem_ptr, original
from netcl.runtime.capture._recording import Args, Fn, Kwargs, RawLaunch, Recording, _new

__all__ = ["capture_disabled", "install", "is_patched", "reconcile", "thread_records", "uninstall"]


class _Local(threading.local):
    rec: Recording | None = None  # what the hooks read: the owner, unless capture_disabled()
    owner: Recording | None = None  # the recording this thread feeds
    depth = 0  # capture_disabled() nesting


_tls = _Local()
_lock = threading.RLock()
_live: set[Recording] = set()  # every recording begun and not yet stopped (its thread may be gone)
Note = Callable[[Recording, EntryPoint, Fn, Args, Kwargs, Any], None]


def _make_hook(entry: EntryPoint, orig: Callable[..., Any], note: Note) -> Callable[..., Any]:
    """A stand-in for ``orig`` that, on a recording thread, calls it and then ``note(recording,
    entry, orig, args, kwargs, result)``; other threads go straight to ``orig``."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        rec = _tls.rec
        if rec is None or not rec.live:
            return orig(*args, **kwargs)
        rec.busy += 1
        try:
            result = orig(*args, **kwargs)
        except Exception:
            rec.busy -= 1
            raise
        note(rec, entry, orig, args, kwargs, result)
        rec.busy -= 1
        return result

    return _named(hook, orig)


def _named(hook: Callable[..., Any], orig: Any) -> Callable[..., Any]:
    hook.__name__ = hook.__qualname__ = getattr(orig, "__name__", "hook")
    hook.__wrapped__ = orig  # type: ignore[attr-defined]
    return hook


def _launch_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
    """The driver's ``enqueue_nd_range_kernel`` (pyopencl's parameters and defaults): records
    the launch on a recording thread."""

    def enqueue_nd_range_kernel(
        queue: Any,
        kernel: Any,
        global_work_size: Any,
        local_work_size: Any,
        global_work_offset: Any = None,
        wait_for: Any = None,
        g_times_l: bool = False,
        allow_empty_ndrange: bool = False,
    ) -> Any:
        rec = _tls.rec
        if rec is not None and not rec.live:
            rec = None  # stopped: the launch goes through unrecorded
        if rec is not None:
            rec.busy += 1
        try:
            event = orig(
                queue,
                kernel,
                global_work_size,
                local_work_size,
                global_work_offset,
                wait_for,
                g_times_l,
                allow_empty_ndrange,
            )
        except Exception:
            if rec is not None:
                rec.busy -= 1
            raise
        if rec is None:  # not a recording thread, or inside capture_disabled()
            return event
        state = rec.kernels.get(id(kernel)) or rec._state(kernel)
        s = state.shape
        # the last launch's shape when the same objects come again (the common loop)
        if not (
            s is not None
            and s[7] is state.snapshot
            and s[1] is queue
            and s[2] is global_work_size
            and s[3] is local_work_size
            and s[4] is global_work_offset
            and s[5] is g_times_l
            and s[6] is allow_empty_ndrange
        ):
            s = rec.new_shape(
                state,
                kernel,
                queue,
                global_work_size,
                local_work_size,
                global_work_offset,
                g_times_l,
                allow_empty_ndrange,
            )
        rec.raw.append(_new(RawLaunch, (s, tuple(wait_for) if wait_for else (), event)))
        rec.busy -= 1
        return event

    return enqueue_nd_range_kernel


def _pairs_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``Kernel._set_arg_multi`` / ``_set_arg_buf_multi(flat)`` (what the invokers call): records
    the arguments on a recording thread, unless they are the same call as last time (same
    objects, equal scalars; a memory object compares by address, and a retained one keeps it)."""

    def hook(kernel: Any, flat: tuple[Any, ...]) -> None:
        rec = _tls.rec
        if rec is None or not rec.live:
            return orig(kernel, flat)  # type: ignore[no-any-return]
        rec.busy += 1
        try:
            orig(kernel, flat)
        except Exception:
            rec.busy -= 1
            raise
        state = rec.kernels.get(id(kernel))
        last = None if state is None else state.last
        try:  # == as the fast path: -0.0 after 0.0 passes (test_capture.py, xfail)
            same = last is not None and last[0] is orig and last[1] == flat
        except ValueError:  # an array argument: noted the long way
            same = False
        if not same:
            rec.note_pairs(orig, kernel, flat)
        rec.busy -= 1
        return None

    return hook


def _native_hook(entry: EntryPoint, orig: Any) -> Any:
    """An ``int_ptr`` property (kind ``handle``) or a ``from_int_ptr`` (``wrap``) noting who
    reaches the raw handle on a recording thread."""
    reached = f"{entry.owner.removeprefix('pyopencl.')}.{entry.name}"
    fn = orig.fget if entry.kind == "handle" else orig

    def hook(*args: Any, **kwargs: Any) -> Any:
        rec = _tls.rec
        if rec is not None and rec.live:
            rec.note_native(reached, sys._getframe(1))
        return fn(*args, **kwargs)

    hook = _named(hook, fn)
    return property(hook, doc=orig.__doc__) if entry.kind == "handle" else staticmethod(hook)


class _BufferStandIn:
    """``pyopencl.Buffer`` while recording: makes the real class's buffers (nothing of the
    stand-in outlives the call) and notes, on a recording thread, each one's birth. To code that
    asks, it is the class: ``isinstance``, ``issubclass``, its attributes, a subclass of it."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        buf = self.cls(*args, **kwargs)
        if (rec := _tls.rec) is not None and rec.live:
            rec.born.add(mem_ptr(buf))
        return buf

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self.cls)

    def __subclasscheck__(self, cls: type) -> bool:
        return issubclass(cls, self.cls)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type]:
        return (self.cls,)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cls, name)


def _pool_hook(orig: Callable[..., Any]) -> Callable[..., Any]:
    """A pyopencl ``MemoryPool``'s ``allocate`` / ``__call__``: on a recording thread, the block
    it hands out is the recorded code's allocation (made now, or held by the pool and so of
    undefined contents), an arena candidate."""

    def hook(pool: Any, size: int) -> Any:
        block = orig(pool, size)
        if (rec := _tls.rec) is not None and rec.live:
            rec.born.add(mem_ptr(block))
        return block

    return _named(hook, orig)


_invoker_memo: dict[Any, Any] = {}


def _memo_invoker(*args: Any, **kwargs: Any) -> Any:
    """pyopencl builds an invoker for every new Kernel object (an sqlite query, ~1 ms); while
    recording, identical requests get the first (pure code) answer: a replay clone costs µs."""
    orig = original("pyopencl.invoker", "generate_enqueue_and_set_args")
    try:
        named = sorted(
            (k, tuple(d.int_ptr for d in v) if k == "devs" else v) for k, v in kwargs.items()
        )
        key = (args, tuple(named))
        found = _invoker_memo.get(key)
    except TypeError:  # an unhashable argument type: no memo
        return orig(*args, **kwargs)
    if found is None:
        found = _invoker_memo[key] = orig(*args, **kwargs)
    return found


# the hooks by kind: the two of every launch, and the generic ones with the note of each
_LAUNCH_HOOKS = {"launch": _launch_hook, "setter_pairs": _pairs_hook}
_NOTES: dict[str, Note] = {
    "setter_triples": Recording.note_pack,
    "setter": Recording.note_one,
    "transfer": Recording.note_transfer,
    "order": Recording.note_transfer,
    "finish": Recording.note_finish,
    "host_wait": Recording.note_wait,
    "event_wait": Recording.note_wait,
}


def _hook_for(entry: EntryPoint, orig: Any) -> Any:
    """The stand-in for one table entry (None: never replaced)."""
    kind = entry.kind
    if kind in _NOTES:
        return _make_hook(entry, orig, _NOTES[kind])
    if kind in _LAUNCH_HOOKS:
        return _named(_LAUNCH_HOOKS[kind](orig), orig)
    if kind in ("handle", "wrap"):
        return _native_hook(entry, orig)
    if kind == "alloc":
        return _BufferStandIn(orig) if isinstance(orig, type) else _pool_hook(orig)
    return _memo_invoker if kind == "invoker" else None


def _hooks() -> dict[tuple[Any, str], Any]:
    made: dict[int, Any] = {}  # one object under two names gets one hook
    hooks: dict[tuple[Any, str], Any] = {}
    for entry, owner, orig in BOUND:
        if (hook := made.get(id(orig))) is None:
            hook = made[id(orig)] = _hook_for(entry, orig)
        if hook is not None:
            hooks[(owner, entry.name)] = hook
    return hooks


# made once: installing is assigning these, removing is assigning the originals
HOOKS: dict[tuple[Any, str], Any] = _hooks()
# what reconcile() puts back: the originals of every hooked attribute
_RESTORE: dict[tuple[Any, str], Any] = {key: ORIGINALS[key] for key in HOOKS}


def install(rec: Recording) -> None:
    """Start feeding ``rec`` with the commands of the calling thread (patching pyopencl)."""
    with _lock:
        other = _tls.owner
        if other is not None and other.live and other is not rec:
            raise RuntimeError(
                "KernelCapture.begin: this thread is already recording into another "
                "KernelCapture; end() that one first (captures of one thread do "
                "not nest)"
            )
        rec.live = True
        _live.add(rec)
        _tls.owner = rec
        _tls.rec = None if _tls.depth else rec
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
    Idempotent, and safe to interrupt: a later call finishes the job."""
    with _lock:
        for rec in [r for r in _live if not (r.live or r.pinned)]:
            _live.discard(rec)
        table = HOOKS if _live else _RESTORE
        for (owner, name), obj in table.items():
            if owner.__dict__.get(name) is not obj:
                setattr(owner, name, obj)


def thread_records() -> bool:
    """Whether the calling thread records into a KernelCapture now (inside
    ``capture_disabled()`` too: its recording goes on after the block)."""
    if not _live:  # no recording anywhere: one set test
        return False
    owner = _tls.owner
    return owner is not None and owner.live


def is_patched() -> bool:
    """Whether any pyopencl entry point is not its original now (for tests and diagnostics)."""
    return any(owner.__dict__.get(name) is not obj for (owner, name), obj in ORIGINALS.items())


@contextlib.contextmanager
def capture_disabled() -> Iterator[None]:
    """Run the block without recording: launches, copies and fills in it execute but are not
    captured. Nestable; affects only the calling thread; also usable as a decorator."""
    # the hooks read one attribute: the thread's recording, or None inside this block
    _tls.depth += 1
    _tls.rec = None
    try:
        yield
    finally:
        _tls.depth -= 1
        if not _tls.depth:
            _tls.rec = _tls.owner
