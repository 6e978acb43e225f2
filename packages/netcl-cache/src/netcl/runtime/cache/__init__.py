"""netcl.runtime.cache: compiled OpenCL programs cached in-process and on disk.

``cacher`` is the process-wide :class:`ProgramCache`; it touches no disk until first used.
:class:`ProgramBuildError` (also ``ProgramCache.BuildError``) is raised when the compiler rejects
a program.
"""

from netcl.runtime.cache._build import ProgramBuildError
from netcl.runtime.cache._program_cache import ProgramCache
from netcl.runtime.cache.version import __version__ as __version__

__all__ = ["ProgramBuildError", "ProgramCache", "cacher"]

cacher = ProgramCache()
