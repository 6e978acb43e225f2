"""The version of the netcl-scheduler distribution: its one source (the build reads it too)."""

__version__ = "0.1.0"
