"""The in-batch loop with no host read per pick makes the batches of the lazy one."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbkb.bandits.batch_selection import select_batch
from torchbkb.bandits.device_batch import run_batch_on_device, select_batch_on_device


def _problem(A, r, seed, device, scale=1.0, lam=0.1):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(A, r, generator=g, dtype=torch.float64) * scale
    V = Z[: 3 * r].T @ Z[: 3 * r] + lam * torch.eye(r, dtype=torch.float64)
    V_inv = torch.linalg.inv(V)
    rls = ((Z @ V_inv) * Z).sum(-1)  # σ̃² = zᵀ V⁻¹ z (the RLS scale with λ folded in)
    mean = torch.randn(A, generator=g, dtype=torch.float64)
    return Z.to(device), mean.to(device), rls.to(device), V_inv.to(device)


@pytest.mark.parametrize("A, r, C, cap",
                         [(200, 5, 2.0, None), (500, 12, 4.0, None), (300, 8, 50.0, 40), (50, 3, 1.0, None)])
@pytest.mark.parametrize("check_every", [1, 7, 32])
def test_the_same_batches_as_the_lazy_and_the_literal_selection(A, r, C, cap, check_every, device):
    for seed in range(6):
        Z, mean, rls, V_inv = _problem(A, r, seed, device)
        for alpha in (0.3, 2.0):
            ref = select_batch(Z, mean, rls, V_inv, alpha, C, cap)
            literal = select_batch(Z, mean, rls, V_inv, alpha, C, cap, lazy=False)
            out = select_batch_on_device(Z, mean, rls, V_inv, alpha, C, cap, check_every=check_every)
            assert torch.equal(out.indices, ref.indices) and torch.equal(out.indices, literal.indices)
            assert torch.allclose(out.rls_start, ref.rls_start, rtol=0, atol=0)
            assert torch.allclose(out.rls_in_batch, ref.rls_in_batch, rtol=1e-9, atol=1e-12)
            assert torch.allclose(out.V_inv, ref.V_inv, rtol=1e-9, atol=1e-12)


def test_runs_of_one_arm_excluded_arms_and_a_zero_variance_end_as_in_the_lazy_selection(device):
    Z, mean, rls, V_inv = _problem(400, 6, 0, device, scale=0.05)  # small features: one arm repeats for long runs
    mean[::3] = -torch.inf  # excluded arms
    for C, cap in ((3.0, None), (1e3, 500), (5.0, 7)):
        ref = select_batch(Z, mean, rls, V_inv, 1.0, C, cap, validate=False)  # -inf: excluded, as BBKB passes them
        out = select_batch_on_device(Z, mean, rls, V_inv, 1.0, C, cap)
        assert torch.equal(out.indices, ref.indices)
        assert len(set(out.indices.tolist())) < out.indices.numel() or out.indices.numel() <= 7
    for s0, cap, length in ((0.0, None, 1), (0.0, 7, 1), (1e-30, None, 1), (1e-30, 7, 7)):
        # σ̃²_fb = 0 ends the batch with the best arm; a negligible one too (the rule stalls), unless a cap ends it
        mean_best, rls_best = mean.clone(), rls.clone()
        mean_best[1], rls_best[1] = mean.max() + 10.0, s0  # arm 1 wins every pick
        ref = select_batch(Z, mean_best, rls_best, V_inv, 1.0, 3.0, cap, validate=False)
        for rule_on_host in (True, False):
            out = run_batch_on_device(Z, mean_best, rls_best, V_inv, 1.0, 3.0, cap, rule_on_host=rule_on_host)[0]
            assert torch.equal(out.indices, ref.indices) and out.indices.numel() == length


@settings(max_examples=40, deadline=None)
@given(A=st.integers(1, 60), r=st.integers(1, 6), C=st.floats(1.0, 8.0), cap=st.one_of(st.none(), st.integers(1, 30)),
       seed=st.integers(0, 2**16), alpha=st.floats(0.0, 3.0))
def test_hypothesis_same_batches(A, r, C, cap, seed, alpha):
    Z, mean, rls, V_inv = _problem(A, r, seed, "cpu")
    ref = select_batch(Z, mean, rls, V_inv, alpha, C, cap)
    out = select_batch_on_device(Z, mean, rls, V_inv, alpha, C, cap, check_every=5)
    assert torch.equal(out.indices, ref.indices)


@pytest.mark.parametrize("prune", [True, False])
def test_bbkb_with_the_device_loop_makes_the_lazy_loops_choices(monkeypatch, prune, device):
    """BBKB's batches (over the pruned arms, mapped back to arm indices, or over every arm) are the same with
    the device loop as with the lazy loop: on 4,000 Cadata arms at the paper's settings."""
    import torchbkb.datasets
    import torchbkb.bandits.device_batch as db
    from torchbkb import BBKB
    from torchbkb.gp.kernels import GaussianKernel

    arms, _ = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device)
    _, values = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device, standardize_rewards=False)
    arms, values = arms[:4000], values[:4000]

    def run(loop_on_device):
        monkeypatch.setattr(db, "use_device_loop", lambda dev: loop_on_device)
        b = BBKB(arms, GaussianKernel.from_width(5.0), noise=0.2, beta=0.894, batch_bound=2.0, seed=1, prune=prune)
        b.fixed_capacity = False  # the eager update on every device: it prunes (the fixed-capacity one scores all)
        picks, scored = [], []
        while b.t < 600:
            idx = b.ask()
            b.tell(idx, values[idx])
            picks.append(idx.cpu())
            scored.append(b.arms_scored)
        return torch.cat(picks), b.batch_sizes, min(scored)

    lazy, device_loop = run(False), run(True)
    assert torch.equal(lazy[0], device_loop[0]) and lazy[1] == device_loop[1]
    assert max(lazy[1]) > 1 and (lazy[2] < arms.shape[0]) == prune  # batches of several picks; pruned when asked


