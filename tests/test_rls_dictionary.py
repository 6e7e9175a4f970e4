import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb import RLSDictionary
from torchbkb.errors import InputDataError


def test_inclusion_probabilities():
    dic = RLSDictionary(q_bar=2.0, seed=0)
    rls = torch.tensor([0.0, 0.1, 0.3, 0.6, 2.0], dtype=torch.float64)
    assert torch.allclose(dic.inclusion_probability(rls), torch.tensor([0.0, 0.2, 0.6, 1.0, 1.0], dtype=torch.float64))
    counts = torch.tensor([4, 3, 2, 1, 0])
    expected = torch.tensor([0.0, 1 - 0.8**3, 1 - 0.4**2, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(dic.inclusion_probability(rls, counts), expected)


def test_empirical_frequencies_match_the_bernoulli_model():
    dic = RLSDictionary(q_bar=1.5, seed=123)
    rls = torch.tensor([0.05, 0.2, 0.4], dtype=torch.float64)
    counts = torch.tensor([1, 3, 2])
    p = dic.inclusion_probability(rls, counts)
    n = 20000
    freq = torch.stack([dic.resample(rls, counts) for _ in range(n)]).double().mean(0)
    # 5 standard deviations of a binomial proportion
    assert torch.all((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / n) + 1e-12)


def test_reproducible_and_checkpointable():
    rls = torch.rand(50, dtype=torch.float64) * 0.5
    a = RLSDictionary(2.0, generator=torch.Generator().manual_seed(7))
    b = RLSDictionary(2.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.resample(rls), b.resample(rls))
    state = a.state_dict()
    nxt = a.resample(rls)
    c = RLSDictionary(2.0, seed=999)
    c.load_state_dict(state)
    assert torch.equal(c.resample(rls), nxt)


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(
        [
            (torch.tensor([0.1, -0.2]), None, "non-negative variances"),
            (torch.tensor([0.1, float("nan")]), None, "finite"),
            (torch.tensor([[0.1]]), None, r"shape \(n,\)"),
            (torch.tensor([1, 2]), None, "floating"),
            (torch.tensor([0.1, 0.2]), torch.tensor([1]), r"counts: expected shape \(2,\)"),
            (torch.tensor([0.1, 0.2]), torch.tensor([1, -1]), "non-negative counts"),
        ]
    )
)
def test_bad_inputs_do_not_consume_randomness(case):
    rls, counts, msg = case
    dic = RLSDictionary(2.0, seed=3)
    state = dic.generator.get_state()
    with pytest.raises(InputDataError, match=msg):
        dic.resample(rls, counts)
    assert torch.equal(state, dic.generator.get_state())


@pytest.mark.parametrize("q", [0.0, -1.0, math.nan])
def test_bad_q_bar(q):
    with pytest.raises(InputDataError, match="q_bar"):
        RLSDictionary(q)
