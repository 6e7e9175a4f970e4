import math

import pytest
import torch

from helpers import close, rbf
from torchbkb import GPUCB, ArmObjective, ExactPosterior, run
from torchbkb.bandits import gpucb as gpucb_module
from torchbkb.bandits.confidence import gpucb_beta
from torchbkb.gp.kernels import GaussianKernel


def _problem(A=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    f = torch.sin(4 * arms[:, 0]) * torch.cos(3 * arms[:, 1])
    return arms, GaussianKernel(0.3), f


def test_incremental_posterior_equals_a_refit_and_logdet_is_exact():
    arms, k, f = _problem()
    lam = 0.05
    bandit = GPUCB(arms, k, noise=lam, beta="theory", F=1.0, seed=0)
    hist = run(bandit, ArmObjective(f, 0.1, seed=1), budget=50, progress=False)
    idx = torch.tensor(hist.index)
    ref = ExactPosterior(k, lam).fit(arms[idx], torch.tensor(hist.reward, dtype=torch.float64))
    for a, b in zip(bandit.posterior.watched(), ref(arms)):
        assert close(a, b, 1e-9)
    X = arms[idx]
    logdet = float(torch.logdet(torch.eye(50, dtype=torch.float64) + rbf(X, X, 0.3) / lam))
    assert bandit.log_det == pytest.approx(logdet, abs=1e-8)
    assert bandit.current_beta() == pytest.approx(gpucb_beta(logdet, noise_std=math.sqrt(lam), lam=lam, F=1.0,
                                                             delta=0.01))


def test_selection_is_the_ucb_argmax_with_lowest_index_ties():
    arms = torch.zeros(5, 1, dtype=torch.float64)  # all identical: every UCB ties
    bandit = GPUCB(arms, GaussianKernel(1.0), noise=0.1, beta=1.0, seed=0)
    i = bandit.ask()
    bandit.tell(i, torch.tensor([1.0], dtype=torch.float64))
    assert int(bandit.ask()) == 0


def test_sublinear_regret():
    arms, k, f = _problem(A=200, seed=3)
    hist = run(GPUCB(arms, k, noise=0.01, beta=0.2, seed=0), ArmObjective(f, 0.1, seed=0), budget=200, progress=False)
    assert hist.normalized_regret[-1] < 0.2
    R = hist.cumulative_regret
    assert R[-1] / 200 < 0.5 * R[49] / 50


def test_checkpoint_resume(tmp_path):
    arms, k, f = _problem(A=80, seed=5)
    full = run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=30,
               progress=False)
    ck = tmp_path / "gpucb.pt"
    run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=12, progress=False,
        checkpoint=ck)
    resumed = run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=30,
                  progress=False, checkpoint=ck)
    assert resumed.index == full.index


def _few_arms(A=30, seed=0):
    """A smooth function on a handful of arms: GP-UCB re-pulls its best arms most of the time."""
    arms = torch.linspace(0, 1, A, dtype=torch.float64)[:, None]
    f = torch.sin(5 * arms[:, 0]) + 0.5 * torch.cos(11 * arms[:, 0])
    return arms, GaussianKernel(0.2), f


@pytest.mark.parametrize("beta", [0.3, "theory"])
def test_repeated_pulls_are_merged_into_counts_exactly(beta, monkeypatch):
    arms, k, f = _few_arms()
    lam, T = 0.05, 300
    bandit = GPUCB(arms, k, noise=lam, beta=beta, seed=0)
    hist = run(bandit, ArmObjective(f, 0.1, seed=1), budget=T, progress=False)
    p = int((bandit.counts > 0).sum())
    assert bandit.compactions >= 5
    assert bandit.posterior.num_train < 2 * p + 16  # rows bounded by the distinct arms, not by t
    idx = torch.tensor(hist.index)
    y = torch.tensor(hist.reward, dtype=torch.float64)
    ref = ExactPosterior(k, lam).fit(arms[idx], y)  # one row per pull
    for a, b in zip(bandit.posterior.watched(), ref(arms)):
        assert close(a, b, 1e-9)
    X = arms[idx]  # the exact log-determinant over all T pulls, repeated rows included
    logdet = float(torch.logdet(torch.eye(T, dtype=torch.float64) + rbf(X, X, 0.2) / lam))
    assert bandit.log_det == pytest.approx(logdet, abs=1e-7)
    # the same run with one row per pull (nothing merged) makes the same choices
    monkeypatch.setattr(gpucb_module, "COMPACT_MIN", 10**9)
    plain = GPUCB(arms, k, noise=lam, beta=beta, seed=0)
    assert run(plain, ArmObjective(f, 0.1, seed=1), budget=T, progress=False).index == hist.index
    assert plain.compactions == 0 and plain.posterior.num_train == T


def test_checkpoint_resume_after_merging_repeated_pulls(tmp_path):
    arms, k, f = _few_arms()
    full_bandit = GPUCB(arms, k, noise=0.05, beta="theory", seed=1)
    full = run(full_bandit, ArmObjective(f, 0.1, seed=2), budget=250, progress=False)
    ck = tmp_path / "gpucb.pt"
    first = GPUCB(arms, k, noise=0.05, beta="theory", seed=1)
    run(first, ArmObjective(f, 0.1, seed=2), budget=130, progress=False, checkpoint=ck)
    assert first.compactions > 0 and first.posterior.num_train > int((first.counts > 0).sum())  # merged, then more rows
    resumed_bandit = GPUCB(arms, k, noise=0.05, beta="theory", seed=1)
    resumed = run(resumed_bandit, ArmObjective(f, 0.1, seed=2), budget=250, progress=False, checkpoint=ck)
    assert resumed.index == full.index
    assert resumed_bandit.compactions == full_bandit.compactions
    assert resumed_bandit.posterior.num_train == full_bandit.posterior.num_train
    for a, b in zip(resumed_bandit.posterior.watched(), full_bandit.posterior.watched()):
        assert close(a, b, 1e-10)
    assert resumed_bandit.log_det == pytest.approx(full_bandit.log_det, abs=1e-10)
