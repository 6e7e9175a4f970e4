"""Every BoTorch acquisition that takes a single-output SingleTaskGP takes a BKBModel.

With a complete dictionary (the model computes the exact GP) values and gradients w.r.t. the candidates equal
SingleTaskGP's with the same hyperparameters to 1e-8 in float64; with a sparse dictionary (DTC) they are
finite, the gradients are not zero, and ``optimize_acqf`` moves the candidates."""

import pytest
import torch
from botorch.acquisition import (
    ExpectedImprovement,
    LogExpectedImprovement,
    PosteriorMean,
    ProbabilityOfImprovement,
    UpperConfidenceBound,
    qExpectedImprovement,
    qKnowledgeGradient,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qLowerBoundMaxValueEntropy,
    qMaxValueEntropy,
    qNoisyExpectedImprovement,
    qProbabilityOfImprovement,
    qSimpleRegret,
    qUpperConfidenceBound,
)
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.acquisition.joint_entropy_search import qJointEntropySearch
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from botorch.test_functions import Hartmann

from torchbkb.botorch import BKBModel, default_kernel

D, N = 3, 16


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(N, D, generator=g, dtype=torch.float64)
    return X, Hartmann(dim=D, negate=True)(X).unsqueeze(-1)


def _gp(X, Y):
    gp = SingleTaskGP(X, Y, covar_module=default_kernel(D))
    gp.likelihood.noise = torch.tensor([1e-3], dtype=torch.float64)
    return gp.eval()


def _bkb(X, Y, **kwargs):
    """BKBModel with _gp's hyperparameters (fixed Matérn-5/2 and noise 1e-3: every acquisition has gradients)."""
    return BKBModel(X, Y, kernel=default_kernel(D), noise=1e-3, **kwargs)


def _sampler(n=32):
    return SobolQMCNormalSampler(torch.Size([n]), seed=0)


def _optimal_samples():
    g = torch.Generator().manual_seed(1)
    return torch.rand(4, D, generator=g, dtype=torch.float64), torch.full((4, 1), 3.5, dtype=torch.float64)


# name -> (factory(model, X, Y), q)
ACQUISITIONS = {
    "EI": (lambda m, X, Y: ExpectedImprovement(m, best_f=Y.max()), 1),
    "LogEI": (lambda m, X, Y: LogExpectedImprovement(m, best_f=Y.max()), 1),
    "PI": (lambda m, X, Y: ProbabilityOfImprovement(m, best_f=Y.max()), 1),
    "UCB": (lambda m, X, Y: UpperConfidenceBound(m, beta=4.0), 1),
    "PosteriorMean": (lambda m, X, Y: PosteriorMean(m), 1),
    "qEI": (lambda m, X, Y: qExpectedImprovement(m, best_f=Y.max(), sampler=_sampler()), 2),
    "qLogEI": (lambda m, X, Y: qLogExpectedImprovement(m, best_f=Y.max(), sampler=_sampler()), 2),
    # cache_root=False: SingleTaskGP's cached root factorizes the same covariance in another order, which gives
    # other (equally valid) MC samples; BoTorch does not offer the cache to models other than its own GPs
    "qNEI": (lambda m, X, Y: qNoisyExpectedImprovement(m, X, sampler=_sampler(), prune_baseline=False,
                                                       cache_root=False), 2),
    "qLogNEI": (lambda m, X, Y: qLogNoisyExpectedImprovement(m, X, sampler=_sampler(), prune_baseline=False,
                                                             cache_root=False), 2),
    "qPI": (lambda m, X, Y: qProbabilityOfImprovement(m, best_f=Y.median(), tau=0.5, sampler=_sampler()), 2),
    "qUCB": (lambda m, X, Y: qUpperConfidenceBound(m, beta=4.0, sampler=_sampler()), 2),
    "qSR": (lambda m, X, Y: qSimpleRegret(m, sampler=_sampler()), 2),
    "qKG": (lambda m, X, Y: qKnowledgeGradient(m, num_fantasies=4, sampler=_sampler(4)), 2),
    "qNIPV": (lambda m, X, Y: qNegIntegratedPosteriorVariance(
        m, mc_points=torch.rand(16, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)), 2),
    "qMES": (lambda m, X, Y: _seeded(qMaxValueEntropy, m, candidate_set=_candidates(), num_mv_samples=4), 1),
    "GIBBON": (lambda m, X, Y: _seeded(qLowerBoundMaxValueEntropy, m, candidate_set=_candidates(), num_mv_samples=4),
               1),
    # condition_noiseless=False: with the default per-point noise 1e-6 SingleTaskGP's conditioned *mean* ignores
    # the noise (5e-3 off the exact formula here; BKBModel is within 1e-8: test_jes_conditioning_is_exact)
    "qJES": (lambda m, X, Y: qJointEntropySearch(m, *_optimal_samples(), estimation_type="LB",
                                                 condition_noiseless=False), 2),
}


