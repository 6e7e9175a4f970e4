"""BKBModel inside unmodified BoTorch code: every supported acquisition/optimizer pair runs, and complete
Hartmann-6 loops (discrete candidates and continuous bounds) beat random search."""

import math

import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    UpperConfidenceBound,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.optim import optimize_acqf, optimize_acqf_discrete
from botorch.sampling import SobolQMCNormalSampler
from botorch.test_functions import Hartmann

from torchbkb.botorch import BBKBUpperConfidenceBound, BKBModel, BKBUpperConfidenceBound, optimize_acqf_bbkb

HART = Hartmann(dim=6, negate=True)  # maximize; optimum 3.32237
BOUNDS = torch.stack([torch.zeros(6), torch.ones(6)]).double()
OPT = {"maxiter": 25}


def _acq(name, model, X, Y):
    sampler = SobolQMCNormalSampler(torch.Size([32]), seed=0)
    return {
        "UCB": lambda: UpperConfidenceBound(model, beta=4.0),
        "BKBUCB": lambda: BKBUpperConfidenceBound(model, beta="theory"),
        "LogEI": lambda: LogExpectedImprovement(model, best_f=Y.max()),
        "qUCB": lambda: qUpperConfidenceBound(model, beta=4.0, sampler=sampler),
        "qLogNEI": lambda: qLogNoisyExpectedImprovement(model, X_baseline=X, sampler=sampler, prune_baseline=False),
        "BBKBUCB": lambda: BBKBUpperConfidenceBound(model, beta=2.0),
    }[name]()


@pytest.mark.parametrize(
    "name,q,continuous",
    [
        ("UCB", 1, False), ("UCB", 1, True), ("BKBUCB", 1, True), ("LogEI", 1, False), ("LogEI", 1, True),
        ("qUCB", 1, False), ("qUCB", 3, False), ("qUCB", 2, True),
        ("qLogNEI", 2, False), ("qLogNEI", 2, True), ("BBKBUCB", 3, False),
    ],
)
def test_unmodified_botorch_acquisitions_and_optimizers(name, q, continuous):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(15, 6, generator=g, dtype=torch.float64)
    Y = HART(X).unsqueeze(-1)
    model = BKBModel(X, Y, seed=0)
    acq = _acq(name, model, X, Y)
    if continuous:
        cand, val = optimize_acqf(acq, BOUNDS, q=q, num_restarts=2, raw_samples=16, options=OPT)
    else:
        choices = torch.rand(300, 6, generator=g, dtype=torch.float64)
        cand, val = optimize_acqf_discrete(acq, q=q, choices=choices)
        assert (cand.unsqueeze(1) == choices.unsqueeze(0)).all(-1).any(-1).all()
    assert cand.shape == (q, 6)
    assert bool(((cand >= 0) & (cand <= 1)).all()) and bool(torch.isfinite(val).all())
    if continuous and q == 1:
        # the optimizer moved the start points along the (nonzero) gradient: not a raw sample
        x = cand.clone().requires_grad_(True)
        acq(x.unsqueeze(0)).sum().backward()
        assert bool(torch.isfinite(x.grad).all())


def _expected_best_of_random(values, k):
    """E[max of k draws without replacement] from a finite set, exactly."""
    s = values.sort().values.double()
    n = len(s)
    i = torch.arange(k - 1, n, dtype=torch.float64)  # the max is the i-th smallest (0-based), i >= k - 1
    log_c = lambda a, b: torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)
    p = torch.exp(log_c(i, torch.tensor(k - 1.0)) - log_c(torch.tensor(float(n)), torch.tensor(float(k))))
    return float((p * s[k - 1 :]).sum())


def test_expected_best_of_random_formula():
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # k = 2 over 4 values: pairs' maxima are 2,3,4,3,4,4 -> mean 20/6
    assert _expected_best_of_random(v, 2) == pytest.approx(20 / 6)
    assert _expected_best_of_random(v, 1) == pytest.approx(2.5)


def test_discrete_loop_beats_random_search():
    n_init, T, bo, rnd = 8, 16, [], []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        C = torch.rand(1500, 6, generator=g, dtype=torch.float64)
        fC = HART(C)
        idx = torch.randperm(len(C), generator=g)[:n_init]
        X, Y = C[idx], fC[idx].unsqueeze(-1)
        for t in range(T):
            model = BKBModel(X, Y, seed=t)  # the only line that differs from a SingleTaskGP loop
            cand, _ = optimize_acqf_discrete(UpperConfidenceBound(model, beta=4.0), q=1, choices=C)
            X, Y = torch.cat([X, cand]), torch.cat([Y, HART(cand).unsqueeze(-1)])
        bo.append(float(Y.max()))
        rnd.append(_expected_best_of_random(fC, n_init + T))
    assert sum(bo) / 3 > sum(rnd) / 3 + 0.4, (bo, rnd)


def test_discrete_bbkb_batches_beat_random_search():
    n_init, budget, bo, rnd = 8, 24, [], []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        C = torch.rand(1500, 6, generator=g, dtype=torch.float64)
        fC = HART(C)
        idx = torch.randperm(len(C), generator=g)[:n_init]
        X, Y = C[idx], fC[idx].unsqueeze(-1)
        while len(X) < budget:
            model = BKBModel(X, Y, seed=len(X))
            alpha = math.sqrt(4.0 * model.noise)  # RLS scale: BoTorch's UCB(beta=4) is α̃ = √(4λ)
            cand, _ = optimize_acqf_bbkb(model, C, batch_bound=2.0, beta=alpha, max_batch_size=budget - len(X))
            X, Y = torch.cat([X, cand]), torch.cat([Y, HART(cand).unsqueeze(-1)])
        bo.append(float(Y.max()))
        rnd.append(_expected_best_of_random(fC, budget))
    assert sum(bo) / 3 > sum(rnd) / 3 + 0.4, (bo, rnd)


def test_continuous_loop_beats_random_search():
    n_init, T, bo = 8, 12, []
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        X = torch.rand(n_init, 6, generator=g, dtype=torch.float64)
        Y = HART(X).unsqueeze(-1)
        for t in range(T):
            model = BKBModel(X, Y, seed=t)
            torch.manual_seed(t)  # optimize_acqf's raw samples
            cand, _ = optimize_acqf(LogExpectedImprovement(model, best_f=Y.max()), BOUNDS, q=1, num_restarts=2,
                                    raw_samples=32, options=OPT)
            X, Y = torch.cat([X, cand]), torch.cat([Y, HART(cand).unsqueeze(-1)])
        bo.append(float(Y.max()))
    # random search with the same budget, averaged over many replicates
    R = HART(torch.rand(2000, n_init + T, 6, generator=torch.Generator().manual_seed(99),
                        dtype=torch.float64)).max(-1).values
    assert sum(bo) / 2 > float(R.mean()) + 0.4, (bo, float(R.mean()))
