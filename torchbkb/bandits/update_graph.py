"""A function of fixed shapes replayed from a CUDA graph: one launch for the sketched bandits' update's ~140 kernels.

:func:`~torchbkb.bandits.fixed_capacity.fixed_update` has fixed shapes and reads nothing on the host, so on a GPU it is
captured once per shape and replayed at every update (on a GPU the update costs its launches, not its arithmetic).
A graph reads static buffers, so:

* each call copies its tensor inputs into the graph's buffers (device copies; for the update, the pulled arms, the
  draws and the last variances), except the ``referenced`` ones -- tensors that stay put, like the arms, the pulled
  arms' rows and the counts --, which the graph reads where they live (a tensor at another address is another graph);
* the ``scalars`` (Python floats or ``None``, like the update's widths) are held in 0-d tensors, so a width that
  changes at every call replays the same graph; a 0-d tensor on the host is read when captured (a new value -- a
  write or another tensor -- is another graph), and so are a module's (the kernel's: a write to its parameters or
  buffers is another graph); other values (sizes, flags) are part of the key;
* the outputs are copied out after each replay, since the next replay overwrites them;
* an owner's graphs are captured on a stream of its own and dropped all at once (:mod:`~torchbkb.utils.graph_capture`:
  destroying a graph can release what the others captured on its stream use).

On a device type outside ``devices`` nothing is captured; listing ``"cpu"`` runs the function eagerly on the same
buffers -- what a graph replays, testable anywhere. A capture that fails says so once and :meth:`UpdateGraphs.run`
returns ``None`` from then on: the caller runs the function itself.

Example:
    >>> import torch
    >>> def step(x, y, w):
    ...     return (x * w + y, x.sum())
    >>> graphs = UpdateGraphs(devices=("cpu",), referenced=("y",), scalars=("w",))
    >>> x, y = torch.ones(3), torch.arange(3.0)
    >>> out = graphs.run(step, {"x": x, "y": y, "w": 2.0}, torch.float32)
    >>> out[0].tolist(), graphs.run(step, {"x": 2 * x, "y": y, "w": 0.5}, torch.float32)[0].tolist(), len(graphs)
    ([2.0, 3.0, 4.0], [1.0, 2.0, 3.0], 1)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from torchbkb.utils.graph_capture import CaptureFailed, GraphCache, GraphStream

__all__ = ["CAPTURED_ON", "GRAPH_BYTES", "REFERENCED", "UpdateGraph", "UpdateGraphs", "module_tensors"]

#: the update's arguments read where they live: the bandit's tensors that stay put (written in place, or replaced:
#: another graph) -- the pulled arms' rows, ``k(a, a)``, the arms, the counts, the reward sums, the exclusions.
REFERENCED = ("K_P", "kdiag", "arms", "counts", "reward_sums", "excluded")
#: the device types whose graphs are captured and replayed (elsewhere the buffers run eagerly).
CAPTURED_ON = ("cuda",)
#: the most bytes a graph's largest output may hold (the update's `(m_cap, A)` rows; past it the call runs eagerly),
#: and one owner's graphs together.
GRAPH_BYTES = 2**31


class UpdateGraph:
    """Static buffers for one key's inputs and, on CUDA, the graph of ``fn`` on them (captured at the first call).

    Args:
        fn: the function, called with keyword arguments; it returns a tuple (or named tuple) of tensors.
        args: the first call's arguments by name; scalars: the names held in 0-d tensors of ``scalar_dtype``;
        referenced: the tensors read where they live; stream: the owner's, to capture on.
    """

    def __init__(self, fn: Callable, args: dict, scalars: tuple[str, ...], referenced: tuple[str, ...],
                 scalar_dtype: torch.dtype, device: torch.device, stream: GraphStream):
        self.fn, self.device, self.stream = fn, torch.device(device), stream
        self.static: dict = {}
        self._copied: list[str] = []
        self._scalars: list[str] = []
        for name, value in args.items():
            if name in scalars and value is not None:
                self.static[name] = torch.zeros((), dtype=scalar_dtype, device=self.device)
                self._scalars.append(name)
            elif isinstance(value, torch.Tensor) and name not in referenced and value.device == self.device:
                self.static[name] = torch.empty_like(value, memory_format=torch.contiguous_format)
                self._copied.append(name)
            else:
                self.static[name] = value
        self._held = [t for v in args.values() if isinstance(v, torch.nn.Module) for t in module_tensors(v)]
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out = None

    def run(self, args: dict):
        """``fn`` on ``args`` (their key this graph's): the inputs copied in, then replayed (CUDA) or called; the
        outputs are copies."""
        for name in self._copied:
            self.static[name].copy_(args[name])
        for name in self._scalars:
            self.static[name].fill_(args[name])
        if self.device.type not in CAPTURED_ON:
            out = self.fn(**self.static)
        else:
            if self._graph is None:
                self._capture()
            self._graph.replay()
            out = self._out
        copies = [t.clone() for t in out]  # the next call overwrites the graph's outputs and the buffers
        return type(out)(*copies) if hasattr(out, "_fields") else type(out)(copies)

    def _capture(self) -> None:
        self._out, self._graph = self.stream.capture(lambda: self.fn(**self.static), self.device)


class UpdateGraphs(GraphCache):
    """The :class:`UpdateGraph` of each key a caller meets, captured on a stream of their own, on the device types
    ``devices``: at most ``keep``, their large outputs at most :data:`GRAPH_BYTES` together (past either, all are
    dropped at once: :mod:`~torchbkb.utils.graph_capture`); none is pickled or copied (each is captured again when
    needed).

    Args:
        devices: where graphs are used (``"cuda"``; ``"cpu"`` runs the buffers eagerly, for tests).
        referenced, scalars: the argument names read where they live, and held in 0-d tensors (module docstring).
        keep: graphs kept (each holds its own memory: the update's `(m_cap, A)` rows among it).

    Attributes:
        enabled: ``False`` after a capture failed (every call then returns ``None``).
        built: graphs built so far (each a capture on CUDA).
    """

    def __init__(self, devices: tuple[str, ...] = ("cuda",), referenced: tuple[str, ...] = REFERENCED,
                 scalars: tuple[str, ...] = ("width", "prune_width"), keep: int = 8):
        super().__init__(keep, GRAPH_BYTES)
        self.devices, self.referenced, self.scalars = tuple(devices), tuple(referenced), tuple(scalars)
        self.enabled, self.built = True, 0

    def run(self, fn: Callable, args: dict, scalar_dtype: torch.dtype, out_bytes: int = 0):
        """``fn(**args)`` through the graph of its key; ``None`` (the caller calls ``fn``) on a device type not in
        :attr:`devices`, when the largest output holds more than :data:`GRAPH_BYTES` (``out_bytes``), or once a
        capture has failed (warned once)."""
        if not self.enabled or out_bytes > GRAPH_BYTES:
            return None
        device = next(v.device for v in args.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        if device.type not in self.devices:
            return None
        key = (id(fn), scalar_dtype, *(self._key_part(n, v, device) for n, v in args.items()))
        graph = self.cached(key)
        if graph is None:
            graph = UpdateGraph(fn, args, self.scalars, self.referenced, scalar_dtype, device, self.stream)
            self.store(key, graph, out_bytes)
            self.built += 1
        try:
            return graph.run(args)
        except CaptureFailed as err:  # a failing call raises as it would eagerly
            self.enabled = False
            self.clear()
            warnings.warn(f"UpdateGraphs: the CUDA graph capture failed ({err}); running without graphs from now on",
                          RuntimeWarning, stacklevel=3)
            return None

    def _key_part(self, name: str, value, device: torch.device) -> tuple:
        if name in self.scalars:
            return name, value is None
        if isinstance(value, torch.Tensor):
            part = (name, tuple(value.shape), value.dtype, value.device)
            if value.device != device:  # a host 0-d tensor, read at the capture: the graph holds it, so its address
                return (*part, value.data_ptr(), value._version)  # and version name its value (no read here)
            if name in self.referenced:
                return (*part, value.data_ptr(), tuple(value.stride()))
            return part
        if isinstance(value, (bool, int, float, str, type(None))):
            return name, value
        if isinstance(value, torch.nn.Module):  # the kernel: its tensors read (or, on the host, taken) when captured
            return name, id(value), tuple((t.data_ptr(), t._version) for t in module_tensors(value))
        return name, id(value)


def module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers of ``module``: a graph that calls it holds them (their addresses stay theirs)."""
    return [*module.parameters(), *module.buffers()]