def _candidates():
    return torch.rand(64, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _seeded(cls, model, **kw):
    torch.manual_seed(0)  # max-value samples are drawn at construction
    return cls(model, **kw)


def _q_total(acqf, q):
    return acqf.get_augmented_q_batch_size(q) if isinstance(acqf, qKnowledgeGradient) else q


def _value_and_grad(acqf, Xc):
    Xc = Xc.clone().requires_grad_(True)
    value = acqf(Xc)
    value.sum().backward()
    return value.detach(), Xc.grad


@pytest.mark.parametrize("name", sorted(ACQUISITIONS))
def test_complete_dictionary_equals_single_task_gp(name):
    make, q = ACQUISITIONS[name]
    X, Y = _data()
    gp, bkb = _gp(X, Y), _bkb(X, Y, inducing_points=X)
    assert bkb.is_exact
    a_gp, a_bkb = make(gp, X, Y), make(bkb, X, Y)
    Xc = torch.rand(3, _q_total(a_gp, q), D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    v_gp, g_gp = _value_and_grad(a_gp, Xc)
    v_bkb, g_bkb = _value_and_grad(a_bkb, Xc)
    assert torch.allclose(v_bkb, v_gp, rtol=0.0, atol=1e-8), (v_bkb - v_gp).abs().max()
    if name == "qNIPV":  # SingleTaskGP's fantasy gradient is off by 0.1 here: compare with finite differences
        g_gp = _finite_differences(a_bkb, Xc)
        assert torch.allclose(g_bkb, g_gp, rtol=0.0, atol=1e-7), (g_bkb - g_gp).abs().max()
    else:
        assert torch.allclose(g_bkb, g_gp, rtol=0.0, atol=1e-8), (g_bkb - g_gp).abs().max()
    assert float(g_gp.abs().max()) > 1e-6  # the comparison is not between two zero gradients


def _finite_differences(acqf, Xc, h=1e-6):
    grad = torch.zeros_like(Xc)
    with torch.no_grad():
        for idx in torch.cartesian_prod(*(torch.arange(s) for s in Xc.shape)):
            e = torch.zeros_like(Xc)
            e[tuple(idx)] = h
            grad[tuple(idx)] = (acqf(Xc + e) - acqf(Xc - e)).sum() / (2 * h)
    return grad


def test_jes_conditioning_is_exact():
    # the noiseless conditioning on optimal samples: mean and variance of the exact GP with per-point noise
    X, Y = _data()
    bkb = _bkb(X, Y, inducing_points=X)
    Xo, Yo = _optimal_samples()
    cond = bkb.condition_on_observations(Xo, Yo, noise=torch.full_like(Yo, 1e-6))
    k = default_kernel(D)
    mu, sd = Y.mean(), Y.std()
    Xa, ya = torch.cat([X, Xo]), ((torch.cat([Y, Yo]) - mu) / sd).squeeze(-1)
    noise = torch.cat([torch.full((N,), 1e-3), torch.full((4,), 1e-6)]).to(torch.float64)
    K = k(Xa, Xa).to_dense() + torch.diag(noise)
    Xq = _candidates()[:5]
    Kq = k(Xq, Xa).to_dense()
    mean = Kq @ torch.linalg.solve(K, ya) * sd + mu
    var = (k(Xq, Xq).to_dense().diagonal() - (Kq * torch.linalg.solve(K, Kq.T).T).sum(-1)) * sd**2
    post = cond.posterior(Xq)
    assert torch.allclose(post.mean.squeeze(-1), mean, rtol=0.0, atol=1e-7)
    assert torch.allclose(post.variance.squeeze(-1), var, rtol=0.0, atol=1e-9)


@pytest.mark.parametrize("name", sorted(ACQUISITIONS))
def test_sparse_dictionary_runs_and_optimize_acqf_moves_the_candidates(name):
    make, q = ACQUISITIONS[name]
    X, Y = _data()
    bkb = _bkb(X, Y, inducing_points=X[:6], exact_fraction=None)
    assert not bkb.is_exact and bkb.num_inducing == 6
    acqf = make(bkb, X, Y)
    Xc = torch.rand(3, _q_total(acqf, q), D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    value, grad = _value_and_grad(acqf, Xc)
    assert bool(torch.isfinite(value).all()) and bool(torch.isfinite(grad).all())
    assert float(grad.abs().max()) > 0.0
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).to(torch.float64)
    start = Xc[:1]
    cand, _ = optimize_acqf(acqf, bounds, q=q, num_restarts=1, batch_initial_conditions=start, options={"maxiter": 20},
                            return_best_only=True)
    assert float((cand - start[0, :q]).abs().max()) > 1e-6


def test_thompson_sampling_equals_single_task_gp():
    X, Y = _data()
    gp, bkb = _gp(X, Y), _bkb(X, Y, inducing_points=X)
    cands = _candidates()
    picks = []
    for model in (gp, bkb):
        torch.manual_seed(0)
        picks.append(MaxPosteriorSampling(model, replacement=False)(cands, num_samples=3))
    assert torch.equal(picks[0], picks[1])
    sparse = _bkb(X, Y, inducing_points=X[:6], exact_fraction=None)
    assert MaxPosteriorSampling(sparse)(cands, num_samples=3).shape == (3, D)
