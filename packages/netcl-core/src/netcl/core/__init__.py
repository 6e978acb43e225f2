"""netcl core: the small shared base of the netcl runtime packages. Import from the submodules
(``netcl.core.tensor``, ``netcl.core.memory``, ... : the package's guide lists them)."""

from netcl.core.version import __version__ as __version__
