"""netcl.runtime.scheduler: Scheduler and ExecutionPlan: sequencing of async ops."""

__all__: list[str] = []
