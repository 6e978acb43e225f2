"""netcl.runtime.graph: describe tensor ops as a static graph, run it with planned buffer reuse.

``Graph.add_op(name, fn, inputs, shape, dtype)`` returns a :class:`TensorRef`;
``GraphExecutor(pool).run(graph)`` runs the ops in topological order and returns the last op's
output as a Tensor the caller owns.
"""

from netcl.runtime.graph._executor import GraphExecutor
from netcl.runtime.graph._graph import Graph, TensorRef
from netcl.runtime.graph.version import __version__ as __version__

__all__ = ["Graph", "GraphExecutor", "TensorRef"]
