"""BKB/BBKB score the variance only of the arms whose UCB bound ``μ̃ + w √(k/λ)`` reaches the largest mean.

Exactness: the choices equal those of scoring every arm (``prune=False``), and an arm that was skipped
never had a chance -- its exact UCB is below the largest one.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import close
from torchbkb import BBKB, BKB
from torchbkb.gp.kernels import GaussianKernel

LAM, WIDTH = 0.2, 2.0 * 0.2**0.5  # "2σ on the GP scale": the RLS-scale UCB bonus at the prior is 2.0


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)


def _problem(A=1500, seed=0):
    """Arms in [0, 1]², rewards a smooth bump in [0, 4] with a zero prior mean (as Cadata's raw house values):
    far from the bump the UCB bound stays below the best mean, so most arms are skipped once it is found."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(A, 2, generator=g, dtype=torch.float64)
    f = 4.0 * torch.exp(-((X - torch.tensor([0.7, 0.3], dtype=torch.float64)) ** 2).sum(-1) / 0.08)
    return X, GaussianKernel(0.15), f


def _bandit(cls, X, k, prune, **kw):
    args = dict(noise=LAM, q_bar=2.0, beta=WIDTH, seed=3, prune=prune)
    if cls is BBKB:
        args["batch_bound"] = 2.0
    args.update(kw)
    return cls(X, k, **args)


def _run(bandit, f, T, scored=None):
    while bandit.t < T:
        idx = bandit.ask()
        bandit.tell(idx, f[idx])
        if scored is not None:
            scored.append(bandit.arms_scored)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_pruned_runs_make_the_choices_of_scoring_every_arm(cls):
    X, k, f = _problem()
    a, b = _bandit(cls, X, k, prune=True), _bandit(cls, X, k, prune=False)
    scored = []
    _run(a, f, 400, scored)
    _run(b, f, 400)
    assert a.history == b.history
    assert torch.equal(a.dictionary, b.dictionary)
    if cls is BBKB:
        assert a.batch_sizes == b.batch_sizes
    # pruning was active: late in the run a small part of the arms is scored (the unpruned run scores all)
    assert min(scored) < 0.25 * X.shape[0] and b.arms_scored == X.shape[0]
    # the full scores are filled in on demand and equal the unpruned ones
    (ma, ra), (mb, rb) = a.scores(), b.scores()
    assert close(ma, mb, 1e-10) and close(ra, rb, 1e-10)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), T=st.integers(2, 120), width=st.sampled_from([0.2, WIDTH, 2.0]))
def test_a_skipped_arm_is_never_the_argmax(seed, T, width):
    """At any point of a run, every arm left unscored has an exact UCB below the largest mean (so below the
    largest UCB, and below every UCB BBKB's batch can reach); the pulled arms are always scored."""
    X, k, f = _problem(A=600, seed=seed % 7)
    bandit = _bandit(BKB, X, k, prune=True, beta=width, seed=seed)
    _run(bandit, f, T)
    mean, rls = bandit.scores()
    exact_ucb = mean + width * rls.sqrt()
    if bandit.scored_arms is not None:
        skipped = torch.ones(X.shape[0], dtype=torch.bool)
        skipped[bandit.scored_arms] = False
        assert not bool(skipped[bandit.counts > 0].any())
        assert bool((exact_ucb[skipped] < mean.max()).all())
        assert bool((rls <= bandit.kdiag / LAM).all())  # σ̃² never above the prior's


