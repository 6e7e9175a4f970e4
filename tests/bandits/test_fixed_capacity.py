"""The fixed-capacity update: the eager update's choices from fixed shapes, one host read, a ``fullgraph`` compile."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixed_capacity_cases import compiled_with, counted_run, drive, problem, reward_noise, run_picks
from torchbkb import BBKB, BKB
from torchbkb.bandits.fixed_capacity import capacity_for, compact_slots, fixed_update
from torchbkb.gp.kernels import GaussianKernel


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 48))
def test_compact_slots_places_the_kept_entries_in_ascending_order(keep, m_cap):
    mask = torch.tensor(keep)
    positions, valid, m = compact_slots(mask, m_cap)
    kept = [i for i, k in enumerate(keep) if k]
    assert int(m) == len(kept)
    placed = min(len(kept), m_cap)
    assert valid.tolist() == [True] * placed + [False] * (m_cap - placed)
    assert positions[:placed].tolist() == kept[:placed]
    assert positions[placed:].tolist() == [0] * (m_cap - placed)


def test_capacity_is_a_power_of_two_that_holds_n():
    for n in (0, 1, 16, 17, 100, 1024, 1025):
        c = capacity_for(n)
        assert c >= max(n, 16) and c & (c - 1) == 0 and (c == 16 or c < 2 * n)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_the_fixed_update_prunes_the_arms_the_eager_update_prunes(cls, device):
    """A narrow width over 3,000 arms: most arms fall below the bound. The fixed update scores the same arms in its
    ``k_cap`` slots (grown from the first guess when more pass), the prior bound for the others, the same picks."""
    arms, f = problem(3, device, A=3_000)
    kw = {"T": 200, "seed": 3, "prune": True, "beta": 0.05} | ({"batch_bound": 3.0} if cls is BBKB else {})
    eager, be = run_picks(cls, arms, f, fixed=False, **kw)

    def setup(b):  # BBKB's replayed picks (a GPU's default) take every arm: no pruning (a test below)
        b.engine.k_cap, b.pick_graphs = 16, None

    fixed, bf = run_picks(cls, arms, f, fixed=True, setup=setup, **kw)
    assert fixed == eager
    assert bf.engine.k_cap > 16  # outgrown on the way, run again in more slots
    assert be.arms_scored_total < 0.1 * 200 * 3_000  # the eager update pruned (BKB: 200 updates, BBKB: fewer)
    assert bf.arms_scored_total == be.arms_scored_total
    assert torch.equal(bf.scored_arms, be.scored_arms)
    # k/λ - k_Sᵀ M k_S with k/λ = 100, in other products: rounding of 100 · 1e-16 per term
    torch.testing.assert_close(bf.arm_rls, be.arm_rls, rtol=0, atol=1e-8)


@pytest.mark.parametrize("prune", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bkb_makes_the_eager_updates_choices(seed, prune, device):
    arms, f = problem(seed, device)
    eager, be = run_picks(BKB, arms, f, fixed=False, T=150, seed=seed, prune=prune)
    fixed, bf = run_picks(BKB, arms, f, fixed=True, T=150, seed=seed, prune=prune)
    assert fixed == eager
    assert torch.equal(bf.dictionary, be.dictionary)
    assert bf.embeddings_computed == be.embeddings_computed
    # the pruned eager update scores in other products: rounding of k/λ - k_Sᵀ M k_S, with k/λ = 100
    torch.testing.assert_close(bf.scores()[0], be.scores()[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(bf.scores()[1], be.scores()[1], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(bf.arm_features() @ bf.arm_features().T, be.arm_features() @ be.arm_features().T)
    assert bf.deff == pytest.approx(be.deff, rel=1e-8)


@pytest.mark.parametrize("seed", [0, 1])
def test_bbkb_makes_the_eager_updates_choices(seed, device):
    arms, f = problem(seed, device)
    eager, _ = run_picks(BBKB, arms, f, fixed=False, T=300, seed=seed, batch_bound=2.0)
    fixed, _ = run_picks(BBKB, arms, f, fixed=True, T=300, seed=seed, batch_bound=2.0)
    assert fixed == eager


def test_a_dictionary_that_outgrows_its_slots_is_redone_in_larger_ones(device):
    arms, f = problem(3, device, A=400)
    eager, be = run_picks(BKB, arms, f, fixed=False, T=120, seed=3, q_bar=20.0)
    fixed, bf = run_picks(BKB, arms, f, fixed=True, T=120, seed=3, q_bar=20.0)
    assert be.dictionary_size > 32 and bf.engine.m_cap >= bf.dictionary_size
    assert fixed == eager


def test_a_singular_dictionary_falls_back_to_the_eager_update(device):
    """Both twins of a point in the dictionary: ``K_S`` is singular to rounding, its Cholesky pivot test fails and
    the eager update (``eigh``) runs on the dictionary drawn."""
    arms, f = problem(4, device, A=60, twins=True)
    eager, _ = run_picks(BKB, arms, f, fixed=False, T=150, seed=4, q_bar=50.0, beta=2.0)
    fixed, bf = run_picks(BKB, arms, f, fixed=True, T=150, seed=4, q_bar=50.0, beta=2.0)
    assert fixed == eager
    held = set(bf.dictionary.tolist())
    assert any(a + 30 in held for a in held if a < 30)


def test_a_resumed_fixed_capacity_run_continues_exactly(device):
    arms, f = problem(5, device)
    whole, _ = run_picks(BKB, arms, f, fixed=True, T=120, seed=5)
    first, b = run_picks(BKB, arms, f, fixed=True, T=120, seed=5, stop_at=60)
    resumed = BKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=5)
    resumed.fixed_capacity = True
    resumed.load_state_dict(b.state_dict())
    torch.testing.assert_close(resumed.arm_means, b.arm_means, rtol=0, atol=0)
    assert drive(resumed, f, 120, reward_noise(5, skip=60), list(first)) == whole  # the noise of the steps left


def test_a_bkb_step_reads_the_device_once(device):
    """With a constant width the fixed-capacity update makes the next UCB argmax too: ``ask`` reads nothing, and
    ``tell`` with the tensor ask returned reads the rewards and the update's flags (with them, for an arm pulled the
    first time, its kernel row's finiteness) -- beside the accuracy check when the dictionary has grown by a quarter."""
    arms, f = problem(6, device)
    eager, _ = run_picks(BKB, arms, f, fixed=False, T=120, seed=6)
    b = BKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=6)
    b.fixed_capacity = True
    picks, asks, tells = counted_run(b, f, 120, reward_noise(6), host_rewards=False)
    assert picks == eager
    assert set(asks[1:]) == {0}
    checks = 2 + math.ceil(math.log(b.dictionary_size) / math.log(1.25))
    assert min(tells[1:]) == 2 and sum(t > 2 for t in tells[1:]) <= checks, tells


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_update_compiles_as_one_graph_and_equals_the_eager_update(dtype, device):
    """``fullgraph=True`` fails on any graph break: a host read, a data-dependent shape. A bandit whose update is
    compiled makes the eager update's choices."""
    import torch._dynamo

    torch._dynamo.reset()
    arms, f = problem(7, device)
    arms = arms.to(dtype)
    eager, _ = run_picks(BKB, arms, f, fixed=True, T=80, seed=7)
    picks, b = run_picks(BKB, arms, f, fixed=True, T=80, seed=7, setup=compiled_with("eager"))
    assert picks == eager
    torch._dynamo.reset()  # the engine's compilations above count towards the recompile limit of the same code
    compiled = torch.compile(fixed_update, fullgraph=True, backend="eager", dynamic=False)
    pulled = b.dictionary  # any ascending pulled arms
    K_P, where = b.rows.pulled_rows(pulled)
    b.engine.set_pulled(pulled, where)
    u = b.engine.draws(torch.full((pulled.numel(),), 0.5, dtype=torch.float64))
    prev = torch.zeros(b.engine.m_cap, dtype=torch.long, device=arms.device)
    m0 = torch.zeros((), dtype=torch.long, device=arms.device)
    P = u.numel()
    asc_arm = torch.cat([pulled, pulled.new_zeros(P - pulled.numel())])
    asc_row = torch.cat([where, where.new_zeros(P - where.numel())])
    pruned = {"prune_width": 0.05, "k_cap": 64, "excluded": torch.zeros(arms.shape[0], dtype=torch.bool,
                                                                      device=arms.device)}
    for kw in ({}, pruned):  # every arm scored; the arms that pass the bound only
        outs = [fn(K_P, asc_row, asc_arm, b.counts, b.reward_sums, u, b.arm_rls, b.kdiag, prev, m0, b.sampler.q_bar,
                   b.sampler.inclusion, b.lam, b.engine.m_cap, 4096, **kw) for fn in (fixed_update, compiled)]
        for a, c in zip(*outs):
            torch.testing.assert_close(a, c, rtol=0, atol=0, equal_nan=True)
    assert 0 <= outs[0].flags[6] < 300  # pruned: some arms fell below the bound


