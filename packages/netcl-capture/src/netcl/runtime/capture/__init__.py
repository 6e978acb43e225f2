"""netcl.runtime.capture: record OpenCL kernel launches once, replay them cheaply."""

__all__: list[str] = []
