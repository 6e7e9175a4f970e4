"""``Bandit.discard(..., exclude=True)``: arms that kept failing are never selected again (every bandit)."""

import pytest
import torch

from torchbkb import BBKB, BKB, GPBUCB, GPUCB, SBPE, EpsGreedy, Random
from torchbkb.errors import InputDataError, TorchBKBError
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


def _told(name, steps=3):
    b = MAKERS[name]()
    for _ in range(steps):
        idx = b.ask()
        b.tell(idx, F[idx])
    return b


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_arms_excluded_by_writing_the_mask_are_never_selected_and_all_of_them_is_an_error(name):
    b = _told(name)
    b.excluded[:] = True
    with pytest.raises(TorchBKBError, match="every one of the 40 arms was excluded"):
        b.ask()
    b.excluded[7] = False  # one arm left: every pick is that arm
    assert set(b.ask().tolist()) == {7}
    assert sorted(b.exclusions) == [a for a in range(40) if a != 7]


@pytest.mark.parametrize("name", ["BKB", "EpsGreedy"])
def test_a_written_mask_keeps_the_reasons_of_discarded_arms_and_readmits(name):
    b = _told(name, steps=1)
    failed = b.ask().tolist()
    b.discard(torch.tensor(failed), exclude=True, reason="boom")
    other = next(a for a in range(40) if a not in failed)
    b.excluded[other] = True  # written directly, before a discard and a readmission
    assert b.readmit() == sorted({other, *failed}) and not b.exclusions
    b.excluded[other] = True
    idx = b.ask()
    assert other not in idx.tolist() and b.exclusions == {other: "excluded"}


def test_a_mask_of_another_kind_is_an_error_that_changes_nothing():
    b = _told("BKB")
    before = (b.t, b.counts.clone(), b.batch_id, dict(b.exclusions))
    for bad in (torch.zeros(40), torch.zeros(39, dtype=torch.bool), [False] * 40):
        b.excluded = bad
        with pytest.raises(InputDataError, match=r"excluded: expected a bool tensor of shape \(40,\) on cpu, got"):
            b.ask()
        assert (b.t, b.batch_id, b.exclusions) == (before[0], before[2], before[3])
        assert torch.equal(b.counts, before[1]) and not b.pending_ids
    b.excluded = torch.zeros(40, dtype=torch.bool)
    b.tell(idx := b.ask(), F[idx])


def test_eps_greedy_exploits_no_excluded_arm_when_every_pulled_arm_is_excluded():
    b = EpsGreedy(ARMS, epsilon=0.0, seed=0)  # greedy after the first, uniform, arm
    first = b.ask()
    b.tell(first, F[first])
    for _ in range(5):  # the greedy arm (the only pulled one) fails, then every arm asked after it
        idx = b.ask()
        assert not bool(b.excluded[idx].any())
        b.discard(idx, exclude=True)
    assert len(b.exclusions) == 5 and first.tolist()[0] in b.exclusions
