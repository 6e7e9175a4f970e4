"""BBKB's device-loop picks replayed from static, padded buffers (a CUDA graph on a GPU; the same chunk eagerly on
the CPU) make the eager device loop's batches."""

import copy
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbkb.bandits.device_batch import run_batch_on_device
from torchbkb.bandits.pick_graph import GRAPH_BYTES, PickGraphs


def _problem(A, r, seed, device, lam=0.1):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(A, r, generator=g, dtype=torch.float64)
    V_inv = torch.linalg.inv(Z[: 3 * r].T @ Z[: 3 * r] + lam * torch.eye(r, dtype=torch.float64))
    rls = ((Z @ V_inv) * Z).sum(-1)
    mean = torch.randn(A, generator=g, dtype=torch.float64)
    return Z.to(device), mean.to(device), rls.to(device), V_inv.to(device)


def _graphs():
    return PickGraphs(devices=("cpu", "cuda"))


def _same(a, b):
    """The same picks; their variances and final ``V⁻¹`` to rounding (float32 features padded with zeros are
    multiplied by other BLAS kernels; the replayed batch sums its rank-one terms at once)."""
    (sa, ia), (sb, ib) = a, b
    assert ia == ib and torch.equal(sa.indices.cpu(), sb.indices.cpu())
    single = torch.float32 in (sa.V_inv.dtype, sa.rls_in_batch.dtype)
    tol = {"rtol": 1e-5, "atol": 1e-6} if single else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(sa.rls_in_batch, sb.rls_in_batch, **tol)
    torch.testing.assert_close(sa.V_inv, sb.V_inv, **tol)
    assert sa.ucb_evaluations == sb.ucb_evaluations


@pytest.mark.parametrize("A, r, C, first", [(200, 5, 2.0, None), (500, 12, 4.0, 40), (50, 3, 1.0, None),
                                            (300, 20, 30.0, 70)])
def test_replayed_picks_are_the_eager_loops(A, r, C, first, device):
    Z, mean, rls, V_inv = _problem(A, r, 0, device)
    flagged = run_batch_on_device(Z, mean, rls, V_inv, 1.3, C, first_check=first, rule_on_host=False)
    _same(run_batch_on_device(Z, mean, rls, V_inv, 1.3, C, first_check=first, graphs=_graphs()), flagged)
    _same(run_batch_on_device(Z, mean, rls, V_inv, 1.3, C, first_check=first), flagged)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rs=st.lists(st.integers(1, 40), min_size=2, max_size=4),
       C=st.floats(1.0, 8.0), alpha=st.floats(0.0, 3.0))
def test_one_cache_serves_batches_of_other_sizes(seed, rs, C, alpha):
    """Graphs reused across batches whose dictionary grows and shrinks give each batch's eager picks."""
    graphs = _graphs()
    for k, r in enumerate(rs):
        Z, mean, rls, V_inv = _problem(120, r, seed + k, "cpu")
        _same(run_batch_on_device(Z, mean, rls, V_inv, alpha, C, graphs=graphs),
              run_batch_on_device(Z, mean, rls, V_inv, alpha, C))
    assert 1 <= len(graphs) <= graphs.keep


@pytest.mark.timeout(600)  # a host rule that never ends a batch would loop for 2²⁴ picks
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), r=st.integers(1, 12), C=st.sampled_from([1.0, 1.5, 2.0, 2.25, 3.0, 7.75]),
       mode=st.sampled_from(["random", "quarter", "zeros", "tiny", "quarter+zeros"]),
       work=st.sampled_from(["float64", "float32"]), first=st.sampled_from([None, 3, 40]),
       cap=st.sampled_from([None, None, 1, 5, 33]))
def test_the_hosts_stop_rule_ends_the_batch_where_the_device_loop_does(seed, r, C, mode, work, first, cap):
    """Replayed or eager, the hallucinated picks leave the stop rule to the host (:func:`sum_rule_end`): the same
    batch as the device loop's done flag, at levels that meet ``C̃`` exactly (σ̃²_fb = 1/4), zero or negligible
    variances (the stalled rule, or with a cap the zero variance alone), a cap within or at a chunk's end, and in
    a float32 ``V⁻¹`` whose arithmetic the host repeats."""
    Z, mean, rls, V_inv = _problem(90, r, seed, "cpu")
    g = torch.Generator().manual_seed(seed)
    if mode.startswith("quarter"):
        rls = torch.full_like(rls, 0.25)  # the level passes 1.25, 1.5, ... exactly
    if mode.endswith("zeros"):  # at a level of exactly C̃, a zero variance stalls
        rls = torch.where(torch.rand(rls.shape, generator=g, dtype=rls.dtype) < 0.3, 0.0, rls)
    if mode == "tiny":
        rls = rls * torch.where(torch.rand(rls.shape, generator=g, dtype=rls.dtype) < 0.3, 1e-12, 1.0)
    V_inv = V_inv.to(getattr(torch, work))
    flagged = run_batch_on_device(Z, mean, rls, V_inv, 0.8, C, cap, first_check=first, rule_on_host=False)
    _same(run_batch_on_device(Z, mean, rls, V_inv, 0.8, C, cap, first_check=first, graphs=_graphs()), flagged)
    _same(run_batch_on_device(Z, mean, rls, V_inv, 0.8, C, cap, first_check=first), flagged)


