"""BBKB's device-loop picks replayed from a CUDA graph: one launch for a chunk of picks instead of a few per pick.

A device-loop pick has no host read and fixed shapes, so a chunk of picks can be captured once in a CUDA graph and
replayed: on a GPU the eager loop spends its time launching a few small kernels per pick, the replay launches them
all at once. The graph works on static buffers: the features are padded with zero columns to a capacity ``r_cap``
(a power of two, so few graphs serve a run whose dictionary size changes), ``V⁻¹`` with a zero block (``V⁻¹ z`` is
unchanged, the padded entries are 0), and ``α̃`` is a 0-d tensor, so a new batch only copies its inputs in. The
chunk writes its state back into the buffers, so replays follow each other.

The chunk's picks are :func:`~torchbkb.bandits.device_batch.hallucinated_pick`'s: every pick hallucinated, no stop
rule on the device (half the kernels of :func:`~torchbkb.bandits.device_batch.pick_step`). The host ends the batch
from the values it reads anyway (the arms and their ``σ̃²_fb``,
:func:`~torchbkb.bandits.batch_stop_rule.sum_rule_end`) and forms the batch's final ``V⁻¹`` from the chunk's ``u``
and ``g``: the picks up to the batch's end are the device loop's.

On the CPU (no graph) :meth:`PickGraph.replay` runs the same chunk eagerly on the same buffers: the arithmetic a
graph replays, testable anywhere.

Inside the graph each pick is still ~18 small kernels of a few µs. ``compiled=True`` runs each pick through one
``torch.compile(fullgraph=True, dynamic=True)`` of :func:`~torchbkb.bandits.device_batch.hallucinated_picks`
(:data:`COMPILED_PICKS` pick a call: fewer, fused kernels) before capturing the chunk; one compilation, shared by every
graph of the process, serves every shape (compiling a longer call costs about the picks it unrolls, and a static one
compiles again per shape). Off by default: its gain on a GPU is not measured yet. A compilation or capture that fails
says so once and the eager picks are captured instead.

Example:
    >>> import torch
    >>> Z = torch.eye(3, dtype=torch.float64)
    >>> g = PickGraph(num_arms=3, r_cap=16, dtype=torch.float64, work=torch.float64, device=torch.device("cpu"))
    >>> g.load(Z, torch.tensor([0.0, 0.1, 0.2], dtype=torch.float64), torch.ones(3, dtype=torch.float64),
    ...        torch.eye(3, dtype=torch.float64), alpha=1.0, batch_bound=2.5)
    >>> g.replay().ids[:2].tolist()
    [2, 1]
"""

from __future__ import annotations

import warnings

import torch

from torchbkb.bandits.device_batch import PickState, Replay, hallucinated_picks, pick_step
from torchbkb.utils.graph_capture import GraphCache, GraphStream

__all__ = ["PickGraph", "PickGraphs", "GRAPH_BYTES", "COMPILED_PICKS", "pick_steps", "hallucinated_picks", "Replay"]

#: the most bytes of padded features a graph's buffers may hold (past it the eager loop runs), and one owner's
#: graphs together.
GRAPH_BYTES = 2**30
#: picks per call of the compiled chunk (a graph of more picks calls it several times): one, whose compilation
#: costs least (a call of 8 picks took 5 times as long to compile on the CPU).
COMPILED_PICKS = 1
_COMPILED: dict[str, object] = {}  # backend -> torch.compile(hallucinated_picks, dynamic=True), shared by all graphs


def pick_steps(Z: torch.Tensor, mean: torch.Tensor, rls0: torch.Tensor, state: PickState, alpha: torch.Tensor,
               C: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, PickState]:
    """``k`` picks of :func:`~torchbkb.bandits.device_batch.pick_step` (no cap, the stall check on): their arms
    `(k,)`, their ``σ̃²`` when picked `(k,)`, and the state after them."""
    ids, rls_in = [], []
    for _ in range(k):
        i, s_i, state = pick_step(Z, mean, rls0, state, alpha, C, True, False)
        ids.append(i)
        rls_in.append(s_i)
    return torch.stack(ids), torch.stack(rls_in), state


