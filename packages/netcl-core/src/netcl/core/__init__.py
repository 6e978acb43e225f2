"""netcl core: the small shared base of the netcl runtime packages.

Import from the submodules: ``netcl.core.tensor``, ``netcl.core.memory``, ``netcl.core.device``,
``netcl.core.telemetry``, ``netcl.core.log``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("netcl-core")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
