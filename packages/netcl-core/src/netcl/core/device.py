"""Default OpenCL context/queue and a stable device identity for cache keys."""

from __future__ import annotations

import os
import threading

import pyopencl as cl

__all__ = ["NoDeviceError", "default_context", "default_queue", "device_identity", "pick_device"]


class NoDeviceError(RuntimeError):
    """No OpenCL device could be found or chosen."""


_lock = threading.Lock()
_context: cl.Context | None = None
_queues: dict[int, cl.CommandQueue] = {}


def pick_device() -> cl.Device:
    """The device netcl uses by default.

    ``PYOPENCL_CTX`` (pyopencl's own variable, e.g. ``0`` or ``0:1``) wins when set; otherwise the
    first GPU of any platform, else the first device of any kind (PoCL's CPU device on a machine
    without a GPU driver).
    """
    if os.environ.get("PYOPENCL_CTX"):
        return cl.create_some_context(interactive=False).devices[0]
    try:
        platforms = cl.get_platforms()
    except cl.LogicError as exc:  # the ICD loader raises when no platform is installed
        raise NoDeviceError(_NO_DEVICE_HELP) from exc
    devices = [d for p in platforms for d in _devices_of(p)]
    if not devices:
        raise NoDeviceError(_NO_DEVICE_HELP)
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


_NO_DEVICE_HELP = (
    "no OpenCL device found: install a vendor OpenCL driver, or PoCL for the CPU with "
    "`pip install 'netcl-core[pocl]'`; choose among several with PYOPENCL_CTX"
)


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
            if os.environ.get("PYOPENCL_CTX"):
                _context = cl.create_some_context(interactive=False)
            else:
                _context = cl.Context([pick_device()])
        return _context


def default_queue(ctx: cl.Context | None = None) -> cl.CommandQueue:
    """An in-order command queue on ``ctx`` (default context when None), one per context."""
    ctx = ctx or default_context()
    with _lock:
        queue = _queues.get(ctx.int_ptr)
        if queue is None:
            queue = _queues[ctx.int_ptr] = cl.CommandQueue(ctx)
        return queue


def device_identity(device: cl.Device) -> str:
    """A stable string naming a device and the software that compiles for it.

    Platform name and version, device name and version, and driver version: any of them changing
    makes compiled binaries stale.
    """
    platform = device.platform
    parts = (
        platform.name,
        platform.version,
        device.name,
        device.version,
        device.driver_version,
    )
    return " | ".join(p.strip() for p in parts)
