"""ThompsonBKB: Thompson sampling on BKB's sketched posterior, written on the sketched bandit's public parts."""

import math

import pytest
import torch

from helpers import gp_sample_problem as _problem
from torchbkb import ArmObjective, ThompsonBKB, run
from torchbkb.errors import InputDataError


def _fitted(steps=40, seed=0, **kw):
    arms, k, f = _problem(seed=seed)
    bandit = ThompsonBKB(arms, k, noise=0.05, q_bar=1.0, seed=seed, **kw)
    run(bandit, ArmObjective(f, 0.1, seed=seed), budget=steps, progress=False)
    return bandit, arms, k, f


def test_a_draw_is_the_formula_in_float64():
    bandit, arms, k, _ = _fitted()
    state = bandit.generator.get_state()
    draws = bandit.sample(3)
    bandit.generator.set_state(state)
    post, lam = bandit.row_posterior, bandit.lam
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=bandit.generator)))
    xi = torch.randn((post.V_inv.shape[0], 3), dtype=torch.float64, generator=gen)
    zeta = torch.randn((3, len(arms)), dtype=torch.float64, generator=gen)
    S = arms[bandit.rows.order_index]  # the dictionary in W's slot order
    Z = k(arms, S) @ post.W.T  # (A, r) features, formed densely here
    eps = torch.linalg.cholesky(lam * post.V_inv) @ xi
    residual = (torch.ones(len(arms), dtype=torch.float64) - (Z * Z).sum(-1)).clamp_min(0.0)
    want = bandit.arm_means + (Z @ eps).T + residual.sqrt() * zeta
    assert torch.allclose(draws, want, atol=1e-10)


def test_each_arm_draws_the_dtc_mean_and_variance():
    bandit, *_ = _fitted(sample_scale=1.5)
    n = 40_000
    draws = bandit.sample(n)  # (n, A)
    mean, rls = bandit.scores()
    var = 1.5**2 * bandit.lam * rls  # ν² λ σ̃²: the weights' part and the residual together
    assert bool(((draws.mean(0) - mean).abs() <= 5 * (var / n).sqrt() + 1e-12).all())
    assert torch.allclose(draws.var(0), var, rtol=0.05, atol=1e-12)


def test_zero_scale_is_greedy_on_the_mean():
    bandit, *_ = _fitted(sample_scale=0.0)
    assert torch.equal(bandit.sample(2), bandit.arm_means.expand(2, -1))
    assert int(bandit.ask()) == int(torch.argmax(bandit.arm_means))


def test_it_learns_and_repeats_itself_from_a_seed():
    arms, k, f = _problem(A=300, seed=1)
    runs = [run(ThompsonBKB(arms, k, noise=0.05, q_bar=1.0, seed=4), ArmObjective(f, 0.1, seed=2), budget=150,
                progress=False) for _ in range(2)]
    assert runs[0].index == runs[1].index
    assert float(f.max() - f[runs[0].index[-20:]].mean()) < 0.2 * float(f.max() - f.mean())


def test_a_checkpoint_resumes_the_same_draws():
    arms, k, f = _problem()
    a = ThompsonBKB(arms, k, noise=0.05, seed=3)
    run(a, ArmObjective(f, 0.1, seed=0), budget=30, progress=False)
    b = ThompsonBKB(arms, k, noise=0.05, seed=99)
    b.load_state_dict(a.state_dict())
    for _ in range(10):
        i, j = a.ask(), b.ask()
        assert torch.equal(i, j)
        a.tell(i, f[i]), b.tell(j, f[j])
    other = ThompsonBKB(arms, k, noise=0.05, sample_scale=2.0)
    with pytest.raises(Exception, match="sample_scale"):
        other.load_state_dict(a.state_dict())


def test_streamed_kernel_rows_draw_the_same():
    arms, k, f = _problem()
    cached = ThompsonBKB(arms, k, noise=0.05, seed=5)
    streamed = ThompsonBKB(arms, k, noise=0.05, seed=5, kernel_cache_bytes=0, chunk_size=32)
    for bandit in (cached, streamed):
        run(bandit, ArmObjective(f, 0.1, seed=1), budget=25, progress=False)
    assert torch.equal(cached.counts, streamed.counts)
    s1, s2 = cached.generator.get_state(), streamed.generator.get_state()
    assert torch.equal(s1, s2)
    assert torch.allclose(cached.sample(4), streamed.sample(4), atol=1e-10)


def test_excluded_arms_are_never_drawn_as_the_pick():
    bandit, arms, k, f = _fitted(steps=10)
    first = bandit.ask()
    bandit.discard(first, exclude=True)  # an evaluation that failed for good
    for _ in range(20):
        i = bandit.ask()
        assert int(i) != int(first)
        bandit.tell(i, f[i])


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, "wide", None])
def test_bad_sample_scale(bad):
    arms, k, _ = _problem()
    with pytest.raises(InputDataError, match="sample_scale"):
        ThompsonBKB(arms, k, noise=0.05, sample_scale=bad)


def test_bad_draw_count_changes_nothing():
    bandit, *_ = _fitted(steps=5)
    state = bandit.generator.get_state()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputDataError, match="n"):
            bandit.sample(bad)
    assert torch.equal(bandit.generator.get_state(), state)


def test_before_any_reward_a_draw_is_the_prior_mean():
    arms, k, _ = _problem()
    bandit = ThompsonBKB(arms, k, noise=0.05, seed=0)
    assert torch.equal(bandit.sample(2), torch.zeros(2, len(arms), dtype=arms.dtype))


def test_the_fixed_capacity_update_makes_the_same_picks():
    """The GPU's default update (fixed shapes) feeds the draws the same posterior as the CPU's eager one."""
    arms, k, f = _problem(A=300, seed=1)
    eager = ThompsonBKB(arms, k, noise=0.05, q_bar=1.0, seed=4)
    fixed = ThompsonBKB(arms, k, noise=0.05, q_bar=1.0, seed=4)
    fixed.fixed_capacity = True
    runs = [run(b, ArmObjective(f, 0.1, seed=2), budget=120, progress=False) for b in (eager, fixed)]
    assert runs[0].index == runs[1].index
