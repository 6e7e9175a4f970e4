import math

import pytest
import torch

from conftest import tol
from helpers import close, exact_gp, rbf
from torchbkb import GPBUCB, GPUCB, ExactPosterior
from torchbkb.bandits.confidence import gpucb_beta
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

LS = 0.2
LAM = 0.01

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)



def _arms(A=150, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(A, 2, generator=g, dtype=torch.float64)
    f = torch.sin(5 * X[:, 0]) * torch.cos(3 * X[:, 1]) + X[:, 1]
    return X.to(device, dtype), f.to(device, dtype)


def _bandit(arms, **kw):
    args = dict(noise=LAM, beta=0.3, batch_bound=2.0, seed=1)
    args.update(kw)
    return GPBUCB(arms, GaussianKernel(LS), **args)


def _run(bandit, f, T):
    while bandit.t < T:
        idx = bandit.ask()
        bandit.tell(idx, f[idx])


def _told(b):
    return torch.tensor(b.history["index"]), torch.tensor(b.history["reward"], dtype=torch.float64)


def test_batch_bound_one_is_gp_ucb(dtype, device):
    arms, f = _arms(dtype=dtype, device=device)
    a, g = _bandit(arms, batch_bound=1.0), GPUCB(arms, GaussianKernel(LS), noise=LAM, beta=0.3, seed=1)
    _run(a, f, 40)
    _run(g, f, 40)
    assert a.batch_sizes == [1] * 40 and a.history["index"] == g.history["index"]
    for u, v in zip(a.posterior.watched(), g.posterior.watched()):
        assert close(u.double().cpu(), v.double().cpu(), tol(dtype))


def test_in_batch_picks_use_exact_hallucinated_variances_and_the_product_rule():
    arms, f = _arms()
    b = _bandit(arms, batch_bound=3.0, beta=0.5)
    _run(b, f, 20)
    checked = 0
    for _ in range(100):
        if checked == 3:
            break
        idx, y = _told(b)
        batch = b.ask().tolist()
        K = rbf(arms, arms, LS)
        mean_fb, cov = exact_gp(K[idx][:, idx], K[idx], K, y, LAM)  # independent exact GP on the told data
        rls_fb = cov.diagonal() / LAM
        level = 1.0
        for k, i in enumerate(batch):
            # picks hallucinated: rows without rewards
            rows = torch.cat([idx, torch.tensor(batch[:k], dtype=torch.long)])
            _, cov_t = exact_gp(K[rows][:, rows], K[rows], K, torch.zeros(len(rows), dtype=torch.float64), LAM)
            rls_t = cov_t.diagonal().clamp_min(0) / LAM
            assert i == int(torch.argmax(mean_fb + b.beta * rls_t.sqrt()))
            assert b.in_batch_rls[k] == pytest.approx(float(rls_t[i]), abs=1e-8)
            level *= 1.0 + float(rls_fb[i])
            assert (level > 3.0) == (k == len(batch) - 1)  # Π(1 + σ²_fb) <= C̃ until the last pick
        assert close(b.posterior.watched()[0], mean_fb, 1e-8)  # the mean is frozen in the batch
        checked += len(batch) >= 2
        b.tell(torch.tensor(batch), f[batch])
    assert checked == 3


@pytest.mark.parametrize("discard", [False, True])
def test_after_the_batch_the_posterior_is_the_exact_gp_of_the_told_rewards(discard):
    arms, f = _arms()
    b = _bandit(arms, batch_bound=4.0, beta=0.6)
    _run(b, f, 15)
    batch = b.ask()
    while len(batch) < 3:
        b.tell(batch, f[batch])
        batch = b.ask()
    order = torch.flip(batch, [0])  # told in another order than asked
    if discard:
        b.tell(order[:-1], f[order[:-1]])
        b.discard(order[-1:])  # the first pick (a hallucinated row) never comes back
    else:
        b.tell(order, f[order])
    idx, y = _told(b)
    ref = ExactPosterior(GaussianKernel(LS), LAM).fit(arms[idx], y)
    for u, v in zip(b.posterior.watched(), ref(arms)):
        assert close(u, v, 1e-8)
    K = rbf(arms[idx], arms[idx], LS)
    log_det = float(torch.logdet(torch.eye(len(idx), dtype=torch.float64) + K / LAM))
    assert b.log_det == pytest.approx(log_det, abs=1e-8)  # Σ log(1 + σ²_{s-1}(x_s)) over the told points
    _run(b, f, b.t + 10)


def test_theory_width_is_batch_bound_times_gpucb_beta():
    arms, f = _arms()
    b = _bandit(arms, beta="theory", batch_bound=2.5, F=1.5, delta=0.1)
    for _ in range(6):
        b.ask()
        expected = gpucb_beta(b.log_det, noise_std=math.sqrt(LAM), lam=LAM, F=1.5, delta=0.1)
        assert b.beta == pytest.approx(2.5 * expected, rel=1e-12)
        idx = b.pending
        b.tell(idx, f[idx])


def _resume_and_continue(a, arms, f, T, mid_batch, **kw):
    """Checkpoint ``a`` (``mid_batch``: with one reward of a batch of two or more told), load it into a bandit
    built with another seed, finish the open batch in both and run both to ``T``; returns the resumed one."""
    if mid_batch:
        batch = a.ask()
        while len(batch) < 2:
            a.tell(batch, f[batch])
            batch = a.ask()
        a.tell(batch[-1:], f[batch[-1:]])
    b = _bandit(arms, seed=99, **kw)
    b.load_state_dict(a.state_dict())
    if mid_batch:
        rest = a.pending
        a.tell(rest, f[rest])
        b.tell(rest, f[rest])
    _run(a, f, T)
    _run(b, f, T)
    return b


@pytest.mark.parametrize("mid_batch", [False, True])
def test_checkpoint_resume_is_an_identical_continuation(mid_batch):
    arms, f = _arms()
    a = _bandit(arms, batch_bound=3.0)
    _run(a, f, 25)
    b = _resume_and_continue(a, arms, f, 70, mid_batch, batch_bound=3.0)
    assert a.history == b.history and a.batch_sizes == b.batch_sizes and a.log_det == pytest.approx(b.log_det, abs=1e-9)


def test_product_rule_batches_are_no_longer_than_bbkbs_sum_rule():
    # same exact variances (BBKB with every pulled arm in its dictionary): Weierstrass, 1 + Σ s <= Π(1 + s)
    from torchbkb import BBKB

    arms, f = _arms(A=100)
    g = _bandit(arms, batch_bound=3.0, beta=0.4)
    s = BBKB(arms, GaussianKernel(LS), noise=LAM, q_bar=1e9, beta=0.4, batch_bound=3.0, seed=1)
    first = g.ask()
    g.tell(first, f[first])
    s.ask()
    s.tell(first, f[first])
    gb, sb = g.ask(), s.ask()
    assert len(gb) <= len(sb) and gb.tolist() == sb[: len(gb)].tolist()


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(batch_bound=0.9), "batch_bound"),
        (dict(batch_bound=float("inf")), "batch_bound"),
        (dict(max_batch_size=0), "max_batch_size"),
        (dict(beta="x"), "beta"),
    ],
)
def test_bad_arguments(kw, msg):
    arms, _ = _arms(A=10)
    with pytest.raises(InputDataError, match=msg):
        _bandit(arms, **kw)


