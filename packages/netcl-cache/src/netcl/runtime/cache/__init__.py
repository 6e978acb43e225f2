"""netcl.runtime.cache: ProgramCache and cacher: OpenCL program binaries cached on disk."""

__all__: list[str] = []
