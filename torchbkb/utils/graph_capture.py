"""CUDA graph capture for graphs that come and go: each owner captures on a stream of its own and drops its graphs
all together.

PyTorch keys cuBLAS workspaces by stream, and a graph bakes the workspace of the stream it was captured on into its
kernels. By default every ``torch.cuda.graph`` in a process captures on one shared side stream, and from PyTorch
2.11 destroying a graph releases the workspace of its capture stream (pytorch/pytorch#175276): a graph dropped
while another one captured on that stream lives leaves the other one reading freed memory (pytorch/pytorch#193402).
So a :class:`GraphStream` gives its owner a capture stream of its own (warm-up and capture both run on it; PyTorch
hands streams out round-robin from a pool of 32 per device, so two owners share one only when 32 were taken between
them), and a :class:`GraphCache` drops all of an owner's graphs at once (after the device finished them) rather
than one at a time.

Example:
    >>> cache = GraphCache(keep=2, max_bytes=100)
    >>> cache.store("a", "graph a", 10); cache.store("b", "graph b", 10); len(cache)
    2
    >>> cache.store("c", "graph c", 10); len(cache), cache.cached("a"), cache.cached("c")
    (1, None, 'graph c')
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["CaptureFailed", "GraphCache", "GraphStream"]


class CaptureFailed(RuntimeError):
    """A function that ran eagerly could not be captured in a CUDA graph."""


class GraphStream:
    """One owner's capture stream (created on first use, per device; never pickled)."""

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

    def synchronize(self) -> None:
        """Wait for the devices this owner captured on (a replay in flight keeps reading its graph's memory)."""
        for device in self._streams:
            torch.cuda.synchronize(device)


class GraphCache:
    """One owner's graphs by key, captured on its :attr:`stream`: at most ``keep`` of them, holding at most
    ``max_bytes`` together; past either, all are dropped at once before one more is added. None is pickled or copied
    (each is captured again when needed).

    Args:
        keep: graphs kept; max_bytes: their large buffers' bytes together.
    """

    def __init__(self, keep: int, max_bytes: int):
        self.keep, self.max_bytes = int(keep), int(max_bytes)
        self.stream = GraphStream()
        self.entries: dict = {}  # key -> (graph, its bytes)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"entries": {}}

    def __len__(self) -> int:
        return len(self.entries)

    def cached(self, key):
        """The graph kept under ``key``, or ``None``."""
        entry = self.entries.get(key)
        return None if entry is None else entry[0]

    def store(self, key, graph, size: int) -> None:
        """Keep ``graph`` (``size`` bytes) under ``key``, after dropping every graph if it would pass a bound."""
        kept = sum(b for _, b in self.entries.values())
        if self.entries and key not in self.entries and (len(self.entries) >= self.keep
                                                         or kept + size > self.max_bytes):
            self.clear()
        self.entries[key] = (graph, int(size))

    def clear(self) -> None:
        """Drop every graph, once the device has finished what was queued."""
        if self.entries:
            self.stream.synchronize()
        self.entries.clear()
