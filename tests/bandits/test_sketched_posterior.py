"""A sketched bandit's ``.posterior`` is its own DTC state handed to a ``DTCPosterior``: no second fit."""

import pytest
import torch

from helpers import close, gp_sample_problem, spy_factorizations
from torchbkb import BBKB, BKB, DTCPosterior, NystromEmbedding, ThompsonBKB
from torchbkb.gp.kernels import GaussianKernel

pytestmark = pytest.mark.usefixtures("one_thread")

LS = 0.25


def _run(cls, steps=60, fixed=False, **kw):
    arms, _, f = gp_sample_problem(A=150, ls=LS)
    bandit = cls(arms, GaussianKernel(LS), noise=0.01, seed=0, **kw)
    bandit.fixed_capacity = fixed
    g = torch.Generator().manual_seed(1)
    while bandit.t < steps:
        idx = bandit.ask()
        bandit.tell(idx, f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=f.dtype))
    return bandit, arms


CASES = [(BKB, {"beta": 0.5}), (BKB, {"beta": 0.5, "prune": False}), (BBKB, {"beta": 0.5}),
         (ThompsonBKB, {}), (BKB, {"beta": 0.5, "kernel_cache_bytes": 0})]


@pytest.mark.parametrize("fixed", [False, True], ids=["eager", "fixed"])
@pytest.mark.parametrize("cls,kw", CASES)
def test_the_posterior_is_the_bandits_state_without_a_factorization(cls, kw, fixed, monkeypatch):
    bandit, arms = _run(cls, fixed=fixed, **kw)
    mean, rls = bandit.scores()
    sizes = spy_factorizations(monkeypatch)
    post = bandit.posterior
    assert sizes == []  # no K_S factorization, no refit of V
    assert torch.equal(post.V_inv, bandit.V_inverse())
    assert torch.equal(post.embedding.projection, bandit.row_posterior.W)
    pm, pv = post(arms)
    # one state, two products: the fixed-capacity scores come from padded buffers, whose BLAS kernels sum in
    # another order (about 1e-11 apart on an AVX2 machine, 1e-13 on an AVX-512 one)
    tol = 1e-10 if fixed else 1e-12
    assert close(pm, mean, tol * float(mean.abs().max())) and close(pv / bandit.lam, rls, tol * float(rls.max()))
    assert bandit.posterior is post  # kept until the next update


@pytest.mark.parametrize("cls,kw", CASES[:3])
def test_the_posterior_equals_a_fit_on_the_dictionary_and_the_pulls(cls, kw):
    bandit, arms = _run(cls, **kw)
    pulled = (bandit.counts > 0).nonzero().squeeze(1)
    n = bandit.counts[pulled].to(arms.dtype)
    emb = NystromEmbedding(GaussianKernel(LS), arms[bandit.dictionary])
    ref = DTCPosterior(emb, noise=bandit.lam).fit(arms[pulled], bandit.reward_sums[pulled] / n, n)
    post = bandit.posterior
    for a, b in zip(post(arms), ref(arms)):
        assert close(a, b, 1e-9)
    assert close(post.joint(arms[:6])[1], ref.joint(arms[:6])[1], 1e-9)
    assert post.num_train == pulled.numel() and torch.equal(post.train_counts, n)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_changing_the_posterior_changes_nothing_in_the_bandit(cls):
    arms, _, f = gp_sample_problem(A=150, ls=LS)
    plain, meddled = (cls(arms, GaussianKernel(LS), noise=0.01, seed=0, beta=0.5) for _ in range(2))
    g = torch.Generator().manual_seed(1)
    while plain.t < 60:
        idx = plain.ask()
        assert torch.equal(meddled.ask(), idx)
        y = f[idx] + 0.1 * torch.randn(idx.shape, generator=g, dtype=f.dtype)
        plain.tell(idx, y)
        meddled.tell(idx, y)
        post = meddled.posterior
        if post is not None:  # the user's own writes into the posterior (load_state_dict copies in place) and updates
            for t in (*post.state, post.embedding.projection):
                t.mul_(2.0)
            post.update(arms[:3], torch.ones(3, dtype=arms.dtype))
            post.update(arms[3:5])
            assert torch.equal(meddled.V_inverse(), plain.V_inverse())
    assert all(torch.equal(a, b) for a, b in zip(meddled.scores(), plain.scores()))


@pytest.mark.parametrize("fixed", [False, True], ids=["eager", "fixed"])
@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_a_posterior_read_earlier_keeps_its_values_as_the_bandit_moves_on(cls, fixed):
    bandit, arms = _run(cls, steps=40, fixed=fixed, beta=0.5)
    post = bandit.posterior
    before = [t.clone() for t in post(arms)]
    g = torch.Generator().manual_seed(2)
    while bandit.t < 80:
        idx = bandit.ask()
        bandit.tell(idx, torch.randn(idx.shape, generator=g, dtype=arms.dtype))
    assert bandit.posterior is not post
    assert all(torch.equal(a, b) for a, b in zip(post(arms), before))


def test_while_a_batch_is_told_in_parts_the_posterior_holds_every_pull():
    arms, _, f = gp_sample_problem(A=150, ls=LS)
    bandit = BBKB(arms, GaussianKernel(LS), noise=0.01, seed=0, beta=0.5)
    while True:
        idx = bandit.ask()
        if bandit.t >= 40 and idx.numel() >= 2:  # a batch of two picks or more
            break
        bandit.tell(idx, f[idx])
    bandit.tell(idx[:1], f[idx[:1]])  # half told: no update yet
    assert bandit.told_since_update == 1
    pulled = (bandit.counts > 0).nonzero().squeeze(1)
    n = bandit.counts[pulled].to(arms.dtype)
    ref = DTCPosterior(NystromEmbedding(GaussianKernel(LS), arms[bandit.dictionary]), noise=bandit.lam)
    ref.fit(arms[pulled], bandit.reward_sums[pulled] / n, n)
    post = bandit.posterior
    assert post.num_train == pulled.numel()
    for a, b in zip(post(arms), ref(arms)):
        assert close(a, b, 1e-9)
    bandit.tell(idx[1:], f[idx[1:]])  # the batch complete: updated, the posterior is the state again
    assert bandit.told_since_update == 0 and torch.equal(bandit.posterior.V_inv, bandit.V_inverse())
