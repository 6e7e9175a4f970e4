"""The BBKB tests' problem and driver: a smooth function on random arms, a BBKB with the tests' settings, and a loop
that asks and tells until a number of rewards."""

import torch

from torchbkb import BBKB
from torchbkb.gp.kernels import GaussianKernel

LS = 0.2


def arms_and_values(A=300, d=2, seed=0, dtype=torch.float64, device="cpu"):
    """`(A, d)` arms uniform in the unit cube and their `(A,)` values."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(A, d, generator=g, dtype=torch.float64)
    f = torch.sin(5 * X[:, 0]) * torch.cos(3 * X[:, 1]) + X[:, 1]
    return X.to(device, dtype), f.to(device, dtype)


def run_batches(bandit, f, T):
    """Ask/tell until ``T`` rewards are told; returns the batches."""
    batches = []
    while bandit.t < T:
        idx = bandit.ask()
        batches.append(idx.tolist())
        bandit.tell(idx, f[idx])
    return batches


def make_bbkb(arms, **kw):
    """A BBKB on ``arms`` with the tests' settings, overridden by ``kw``."""
    args = dict(noise=0.01, q_bar=2.0, beta=0.3, batch_bound=2.0, seed=1)
    args.update(kw)
    return BBKB(arms, GaussianKernel(LS), **args)
