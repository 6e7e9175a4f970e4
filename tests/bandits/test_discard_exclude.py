"""``Bandit.discard(..., exclude=True)``: arms that kept failing are never selected again (every bandit)."""

import pytest
import torch

from torchbkb import BBKB, BKB, GPBUCB, GPUCB, SBPE, EpsGreedy, Random
from torchbkb.errors import TorchBKBError
from torchbkb.gp.kernels import GaussianKernel

ARMS = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = -((ARMS - 0.5) ** 2).sum(-1)
MAKERS = {
    "Random": lambda: Random(ARMS, seed=0),
    "EpsGreedy": lambda: EpsGreedy(ARMS, epsilon=0.2, seed=0),
    "GPUCB": lambda: GPUCB(ARMS, GaussianKernel(0.3), noise=0.01, beta=1.0, seed=0),
    "BKB": lambda: BKB(ARMS, GaussianKernel(0.3), noise=0.01, beta=1.0, seed=0),
    "BBKB": lambda: BBKB(ARMS, GaussianKernel(0.3), noise=0.01, beta=1.0, batch_bound=3.0, seed=0),
    "GPBUCB": lambda: GPBUCB(ARMS, GaussianKernel(0.3), noise=0.01, beta=1.0, batch_bound=3.0, seed=0),
    "SBPE": lambda: SBPE(ARMS, GaussianKernel(0.3), noise=0.01, budget=200, rkhs_norm=1.0, subgaussian=0.1, seed=0),
}

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)



@pytest.mark.parametrize("name", sorted(MAKERS))
def test_excluded_arms_are_never_selected_again(name):
    b = MAKERS[name]()
    excluded = set()
    for _ in range(60):
        if getattr(b, "remaining", 1) <= 0:  # SBPE: the budget is spent
            break
        idx = b.ask()
        assert not (set(idx.tolist()) & excluded)
        bad = [i for i in idx.tolist() if i % 4 == 0 and len(excluded) < 30]  # some arms "keep failing"
        good = [i for i in idx.tolist() if i not in bad]
        if good:
            b.tell(torch.tensor(good), F[good])
        if bad:
            b.discard(torch.tensor(bad), exclude=True)
            excluded |= set(bad)
    assert excluded and set(torch.nonzero(b.excluded).squeeze(1).tolist()) == excluded
    assert int(b.counts[list(excluded)].sum()) == 0 and int(b.counts.sum()) == b.t


def test_exclusion_is_checkpointed_and_all_excluded_is_an_error():
    b = BKB(ARMS[:3], GaussianKernel(0.3), noise=0.01, beta=1.0, seed=0)
    for _ in range(2):
        b.discard(b.ask(), exclude=True)
    c = BKB(ARMS[:3], GaussianKernel(0.3), noise=0.01, beta=1.0, seed=0)
    c.load_state_dict(b.state_dict())
    assert torch.equal(c.excluded, b.excluded) and int(c.excluded.sum()) == 2
    c.discard(c.ask(), exclude=True)
    with pytest.raises(TorchBKBError, match="every one of the 3 arms was excluded"):
        c.ask()
