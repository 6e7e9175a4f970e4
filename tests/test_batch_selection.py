import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import DeviceReads, Dispatches, TorchRows, batch_strategies, close
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.bandits.batch_selection import UNBOUNDED_PICKS, picks_to_stop, select_batch, stop_rule_stalls
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel


def _problem(seed=0, A=400, n=300, m=15, lam=1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    pulled = torch.randint(0, A, (n,), generator=g)
    y = torch.sin(6 * arms[pulled, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), arms[pulled[:m]].to(dtype)), noise=lam)
    post.fit(arms[pulled].to(dtype), y.to(dtype))
    Z = post.embedding(arms.to(dtype))
    kd = torch.ones(A, dtype=dtype)
    mean, rls = post.score_embedded(Z, kd)
    return arms.to(dtype), post, Z, mean, rls


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lazy_and_eager_give_identical_batches(seed, dtype):
    _, post, Z, mean, rls = _problem(seed, dtype=dtype)
    kw = dict(alpha=1.5, batch_bound=4.0, max_batch_size=200)
    lazy = select_batch(Z, mean, rls, post.V_inv, lazy=True, **kw)
    eager = select_batch(Z, mean, rls, post.V_inv, lazy=False, **kw)
    assert lazy.indices.tolist() == eager.indices.tolist()
    assert len(lazy.indices) > 1
    assert lazy.ucb_evaluations < eager.ucb_evaluations


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_candidates_select_as_the_eager_loop(dtype):
    """The loop's host bookkeeping keeps the candidates' dtype (bfloat16, which NumPy lacks, included)."""
    _, post, Z, mean, rls = _problem(2)
    Z, mean, rls = Z.to(dtype), mean.to(dtype), rls.to(dtype)
    kw = dict(alpha=1.5, batch_bound=4.0, max_batch_size=60)
    lazy = select_batch(Z, mean.requires_grad_(), rls, post.V_inv, lazy=True, **kw)
    eager = select_batch(Z, mean, rls, post.V_inv, lazy=False, **kw)
    assert lazy.indices.tolist() == eager.indices.tolist() and len(lazy.indices) > 1
    assert lazy.rls_start.dtype == lazy.rls_in_batch.dtype == dtype


def test_in_batch_variances_equal_a_refit_with_the_picks_hallucinated():
    arms, post, Z, mean, rls = _problem(1)
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=2.0, batch_bound=5.0)
    assert len(sel.indices) >= 4
    for k in range(len(sel.indices)):
        ref = DTCPosterior(post.embedding, noise=post.lam).fit(post.train_X, post.train_y)
        for j in sel.indices[:k]:
            ref.update(arms[j])  # y=None: hallucinated
        assert close(ref.rls(arms[sel.indices[k]][None])[0], sel.rls_in_batch[k], 1e-10)
        assert close(ref.mean(arms), mean, 1e-10)  # the mean is frozen


def test_batch_bound_one_gives_batches_of_one_and_the_ucb_argmax():
    _, post, Z, mean, rls = _problem(2)
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=1.0)
    assert sel.indices.tolist() == [int(torch.argmax(mean + rls.sqrt()))]


def test_termination_rule_and_cap():
    _, post, Z, mean, rls = _problem(3)
    C = 3.0
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C)
    partial = 1.0 + torch.cumsum(sel.rls_start, 0)
    assert bool((partial[:-1] <= C).all()) and float(partial[-1]) > C  # the last pick crossed C̃
    prod = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C, stop_rule="product")
    assert len(prod.indices) <= len(sel.indices)  # Weierstrass: 1 + Σ <= Π (1 + ·)
    capped = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=C, max_batch_size=2)
    assert capped.indices.tolist() == sel.indices[:2].tolist()


def test_long_batches_switch_to_the_direct_form_consistently():
    _, post, Z, mean, rls = _problem(4, m=6)
    a = select_batch(Z, mean, rls, post.V_inv, alpha=0.5, batch_bound=1e9, max_batch_size=40, lazy=True)
    b = select_batch(Z, mean, rls, post.V_inv, alpha=0.5, batch_bound=1e9, max_batch_size=40, lazy=False)
    assert a.indices.tolist() == b.indices.tolist() and len(a.indices) == 40 > Z.shape[1]
    assert bool((a.rls_in_batch[1:] <= rls[a.indices[1:]] + 1e-12).all())


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(
        [
            (dict(batch_bound=0.5), "batch_bound"),
            (dict(alpha=-1.0), "alpha"),
            (dict(max_batch_size=0), "max_batch_size"),
            (dict(stop_rule="max"), "stop_rule"),
            (dict(rls="neg"), "non-negative"),
            (dict(mean="short"), r"mean: expected shape"),
            (dict(mean="nan"), "finite"),
            (dict(V_inv="wrong"), r"V_inv: expected shape"),
        ]
    )
)
def test_bad_inputs(case):
    kw, msg = case
    _, post, Z, mean, rls = _problem(0, A=50)
    args = dict(Z=Z, mean=mean, rls=rls, V_inv=post.V_inv, alpha=1.0, batch_bound=2.0)
    args.update(kw)
    if args["rls"] == "neg" if isinstance(args["rls"], str) else False:
        args["rls"] = -rls
    if isinstance(args["mean"], str):
        args["mean"] = mean[:-1] if args["mean"] == "short" else torch.full_like(mean, float("nan"))
    if isinstance(args["V_inv"], str):
        args["V_inv"] = post.V_inv[:-1]
    with pytest.raises(InputDataError, match=msg):
        select_batch(**args)


