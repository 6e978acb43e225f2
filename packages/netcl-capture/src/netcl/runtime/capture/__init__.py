"""netcl.runtime.capture: KernelCapture: record OpenCL kernel launches once, replay them with near-zero overhead."""

__all__: list[str] = []