@pytest.mark.parametrize("mid_batch", [False, True])
def test_repeated_pulls_are_merged_at_batch_ends_and_survive_a_checkpoint(mid_batch):
    arms = torch.linspace(0, 1, 25, dtype=torch.float64)[:, None]
    f = torch.sin(5 * arms[:, 0]) + 0.5 * torch.cos(11 * arms[:, 0])
    a = _bandit(arms, batch_bound=2.0)
    _run(a, f, 150)
    p = int((a.counts > 0).sum())
    assert a.compactions >= 1 and a.posterior.num_train < 2 * p + 16 + max(a.batch_sizes)
    idx, y = _told(a)
    ref = ExactPosterior(GaussianKernel(LS), LAM).fit(arms[idx], y)  # one row per told reward
    for u, v in zip(a.posterior.watched(), ref(arms)):
        assert close(u, v, 1e-9)
    b = _resume_and_continue(a, arms, f, 300, mid_batch, batch_bound=2.0)
    assert a.history == b.history and a.batch_sizes == b.batch_sizes and a.compactions == b.compactions
    for u, v in zip(a.posterior.watched(), b.posterior.watched()):
        assert close(u, v, 1e-10)


def test_consecutive_repeats_share_a_row_and_keep_exact_variances():
    # few arms and a narrow width: late batches pick the same arm again and again
    arms = torch.linspace(0, 1, 12, dtype=torch.float64)[:, None]
    f = torch.sin(5 * arms[:, 0])
    # (a well-known arm alone would fill a batch for ages)
    b = _bandit(arms, batch_bound=1.5, beta=0.05, max_batch_size=25)
    _run(b, f, 40)
    K = rbf(arms, arms, LS)
    repeats = 0
    for _ in range(30):
        idx, y = _told(b)
        n_before = b.posterior.num_train
        batch = b.ask().tolist()
        repeats += sum(u == v for u, v in zip(batch[:-1], batch[1:-1]))
        rows = len(batch) - 1 - sum(u == v for u, v in zip(batch[:-2], batch[1:-1]))
        assert b.posterior.num_train == n_before + rows  # one row per run of equal picks
        for k, i in enumerate(batch):
            prior = torch.cat([idx, torch.tensor(batch[:k], dtype=torch.long)])
            _, cov_t = exact_gp(K[prior][:, prior], K[prior], K, torch.zeros(len(prior), dtype=torch.float64), LAM)
            assert b.in_batch_rls[k] == pytest.approx(float(cov_t[i, i].clamp_min(0)) / LAM, abs=1e-9)
        b.tell(torch.tensor(batch), f[batch])
        idx, y = _told(b)
        ref = ExactPosterior(GaussianKernel(LS), LAM).fit(arms[idx], y)
        for u, v in zip(b.posterior.watched(), ref(arms)):
            assert close(u, v, 1e-9)
    assert repeats >= 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cap", [None, 4])
