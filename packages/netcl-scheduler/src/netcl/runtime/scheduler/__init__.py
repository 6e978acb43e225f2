"""netcl.runtime.scheduler: sequencing of async ops. ``Scheduler`` collects callables and OpenCL
events into ``ExecutionPlan`` objects and runs the plans in submission order."""

from netcl.runtime.scheduler._plan import ExecutionPlan
from netcl.runtime.scheduler._scheduler import Scheduler
from netcl.runtime.scheduler.version import __version__ as __version__

__all__ = ["ExecutionPlan", "Scheduler"]