def test_a_cap_or_too_large_features_run_the_eager_loop():
    graphs = _graphs()
    Z, mean, rls, V_inv = _problem(100, 4, 1, "cpu")
    _same(run_batch_on_device(Z, mean, rls, V_inv, 1.0, 50.0, 7, graphs=graphs),
          run_batch_on_device(Z, mean, rls, V_inv, 1.0, 50.0, 7, rule_on_host=False))
    assert len(graphs) == 0  # a capped batch never uses a graph
    assert graphs.get(GRAPH_BYTES // 8 // 16 + 1, 16, torch.float64, torch.float64, torch.device("cpu"), 32) is None
    assert PickGraphs().get(100, 4, torch.float64, torch.float64, torch.device("cpu"), 32) is None  # CUDA only


def test_bbkb_with_replayed_picks_makes_the_lazy_loops_choices_and_copies(device):
    """BBKB on 4,000 Cadata arms: the same batches with replayed picks as with the lazy loop; a copy and a
    pickle made mid-run (the graphs are not copied) go on with the same picks."""
    import torchbkb.datasets
    from torchbkb import BBKB
    from torchbkb.gp.kernels import GaussianKernel

    arms, _ = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device)
    _, values = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device, standardize_rewards=False)
    arms, values = arms[:4000], values[:4000]

    def make(replayed):
        b = BBKB(arms, GaussianKernel.from_width(5.0), noise=0.2, beta=0.894, batch_bound=2.0, seed=1)
        b.device_loop, b.pick_graphs = replayed, _graphs() if replayed else None
        return b

    def drive(b, until):
        picks = []
        while b.t < until:
            idx = b.ask()
            b.tell(idx, values[idx])
            picks.append(idx.cpu())
        return torch.cat(picks)

    lazy, replayed = make(False), make(True)
    assert torch.equal(drive(lazy, 300), drive(replayed, 300)) and lazy.batch_sizes == replayed.batch_sizes
    assert len(replayed.pick_graphs) >= 1
    twin, thawed = copy.deepcopy(replayed), pickle.loads(pickle.dumps(replayed))
    assert len(twin.pick_graphs) == 0 and len(thawed.pick_graphs) == 0
    rest = drive(lazy, 600)
    assert torch.equal(drive(replayed, 600), rest) and torch.equal(drive(twin, 600), rest)
    assert torch.equal(drive(thawed, 600), rest)
    assert max(lazy.batch_sizes) > 1