def test_validate_false_gives_the_same_batch():
    _, post, Z, mean, rls = _problem(5)
    a = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=3.0)
    b = select_batch(Z, mean, rls, post.V_inv, alpha=1.0, batch_bound=3.0, validate=False)
    assert a.indices.tolist() == b.indices.tolist() and torch.equal(a.rls_in_batch, b.rls_in_batch)


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_a_winning_arm_with_zero_variance_ends_the_batch(alpha):
    """σ̃²_fb = 0 (rounding can clamp a well-sampled arm there) leaves the sum rule stuck: the batch ends
    instead of repeating that arm forever; an arm with positive variance still repeats under α = 0."""
    _, post, Z, mean, rls = _problem(0)
    top = int(torch.argmax(mean))
    mean = mean.clone()
    mean[top] = mean.max() + 10.0  # the winner whatever the width
    rls = rls.clone()
    rls[top] = 0.0
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=alpha, batch_bound=2.0)
    assert sel.indices.tolist() == [top]
    rls[top] = 0.25
    sel = select_batch(Z, mean, rls, post.V_inv, alpha=0.0, batch_bound=2.0)
    assert sel.indices.tolist() == [top] * 5  # 1 + 4 · 0.25 = 2 <= C̃, the fifth pick crosses it


def _one_pick_at_a_time(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size=None, stop_rule="sum"):
    """Reference: 001 Algorithm 1 lines 4-8 literally -- every arm rescored from a dense V_t⁻¹ after every pick."""
    Zw, V = Z.to(torch.float64), V_inv.clone()
    rls0 = rls.to(torch.float64)
    residual = rls0 - ((Zw @ V_inv) * Zw).sum(-1)  # σ̃²_fb minus its V-dependent part
    picks, level = [], 1.0
    while True:
        cur = (residual + ((Zw @ V) * Zw).sum(-1)).clamp_min(0.0)
        i = int(torch.argmax(mean.to(torch.float64) + alpha * cur.sqrt()))
        picks.append(i)
        s = float(rls0[i])
        level = level + s if stop_rule == "sum" else level * (1.0 + s)
        if level > batch_bound or len(picks) == max_batch_size or s <= 0.0:
            return picks
        u = V @ Zw[i]
        V = V - torch.outer(u, u) / (1.0 + Zw[i] @ u)


def _dominant_arm_problem(seed, A=300):
    """A sampled arm well ahead of the rest: batches are runs of repeated picks (the common case late in a
    BBKB run) interrupted by arms whose UCB catches up."""
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    best = torch.tensor([[0.3, 0.6]], dtype=torch.float64)
    X = torch.cat([best.repeat(5, 1), arms[torch.randint(0, A, (60,), generator=g)]])
    y = 5.0 - 20.0 * ((X - best) ** 2).sum(-1)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[::7]), noise=0.5).fit(X, y)
    arms = torch.cat([arms, best])
    Z = post.embedding(arms)
    mean, rls = post.score_embedded(Z, torch.ones(A + 1, dtype=torch.float64))
    return Z, mean, rls, post.V_inv


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("stop_rule", ["sum", "product"])
def test_runs_of_one_arm_are_the_picks_made_one_at_a_time(lazy, stop_rule):
    """A run of repeated picks is decided in closed form (j hallucinations of x_i: one rank-one term
    j·z zᵀ); it must be exactly the sequence of one-at-a-time argmaxes, including where another arm
    interrupts the run."""
    Z, mean, rls, V_inv = _dominant_arm_problem(0)
    for alpha, C in [(0.3, 3.0), (1.0, 6.0), (2.5, 40.0)]:
        sel = select_batch(Z, mean, rls, V_inv, alpha=alpha, batch_bound=C, stop_rule=stop_rule, lazy=lazy)
        ref = _one_pick_at_a_time(Z, mean, rls, V_inv, alpha, C, stop_rule=stop_rule)
        assert sel.indices.tolist() == ref
    long = select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=12.0, stop_rule=stop_rule,
                        lazy=lazy).indices.tolist()
    assert long == _one_pick_at_a_time(Z, mean, rls, V_inv, 1.0, 12.0, stop_rule=stop_rule)
    runs = [len(list(grp)) for _, grp in itertools.groupby(long)]
    assert max(runs) >= 8 and len(runs) >= 3  # long runs, and interruptions


