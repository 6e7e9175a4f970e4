"""The inclusion rule in the BoTorch model's dictionary sampling: repeated evaluations of one point."""

import pytest
import torch

from torchbkb.botorch import BKBModel, sample_dictionary
from torchbkb.sampling.dictionary_replay import draw_dictionary
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel


def _rows():
    # point a given 4 times (σ̃² = 0.05 each), b once (σ̃² = 0.5: always kept), c once (σ̃² = 0.05)
    X = torch.tensor([[0.0], [0.0], [1.0], [0.0], [2.0], [0.0]], dtype=torch.float64)
    rls = torch.tensor([0.05, 0.05, 0.5, 0.05, 0.05, 0.05], dtype=torch.float64)
    return X, rls


@pytest.mark.parametrize("inclusion, p_a", [("per_pull", 1 - (1 - 0.1) ** 4), ("count_scaled", 0.4)])
def test_a_repeated_point_enters_with_the_rules_probability(inclusion, p_a):
    X, rls = _rows()
    g = torch.Generator().manual_seed(0)
    n = 4000
    hits_a = hits_c = 0
    for _ in range(n):
        S = draw_dictionary(X, rls, q_bar=2.0, generator=g, inclusion=inclusion)
        hits_a += bool((S == 0.0).any())
        hits_c += bool((S == 2.0).any())
        assert bool((S == 1.0).any())  # p = 1
        if inclusion == "count_scaled":
            assert int((S == 0.0).sum()) <= 1  # one draw per distinct point
    tol = 4 * (0.4 * 0.6 / n) ** 0.5
    assert abs(hits_a / n - p_a) < tol
    assert abs(hits_c / n - 0.1) < tol  # a point given once: both rules agree


def test_the_replay_groups_repeated_rows():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, dtype=torch.float64, generator=g).repeat(5, 1)  # every point evaluated 5 times
    S = sample_dictionary(GaussianKernel(0.3), X, 0.01, q_bar=2.0, generator=torch.Generator().manual_seed(1),
                          inclusion="count_scaled")
    assert torch.unique(S, dim=0).shape[0] == S.shape[0]  # each distinct point at most once
    S2 = sample_dictionary(GaussianKernel(0.3), X, 0.01, q_bar=2.0, generator=torch.Generator().manual_seed(1))
    assert S2.shape[0] >= 1


def test_bkbmodel_takes_the_rule():
    g = torch.Generator().manual_seed(2)
    X = torch.rand(150, 2, dtype=torch.float64, generator=g).repeat(2, 1)
    Y = X.sum(-1, keepdim=True) + 0.01 * torch.randn(300, 1, dtype=torch.float64, generator=g)
    model = BKBModel(X, Y, noise=0.01, inclusion="count_scaled", seed=0, exact_fraction=None)
    assert model.inclusion == "count_scaled"
    assert torch.unique(model.engine.dictionary, dim=0).shape[0] == model.engine.dictionary.shape[0]
    with pytest.raises(InputDataError, match="inclusion: expected one of"):
        BKBModel(X, Y, inclusion="per_arm")
