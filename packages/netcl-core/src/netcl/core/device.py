"""Default OpenCL context/queue and a stable device identity for cache keys."""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import pyopencl as cl

from netcl.core import settings

if TYPE_CHECKING:
    from netcl.core.profiling import Collector

__all__ = [
    "NoDeviceError",
    "default_context",
    "default_queue",
    "device_identity",
    "pick_device",
    "checker",
    "claim_held",
    "finish_at_exit",
    "held_blocks",
    "out_of_order",
    "watcher",
]

#: pyopencl's variable choosing the platform and device (``0``, ``0:1``, a name's start).
CTX_ENV = settings.PYOPENCL_CTX.name


class NoDeviceError(RuntimeError):
    """No OpenCL device could be chosen: no platform, no device, or a ``PYOPENCL_CTX`` that
    matches none. The message (one line) names ``PYOPENCL_CTX`` and its value, and lists the
    platforms and devices there are."""


_PROFILING = cl.command_queue_properties.PROFILING_ENABLE
_OUT_OF_ORDER = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
_lock = threading.Lock()
_context: cl.Context | None = None
_queues: dict[tuple[int, str], cl.CommandQueue] = {}


def pick_device() -> cl.Device:
    """The device netcl uses by default: ``PYOPENCL_CTX``'s when set, otherwise the first GPU of
    any platform, else the first device of any kind; :class:`NoDeviceError` when there is none."""
    if settings.PYOPENCL_CTX.value():
        return _context_from_env().devices[0]
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:  # the ICD loader raises when no platform is installed
        raise _no_device(f"no OpenCL platform found ({exc})") from exc
    devices = [d for p in platforms for d in _devices_of(p)]
    if not devices:
        raise _no_device("no OpenCL device found")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


def _context_from_env() -> cl.Context:
    try:
        return cl.create_some_context(interactive=False)
    except cl.Error as exc:  # pyopencl's "input did not match any platform", "no devices found"
        raise _no_device(f"matches no OpenCL device (pyopencl: {exc})") from exc


def _no_device(why: str) -> NoDeviceError:
    """The one error for every way of finding no device, on one line: what went wrong, the
    variable and its value, every platform and device, and what to do."""
    value = settings.PYOPENCL_CTX.value()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    parts, devices = [], 0  # every platform and device, in PYOPENCL_CTX's numbering
    for i, plat in enumerate(platforms):
        devs = _devices_of(plat)
        devices += len(devs)
        names = ", ".join(f"[{i}:{j}] {dev.name.strip()}" for j, dev in enumerate(devs))
        parts.append(f"[{i}] {plat.name.strip()}: {names or 'no devices'}")
    listed = "; ".join(parts)
    advice = (
        "install a vendor OpenCL driver, or PoCL for the CPU with `pip install 'pyopencl[pocl]'`"
    )
    if devices:
        advice = (
            f"set {CTX_ENV} to a platform or platform:device index listed here (e.g. "
            f"{CTX_ENV}=0), or unset it to let netcl choose"
        )
    text = f"{CTX_ENV}={value!r} {why}" if value else f"{why} ({CTX_ENV} is not set)"
    text = f"{text}; OpenCL platforms and devices: {listed or 'none'}; {advice}"
    return NoDeviceError(" ".join(text.split()))  # one line, whatever a driver's name holds


def _devices_of(platform: cl.Platform) -> list[cl.Device]:
    try:
        return list(platform.get_devices())
    except cl.Error:  # a platform with no devices raises DEVICE_NOT_FOUND
        return []


def default_context() -> cl.Context:
    """The process-wide default context (created on first call, on :func:`pick_device`)."""
    global _context
    with _lock:
        if _context is None:
            from_env = settings.PYOPENCL_CTX.value()
            _context = _context_from_env() if from_env else cl.Context([pick_device()])
        return _context


def default_queue(
    ctx: cl.Context | None = None, *, profiling: bool | None = None
) -> cl.CommandQueue:
    """The in-order command queue on ``ctx`` (default context when None) for the profiling
    setting, made on first use: ``profiling=True`` gives one with ``PROFILING_ENABLE`` (device
    timestamps on its events); ``None`` reads ``NETCL_PROFILE``: ``summary`` gives a plain
    queue whose units are stamped on a side queue, or, where the device cannot do that (said
    once in the log), a profiling one."""
    setting = (
        settings.PROFILE.value("off") if profiling is None else ("commands" if profiling else "off")
    )
    ctx = ctx or default_context()
    key = (ctx.int_ptr, setting)
    with _lock:
        if (queue := _queues.get(key)) is None:
            queue = cl.CommandQueue(ctx, properties=_PROFILING if setting == "commands" else 0)
            if setting == "summary" and watcher(queue) is None:  # not bracketed: profiled
                queue = cl.CommandQueue(ctx, properties=_PROFILING)
            _queues[key] = queue
        return queue


