"""netcl.runtime.scheduler: sequencing of async ops.

``Scheduler`` collects callables and OpenCL events into ``ExecutionPlan`` objects and runs the
plans in submission order (sync mode: each plan waits for the previous one's events; async mode:
a plan with ``queue`` and ``after`` is ordered on the device). A failed run raises
``Scheduler.Error``; an interrupted run keeps what it did not complete for the next ``run``.
"""

from netcl.runtime.scheduler._plan import ExecutionPlan
from netcl.runtime.scheduler._scheduler import Scheduler
from netcl.runtime.scheduler.version import __version__ as __version__

__all__ = ["ExecutionPlan", "Scheduler"]
