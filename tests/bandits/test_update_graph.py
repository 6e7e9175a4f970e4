"""The fixed-capacity update replayed from static buffers (a CUDA graph on a GPU; the same buffers eagerly on the CPU)
makes the update's choices, serves a run with few graphs, and falls back to launching operation by operation."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from torchbkb import BBKB, BKB
from torchbkb.bandits.update_graph import GRAPH_BYTES, UpdateGraph, UpdateGraphs
from torchbkb.utils.graph_capture import CaptureFailed
from torchbkb.gp.kernels import GaussianKernel


def _problem(seed: int, device, A: int = 400, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    return arms.to(device, dtype), torch.sin(5 * arms).sum(-1).to(device)


def _bandit(cls, arms, seed: int, graphs: bool, **kw):
    kw = {"noise": 0.01, "q_bar": 2.0, "beta": 0.5, "seed": seed} | kw
    b = cls(arms, GaussianKernel(0.2), **kw)
    b.fixed_capacity = True
    b.engine.graphs = UpdateGraphs(devices=("cpu", "cuda")) if graphs else None
    return b


def _drive(b, f, T: int, seed: int, picks: list[int] | None = None) -> list[int]:
    g = torch.Generator().manual_seed(100 + seed)
    for _ in range(len(picks or [])):  # the noise of the evaluations made already
        torch.randn((1,), generator=g, dtype=torch.float64)
    picks = list(picks or [])
    while b.t < T:
        idx = b.ask()
        picks += idx.tolist()
        b.tell(idx, f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=torch.float64).to(f.device))
    return picks


def _same_state(a, b):
    assert torch.equal(a.dictionary, b.dictionary)
    assert torch.equal(a.arm_means, b.arm_means) and torch.equal(a.arm_rls, b.arm_rls)
    assert a.embeddings_computed == b.embeddings_computed and a.arms_scored_total == b.arms_scored_total


@pytest.mark.filterwarnings("ignore::torchbkb.errors.TheoryWarning")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("beta, prune", [(0.5, False), (0.5, True), ("theory", True)])
def test_bkb_with_a_replayed_update_makes_the_same_choices(beta, prune, dtype, device):
    """A constant width (the update makes the next pick), the theory width (a new width each update: the same
    graphs) and pruning (the scored arms in ``k_cap`` slots): bitwise the same picks, dictionary and scores."""
    arms, f = _problem(0, device, dtype=dtype)
    kw = {"beta": beta, "prune": prune, "noise": 0.01 if dtype == torch.float64 else 0.1}
    kw |= {"horizon": 150} if beta == "theory" else {}
    plain = _bandit(BKB, arms, 0, graphs=False, **kw)
    replayed = _bandit(BKB, arms, 0, graphs=True, **kw)
    assert _drive(replayed, f, 150, 0) == _drive(plain, f, 150, 0)
    _same_state(replayed, plain)
    graphs = replayed.engine.graphs
    assert graphs.enabled and 1 <= len(graphs) <= graphs.keep
    # a graph per capacity (m_cap, k_cap, the pulled arms' P doubling), not one per update or per width
    assert graphs.built <= 12, graphs.built


@pytest.mark.parametrize("seed", [0, 1])
def test_bbkb_with_a_replayed_update_makes_the_same_batches(seed, device):
    arms, f = _problem(seed, device)
    plain = _bandit(BBKB, arms, seed, graphs=False, batch_bound=2.0)
    replayed = _bandit(BBKB, arms, seed, graphs=True, batch_bound=2.0)
    assert _drive(replayed, f, 300, seed) == _drive(plain, f, 300, seed)
    _same_state(replayed, plain)
    assert replayed.engine.graphs.built >= 1


def test_a_dictionary_that_outgrows_its_slots_is_replayed_in_larger_ones(device):
    arms, f = _problem(3, device)
    plain = _bandit(BKB, arms, 3, graphs=False, q_bar=20.0)
    replayed = _bandit(BKB, arms, 3, graphs=True, q_bar=20.0)
    assert _drive(replayed, f, 120, 3) == _drive(plain, f, 120, 3)
    assert replayed.engine.m_cap >= 64 and replayed.dictionary_size > 32
    _same_state(replayed, plain)


def test_a_copied_or_pickled_bandit_rebuilds_its_graphs_and_goes_on_alike(device):
    arms, f = _problem(5, device)
    whole = _drive(_bandit(BKB, arms, 5, graphs=True), f, 120, 5)
    b = _bandit(BKB, arms, 5, graphs=True)
    first = _drive(b, f, 60, 5)
    assert len(b.engine.graphs) >= 1
    for other in (copy.deepcopy(b), pickle.loads(pickle.dumps(b))):
        assert len(other.engine.graphs) == 0 and other.engine.graphs.enabled
        assert _drive(other, f, 120, 5, first) == whole
    assert _drive(b, f, 120, 5, first) == whole


def test_a_failed_capture_warns_once_and_updates_without_graphs(monkeypatch):
    arms, f = _problem(6, "cpu")
    plain = _drive(_bandit(BKB, arms, 6, graphs=False), f, 80, 6)

    def fail(self, args):
        raise CaptureFailed("RuntimeError: operation not permitted when stream is capturing")

    monkeypatch.setattr(UpdateGraph, "run", fail)
    b = _bandit(BKB, arms, 6, graphs=True)
    with pytest.warns(RuntimeWarning, match="capture failed") as caught:
        assert _drive(b, f, 80, 6) == plain
    assert len([w for w in caught if "capture failed" in str(w.message)]) == 1
    assert not b.engine.graphs.enabled and len(b.engine.graphs) == 0


def test_a_failing_update_raises_as_it_does_without_graphs():
    graphs = UpdateGraphs(devices=("cpu",))

    def step(x):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        graphs.run(step, {"x": torch.ones(2)}, torch.float64)
    assert graphs.enabled


def test_keys_copy_inputs_hold_widths_in_tensors_and_read_large_tensors_where_they_live():
    calls = []

    def step(x, big, w, n, q):
        calls.append((x.data_ptr(), big.data_ptr()))
        return ((x * (1.0 if w is None else w) + big[: x.shape[0]]) * q, torch.tensor(n))

    graphs = UpdateGraphs(devices=("cpu",), referenced=("big",), scalars=("w",), keep=2)
    big, q = torch.arange(10.0), torch.tensor(3.0)
    out = graphs.run(step, {"x": torch.ones(3), "big": big, "w": 2.0, "n": 4, "q": q}, torch.float32)
    assert out[0].tolist() == [6.0, 9.0, 12.0]
    x2 = torch.full((3,), 2.0)
    assert graphs.run(step, {"x": x2, "big": big, "w": 0.5, "n": 4, "q": q}, torch.float32)[0].tolist() == [3, 6, 9]
    assert graphs.built == 1  # a new width and new inputs: the same graph
    assert calls[0] == calls[1] and calls[0][0] != x2.data_ptr() and calls[0][1] == big.data_ptr()
    big.add_(1.0)  # read where it lives: an in-place change is seen
    assert graphs.run(step, {"x": x2, "big": big, "w": 0.5, "n": 4, "q": q}, torch.float32)[0].tolist() == [6, 9, 12]
    graphs.run(step, {"x": x2, "big": big.clone(), "w": 0.5, "n": 4, "q": q}, torch.float32)  # another address
    graphs.run(step, {"x": x2, "big": big, "w": 0.5, "n": 5, "q": q}, torch.float32)  # another size
    graphs.run(step, {"x": torch.ones(4), "big": big, "w": 0.5, "n": 4, "q": q}, torch.float32)  # another shape
    assert graphs.built == 4 and len(graphs) == 2  # a third graph dropped both before it, all at once
    assert graphs.run(step, {"x": x2, "big": big, "w": None, "n": 4, "q": q}, torch.float32) is not None
    assert graphs.built == 5  # no width is another graph


def test_graphs_serve_their_devices_and_sizes_only():
    step = lambda x: (x + 1,)  # noqa: E731
    args = {"x": torch.ones(2)}
    assert UpdateGraphs().run(step, args, torch.float64) is None  # CUDA only by default
    graphs = UpdateGraphs(devices=("cpu",))
    assert graphs.run(step, args, torch.float64, out_bytes=GRAPH_BYTES + 1) is None
    assert graphs.run(step, args, torch.float64, out_bytes=GRAPH_BYTES)[0].tolist() == [2.0, 2.0]
    half = GRAPH_BYTES // 2 + 1  # two graphs of more than half the bytes are never kept together
    graphs = UpdateGraphs(devices=("cpu",))
    graphs.run(step, args, torch.float64, out_bytes=half)
    graphs.run(step, {"x": torch.ones(3)}, torch.float64, out_bytes=half)
    assert graphs.built == 2 and len(graphs) == 1


def test_an_engine_pickled_before_the_graphs_launches_without_them():
    arms, f = _problem(7, "cpu")
    b = _bandit(BKB, arms, 7, graphs=True)
    _drive(b, f, 20, 7)
    state = b.engine.__getstate__()
    del state["graphs"]
    engine = type(b.engine).__new__(type(b.engine))
    engine.__dict__.update(state)
    assert engine.graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_an_update_is_one_graph_launch_beside_its_copies():
    """On a GPU the replayed update launches the graph and copies (inputs in, outputs out), not ~140 kernels."""
    from torch.profiler import ProfilerActivity, profile

    arms, f = _problem(8, "cuda", A=5_000)
    b = BKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=8)
    _drive(b, f, 40, 8)
    assert b.engine.graphs.built >= 1 and b.engine.graphs.enabled
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            idx = b.ask()
            b.tell(idx, f[idx])
    names = [e.name for e in prof.events()]
    assert sum("GraphLaunch" in n for n in names) >= 5, sorted(set(names))  # one replay per update at least


def test_computed_dictionary_rows_replay_alike_and_a_kernel_write_is_another_graph(device):
    """Many arms (no cached pulled rows): the kernel runs inside the update; the same picks replayed. A write to
    the kernel's buffers makes the next update build another graph (a graph takes a host scalar when captured)."""
    arms, f = _problem(9, device)
    plain = _bandit(BKB, arms, 9, graphs=False, row_cache_bytes=0)
    replayed = _bandit(BKB, arms, 9, graphs=True, row_cache_bytes=0)
    assert _drive(replayed, f, 100, 9) == _drive(plain, f, 100, 9)
    _same_state(replayed, plain)
    graphs = UpdateGraphs(devices=("cpu",))
    kernel = GaussianKernel(0.5)
    step = lambda x, kernel: (kernel(x, x),)  # noqa: E731
    x = torch.rand(4, 2, dtype=torch.float64)
    first = graphs.run(step, {"x": x, "kernel": kernel}, torch.float64)[0]
    graphs.run(step, {"x": x, "kernel": kernel}, torch.float64)
    assert graphs.built == 1
    kernel.lengthscale.fill_(0.25)
    second = graphs.run(step, {"x": x, "kernel": kernel}, torch.float64)[0]
    assert graphs.built == 2 and torch.equal(second, GaussianKernel(0.25)(x, x)) and not torch.equal(first, second)


