"""S-BPE (003 Algorithm 1): schedule, variance-only batches, elimination, budget, checkpoints, bad inputs."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import exact_gp, rbf, titsias_dtc
import torchbkb
from torchbkb import ArmObjective, SBPE
from torchbkb.bandits import sbpe_batch_sizes
from torchbkb.bandits.confidence import vakili_beta, vakili_beta_continuous
from torchbkb.errors import InputDataError, TorchBKBError
from torchbkb.gp.kernels import GaussianKernel

LS = 0.25


def _problem(seed, A=150, C=2.0, dtype=torch.float64):
    """Arms in [0,1]², f = Σ α_j k(·, c_j) with ‖f‖_H = C exactly."""
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, dtype=torch.float64, generator=g)
    c = torch.rand(6, 2, dtype=torch.float64, generator=g)
    a = torch.randn(6, dtype=torch.float64, generator=g)
    a = a / torch.sqrt(a @ rbf(c, c, LS) @ a) * C
    return arms.to(dtype), (rbf(arms, c, LS) @ a).to(dtype), g


def _play(bandit, f, g, noise_std):
    while bandit.remaining:
        i = bandit.ask()
        bandit.tell(i, f[i] + noise_std * torch.randn(i.shape, dtype=f.dtype, generator=g))


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("N", [1, 2, 3, 10, 17, 100, 1000, 4321, 10**6])
def test_batch_lengths_follow_the_schedule(N):
    sizes = sbpe_batch_sizes(N)
    prev, expected = 1, []
    while sum(expected) < N:
        nxt = math.ceil(math.sqrt(N * prev) - 1e-9)  # float reference, exact for these N
        expected.append(min(nxt, N - sum(expected)))
        prev = nxt
    assert sizes == expected and sum(sizes) == N
    if N >= 4:
        assert len(sizes) <= math.ceil(math.log2(math.log2(N))) + 1  # B <= ⌈log log N⌉ + 1 (Li & Scarlett, Prop. 1)


def test_ask_returns_the_scheduled_batches_and_never_exceeds_the_budget():
    arms, f, g = _problem(0, A=60)
    b = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=50, beta=1.0, seed=0)
    seen = []
    while b.remaining:
        i = b.ask()
        assert torch.equal(b.ask(), i)  # idempotent while pending
        assert i.numel() <= b.remaining + i.numel() and bool(b.active[i].all())
        seen.append(i.numel())
        b.tell(i, f[i])
    assert seen == b.schedule == sbpe_batch_sizes(50) and b.asked == 50 and b.t == 50
    state = b.state_dict()
    with pytest.raises(TorchBKBError, match="budget of 50 evaluations exhausted"):
        b.ask()
    assert b.batch_id == len(seen) and b.state_dict()["t"] == state["t"] and len(b.pending) == 0
    assert int(b.recommend()) in b.active.nonzero().squeeze(1).tolist()


def test_run_loop_integration():
    arms, f, _ = _problem(1, A=80)
    b = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=60, rkhs_norm=2.0, seed=1)
    hist = torchbkb.run(b, ArmObjective(f, noise_std=0.1, seed=0), budget=60, progress=False)
    assert hist.batch_sizes == sbpe_batch_sizes(60)
    assert all(s >= 1 for s in hist.dictionary_size)


# ----------------------------------------------------------------------------- in-batch rule
def test_batches_are_variance_only_and_use_only_the_current_batch():
    """While a batch fits in the recursive-RLS base case, its picks are the exact max-variance sequence
    over the active set, computed from this batch's picks only (independent formula); rewards are never
    looked at (changing them cannot change the next batch as long as the active set is the same)."""
    arms, f, g = _problem(2, A=100)
    # β huge: nothing eliminated
    b = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=30, beta=1e6, seed=0, base_size=64)
    first = b.ask()
    b.tell(first, f[first])
    second = b.ask()
    assert b.active.all()
    for batch in (first, second):
        ref = []
        for _ in range(batch.numel()):
            if ref:
                Xp = arms[ref]
                _, cov = exact_gp(rbf(Xp, Xp, LS), rbf(Xp, arms, LS), rbf(arms, arms, LS),
                                  torch.zeros(len(ref), dtype=torch.float64), 0.01)
                var = torch.diagonal(cov)
            else:
                var = torch.ones(100, dtype=torch.float64)
            ref.append(int(torch.argmax(var)))
        assert batch.tolist() == ref
    other = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=30, beta=1e6, seed=0, base_size=64)
    i = other.ask()
    other.tell(i, torch.randn(i.shape, dtype=torch.float64))  # different rewards
    assert torch.equal(other.ask(), second)


# ----------------------------------------------------------------------------- elimination
def test_elimination_follows_eq_13_with_an_independent_posterior():
    arms, f, g = _problem(3)
    b = SBPE(arms, GaussianKernel(LS), noise=1e-3, budget=120, rkhs_norm=2.0, subgaussian=0.03, delta=0.05, seed=3)
    i = b.ask()
    y = f[i] + 0.03 * torch.randn(i.shape, dtype=torch.float64, generator=g)
    b.tell(i, y)
    post = b.posterior
    Z = torch.unique(post.embedding.inducing_points, dim=0)
    X = arms[i]
    mu, cov = titsias_dtc(rbf(Z, Z, LS), rbf(X, Z, LS), rbf(arms, Z, LS), rbf(arms, arms, LS), y, 1e-3)
    lam_max = b.lambda_maxes[0]
    ref_lm = float(torch.linalg.eigvalsh(rbf(X, X, LS) - rbf(X, Z, LS)
                                         @ torch.linalg.solve(rbf(Z, Z, LS), rbf(Z, X, LS)))[-1])
    assert lam_max == pytest.approx(max(ref_lm, 0.0), abs=1e-8)
    beta = vakili_beta(0.05 / (4 * b.num_batches * 150), 2.0, 0.03, 1e-3, lam_max)  # β(δ/(4B|X|))
    assert b.betas[0] == pytest.approx(beta)
    sd = torch.diagonal(cov).clamp_min(0).sqrt()
    assert torch.allclose(b.upper, mu + beta * sd, atol=1e-8) and torch.allclose(b.lower, mu - beta * sd, atol=1e-8)
    keep = (mu + beta * sd) >= (mu - beta * sd).max()
    assert torch.equal(b.active, keep)
    assert b.active_sizes == [int(keep.sum())]


@pytest.mark.parametrize("seed", range(4))
def test_elimination_never_removes_the_maximizer_at_low_noise(seed):
    arms, f, g = _problem(10 + seed)
    b = SBPE(arms, GaussianKernel(LS), noise=1e-4, budget=200, rkhs_norm=2.0, subgaussian=0.01, delta=0.05, seed=seed)
    _play(b, f, g, 0.01)
    assert bool(b.active[int(torch.argmax(f))])
    assert b.active_sizes[-1] <= 30  # and it did eliminate: 150 arms down to a few
    rec = int(b.recommend())
    assert float(f.max() - f[rec]) <= 0.1 * float(f.max() - f.min())
    assert len(b.betas) == b.num_batches and all(lm <= 1e-4 for lm in b.lambda_maxes[:2])


def test_continuous_intervals_eq_15():
    arms, f, g = _problem(5, A=100)
    b = SBPE(arms, GaussianKernel(LS), noise=1e-4, budget=60, rkhs_norm=2.0, subgaussian=0.01, interval="continuous",
             discretization_c=2.0, seed=5)
    finite = SBPE(arms, GaussianKernel(LS), noise=1e-4, budget=60, rkhs_norm=2.0, subgaussian=0.01, seed=5)
    for bandit in (b, finite):
        i = bandit.ask()
        bandit.tell(i, f[i] + 0.01 * torch.randn(i.shape, dtype=torch.float64, generator=g))
    n = b.schedule[0]
    beta = vakili_beta_continuous(0.01 / (2 * b.num_batches), n, 2.0, 0.01, 1e-4, b.lambda_maxes[0], dim=2, c=2.0,
                                  kmax=1.0)
    assert b.betas[0] == pytest.approx(beta)
    mean, var = b.posterior(arms)
    half = 2 / n + beta * (var.sqrt() + 2 / math.sqrt(n))
    assert torch.allclose(b.upper, mean + half, atol=1e-8)
    assert bool(b.active[int(torch.argmax(f))])
    assert int(b.active.sum()) >= int(finite.active.sum())  # wider intervals eliminate less


def test_lambda_max_modes_and_constant_beta():
    arms, f, g = _problem(6, A=60)
    lemma = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=20, lambda_max="lemma", seed=0)
    fixed = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=20, lambda_max=0.04, seed=0)
    const = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=20, beta=0.5, seed=0)
    for bandit in (lemma, fixed, const):
        i = bandit.ask()
        bandit.tell(i, f[i])
    assert lemma.lambda_maxes == [0.01] and fixed.lambda_maxes == [0.04]
    assert fixed.betas[0] == pytest.approx(vakili_beta(0.01 / (4 * 3 * 60), 1.0, 0.1, 0.01, 0.04))
    assert const.betas == [0.5]


def test_discarded_batch_skips_elimination():
    arms, f, _ = _problem(7, A=50)
    b = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=30, seed=0)
    i = b.ask()
    b.discard(i)
    assert b.active.all() and b.betas == [] and b.asked == i.numel()
    j = b.ask()
    assert j.numel() == b.schedule[1]


def test_float32_run(dtype):
    arms, f, g = _problem(8, A=80, dtype=dtype)
    b = SBPE(arms, GaussianKernel(LS), noise=1e-3, budget=60, rkhs_norm=2.0, subgaussian=0.01, seed=0)
    _play(b, f, g, 0.01)
    assert bool(b.active[int(torch.argmax(f))]) and b.upper.dtype == dtype


# ----------------------------------------------------------------------------- checkpoints
def test_checkpoint_resumes_identically():
    arms, f, g = _problem(9, A=80)
    kw = dict(noise=1e-3, budget=80, rkhs_norm=2.0, subgaussian=0.03, seed=4)
    a = SBPE(arms, GaussianKernel(LS), **kw)
    i = a.ask()
    a.tell(i, f[i])
    i = a.ask()
    a.tell(i[:3], f[i[:3]])  # mid-batch
    state = a.state_dict()
    b = SBPE(arms, GaussianKernel(LS), **kw)
    b.load_state_dict(state)
    for bandit in (a, b):
        rest = bandit.pending
        bandit.tell(rest, f[rest])
    assert torch.equal(a.active, b.active) and a.betas == b.betas
    assert torch.equal(a.ask(), b.ask())
    with pytest.raises(InputDataError, match="budget 81"):
        SBPE(arms, GaussianKernel(LS), **{**kw, "budget": 81}).load_state_dict(state)


def test_a_checkpoint_at_every_batch_boundary_loads_and_resumes_identically():
    """Before the first elimination every bound is ``nan``, and after one that drops arms theirs are: both load."""
    arms, f, g = _problem(9, A=80)
    kw = dict(noise=1e-3, budget=80, rkhs_norm=2.0, subgaussian=0.03, seed=4)
    ref = SBPE(arms, GaussianKernel(LS), **kw)
    states = []
    while ref.remaining > 0:
        states.append(ref.state_dict())
        i = ref.ask()
        ref.tell(i, f[i])
    assert bool(torch.isnan(states[0]["algorithm"]["upper"]).all()) and any(
        bool(torch.isnan(st["algorithm"]["upper"]).any()) and not bool(torch.isnan(st["algorithm"]["upper"]).all())
        for st in states)
    for state in states:
        b = SBPE(arms, GaussianKernel(LS), **kw)
        b.load_state_dict(state)
        while b.remaining > 0:
            i = b.ask()
            b.tell(i, f[i])
        assert b.history == ref.history and torch.equal(b.active, ref.active)
        assert torch.equal(b.upper.isnan(), ref.upper.isnan()) and b.betas == ref.betas


def test_a_run_stopped_by_a_failing_objective_resumes_from_its_checkpoint(tmp_path):
    arms, f, g = _problem(9, A=80)
    kw = dict(noise=1e-3, budget=80, rkhs_norm=2.0, subgaussian=0.03, seed=4)
    calls = {"n": 0, "fail_at": None}

    def flaky(x):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:  # mid-run, after eliminations that dropped arms (their bounds are nan)
            raise RuntimeError("the simulator crashed")
        return float(f[int((arms - x).abs().sum(1).argmin())])

    a = SBPE(arms, GaussianKernel(LS), **kw)
    ref = torchbkb.run(a, flaky, budget=80, progress=False)
    calls.update(n=0, fail_at=40)
    ck = tmp_path / "sbpe.pt"
    with pytest.raises(torchbkb.errors.ObjectiveError):
        torchbkb.run(SBPE(arms, GaussianKernel(LS), **kw), flaky, budget=80, checkpoint=ck, progress=False)
    b = SBPE(arms, GaussianKernel(LS), **kw)
    hist = torchbkb.run(b, flaky, budget=80, checkpoint=ck, progress=False)
    # the failed arm is told after its batch's others: the same batches, one in another order (so the last
    # batch's measured λ_max, and its width, differ in the last digits)
    assert sorted(zip(hist.batch, hist.index)) == sorted(zip(ref.batch, ref.index))
    assert torch.equal(a.active, b.active) and torch.equal(a.recommend(), b.recommend())
    assert b.betas == pytest.approx(a.betas, rel=1e-5)


def test_a_run_ends_when_sbpe_has_asked_its_budget_though_points_failed(tmp_path):
    """Failed points, and a batch cut by a shorter run's budget, are asked and count against S-BPE's own budget:
    the run then ends with the history it has (it used to raise from the next ask and return nothing)."""
    arms, f, g = _problem(9, A=80)
    kw = dict(noise=1e-3, budget=60, rkhs_norm=2.0, subgaussian=0.03, seed=4)
    bad = arms[:, 0] > 0.85

    def flaky(i):
        if bool(bad[int(i[0])]):
            raise RuntimeError("the simulator crashed")
        return float(f[int(i[0])])

    b = SBPE(arms, GaussianKernel(LS), **kw)
    with pytest.warns(RuntimeWarning, match="left out"):
        hist = torchbkb.run(b, flaky, budget=60, on_failure="skip", progress=False)
    assert hist.failures and len(hist) + len(hist.failures) == 60 == b.asked
    assert "own budget of 60" in hist.meta["stopped"]
    ck = tmp_path / "short.pt"
    first = torchbkb.run(SBPE(arms, GaussianKernel(LS), **kw), f, budget=20, checkpoint=ck, progress=False)
    c = SBPE(arms, GaussianKernel(LS), **kw)
    rest = torchbkb.run(c, f, budget=60, checkpoint=ck, progress=False)
    assert len(first) == 20 and 20 < len(rest) < 60 and c.remaining == 0 and "own budget" in rest.meta["stopped"]


# ----------------------------------------------------------------------------- bad inputs
@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(
        [
            (dict(budget=0), "budget"),
            (dict(budget=2.5), "budget"),
            (dict(noise=0.0), "noise"),
            (dict(rkhs_norm=-1.0), "rkhs_norm"),
            (dict(subgaussian=-0.1), "subgaussian"),
            (dict(delta=1.5), "delta"),
            (dict(beta="ucb"), "beta"),
            (dict(lambda_max="guess"), "lambda_max"),
            (dict(lambda_max=-1.0), "lambda_max"),
            (dict(interval="grid"), "interval"),
            (dict(discretization_c=0.0), "discretization_c"),
            (dict(oversample=-2.0), "oversample"),
            (dict(refresh=0), "refresh"),
            (dict(arms=torch.rand(5)), "arms"),
            (dict(arms=torch.tensor([[0.0, float("inf")]])), "finite"),
        ]
    )
)
def test_bad_constructor_arguments(case):
    kw, msg = case
    args = dict(arms=torch.rand(10, 2, dtype=torch.float64), noise=0.01, budget=20)
    args.update(kw)
    arms = args.pop("arms")
    with pytest.raises(InputDataError, match=msg):
        SBPE(arms, GaussianKernel(LS), **args)


def test_bad_tell_leaves_state_unchanged():
    arms, f, _ = _problem(11, A=40)
    b = SBPE(arms, GaussianKernel(LS), noise=0.01, budget=20, seed=0)
    i = b.ask()
    before = b.state_dict()
    for idx, y, msg in [
        (i, f[i][:-1], "rewards"),
        (torch.tensor([39 if int(i[0]) != 39 else 38]), f[:1], "asked"),
        (i, torch.full(i.shape, float("nan"), dtype=torch.float64), "finite"),
    ]:
        with pytest.raises(InputDataError, match=msg):
            b.tell(idx, y)
    after = b.state_dict()
    assert before["pending"] == after["pending"] and before["t"] == after["t"]
    assert torch.equal(before["algorithm"]["active"], after["algorithm"]["active"])
