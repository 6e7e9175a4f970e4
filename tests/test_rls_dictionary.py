import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb import BBKB, BKB, CheckpointError, RLSDictionary
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.errors import InputDataError


def test_inclusion_probabilities():
    dic = RLSDictionary(q_bar=2.0, seed=0, inclusion="per_pull")
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


# ---------------------------------------------------------------- the two inclusion rules for repeated pulls
def test_the_two_inclusion_rules_exactly():
    rls = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.3, 0.0, 0.6], dtype=torch.float64)
    counts = torch.tensor([0, 1, 3, 10, 2, 7, 4])
    per_pull = RLSDictionary(2.0, inclusion="per_pull").inclusion_probability(rls, counts)
    scaled = RLSDictionary(2.0, inclusion="count_scaled").inclusion_probability(rls, counts)
    p = (2.0 * rls).clamp(max=1.0)
    torch.testing.assert_close(per_pull, 1 - (1 - p) ** counts.double(), rtol=0, atol=1e-15)
    torch.testing.assert_close(scaled, (2.0 * counts.double() * rls).clamp(max=1.0), rtol=0, atol=1e-15)
    # n = 0, 1: the same
    assert scaled[0] == per_pull[0] == 0 and float(scaled[1]) == pytest.approx(float(per_pull[1])) == 0.2
    assert bool((scaled >= per_pull).all())
    assert float(scaled[2]) == pytest.approx(0.6) and float(per_pull[2]) == pytest.approx(0.488)
    assert float(scaled[3]) == 1.0 and float(scaled[5]) == float(per_pull[5]) == 0.0  # clamped at 1; σ̃² = 0 never


@pytest.mark.parametrize("inclusion", ["per_pull", "count_scaled"])
def test_empirical_inclusion_frequencies_match_the_rule(inclusion):
    rls = torch.tensor([0.05, 0.05, 0.05, 0.2], dtype=torch.float64)
    counts = torch.tensor([0, 1, 4, 2])
    dic = RLSDictionary(2.0, inclusion=inclusion, seed=3)
    draws = 20000
    freq = torch.stack([dic.resample(rls, counts) for _ in range(draws)]).double().mean(0)
    p = dic.inclusion_probability(rls, counts)
    assert bool(((freq - p).abs() <= 4 * (p * (1 - p) / draws).sqrt() + 1e-12).all()), (freq, p)


def test_the_default_rule_is_the_authors():
    assert RLSDictionary(2.0).inclusion == "count_scaled"
    arms = torch.rand(10, 1, dtype=torch.float64)
    assert BKB(arms, GaussianKernel(0.3), noise=0.1, beta=0.3).inclusion == "count_scaled"


def test_an_unknown_inclusion_rule_is_refused():
    with pytest.raises(InputDataError, match="inclusion"):
        RLSDictionary(2.0, inclusion="per_arm")
    with pytest.raises(InputDataError, match="inclusion"):
        BKB(torch.rand(10, 1, dtype=torch.float64), GaussianKernel(0.3), noise=0.1, beta=0.3, inclusion=None)


def test_the_rule_travels_with_the_state_dict_and_the_bandits():
    dic = RLSDictionary(2.0, inclusion="count_scaled", seed=0)
    other = RLSDictionary(2.0, seed=1)
    other.load_state_dict(dic.state_dict())
    assert other.inclusion == "count_scaled"
    arms = torch.rand(60, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = torch.sin(4 * arms[:, 0])
    for cls, kw in ((BKB, {}), (BBKB, {"batch_bound": 2.0})):
        b = cls(arms, GaussianKernel(0.3), noise=0.01, beta=0.3, inclusion="count_scaled", seed=0, **kw)
        assert b.sampler.inclusion == "count_scaled"
        for _ in range(10):
            i = b.ask()
            b.tell(i, f[i])
        literal = cls(arms, GaussianKernel(0.3), noise=0.01, beta=0.3, seed=0, inclusion="per_pull", **kw)
        with pytest.raises(CheckpointError, match="inclusion"):
            literal.load_state_dict(b.state_dict())


def test_count_scaled_keeps_repeatedly_pulled_arms_more_often():
    """BKB pulling a few arms many times: the authors' rule keeps a larger dictionary on average (q̄ = 2)."""
    arms = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    f = torch.exp(-((arms - 0.6) ** 2).sum(-1) / 0.02)
    sizes = {}
    for inclusion in ("per_pull", "count_scaled"):
        total = 0
        for seed in range(4):
            b = BKB(arms, GaussianKernel(0.2), noise=0.01, beta=0.2, q_bar=2.0, inclusion=inclusion, seed=seed)
            for _ in range(150):
                i = b.ask()
                b.tell(i, f[i])
                total += b.dictionary_size
        sizes[inclusion] = total
    assert sizes["count_scaled"] > sizes["per_pull"]


def test_a_rule_swapped_in_for_a_study_reaches_the_bandits_resampling(monkeypatch):
    """The peers harness (``../shared/peers/run_peers.py``, its inclusion-rule diagnostic) compares rules by
    replacing ``RLSDictionary._probability`` in its process: the replaced rule is the one BKB draws with."""
    from torchbkb.sampling.rls_dictionary import inclusion_probability

    arms = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    f = torch.sin(6 * arms[:, 0]) + arms[:, 1]

    def picks(**kw):
        bandit = BKB(arms, GaussianKernel(0.15), noise=0.01, beta=0.5, seed=1, **kw)
        out = []
        for _ in range(60):
            i = bandit.ask()
            bandit.tell(i, f[i])
            out += i.tolist()
        return out, bandit.dictionary_size

    per_pull = picks(inclusion="per_pull")
    default = picks()
    assert per_pull != default
    monkeypatch.setattr(RLSDictionary, "_probability",
                        lambda self, rls, counts: inclusion_probability(rls, counts, self.q_bar, "per_pull"))
    assert picks() == per_pull