@settings(max_examples=40, deadline=None)
@given(**batch_strategies(max_cap=60))
def test_batches_equal_the_one_at_a_time_reference(seed, alpha, C, cap, stop_rule, dominant):
    if dominant:
        Z, mean, rls, V_inv = _dominant_arm_problem(seed, A=120)
    else:
        _, post, Z, mean, rls = _problem(seed, A=120, m=8)
        V_inv = post.V_inv
    sel = select_batch(Z, mean, rls, V_inv, alpha=alpha, batch_bound=C, max_batch_size=cap, stop_rule=stop_rule)
    assert sel.indices.tolist() == _one_pick_at_a_time(Z, mean, rls, V_inv, alpha, C, cap, stop_rule)


@settings(max_examples=200, deadline=None)
@given(level=st.floats(1.0, 50.0), s0=st.floats(1e-9, 10.0), C=st.floats(1.0, 60.0),
       rule=st.sampled_from(["sum", "product"]))
def test_picks_to_stop_matches_accumulating_the_rule(level, s0, C, rule):
    n = picks_to_stop(level, s0, C, rule)
    after = (lambda k: level + k * s0) if rule == "sum" else (lambda k: level * (1.0 + s0) ** k)
    if n is None:  # more than UNBOUNDED_PICKS picks (up to rounding at the boundary)
        assert after(UNBOUNDED_PICKS * (1 - 1e-9)) <= C
        assert stop_rule_stalls(level, s0, C, rule)
    else:
        assert n >= 1 and after(n) > C and (n == 1 or after(n - 1) <= C)
        assert n <= UNBOUNDED_PICKS + 1 and not stop_rule_stalls(level, s0, C, rule)


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("means", [(1.0, 0.5, 0.2), (0.5, 1.0, 0.2)])
def test_runs_on_orthogonal_arms_end_exactly_where_the_ucbs_cross(lazy, means):
    """Orthogonal unit features and V = I: an arm picked n times has σ̃² = 1/(1 + n) exactly, so the whole
    batch is known in closed form -- including the tie at n = 3 (1 + √(1/4) = 0.5 + 1), which the lowest
    index wins (the running arm in the first case, the challenger in the second)."""
    Z = torch.eye(3, dtype=torch.float64)
    mean = torch.tensor(means, dtype=torch.float64)
    rls = torch.ones(3, dtype=torch.float64)
    sel = select_batch(Z, mean, rls, torch.eye(3, dtype=torch.float64), alpha=1.0, batch_bound=1e9, max_batch_size=60,
                       lazy=lazy)
    n, expected = [0, 0, 0], []
    for _ in range(60):
        ucb = [float(mean[a]) + (1.0 / (1 + n[a])) ** 0.5 for a in range(3)]
        a = ucb.index(max(ucb))  # lowest index on ties
        expected.append(a)
        n[a] += 1
    first = [0, 0, 0, 0, 1] if means[0] == 1.0 else [1, 1, 1, 0]  # the tie after three picks of the leader
    assert expected[: len(first)] == first
    assert sel.indices.tolist() == expected
    assert close(sel.rls_in_batch,
                 torch.tensor([1.0 / (1 + expected[:k].count(a)) for k, a in enumerate(expected)], dtype=torch.float64),
                 1e-12)


@pytest.mark.parametrize("stop_rule", ["sum", "product"])
def test_a_tiny_batch_start_variance_leaves_the_cap_to_end_the_batch(stop_rule):
    """σ̃²_fb = 1e-30 > 0: the stop rule would need ~10³⁰ picks; the batch ends at max_batch_size, promptly."""
    Z = torch.eye(3, dtype=torch.float64)
    mean = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    rls = torch.tensor([1e-30, 1.0, 1.0], dtype=torch.float64)
    sel = select_batch(Z, mean, rls, torch.eye(3, dtype=torch.float64), alpha=0.1, batch_bound=2.0, max_batch_size=50,
                       stop_rule=stop_rule)
    assert sel.indices.tolist() == [0] * 50
    assert picks_to_stop(1.0, 1e-30, 2.0, stop_rule) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_rule", ["sum", "product"])