class PickGraph:
    """Static buffers for ``num_arms`` arms and ``r_cap`` feature columns, and ``picks`` picks of
    :func:`~torchbkb.bandits.device_batch.hallucinated_pick` on them, captured in a CUDA graph on a CUDA device.

    Args:
        num_arms, r_cap: the buffers' arms and feature columns; dtype: the features'; work: ``V⁻¹``'s dtype.
        device: where the buffers live (a graph on CUDA only); picks: picks per replay.
        compiled: run the picks through ``torch.compile(fullgraph=True, dynamic=True, backend=backend)``,
            :data:`COMPILED_PICKS` per call (``picks`` a multiple of it; otherwise eager).
        stream: the owner's :class:`~torchbkb.utils.graph_capture.GraphStream` to capture on (default: one of its
            own).
    """

    def __init__(self, num_arms: int, r_cap: int, dtype: torch.dtype, work: torch.dtype, device: torch.device,
                 picks: int = 32, compiled: bool = False, backend: str = "inductor",
                 stream: GraphStream | None = None):
        zeros = lambda *shape, dt=dtype: torch.zeros(*shape, dtype=dt, device=device)  # noqa: E731
        self.picks, self.device = int(picks), torch.device(device)
        self.compiled, self.backend = bool(compiled) and self.picks % COMPILED_PICKS == 0, backend
        self.Z, self.mean, self.rls0 = zeros(num_arms, r_cap), zeros(num_arms), zeros(num_arms)
        self.alpha, self.batch_bound = zeros(()), 1.0
        self.state = PickState(cur=zeros(num_arms), ucb=zeros(num_arms), V_inv=zeros(r_cap, r_cap, dt=work),
                               level=zeros((), dt=work), done=zeros((), dt=torch.bool),
                               count=zeros((), dt=torch.long))
        self.r = 0
        self.stream = GraphStream() if stream is None else stream
        self._graph = None
        self._out: Replay | None = None  # the graph's outputs

    def load(self, Z: torch.Tensor, mean: torch.Tensor, rls0: torch.Tensor, V_inv: torch.Tensor, alpha: float,
             batch_bound: float) -> None:
        """Copy a batch's start into the buffers (device copies and fills only): ``Z`` `(A, r)`, ``mean``, ``rls0``
        `(A,)` in the buffers' dtype, ``V_inv`` `(r, r)`; the state's ``cur``, ``ucb`` and ``V_inv`` as at the
        batch's first pick (its ``level``, ``done`` and ``count`` are not used: the reader keeps the stop rule)."""
        r = Z.shape[1]
        self.Z[:, :r].copy_(Z)
        if r < self.r or self._graph is None:
            self.Z[:, r:].zero_()  # columns past r are zero from an earlier, smaller batch otherwise
        self.r = r
        self.mean.copy_(mean)
        self.rls0.copy_(rls0)
        self.alpha.fill_(alpha)
        self.batch_bound = float(batch_bound)  # the reader's stop rule takes it from here
        s = self.state
        s.cur.copy_(rls0)
        s.ucb.copy_(mean + float(alpha) * rls0.clamp_min(0.0).sqrt())  # the eager loop's expression
        s.V_inv.zero_()
        s.V_inv[:r, :r].copy_(V_inv)

    def _chunk(self) -> Replay:
        """``picks`` picks from the buffers' state, written back into it after the last one (a failure before
        leaves it as it was)."""
        state, parts = self.state, []
        if self.compiled:
            if self.backend not in _COMPILED:
                _COMPILED[self.backend] = torch.compile(hallucinated_picks, fullgraph=True, dynamic=True,
                                                        backend=self.backend)
            for _ in range(self.picks // COMPILED_PICKS):
                *out, state = _COMPILED[self.backend](self.Z, self.mean, state, self.alpha, COMPILED_PICKS)
                parts.append(out)
            out = [torch.cat(p) for p in zip(*parts)]
        else:
            *out, state = hallucinated_picks(self.Z, self.mean, state, self.alpha, self.picks)
        for dst, src in zip(self.state[:3], state[:3]):  # cur, ucb, V_inv; the host keeps the stop rule
            dst.copy_(src)
        return Replay.of(*out, self.rls0)

    def replay(self) -> Replay:
        """The next ``picks`` picks (copies: the next replay overwrites the graph's outputs); on a CUDA device
        from the graph, captured at the first call."""
        if self.device.type != "cuda":
            return self._run_chunk()
        if self._graph is None:
            self._capture()
        self._graph.replay()
        return Replay(*(t.clone() for t in self._out))

    def _run_chunk(self) -> Replay:
        """:meth:`_chunk`; a compiled chunk whose compilation fails warns once and runs eagerly from then on."""
        if not self.compiled:
            return self._chunk()
        try:
            return self._chunk()
        except Exception as err:  # noqa: BLE001 - any compiler failure; the eager chunk raises real errors
            self._give_up_compiling(err)  # the state is as it was (_chunk writes it back last)
            return self._chunk()

    def _give_up_compiling(self, err: Exception) -> None:
        self.compiled = False
        warnings.warn(f"PickGraph: the compiled picks failed ({type(err).__name__}: {str(err)[:200]}); "
                      f"replaying the eager picks", RuntimeWarning, stacklevel=4)

    def _capture(self) -> None:
        try:
            self._out, self._graph = self._captured()
        except Exception as err:  # noqa: BLE001 - a compiled chunk that cannot be captured: the eager one is
            if not self.compiled:
                raise
            self._give_up_compiling(err)  # the state is as it was (_captured restores it after its warm-up)
            self._out, self._graph = self._captured()

    def _captured(self):
        saved = [t.clone() for t in self.state]

        def warm_up():  # one chunk outside the capture, then the state as it was
            self._chunk()
            for dst, src in zip(self.state, saved):
                dst.copy_(src)

        return self.stream.capture(self._chunk, self.device, warm_up)


class PickGraphs(GraphCache):
    """The :class:`PickGraph` of each shape a bandit meets (a few: ``r_cap`` is a power of two), kept while it
    lives (at most ``keep``, their features at most :data:`GRAPH_BYTES` together: past either, all are dropped at
    once, :mod:`~torchbkb.utils.graph_capture`), captured on a stream of their own, on the device types ``devices``,
    with their picks compiled when ``compiled`` (through ``backend``); none is pickled or copied (it is rebuilt when
    needed)."""

    def __init__(self, keep: int = 4, devices: tuple[str, ...] = ("cuda",), compiled: bool = False,
                 backend: str = "inductor"):
        super().__init__(keep, GRAPH_BYTES)
        self.devices = tuple(devices)
        self.compiled, self.backend = bool(compiled), backend

    def get(self, num_arms: int, r: int, dtype: torch.dtype, work: torch.dtype, device: torch.device,
            picks: int) -> PickGraph | None:
        """The graph for these shapes (built when new); ``None`` on a device type not in ``devices`` (a CPU gains
        nothing: its picks are replayed eagerly) or when the padded features pass :data:`GRAPH_BYTES`."""
        if torch.device(device).type not in self.devices:
            return None
        r_cap = max(16, 1 << max(r - 1, 0).bit_length())
        size = num_arms * r_cap * torch.finfo(dtype).bits // 8
        if size > GRAPH_BYTES:
            return None
        key = (num_arms, r_cap, dtype, work, str(device), picks)
        graph = self.cached(key)
        if graph is None:
            graph = PickGraph(num_arms, r_cap, dtype, work, device, picks, self.compiled, self.backend, self.stream)
            self.store(key, graph, size)
        return graph
