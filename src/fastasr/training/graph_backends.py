"""What captures a training step's parts (:mod:`fastasr.training.captured_step`): CUDA graphs on a
GPU (:class:`CudaGraphs`), or a stand-in that records a function and runs it at each replay
(:class:`EagerGraphs`), which runs the capture's plumbing on a CPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


class CudaGraphs:
    """Captures with ``torch.cuda.graph`` into one shared memory pool."""

    def __init__(self) -> None:
        self.pool = None
        self._side: torch.cuda.Stream | None = None

    def warm_up(self, fn: Callable[[], Any]) -> None:
        """``fn`` once on a side stream before a shape's first capture (lazily made handles and
        workspaces, Triton's compiles of this shape)."""
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            fn()
        torch.cuda.current_stream().wait_stream(self._side)

    def capture(self, fn: Callable[[], Any]) -> Graph:
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn()
        return Graph(lambda: (graph.replay(), outputs)[1], graph=graph)


class EagerGraphs:
    """A stand-in backend: "capturing" records ``fn``, a replay runs it (the plumbing on a CPU)."""

    def warm_up(self, fn: Callable[[], Any]) -> None:
        pass

    def capture(self, fn: Callable[[], Any]) -> Graph:
        return Graph(fn)


@dataclass
class Graph:
    """A captured function: :meth:`replay` runs it again and returns its outputs (a CUDA
    graph's outputs are the same tensors at every replay)."""

    replay: Callable[[], Any]
    graph: Any = None
