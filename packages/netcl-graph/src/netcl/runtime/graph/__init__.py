"""netcl.runtime.graph: Graph, GraphExecutor, TensorRef: static graphs with buffer reuse."""

__all__: list[str] = []
