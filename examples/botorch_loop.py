"""A BoTorch loop as in BoTorch's "Getting started" -- with only the model class swapped for BKB.

Maximizes Hartmann-6 on the unit cube three ways, all with unmodified BoTorch acquisition functions and
optimizers:

1. continuous domain: ``LogExpectedImprovement`` + ``optimize_acqf`` (gradients flow through BKBModel);
2. discrete domain: ``UpperConfidenceBound`` + ``optimize_acqf_discrete`` over 20,000 candidates;
3. BBKB's adaptive batches: ``optimize_acqf_bbkb`` over the same candidates.

The BoTorch line each loop would have had is kept in a comment next to the one that replaces it. Also
shows ``BKBModel.from_model`` (adopt a fitted SingleTaskGP's hyperparameters, training-free afterwards).

Run from the repository root:  python examples/botorch_loop.py        (about 10-30 s on 2 CPU cores)
"""

from __future__ import annotations

import math
import time

import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf, optimize_acqf_discrete
from botorch.test_functions import Hartmann
from gpytorch.mlls import ExactMarginalLogLikelihood

from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood, optimize_acqf_bbkb

torch.manual_seed(0)
f = Hartmann(dim=6, negate=True)  # maximum 3.32237
bounds = torch.stack([torch.zeros(6), torch.ones(6)]).to(torch.double)


def continuous_loop(n_init: int = 10, iterations: int = 20) -> torch.Tensor:
    train_X = torch.rand(n_init, 6, dtype=torch.double)
    train_Y = f(train_X).unsqueeze(-1)
    for _ in range(iterations):
        # gp = SingleTaskGP(train_X, train_Y, input_transform=Normalize(d=6), outcome_transform=Standardize(m=1))
        # fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        gp = BKBModel(train_X, train_Y, input_transform=Normalize(d=6), outcome_transform=Standardize(m=1))
        fit_gpytorch_mll(DTCMarginalLogLikelihood(gp.likelihood, gp))
        logEI = LogExpectedImprovement(model=gp, best_f=train_Y.max())
        candidate, acq_value = optimize_acqf(logEI, bounds=bounds, q=1, num_restarts=5, raw_samples=64)
        train_X = torch.cat([train_X, candidate])
        train_Y = torch.cat([train_Y, f(candidate).unsqueeze(-1)])
    return train_Y


def discrete_loop(choices: torch.Tensor, n_init: int = 10, iterations: int = 40) -> torch.Tensor:
    idx = torch.randperm(len(choices))[:n_init]
    train_X, train_Y = choices[idx], f(choices[idx]).unsqueeze(-1)
    for t in range(iterations):
        # model = SingleTaskGP(train_X, train_Y)      (+ fit_gpytorch_mll)
        model = BKBModel(train_X, train_Y, seed=t)
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        candidate, _ = optimize_acqf_discrete(UpperConfidenceBound(model, beta=4.0), q=1, choices=choices)
        train_X = torch.cat([train_X, candidate])
        train_Y = torch.cat([train_Y, f(candidate).unsqueeze(-1)])
    return train_Y


def bbkb_loop(choices: torch.Tensor, n_init: int = 10, budget: int = 50) -> tuple[torch.Tensor, list[int]]:
    idx = torch.randperm(len(choices))[:n_init]
    train_X, train_Y = choices[idx], f(choices[idx]).unsqueeze(-1)
    sizes = []
    while len(train_X) < budget:
        model = BKBModel(train_X, train_Y, seed=len(train_X))
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        # RLS scale (σ̃² = σ²_GP / λ): BoTorch's UCB(beta=b) is α̃ = √(b·λ), and C̃ = 1 + 0.1/λ ends a batch once
        # the GP-scale variances of its picks (standardized outcomes, at the batch start) sum past 0.1
        alpha = math.sqrt(4.0 * model.noise)
        batch, _ = optimize_acqf_bbkb(model, choices, batch_bound=1.0 + 0.1 / model.noise, beta=alpha,
                                      max_batch_size=budget - len(train_X))
        sizes.append(len(batch))
        train_X = torch.cat([train_X, batch])
        train_Y = torch.cat([train_Y, f(batch).unsqueeze(-1)])
    return train_Y, sizes


def main() -> None:
    t0 = time.perf_counter()
    Y = continuous_loop()
    print(f"continuous (LogEI + optimize_acqf):   best {Y.max():.3f} after {len(Y)} evaluations   "
          f"({time.perf_counter() - t0:.1f} s)")

    choices = torch.rand(20_000, 6, dtype=torch.double)
    t0 = time.perf_counter()
    Y = discrete_loop(choices)
    print(f"discrete (UCB + optimize_acqf_discrete): best {Y.max():.3f} after {len(Y)} evaluations   "
          f"({time.perf_counter() - t0:.1f} s)")

    t0 = time.perf_counter()
    Y, sizes = bbkb_loop(choices)
    print(f"BBKB batches (optimize_acqf_bbkb):       best {Y.max():.3f} after {len(Y)} evaluations in {len(sizes)} "
          f"batches "
          f"{sizes}   ({time.perf_counter() - t0:.1f} s)")

    best_random = f(choices[torch.randperm(len(choices))[:50]]).max()
    print(f"random search, 50 evaluations:           best {best_random:.3f}   (optimum 3.322)")

    # Training-free plugin: fit a SingleTaskGP once, then keep its hyperparameters and go BKB
    train_X = torch.rand(40, 6, dtype=torch.double)
    gp = SingleTaskGP(train_X, f(train_X).unsqueeze(-1))
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    bkb = BKBModel.from_model(gp, seed=0)
    Xq = torch.rand(5, 1, 6, dtype=torch.double)
    gap = (bkb.posterior(Xq).mean - gp.posterior(Xq).mean).abs().max()
    print(f"from_model: dictionary of {bkb.num_inducing} / 40 points, max |mean difference| to the GP {gap:.2e}")


if __name__ == "__main__":
    main()