def test_a_prior_variance_too_small_for_the_product_rule_ends_the_batch(cap):
    """A kernel with prior variance 1e-100 (σ²_fb ≈ 0 next to λ): the product never passes C̃, so without a cap each
    pick ends its batch instead of repeating the arm forever; with a cap the batch runs to the cap."""
    arms, f = _arms(A=40)
    base = GaussianKernel(LS)
    b = GPBUCB(arms, lambda x1, x2: 1e-100 * base(x1, x2), noise=LAM, beta=0.3, batch_bound=2.0, max_batch_size=cap,
               seed=1)
    _run(b, f, 20)
    assert b.batch_sizes[0] == 1 and set(b.batch_sizes[1:]) == {1 if cap is None else cap}


def _literal_batch(X, rows, y_rows, alpha, C, rule):
    """One batch selected one pick at a time from scratch: the exact GP refitted on the history plus the
    picks so far (hallucinated: their rewards do not matter to the variances), UCB μ_fb + α σ_{t-1}."""
    K = lambda A, B: rbf(A, B, LS)  # noqa: E731
    R = X[rows]
    mean_fb, cov = exact_gp(K(R, R), K(R, X), K(X, X), y_rows, LAM)
    var_fb = cov.diagonal() / LAM
    picks, level = [], 1.0
    while True:
        H = X[rows + picks]
        _, cov_t = exact_gp(K(H, H), K(H, X), K(X, X), torch.zeros(len(rows) + len(picks), dtype=torch.float64), LAM)
        var_t = cov_t.diagonal().clamp_min(0.0) / LAM
        i = int(torch.argmax(mean_fb + alpha * var_t.sqrt()))
        picks.append(i)
        level *= 1.0 + float(var_fb[i] if rule == "batch_start" else var_t[i])
        if level > C:
            return picks


@pytest.mark.parametrize("rule", ["batch_start", "in_batch"])
def test_stop_rules_match_literal_one_at_a_time_selection(rule):
    arms, f = _arms(A=60, seed=3)
    bandit = _bandit(arms, beta=0.5, batch_bound=3.0, stop_rule=rule)
    while bandit.t < 50:
        batch = bandit.ask()
        if bandit.t:
            rows = list(bandit.history["index"])
            y = torch.tensor(bandit.history["reward"], dtype=torch.float64)
            assert batch.tolist() == _literal_batch(arms, rows, y, 0.5, 3.0, rule)
        bandit.tell(batch, f[batch])


def test_in_batch_rule_gives_batches_at_least_as_long():
    arms, f = _arms(A=80, seed=4)
    sizes = {}
    for rule in ("batch_start", "in_batch"):
        bandit = _bandit(arms, beta=0.5, batch_bound=3.0, stop_rule=rule)
        first = bandit.ask()
        bandit.tell(first, f[first])
        batch = bandit.ask()  # both rules see the same posterior and pick the same arms while both go on
        sizes[rule] = batch.tolist()
    short, long_ = sizes["batch_start"], sizes["in_batch"]
    assert len(long_) >= len(short) and long_[: len(short)] == short


def test_unknown_stop_rule_is_rejected():
    arms, _ = _arms(A=10)
    with pytest.raises(InputDataError, match="stop_rule: expected one of"):
        _bandit(arms, stop_rule="desautels")
