"""Checkpoints written before a field existed load through one hook and continue as the bandit would have."""

import pytest
import torch

from torchbkb import BBKB, BKB, GPBUCB, GPUCB
from torchbkb.bandits.checkpoint_formats import ALGORITHM_DEFAULTS, upgraded
from torchbkb.gp.kernels import GaussianKernel

BASE_FIELDS_ADDED = ("excluded", "exclusions", "fingerprint")


def _bandit(cls):
    arms = torch.rand(120, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    extra = {"batch_bound": 3.0, "max_batch_size": 4} if cls in (BBKB, GPBUCB) else {}
    return cls(arms, GaussianKernel(0.3), noise=0.05, beta=0.5, seed=4, **extra)


def _steps(b, n, g):
    values = torch.sin(5 * b.arms).sum(-1)
    picks = []
    for _ in range(n):
        idx = b.ask()
        b.tell(idx, values[idx] + 0.05 * torch.randn(idx.shape, generator=g, dtype=torch.float64))
        picks.append(idx)
    return torch.cat(picks)


@pytest.mark.parametrize("cls", [BKB, BBKB, GPUCB, GPBUCB])
def test_a_checkpoint_without_the_newer_fields_loads_and_continues_the_same(cls):
    b = _bandit(cls)
    _steps(b, 25, torch.Generator().manual_seed(1))
    state = b.state_dict()
    old = {k: v for k, v in state.items() if k not in BASE_FIELDS_ADDED}
    old["algorithm"] = {k: v for k, v in state["algorithm"].items() if k not in ALGORITHM_DEFAULTS}
    dropped = set(state["algorithm"]) - set(old["algorithm"])
    assert dropped or cls is GPUCB and "compactions" not in state["algorithm"]
    resumed = _bandit(cls)
    resumed.load_state_dict(old)
    assert "practical_sum" not in old["algorithm"]  # the hook copies, the caller's dict is untouched
    g1, g2 = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    assert torch.equal(_steps(b, 15, g1), _steps(resumed, 15, g2))


def test_the_hook_fills_only_the_fields_the_loading_bandit_has():
    b = _bandit(BKB)
    state = b.state_dict()
    new = upgraded({**state, "algorithm": {}}, state)
    assert "practical_sum" not in new["algorithm"] and new["algorithm"]["prune"] == (False, 0, 0)
    assert upgraded("not a state", state) == "not a state"
