import math

import pytest
import torch

from helpers import close, rbf
from torchbkb import GPUCB, ArmObjective, ExactPosterior, run
from torchbkb.confidence import gpucb_beta
from torchbkb.kernels import GaussianKernel


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
    assert bandit.current_beta() == pytest.approx(gpucb_beta(logdet, noise_std=math.sqrt(lam), lam=lam, F=1.0, delta=0.01))


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
    full = run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=30, progress=False)
    ck = tmp_path / "gpucb.pt"
    run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=12, progress=False, checkpoint=ck)
    resumed = run(GPUCB(arms, k, noise=0.05, beta="theory", seed=1), ArmObjective(f, 0.1, seed=2), budget=30, progress=False, checkpoint=ck)
    assert resumed.index == full.index
