import math

import pytest
import torch

from helpers import close, gp_sample_problem as _problem
from torchbkb import BKB, GPUCB, ArmObjective, ExactPosterior, run
from torchbkb.bandits import kernel_row_cache as row_cache_module
from torchbkb.bandits.confidence import bkb_beta
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel


def test_huge_q_bar_makes_bkb_exactly_gpucb():
    arms, k, f = _problem()
    obj_a, obj_b = ArmObjective(f, 0.1, seed=3), ArmObjective(f, 0.1, seed=3)
    bkb = BKB(arms, k, noise=0.05, q_bar=1e12, beta=0.3, seed=11)
    ucb = GPUCB(arms, k, noise=0.05, beta=0.3, seed=11)
    ha = run(bkb, obj_a, budget=60, progress=False)
    hb = run(ucb, obj_b, budget=60, progress=False)
    assert ha.index == hb.index
    assert bkb.dictionary_size == int((bkb.counts > 0).sum())  # every pulled arm is in S
    mean, rls = bkb.scores()
    m2, v2 = ucb.posterior.watched()
    assert close(mean, m2, 1e-8) and close(rls, v2 / 0.05, 1e-6)


def _ratio_check(bandit, arms, k, lam):
    """σ̃²_t / σ²_t over all arms, with σ² the exact posterior on all pulls (with counts)."""
    pulled = (bandit.counts > 0).nonzero().squeeze(1)
    y = (bandit.reward_sums[pulled] / bandit.counts[pulled]).to(arms.dtype)
    exact = ExactPosterior(k, lam).fit(arms[pulled], y, bandit.counts[pulled].to(arms.dtype))
    return bandit.scores()[1] / exact.rls(arms)


def test_theorem1_accuracy_and_a_small_dictionary():
    # 1-D smooth problem; q̄ from Theorem 1 with ε = 1/2 (α = 3), δ = 0.1, T = 1500
    A, T, lam, delta, eps = 80, 1500, 0.5, 0.1, 0.5
    arms = torch.linspace(0, 1, A, dtype=torch.float64)[:, None]
    k = GaussianKernel(0.3)
    f = torch.sin(5 * arms[:, 0]) + 0.5 * torch.cos(11 * arms[:, 0])
    alpha = (1 + eps) / (1 - eps)
    q_bar = 6 * alpha * math.log(4 * T / delta) / eps**2
    for seed, qb in [(0, q_bar), (1, 20.0)]:  # the theorem's q̄ (≈ 792) and a practical one
        bandit = BKB(arms, k, noise=lam, q_bar=qb, beta=0.5, seed=seed)
        obj = ArmObjective(f, noise_std=0.2, seed=seed)
        for t_check in (50, 400, T):
            run(bandit, obj, budget=t_check, progress=False)
            ratio = _ratio_check(bandit, arms, k, lam)
            assert (float(ratio.min()) >= 1 / alpha and float(ratio.max()) <= alpha), (qb, t_check, ratio.min(),
                                                                                       ratio.max())
        assert bandit.dictionary_size <= int((bandit.counts > 0).sum())
        assert bandit.dictionary_size < T / 20  # far below t
    assert bandit.dictionary_size < int((bandit.counts > 0).sum())  # q̄ = 20 really sparsifies


def test_sublinear_regret_on_a_gp_sample():
    arms, k, f = _problem(A=300, seed=4, ls=0.2)
    bandit = BKB(arms, k, noise=0.01, q_bar=2.0, beta=0.3, seed=0)
    hist = run(bandit, ArmObjective(f, noise_std=0.1, seed=0), budget=400, progress=False)
    R = hist.cumulative_regret
    assert R[-1] / 400 < 0.5 * R[99] / 100  # the average regret keeps falling
    assert hist.normalized_regret[-1] < 0.1
    assert hist.index[-20:].count(int(torch.argmax(f))) >= 15  # it settled on the best arm
    assert bandit.dictionary_size < 60


def test_theory_beta_is_theorem2_with_the_current_deff():
    arms, k, f = _problem(A=60)
    bandit = BKB(arms, k, noise=0.1, q_bar=3.0, beta="theory", F=2.0, delta=0.05, epsilon=0.5, seed=2)
    run(bandit, ArmObjective(f, 0.1), budget=25, progress=False)
    mean, rls = bandit.scores()
    deff = float((bandit.counts.double() * rls).sum())
    assert bandit.deff == pytest.approx(deff, rel=1e-12)
    expected = bkb_beta(deff, 25, noise_std=math.sqrt(0.1), lam=0.1, F=2.0, delta=0.05, epsilon=0.5, kappa2=1.0)
    assert bandit.current_beta() == pytest.approx(expected, rel=1e-12)
    assert BKB(arms, k, noise=0.1, alpha=3.0).epsilon == pytest.approx(0.5)