class _EmulatedGraph:
    """A CUDA graph's contract on the CPU: capturing allocates the outputs once, and every replay overwrites them in
    place from the static buffers -- whatever keeps a reference to an output sees the next replay's values."""

    def __init__(self, graph: UpdateGraph):
        self.graph = graph

    def replay(self):
        for dst, src in zip(self.graph._out, self.graph.fn(**self.graph.static)):
            dst.copy_(src)


def _emulate_capture(monkeypatch):
    import torchbkb.bandits.update_graph as module

    def capture(self):
        out = self.fn(**self.static)
        self._out = type(out)(*(torch.full_like(t, 7) for t in out))  # garbage until the first replay
        self._graph = _EmulatedGraph(self)

    monkeypatch.setattr(module, "CAPTURED_ON", ("cpu",))
    monkeypatch.setattr(UpdateGraph, "_capture", capture)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_outputs_overwritten_at_every_replay_leave_the_choices_alone(cls, monkeypatch):
    """With a graph's overwrite-in-place contract emulated, the same picks and state: nothing the bandit keeps is a
    graph's output (a kept output would change under it at the next update), and a read-out held by a user stays."""
    arms, f = _problem(10, "cpu")
    kw = {"batch_bound": 2.0} if cls is BBKB else {"prune": True}
    plain = _bandit(cls, arms, 10, graphs=False, **kw)
    expected = _drive(plain, f, 150, 10)
    _emulate_capture(monkeypatch)
    replayed = _bandit(cls, arms, 10, graphs=True, **kw)
    first = _drive(replayed, f, 100, 10)
    held = replayed.arm_means
    kept = held.clone()
    assert _drive(replayed, f, 150, 10, first) == expected
    assert torch.equal(held, kept)
    _same_state(replayed, plain)
    assert replayed.engine.graphs.built >= 1