@pytest.mark.parametrize("width", [0.5, "theory"])
def test_a_bbkb_batch_reads_the_device_once_to_select_and_once_to_update(width, device):
    """With the device loop and the fixed-capacity update (forced here on any device) and eager picks (no CUDA graph,
    so no deferred update: ``tests/bandits/test_deferred_update.py`` counts that one): ``ask`` reads its batch once
    when it ends within the first check (a little over the last batch's length), once more per 32 picks past it, and
    the theory width once more (its sum); ``tell`` with ask's own tensor reads the rewards (nothing on a GPU when
    they come from the host) and the update's flags with the new arms' kernel rows' finiteness, once each -- beside
    the float64 accuracy check of the variances, which runs when the dictionary has grown by a quarter (a few times a
    run); the same batches as the CPU's loops."""
    arms, f = problem(8, device)
    lazy, _ = run_picks(BBKB, arms, f, fixed=False, T=200, seed=8, batch_bound=3.0, beta=width)
    b = BBKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=width, seed=8, batch_bound=3.0)
    b.fixed_capacity, b.device_loop, b.pick_graphs = True, True, None
    picks, asks, tells = counted_run(b, f, 200, reward_noise(8), host_rewards=True)
    assert picks == lazy
    sizes = b.batch_sizes
    for k in range(1, len(sizes)):
        first = int(1.25 * sizes[k - 1]) + 2
        extra = max(0, -(-(sizes[k] - first) // 32))
        # the theory width's sum is read once, by ask or by the update that prunes with it
        theory = (width == "theory") and tells[k - 1] == 2
        assert asks[k] == 1 + extra + theory, (k, sizes[k - 1], sizes[k], tells[k - 1])
    checks = 2 + math.ceil(math.log(b.dictionary_size) / math.log(1.25))  # growths by a quarter, at most
    base = 2 + (width == "theory")
    assert min(tells[1:]) >= 2 and sum(t > base for t in tells[1:]) <= checks, tells


def test_a_long_batch_goes_to_the_lazy_loop_with_the_same_picks(device, monkeypatch):
    """Past ``DEVICE_PICKS_MAX`` picks (16 here) a batch is given to the lazy loop, and after a batch that long the
    next one starts there: the same batches as the CPU's loops."""
    from torchbkb.bandits import device_batch

    monkeypatch.setattr(device_batch, "DEVICE_PICKS_MAX", 16)
    arms, f = problem(9, device)
    lazy, _ = run_picks(BBKB, arms, f, fixed=False, T=300, seed=9, batch_bound=3.0)
    picks, b = run_picks(BBKB, arms, f, fixed=True, T=300, seed=9, batch_bound=3.0,
                    setup=lambda b: setattr(b, "device_loop", True))
    assert max(b.batch_sizes) > 16 and picks == lazy


def test_a_pickled_bandit_with_a_compiled_update_continues_exactly():
    import pickle

    import torch._dynamo

    torch._dynamo.reset()
    arms, f = problem(10, torch.device("cpu"))
    whole, _ = run_picks(BKB, arms, f, fixed=True, T=60, seed=10)
    first, b = run_picks(BKB, arms, f, fixed=True, T=60, seed=10, stop_at=30, setup=compiled_with("eager"))
    b = pickle.loads(pickle.dumps(b))
    assert drive(b, f, 60, reward_noise(10, skip=30), first) == whole and b.engine.compiled


def test_a_compilation_that_fails_warns_once_and_the_update_runs_eagerly(monkeypatch):
    """``torch.compile`` is never required: a compiler failure (here a backend that raises) turns compilation off
    with one warning, and the run makes the eager update's choices."""
    import torch._dynamo

    torch._dynamo.reset()
    arms, f = problem(11, torch.device("cpu"))
    whole, _ = run_picks(BKB, arms, f, fixed=True, T=40, seed=11)

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    with pytest.warns(RuntimeWarning, match="torch.compile failed") as caught:
        picks, b = run_picks(BKB, arms, f, fixed=True, T=40, seed=11, setup=compiled_with(broken))
    assert picks == whole and not b.engine.compiled
    assert sum("torch.compile failed" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_discards_exclusions_and_readmissions_make_the_eager_choices(cls, device):
    """Arms that keep failing are discarded and excluded, then readmitted: the fixed-capacity update (with BKB's
    fused argmax and BBKB's device loop) and the eager one pick the same arms throughout."""
    arms, f = problem(12, device, A=80)
    runs = []
    for fixed in (False, True):  # (a cap: 80 arms at a constant width grow batches of millions of repeated picks)
        kw = {"batch_bound": 3.0, "max_batch_size": 40} if cls is BBKB else {}
        b = cls(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=12, **kw)
        b.fixed_capacity = fixed
        if cls is BBKB:
            b.device_loop = fixed
        picks = []
        for step in range(60):
            idx = b.ask()
            picks.append(idx.tolist())
            bad = [i for i in idx.tolist() if i % 7 == 0 and step < 30]
            good = [i for i in idx.tolist() if i not in bad]
            if good:
                b.tell(torch.tensor(good), f[good])
            if bad:
                b.discard(torch.tensor(bad), exclude=True)
            if step == 40:
                b.readmit()
        runs.append(picks)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_a_fully_discarded_first_batch_leaves_the_prior_in_both_updates(cls, device):
    """The first batch discarded whole (its evaluations all failed): no arm pulled, the fixed-capacity update (the
    default off the CPU) keeps the prior as the eager one does, then both make the same choices."""
    arms, f = problem(14, device, A=60)
    runs = []
    for fixed in (False, True):
        b = cls(arms, GaussianKernel(0.2), noise=0.1, beta=0.5, seed=14)
        b.fixed_capacity = fixed
        first = b.ask()
        b.discard(first, exclude=True)
        assert b.t == 0 and b.dictionary_size == 0
        picks = [first.tolist()]
        for _ in range(12):
            idx = b.ask()
            picks.append(idx.tolist())
            b.tell(idx, f[idx])
        runs.append(picks)
    assert runs[0] == runs[1] and runs[0][0][0] not in runs[0][1]


def test_streamed_dictionary_rows_run_the_eager_update(device):
    """Dictionary rows past ``kernel_cache_bytes`` are streamed: the fixed-capacity update steps aside."""
    arms, f = problem(13, device)
    eager, _ = run_picks(BKB, arms, f, fixed=False, T=60, seed=13, kernel_cache_bytes=1)
    fixed, b = run_picks(BKB, arms, f, fixed=True, T=60, seed=13, kernel_cache_bytes=1)
    assert fixed == eager and b.dictionary_size > 0


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_without_cached_pulled_rows_the_update_computes_the_dictionary_rows(cls, device):
    """Many arms: once the pulled arms' rows outgrow ``row_cache_bytes`` (0 here) the fixed-capacity update computes
    the dictionary's rows from the arms, at fixed shapes still: the eager update's choices; a BKB ``ask`` reads
    nothing and ``tell`` the rewards and the flags (beside the accuracy checks)."""
    arms, f = problem(13, device)
    eager, be = run_picks(cls, arms, f, fixed=False, T=120, seed=13, row_cache_bytes=0)
    fixed, bf = run_picks(cls, arms, f, fixed=True, T=120, seed=13, row_cache_bytes=0)
    assert fixed == eager and torch.equal(bf.dictionary, be.dictionary)
    torch.testing.assert_close(bf.scores()[0], be.scores()[0], rtol=1e-8, atol=1e-8)
    b = BKB(arms, GaussianKernel(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=13, row_cache_bytes=0)
    b.fixed_capacity = True
    picks, asks, tells = counted_run(b, f, 120, reward_noise(13), host_rewards=False)
    assert picks == run_picks(BKB, arms, f, fixed=False, T=120, seed=13, row_cache_bytes=0)[0]
    checks = 2 + math.ceil(math.log(b.dictionary_size) / math.log(1.25))
    assert set(asks[1:]) == {0} and sum(t > 2 for t in tells[1:]) <= checks, tells


def test_non_finite_kernel_rows_raise_a_typed_error(device):
    """A kernel that returns NaN for some arms: the fixed-capacity update computing the dictionary's rows says so
    (a typed error) before adopting the update."""
    from torchbkb.errors import NumericsError

    arms, f = problem(14, device)

    class Broken(GaussianKernel):
        def forward(self, x1, x2, **kw):
            K = super().forward(x1, x2, **kw)
            return torch.where((x2[:, 0] > 0.95).unsqueeze(0), torch.nan, K) if x1.shape[0] > 1 else K

    b = BKB(arms, Broken(0.2), noise=0.01, q_bar=2.0, beta=0.5, seed=14, row_cache_bytes=0)
    b.fixed_capacity = True
    with pytest.raises(NumericsError, match="finite"):
        drive(b, f, 40, reward_noise(14), [])


def test_computed_dictionary_rows_compile_as_one_graph(device):
    """The kernel call inside the update traces with ``fullgraph=True`` (no fallback warning) and gives the eager
    update's picks."""
    import warnings

    import torch._dynamo

    torch._dynamo.reset()  # a compilation of another test in this process counts towards the recompile limit
    arms, f = problem(15, device)
    eager, _ = run_picks(BKB, arms, f, fixed=False, T=80, seed=15, row_cache_bytes=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled, b = run_picks(BKB, arms, f, fixed=True, T=80, seed=15, row_cache_bytes=0,
                                setup=compiled_with("eager"))
    assert compiled == eager and b.engine.compiled