def test_embedding_recomputed_only_when_the_dictionary_changes():
    arms, k, f = _problem(A=80)
    bandit = BKB(arms, k, noise=0.5, q_bar=1.0, beta=0.2, seed=5)
    obj = ArmObjective(f, 0.05, seed=1)
    changes, prev = 0, None
    for _ in range(120):
        i = bandit.ask()
        bandit.tell(i, obj(i))
        cur = bandit.dictionary.tolist()
        changes += cur != prev and len(cur) > 0
        prev = cur
    assert bandit.embeddings_computed == changes
    assert changes < 120  # it does get reused


@pytest.mark.parametrize(
    "row_cache_bytes,refill_bytes",
    # rows refilled from the pulled-row cache / patched from it / computed in blocks
    [(2**28, 2**22), (2**28, 0), (0, 2**22)],
)
def test_checkpoint_resume_gives_the_identical_trajectory(tmp_path, monkeypatch, row_cache_bytes, refill_bytes):
    monkeypatch.setattr(row_cache_module, "REFILL_BYTES", refill_bytes)
    arms, k, f = _problem(A=100, seed=7)

    def bandit():
        return BKB(arms, k, noise=0.05, q_bar=2.0, beta="theory", seed=3, row_cache_bytes=row_cache_bytes)

    full = run(bandit(), ArmObjective(f, 0.1, seed=9), budget=40, progress=False)
    ck = tmp_path / "bkb.pt"
    run(bandit(), ArmObjective(f, 0.1, seed=9), budget=17, progress=False, checkpoint=ck)
    resumed = run(bandit(), ArmObjective(f, 0.1, seed=9), budget=40, progress=False, checkpoint=ck)
    assert resumed.index == full.index and resumed.reward == full.reward
    assert resumed.dictionary_size == full.dictionary_size


def test_float32_arms_run():
    arms, k, f = _problem(A=100)
    bandit = BKB(arms.float(), k, noise=0.05, q_bar=2.0, beta=0.3, seed=0)
    hist = run(bandit, f.float(), budget=30, progress=False)
    assert len(hist) == 30 and bandit.scores()[0].dtype == torch.float32


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(q_bar=0.0), "q_bar"),
        (dict(epsilon=1.0), "epsilon"),
        (dict(alpha=0.5), "alpha"),
        (dict(noise=-1.0), "noise"),
        (dict(beta="big"), "beta"),
        (dict(beta=-1.0), "beta"),
        (dict(delta=0.0), "delta"),
    ],
)
def test_bad_constructor_arguments(kw, msg):
    arms, k, _ = _problem(A=10)
    args = dict(noise=0.1)
    args.update(kw)
    with pytest.raises(InputDataError, match=msg):
        BKB(arms, k, **args)


def test_pulled_row_cache_same_choices_and_dropped_past_its_budget():
    """Rows of pulled arms are cached once and copied when they re-enter the dictionary; with no cache (or
    once it outgrows its budget and is dropped) the rows are computed -- the run makes the same choices."""
    arms, k, f = _problem()
    runs = {}
    for name, budget in (("cache", 2**28), ("patched", 2**28), ("none", 0), ("dropped", 40 * arms.shape[0] * 8)):
        b = BKB(arms, k, noise=0.01, q_bar=2.0, beta="theory", seed=2, row_cache_bytes=budget)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(row_cache_module, "REFILL_BYTES", 0 if name == "patched" else row_cache_module.REFILL_BYTES)
            runs[name] = (run(b, ArmObjective(f, 0.1, seed=5), budget=80, progress=False).index, b)
    assert runs["cache"][0] == runs["patched"][0] == runs["none"][0] == runs["dropped"][0]
    assert runs["cache"][1].rows.order == sorted(runs["cache"][1].rows.order)  # refilled in dictionary order
    assert runs["patched"][1].rows.order != sorted(runs["patched"][1].rows.order)  # entering rows put into freed slots
    cached = runs["cache"][1]
    assert cached.rows.caches_pulled_rows and cached.rows.num_pulled_rows == int((cached.counts > 0).sum())
    assert not runs["none"][1].rows.caches_pulled_rows
    assert not runs["dropped"][1].rows.caches_pulled_rows and int((runs["dropped"][1].counts > 0).sum()) > 40


def test_arms_without_dimensions_are_refused():
    with pytest.raises(InputDataError, match="d >= 1"):
        BKB(torch.rand(5, 0, dtype=torch.float64), GaussianKernel(0.3), noise=0.1, seed=0)