@pytest.mark.parametrize("s0", [0.0, 1e-30, 0.1 / UNBOUNDED_PICKS])
def test_without_a_cap_a_pick_the_rule_cannot_stop_ends_the_batch(stop_rule, s0):
    """No max_batch_size and σ̃²_fb ≈ 0 (the rule would need > 2²⁴ picks of the arm, or never stop): the batch
    ends with that pick instead of running (practically) forever; the picks before it are kept."""
    Z, V_inv = torch.eye(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64)
    mean = torch.tensor([0.0, 1.0], dtype=torch.float64)
    rls = torch.tensor([1.0, s0], dtype=torch.float64)  # arm 0 picked j times: σ̃² = 1/(1 + j)
    # α = 1.5: arm 0's UCB 1.5, 1.06, 0.87 after 0, 1, 2 picks; arm 1's 1 + 1.5·√s0 wins the third pick
    sel = select_batch(Z, mean, rls, V_inv, alpha=1.5, batch_bound=10.0, stop_rule=stop_rule)
    assert sel.indices.tolist() == [0, 0, 1]
    sel = select_batch(Z, mean, rls, V_inv, alpha=0.5, batch_bound=10.0, stop_rule=stop_rule)
    assert sel.indices.tolist() == [1]  # arm 1 first: a batch of that one pick
    assert stop_rule_stalls(1.0, s0, 10.0, stop_rule) and stop_rule_stalls(3.0, s0, 10.0, stop_rule)
    # the threshold: 2²⁴ picks of σ̃² = 1/2²³ would pass 1 + 2 (sum rule) -- not a stall
    assert not stop_rule_stalls(1.0, 8.0 / UNBOUNDED_PICKS, 3.0, "sum")
    assert picks_to_stop(1.0, 8.0 / UNBOUNDED_PICKS, 3.0, "sum") == UNBOUNDED_PICKS // 4 + 1


def test_a_pick_dispatches_few_tensor_operations_and_reads_few_values():
    """On its torch state (features it cannot read on the host) the lazy loop's bookkeeping (argmax, the arms to
    refresh, scalar reads) still runs on host arrays: a pick costs its products, not a dispatch per bookkeeping step
    (the torch-only loop took 48 operations and 8 reads per pick here)."""
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(2000, 12, generator=g, dtype=torch.float64) / 3
    mean = 0.01 * torch.randn(2000, generator=g, dtype=torch.float64)
    rls = 1 + torch.rand(2000, generator=g, dtype=torch.float64)
    V_inv = torch.eye(12, dtype=torch.float64)
    with DeviceReads() as reads, Dispatches() as ops:
        sel = select_batch(TorchRows(Z), mean, rls, V_inv, alpha=1.0, batch_bound=80.0, max_batch_size=120,
                           validate=False)
    picks = len(sel.indices)
    assert picks > 30 and len(set(sel.indices.tolist())) > 5  # alternating arms and runs, past r hallucinations
    assert ops.count <= 30 * picks and len(reads.names) <= 2 * picks


@pytest.mark.timeout(60)  # before the rule knew this stall, the loops never ended
@pytest.mark.parametrize("stop_rule, C", [("sum", 2.0), ("product", 2.25)])
def test_a_variance_that_cannot_move_a_level_at_the_bound_ends_the_batch(stop_rule, C):
    """Two picks of σ̃²_fb = 1/2 bring the level to exactly C̃ (1 + ½ + ½, or 1.5²) without passing it; the next
    argmax has a positive variance too small to move the level: no count of its picks ends the batch, so (without a
    cap) it is the batch's last, in the lazy loop and, for BBKB's rule, in the device loop in either work dtype."""
    from torchbkb.bandits.device_batch import run_batch_on_device

    assert picks_to_stop(C, 1e-300, C, stop_rule) is None and stop_rule_stalls(C, 1e-17, C, stop_rule)
    Z = torch.eye(3, dtype=torch.float64)
    mean = torch.tensor([0.0, 0.0, 0.6], dtype=torch.float64)
    rls = torch.tensor([0.5, 0.5, 1e-300], dtype=torch.float64)
    V_inv = torch.diag(rls.clamp_min(1e-3))
    sel = select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=C, stop_rule=stop_rule)
    assert sel.indices.tolist() == [0, 1, 2]
    if stop_rule == "sum":
        for work in (torch.float64, torch.float32):
            for host_rule in (True, False):
                out, _ = run_batch_on_device(Z, mean, rls, V_inv.to(work), 1.0, C, rule_on_host=host_rule)
                assert out.indices.tolist() == [0, 1, 2]
