"""The version of the netcl-core distribution: its one source (the build reads it too)."""

__version__ = "0.1.0"