def watcher(*queues: cl.CommandQueue) -> Collector | None:
    """The device-time collector when :func:`netcl.core.profiling.enabled` holds for every one of
    ``queues`` (several only if all profile: a plain queue's units are stamped one queue at a time),
    else None: the check a package makes once per queue. Device time loads here with the first
    profiling queue or in summary mode, so a process without either never imports it."""
    plain = sum(not q.properties & _PROFILING for q in queues)
    if not queues or (plain and (len(queues) > 1 or not _summary())):
        return None  # a plain queue outside summary mode: nothing to load
    from netcl.core import profiling

    return profiling.collector() if all(map(profiling.enabled, queues)) else None


def _summary() -> bool:
    """Whether summary mode is on: set in code (the collector's mode), else by NETCL_PROFILE."""
    mode = settings.profile_in_code
    return mode == "summary" if mode else settings.PROFILE.raw().strip().lower() == "summary"


class Checking(Protocol):
    """What checked mode offers the packages (``netcl.core.memory.Checker``)."""

    def guarded(self, ptr: int) -> tuple[Any, Any, Any, str] | None: ...
    def check_all(self, who: str) -> None: ...


# set by netcl.core.memory as it loads (_use_pools): its checker, held and claim. A process
# that never made a BufferPool never imports it, and has no checked pool and no held block.
_Seams: TypeAlias = tuple[
    Callable[[], Checking | None], Callable[[], set[int]], Callable[[set[int]], list[Any]]
]
_pools: _Seams | None = None


def _use_pools(seams: _Seams) -> None:
    """netcl.core.memory's answers to the pool seams below (checker, held, claim), given as it
    loads."""
    global _pools
    _pools = seams


def checker() -> Checking | None:
    """Checked mode's seam, as :func:`watcher` is device time's: the checker while a checked
    BufferPool is alive, else None; loads nothing."""
    return None if _pools is None else _pools[0]()


def held_blocks() -> set[int]:
    """The ``int_ptr`` of every block the live BufferPools hold for reuse (released, not handed
    out again): memory nothing outside its pool can reach. Loads nothing."""
    return set() if _pools is None else _pools[1]()


def claim_held(ptrs: set[int]) -> list[Any]:
    """Take the blocks of ``ptrs`` (by ``int_ptr``) that live BufferPools hold for reuse out of
    their pools, which count them as in use from then on, and return them: the caller keeps
    them, and no pool hands them out again. Loads nothing."""
    return [] if _pools is None else _pools[2](ptrs)


def out_of_order(queue: cl.CommandQueue) -> bool:
    """Whether ``queue`` may run its commands out of order (then only events order them)."""
    return bool(queue.properties & _OUT_OF_ORDER)


def device_identity(device: cl.Device) -> str:
    """A stable string naming a device and the software that compiles for it (platform name and
    version, device name and version, driver version: a change makes compiled binaries stale)."""
    platform = device.platform
    parts = (platform.name, platform.version, device.name, device.version, device.driver_version)
    return " | ".join(p.strip() for p in parts)


# A process ending right after enqueuing work (replays above all) left commands running while
# the interpreter freed what they use: PoCL crashed at exit (1 run in 10). So the queues of the
# live owners registered here are finished at exit.
_AT_EXIT = weakref.WeakKeyDictionary[object, tuple[cl.CommandQueue, ...]]()


def finish_at_exit(owner: object, queues: Iterable[cl.CommandQueue]) -> None:
    """Finish ``queues`` when the process exits, if ``owner`` (weakly referable) is still alive:
    for objects that enqueue work on memory they hold (a capture's replay program)."""
    _AT_EXIT[owner] = tuple(queues)


@atexit.register
def _finish_all() -> None:
    for queues in list(_AT_EXIT.values()):
        for queue in queues:
            with contextlib.suppress(cl.Error):
                queue.finish()