def test_scores_fill_in_the_skipped_variances_exactly():
    X, k, f = _problem()
    bandit = _bandit(BKB, X, k, prune=True)
    _run(bandit, f, 300)
    assert bandit.arms_scored < X.shape[0]
    partial = bandit.arm_rls.clone()
    mean, rls = bandit.scores()
    post = bandit.posterior  # the DTC posterior on the same dictionary and pulls (float64 reference)
    ref_mean, ref_var = post(X)
    assert close(mean, ref_mean, 1e-9) and close(rls, ref_var / LAM, 1e-7)
    assert torch.equal(rls[bandit.scored_arms], partial[bandit.scored_arms])  # the scored ones are not recomputed
    assert bandit.scores()[1] is rls  # computed once per update


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_checkpoint_resume_with_pruning_is_an_identical_continuation(cls):
    X, k, f = _problem()
    a = _bandit(cls, X, k, prune=True)
    _run(a, f, 150)
    if cls is BBKB:  # stop in the middle of a batch
        idx = a.ask()
        while len(idx) < 2:
            a.tell(idx, f[idx])
            idx = a.ask()
        a.tell(idx[:1], f[idx[:1]])
    assert a.arms_scored < X.shape[0]
    b = _bandit(cls, X, k, prune=True, seed=99)
    b.load_state_dict(a.state_dict())
    # (BBKB, stopped mid-batch, refits on loading with the batch's told rewards; its next update redoes it)
    if cls is BKB:
        # the refit on loading took the same path
        assert torch.equal(a.arm_means, b.arm_means) and torch.equal(a.arm_rls, b.arm_rls)
    assert a.pruning.state() == b.pruning.state()
    _run(a, f, 400)
    _run(b, f, 400)
    assert a.history == b.history
    assert torch.equal(a.scores()[0], b.scores()[0]) and torch.equal(a.scores()[1], b.scores()[1])


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_excluded_arms_do_not_set_the_pruning_level(cls):
    """The level the bounds are compared with is the largest mean of the arms that can still be picked: with
    the best arms excluded, the runs with and without pruning still agree."""
    X, k, f = _problem()
    runs = []
    for prune in (True, False):
        bandit = _bandit(cls, X, k, prune=prune)
        _run(bandit, f, 120)
        excluded, later = 0, []
        while excluded < 3 or len(later) < 100:
            idx = bandit.ask()
            if excluded < 3:  # the first arm of each of the next three selections keeps failing: excluded
                bandit.discard(idx[:1], exclude=True)
                idx, excluded = idx[1:], excluded + 1
            else:
                later += idx.tolist()  # asked after the exclusions
            if len(idx):
                bandit.tell(idx, f[idx])
        runs.append((bandit.history["index"], later, bandit.excluded.nonzero().squeeze(1).tolist()))
    assert runs[0] == runs[1]
    _, later, excluded = runs[0]
    assert len(excluded) == 3 and not set(later) & set(excluded)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_pruning_level_is_the_largest_mean_among_arms_not_excluded(cls):
    """Exclude every arm whose mean is within the UCB bonus of the top: the arms left all have bounds below
    the overall largest mean, so a level taken over all arms would skip every one of them."""
    X, k, f = _problem()
    bandit = _bandit(cls, X, k, prune=True)
    _run(bandit, f, 150)
    mean = bandit.scores()[0]
    bandit.excluded |= mean >= float(mean.max()) - 2.5  # as discard(..., exclude=True) would, for many arms at once
    idx = bandit.ask()  # one more update: it rescores with the exclusions
    bandit.tell(idx, f[idx])
    mean, rls = bandit.scores()
    ucb = (mean + WIDTH * rls.sqrt()).masked_fill(bandit.excluded, -torch.inf)
    best = int(torch.argmax(ucb))
    assert bandit.scored_arms is None or best in bandit.scored_arms.tolist()
    assert int(bandit.ask()[0]) == best


def test_scored_features_and_the_scoring_counters():
    X, k, f = _problem()
    bandit = _bandit(BBKB, X, k, prune=True)
    _run(bandit, f, 300)
    scored = bandit.scored_arms
    assert scored is not None and bandit.arms_scored == scored.numel() < X.shape[0]
    assert close(bandit.scored_features(), bandit.arm_features()[scored], 1e-12)
    assert bandit.arms_scored <= bandit.arms_scored_total < bandit.num_resparsifications * X.shape[0]
    full = _bandit(BBKB, X, k, prune=False)
    _run(full, f, 300)
    assert full.arms_scored_total == full.num_resparsifications * X.shape[0]
    with pytest.raises(Exception, match="prune"):
        full.scored_features()


def test_pruning_backs_off_when_most_arms_pass(monkeypatch):
    """With a width so wide that no arm can be skipped, an attempt (means first, then every variance) costs a
    pass more than scoring in one product: after each failed attempt the next 1, 2, 4, ... (at most
    PRUNE_MAX_BACKOFF) updates do not try; the choices stay those of scoring every arm, and a checkpoint taken
    in the middle of a back-off resumes identically (the refit on loading repeats the saved scoring path)."""
    from torchbkb.bandits import pruning as pruning_module
    from torchbkb.gp import kernel_row_posterior as scoring_module

    X, k, f = _problem(A=400)
    a = _bandit(BKB, X, k, prune=True, beta=50.0)
    attempts = []
    while a.t < 120:
        i = a.ask()
        a.tell(i, f[i])
        attempts.append(a.pruning.last_attempt)
        assert a.arms_scored == X.shape[0]  # nothing can be skipped at this width
    at = [t for t, x in enumerate(attempts) if x]
    gaps = [j - i for i, j in zip(at, at[1:])]
    cap = pruning_module.PRUNE_MAX_BACKOFF
    assert gaps[:5] == [2, 3, 5, 9, 17] and set(gaps[4:]) == {cap + 1}  # waits 1, 2, 4, 8, 16, 16, ...
    full = _bandit(BKB, X, k, prune=False, beta=50.0)
    _run(full, f, 120)
    assert full.history == a.history
    a2 = _bandit(BKB, X, k, prune=True, beta=50.0)
    # stop in a back-off, after an update that did not try
    while a2.pruning.wait == 0 or a2.pruning.last_attempt or a2.t < 60:
        i = a2.ask()
        a2.tell(i, f[i])
    b = _bandit(BKB, X, k, prune=True, beta=50.0, seed=77)
    calls = []
    one_product = scoring_module.score_kernel_columns
    monkeypatch.setattr(scoring_module, "score_kernel_columns", lambda *args: calls.append(1) or one_product(*args))
    b.load_state_dict(a2.state_dict())
    assert calls == [1]  # the refit on loading scored in one product, as the saved run's last update did
    assert torch.equal(a2.arm_means, b.arm_means) and b.pruning.wait == a2.pruning.wait > 0
    _run(a2, f, 200)
    _run(b, f, 200)
    assert a2.history == b.history and torch.equal(a2.arm_means, b.arm_means)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), A=st.integers(1, 60), P=st.integers(0, 8), n_excluded=st.integers(0, 5))
