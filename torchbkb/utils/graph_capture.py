"""CUDA graph capture for graphs that come and go: each owner captures on a stream of its own and drops its graphs
all together.

PyTorch keys cuBLAS workspaces by stream, and a graph bakes the workspace of the stream it was captured on into its
kernels. By default every ``torch.cuda.graph`` in a process captures on one shared side stream, and from PyTorch
2.11 destroying a graph releases the workspace of its capture stream (pytorch/pytorch#175276): a graph dropped
while another one captured on that stream lives leaves the other one reading freed memory (pytorch/pytorch#193402).
So a :class:`GraphStream` gives its owner a capture stream of its own (warm-up and capture both run on it; PyTorch
hands streams out round-robin from a pool of 32 per device, so two owners share one only when 32 were taken between
them) and tells the owner to drop every graph at once (:meth:`GraphStream.flush`, after the device finished them)
rather than one at a time.

Example:
    >>> import torch
    >>> stream = GraphStream()
    >>> stream.needs_flush(kept=3, keep=4, kept_bytes=0, new_bytes=10, max_bytes=100)
    False
    >>> stream.needs_flush(kept=4, keep=4, kept_bytes=0, new_bytes=10, max_bytes=100)
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["CaptureFailed", "GraphStream"]


class CaptureFailed(RuntimeError):
    """A function that ran eagerly could not be captured in a CUDA graph."""


class GraphStream:
    """One owner's capture stream (created on first use, per device; never pickled) and its flush rule."""

    def __init__(self):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def __getstate__(self) -> dict:
        return {"_streams": {}}

    def capture(self, fn: Callable[[], object], device: torch.device, warm_up: Callable[[], object] | None = None):
        """``(out, graph)``: ``fn()`` captured in a CUDA graph on this owner's stream on ``device``, after
        ``warm_up()`` (default ``fn``) ran once on that stream (cuBLAS and cuSOLVER workspaces, a compilation).
        An error of the warm-up is raised as it is, one of the capture as :class:`CaptureFailed`."""
        device = torch.device(device)
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            (warm_up or fn)()
        current.wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                out = fn()
        except Exception as err:  # noqa: BLE001 - whatever cannot be captured (a host read, a library call)
            raise CaptureFailed(f"{type(err).__name__}: {str(err)[:200]}") from err
        return out, graph

    @staticmethod
    def needs_flush(kept: int, keep: int, kept_bytes: int, new_bytes: int, max_bytes: int) -> bool:
        """Whether an owner holding ``kept`` graphs (``kept_bytes`` of large outputs) drops them all before it
        builds one more of ``new_bytes``: more than ``keep`` graphs, or more than ``max_bytes`` together."""
        return kept > 0 and (kept >= keep or kept_bytes + new_bytes > max_bytes)

    def flush(self, graphs: dict) -> None:
        """Drop every graph in ``graphs`` once the device has finished what was queued (a replay in flight keeps
        reading its memory)."""
        if graphs:
            for device in self._streams:
                torch.cuda.synchronize(device)
        graphs.clear()