def test_compiled_picks_trace_as_one_graph_and_equal_the_eager_loop(device):
    """``compiled=True`` traces each pick with ``fullgraph=True`` (a backend that runs the traced graph: the
    tracing, not the code generation) -- no fallback warning -- and gives the eager loop's batches; one
    compilation (``dynamic=True``) serves graphs of two arm counts and two feature capacities."""
    import warnings

    import torch._dynamo

    import torchbkb.bandits.pick_graph as pg

    torch._dynamo.reset()  # a compilation of another test in this process would be a second trace
    traced = []

    def backend(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    graphs = PickGraphs(devices=("cpu", "cuda"), compiled=True, backend=backend)
    for A, r, seed in [(300, 9, 3), (450, 20, 4), (300, 9, 5)]:
        Z, mean, rls, V_inv = _problem(A, r, seed, device)
        eager = run_batch_on_device(Z, mean, rls, V_inv, 1.1, 6.0, first_check=20)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            _same(run_batch_on_device(Z, mean, rls, V_inv, 1.1, 6.0, first_check=20, graphs=graphs), eager)
        assert graphs.get(A, r, Z.dtype, V_inv.dtype, Z.device, 32).compiled  # the graph the batch used
    assert len(graphs) == 2 and len(traced) == 1
    pg._COMPILED.pop(backend)


def test_a_compilation_that_fails_warns_once_and_the_picks_run_eagerly(monkeypatch):
    import warnings

    import torchbkb.bandits.pick_graph as pg

    def broken(fn, **kw):
        def fail(*args, **kwargs):
            raise RuntimeError("no compiler here")
        return fail

    monkeypatch.setattr(pg.torch, "compile", broken)
    monkeypatch.setattr(pg, "_COMPILED", {})
    Z, mean, rls, V_inv = _problem(200, 6, 4, "cpu")
    eager = run_batch_on_device(Z, mean, rls, V_inv, 1.0, 5.0)
    graphs = PickGraphs(devices=("cpu",), compiled=True, backend="eager")
    with pytest.warns(RuntimeWarning, match="compiled picks failed"):
        _same(run_batch_on_device(Z, mean, rls, V_inv, 1.0, 5.0, graphs=graphs), eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no second warning: the picks run eagerly now
        _same(run_batch_on_device(Z, mean, rls, V_inv, 1.0, 5.0, graphs=graphs), eager)


def test_pruned_candidates_are_picked_without_a_graph():
    """The eager update's pruned candidates change in number from batch to batch: the device loop picks among them
    eagerly (a graph per count would be captured and dropped each batch), with the lazy loop's choices."""
    import torchbkb.datasets
    from torchbkb import BBKB
    from torchbkb.gp.kernels import GaussianKernel

    arms, _ = torchbkb.datasets.load("cadata", dtype=torch.float64)
    _, values = torchbkb.datasets.load("cadata", dtype=torch.float64, standardize_rewards=False)
    arms, values = arms[:3000], values[:3000]
    runs = []
    for device_loop in (False, True):
        b = BBKB(arms, GaussianKernel.from_width(5.0), noise=0.2, beta=0.894, batch_bound=2.0, seed=2, prune=True)
        b.device_loop, b.pick_graphs = device_loop, PickGraphs(keep=100, devices=("cpu", "cuda"))
        picks = []
        while b.t < 300:
            idx = b.ask()
            b.tell(idx, values[idx])
            picks.append(idx)
        runs.append((torch.cat(picks), b.arms_scored_total, len(b.pick_graphs)))
    assert torch.equal(runs[0][0], runs[1][0])
    assert runs[1][1] < 3000 * len(b.batch_sizes) / 2  # mostly pruned
    assert len(b.batch_sizes) > 10 and runs[1][2] <= 2  # graphs only over every arm (a width or two of features)


@pytest.mark.parametrize("r", [0, 1, 17])
def test_replayed_picks_in_float32_and_without_features(r):
    """Float32 features with a float64 ``V⁻¹`` (the bandits' mix), and an empty dictionary (``r = 0``, ``z ≡ 0``):
    replayed or eager, the done flag's batch."""
    Z, mean, rls, V_inv = _problem(150, max(r, 1), 5, "cpu")
    Z, V_inv = (Z[:, :r], V_inv[:r, :r]) if r else (Z[:, :0], V_inv[:0, :0])
    rls = rls if r else torch.ones_like(rls)
    Z32, mean32, rls32 = Z.float(), mean.float(), rls.float()
    flagged = run_batch_on_device(Z32, mean32, rls32, V_inv, 0.7, 3.0, rule_on_host=False)
    _same(run_batch_on_device(Z32, mean32, rls32, V_inv, 0.7, 3.0, graphs=_graphs()), flagged)
    _same(run_batch_on_device(Z32, mean32, rls32, V_inv, 0.7, 3.0), flagged)


def test_a_replayed_pick_launches_half_the_kernels_of_a_device_loop_pick():
    """What a GPU launches inside the graph, counted at the dispatcher on the CPU (views and empty allocations
    left out): a replayed pick, with no done flag, at most 20 kernels (18.3 now), as many as an eager pick with
    the rule on the host; a pick with the stop rule on the device (its done flag), over 30. The batch is the
    same."""
    from benchmarks.op_counts import KernelCount

    Z, mean, rls, V_inv = _problem(2000, 12, 0, "cpu")
    graphs = _graphs()
    run_batch_on_device(Z, mean, rls, V_inv, 1.0, 1e3, pick_limit=64, graphs=graphs)  # builds the graph
    graph = graphs.get(2000, 12, Z.dtype, V_inv.dtype, Z.device, 32)
    graph.load(Z, mean, rls, V_inv, 1.0, 1e3)
    with KernelCount() as replayed:
        graph.replay()
    with KernelCount() as eager:
        run_batch_on_device(Z, mean, rls, V_inv, 1.0, 1e3, pick_limit=32)
    with KernelCount() as flagged:
        run_batch_on_device(Z, mean, rls, V_inv, 1.0, 1e3, pick_limit=32, rule_on_host=False)
    assert max(replayed.work, eager.work) <= 20 * 32 < 30 * 32 < flagged.work