def test_survivors_are_the_fixed_shape_mask_of_the_same_bound(seed, A, P, n_excluded):
    """The eager update's survivors are the arms of the fixed-capacity update's mask, with or without exclusions,
    ties at the level included."""
    from torchbkb.bandits.pruning import survivor_mask, ucb_survivors

    g = torch.Generator().manual_seed(seed)
    mean = torch.randint(0, 4, (A,), generator=g).to(torch.float64) / 4  # ties with the largest mean
    bonus = torch.randint(0, 3, (A,), generator=g).to(torch.float64) / 8
    keep = torch.randint(0, A, (P,), generator=g)  # may repeat
    excluded = torch.zeros(A, dtype=torch.bool)
    excluded[torch.randint(0, A, (min(n_excluded, A - 1),), generator=g)] = True
    valid = torch.ones(P, dtype=torch.bool)
    for exc in (excluded, torch.zeros(A, dtype=torch.bool)):
        ref = survivor_mask(mean, bonus, exc, keep, valid).nonzero().squeeze(1)
        assert torch.equal(ucb_survivors(mean, bonus, exc, keep), ref)


def _isolated_best_arm(seed):
    """500 arms in [0, 0.5] with rewards 0.3 sin 8x, and arm 0 alone at x = 3 with the best reward, 1: once found,
    its mean sets the pruning level."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(500, 1, generator=g, dtype=torch.float64) * 0.5
    X[0] = 3.0
    f = 0.3 * torch.sin(8.0 * X[:, 0])
    f[0] = 1.0
    return X, f


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize(("cls", "seed", "T"), [(BKB, 0, 60), (BBKB, 1, 40)])
def test_arms_excluded_by_writing_the_mask_after_a_pruned_update_leave_the_exact_argmax(cls, seed, T, fixed):
    """The last update pruned with the level of an arm that a direct write of ``excluded`` then excludes (an isolated
    arm of the best reward): the next pick is still the argmax of the exact UCBs of the arms left."""
    X, f = _isolated_best_arm(seed)
    kw = {"batch_bound": 2.0, "max_batch_size": 20} if cls is BBKB else {}
    bandit = cls(X, GaussianKernel(0.1), noise=0.5, beta=0.1, seed=seed, **kw)
    bandit.fixed_capacity = fixed
    _run(bandit, f, T)
    assert bandit.scored_arms is not None  # the last update pruned
    mean, rls = bandit.scores()
    top = int(mean.argmax())
    assert top == 0
    bandit.excluded[top] = True
    ucb = (mean + 0.1 * rls.sqrt()).masked_fill(bandit.excluded, -torch.inf)
    assert int(bandit.ask()[0]) == int(ucb.argmax())


def test_a_checkpoint_after_a_direct_write_of_the_mask_resumes_with_the_same_choices():
    """The checkpoint is taken between the write and the next ``ask``: the resumed bandit picks as the live one."""
    X, f = _isolated_best_arm(0)
    make = lambda: BKB(X, GaussianKernel(0.1), noise=0.5, beta=0.1, seed=0)  # noqa: E731
    live = make()
    _run(live, f, 60)
    assert live.scored_arms is not None
    live.excluded[0] = True
    resumed = make()
    resumed.load_state_dict(live.state_dict())
    for _ in range(10):
        idx = live.ask()
        assert resumed.ask().tolist() == idx.tolist()
        live.tell(idx, f[idx])
        resumed.tell(idx, f[idx])