@pytest.mark.parametrize("stall_check", [True, False])
def test_a_pick_compiles_as_one_graph_and_equals_the_eager_pick(stall_check, device):
    """``fullgraph=True`` fails on any graph break: a host read (``.item()``, ``bool(tensor)``), a data-dependent
    shape (``nonzero``, a boolean mask). The compiled picks equal the eager ones."""
    import torch._dynamo

    from torchbkb.bandits.device_batch import PickState, pick_step

    torch._dynamo.reset()
    Z, mean, rls, V_inv = _problem(300, 6, 0, device)
    compiled = torch.compile(pick_step, fullgraph=True, backend="eager", dynamic=False)

    def start():
        cur = rls.clone()
        zero = torch.zeros((), device=Z.device)
        return PickState(cur, mean + 0.7 * cur.sqrt(), V_inv.clone(), zero.double() + 1.0, zero.bool(), zero.long())

    eager_state, compiled_state = start(), start()
    for t in range(12):
        i, r_i, eager_state = pick_step(Z, mean, rls, eager_state, 0.7, 3.0, stall_check, t == 11)
        j, r_j, compiled_state = compiled(Z, mean, rls, compiled_state, 0.7, 3.0, stall_check, t == 11)
        assert int(i) == int(j) and torch.equal(r_i, r_j)
        assert all(torch.equal(a, b) for a, b in zip(eager_state, compiled_state))
    assert bool(eager_state.done)


def test_a_batch_past_the_pick_limit_is_given_up():
    """``pick_limit``: a batch that has not ended after that many picks returns ``None`` (BBKB hands it to the lazy
    loop, which takes long runs of one arm in closed form); one that ends within it is the same batch."""
    Z, mean, rls, V_inv = _problem(200, 5, 3, torch.device("cpu"))
    whole = run_batch_on_device(Z, mean, rls, V_inv, 1.0, 6.0)
    n = whole[0].indices.numel()
    assert n > 4
    assert run_batch_on_device(Z, mean, rls, V_inv, 1.0, 6.0, check_every=2, pick_limit=n - 2) is None
    within = run_batch_on_device(Z, mean, rls, V_inv, 1.0, 6.0, first_check=n + 3, pick_limit=n + 3)
    assert within[1] == whole[1] == whole[0].indices.tolist()
