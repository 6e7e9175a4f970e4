"""Every bandit the package exports, pickled or deep-copied mid-run -- between batches and with a batch told in part --
goes on with the same picks as the original (process pools, Dask and ``copy.deepcopy`` hand bandits around so)."""

import copy
import pickle

import pytest
import torch

from helpers import gpu_defaults
from torchbkb import BBKB, BKB, GPBUCB, GPUCB, SBPE, EpsGreedy, Random, ThompsonBKB
from torchbkb.gp.kernels import GaussianKernel

ARMS = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
F = torch.sin(4 * ARMS[:, 0]) + ARMS[:, 1]
KERNEL = GaussianKernel(0.3)
MAKERS = {
    "Random": lambda: Random(ARMS, seed=0),
    "EpsGreedy": lambda: EpsGreedy(ARMS, epsilon=0.2, seed=0),
    "GPUCB": lambda: GPUCB(ARMS, KERNEL, noise=0.1, beta=0.5, seed=0),
    "BKB": lambda: BKB(ARMS, KERNEL, noise=0.1, beta=0.5, seed=0),
    "BKB theory": lambda: BKB(ARMS, KERNEL, noise=0.1, beta="theory", seed=0),
    "BBKB": lambda: BBKB(ARMS, KERNEL, noise=0.1, beta=0.5, batch_bound=3.0, max_batch_size=8, seed=0),
    "GPBUCB": lambda: GPBUCB(ARMS, KERNEL, noise=0.1, beta=0.5, batch_bound=3.0, seed=0),
    "ThompsonBKB": lambda: ThompsonBKB(ARMS, KERNEL, noise=0.1, seed=0),
    "SBPE": lambda: SBPE(ARMS, KERNEL, noise=0.1, budget=400, seed=0),
    "SBPE theory width": lambda: SBPE(ARMS, KERNEL, noise=0.1, budget=400, rkhs_norm=1.0, subgaussian=0.1, seed=0),
    "BKB fixed capacity": lambda: gpu_defaults(BKB(ARMS, KERNEL, noise=0.1, beta=0.5, seed=0)),
    "BBKB fixed capacity": lambda: gpu_defaults(BBKB(ARMS, KERNEL, noise=0.1, beta=0.5, batch_bound=3.0, seed=0)),
}

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)


def _rewards(idx: torch.Tensor, step: int) -> torch.Tensor:
    return F[idx] + 0.05 * torch.randn(len(idx), generator=torch.Generator().manual_seed(step), dtype=F.dtype)


def _go_on(b, steps: int, start: int) -> list[list[int]]:
    picks = []
    for step in range(start, start + steps):
        if getattr(b, "remaining", 1) == 0:  # SBPE's budget spent
            break
        idx = b.ask()
        picks.append(idx.tolist())
        b.tell(idx, _rewards(idx, step))
    return picks


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_copied_bandit_goes_on_with_the_same_picks(name, how):
    b = MAKERS[name]()
    _go_on(b, 6, 0)
    twin = pickle.loads(pickle.dumps(b)) if how == "pickle" else copy.deepcopy(b)
    assert _go_on(twin, 6, 6) == _go_on(b, 6, 6)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_bandit_pickled_with_a_batch_told_in_part_goes_on_alike(name):
    b = MAKERS[name]()
    _go_on(b, 2, 0)
    idx = b.ask()
    b.tell(idx[:1], _rewards(idx[:1], 99))
    twin = pickle.loads(pickle.dumps(b))
    for x in (b, twin):
        assert x.pending.tolist() == idx[1:].tolist()
        if len(idx) > 1:
            x.tell(idx[1:], _rewards(idx[1:], 100))
    assert _go_on(twin, 5, 10) == _go_on(b, 5, 10)
