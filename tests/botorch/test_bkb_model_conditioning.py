"""BKBModel conditioning: ``condition_on_observations`` equals a refit (with transforms and heteroskedastic noise),
``fantasize`` batches its samples, ``hallucinate`` keeps the mean, and bad conditioning is refused."""

import pytest
import torch
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.sampling import SobolQMCNormalSampler

from bkb_model_cases import LAM, dictionary_model, krbf, model_data
from conftest import tol
from helpers import close
from torchbkb.errors import InputDataError


def test_condition_on_observations_equals_refit(dtype):
    X, Y, Xq = model_data(n=40)
    S = X[::4]
    it = lambda: Normalize(2, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=dtype))
    c = lambda t: t.to(dtype)
    for k in (1, 3, 9):  # Sherman-Morrison steps and a refactorization
        base = dictionary_model(X[:30], Y[:30], S, dtype=dtype, input_transform=it())
        cond = base.condition_on_observations(c(X[30 : 30 + k]), c(Y[30 : 30 + k]))
        refit = dictionary_model(X[: 30 + k], Y[: 30 + k], S, dtype=dtype, input_transform=it())
        p1, p2 = cond.posterior(c(Xq)), refit.posterior(c(Xq))
        t = tol(dtype) * 10
        assert close(p1.mean.double(), p2.mean.double(), atol=t)
        assert close(p1.distribution.covariance_matrix.double(), p2.distribution.covariance_matrix.double(), atol=t)
        assert cond.train_inputs[0].shape == (30 + k, 2)
    # the original is unchanged
    assert base.train_inputs[0].shape == (30, 2)
    assert close(base.posterior(c(Xq)).mean.double(),
                 dictionary_model(X[:30], Y[:30], S, dtype=dtype).posterior(c(Xq)).mean.double(), atol=tol(dtype) * 10)


def test_condition_with_outcome_transform_uses_the_stored_statistics():
    X, Y, Xq = model_data(n=40)
    base = dictionary_model(X[:30], Y[:30], X[::4], outcome_transform=Standardize(m=1))
    cond = base.condition_on_observations(X[30:], Y[30:])
    mu, sd = Y[:30].mean(), Y[:30].std()
    ref = dictionary_model(X, (Y - mu) / sd, X[::4])
    assert close(cond.posterior(Xq).mean, mu + sd * ref.posterior(Xq).mean, atol=1e-9)


def test_condition_with_noise_is_heteroskedastic_exact_gp():
    X, Y, Xq = model_data(n=20)
    base = dictionary_model(X[:12], Y[:12], X)  # dictionary holds every point: exact GP
    noise = torch.linspace(0.01, 0.3, 8, dtype=torch.float64).unsqueeze(-1)
    cond = base.condition_on_observations(X[12:], Y[12:], noise=noise)
    D = torch.cat([torch.full((12,), LAM, dtype=torch.float64), noise[:, 0]])
    K = krbf(X, X)
    M = K + torch.diag(D)
    Kq = krbf(X, Xq)
    m_ref = Kq.T @ torch.linalg.solve(M, Y[:, 0])
    cov_ref = krbf(Xq, Xq) - Kq.T @ torch.linalg.solve(M, Kq)
    post = cond.posterior(Xq)
    assert close(post.mean[:, 0], m_ref, atol=1e-8)
    assert close(post.distribution.covariance_matrix, cov_ref, atol=1e-8)


def test_fantasize_batches_each_sample_like_a_refit():
    X, Y, Xq = model_data(n=30)
    S = X[::3]
    base = dictionary_model(X[:25], Y[:25], S)
    sampler = SobolQMCNormalSampler(torch.Size([4]), seed=0)
    fant = base.fantasize(X[25:], sampler)
    assert fant.batch_shape == torch.Size([4])
    post = fant.posterior(Xq)
    assert post.mean.shape == (4, 7, 1)
    Yf = fant.train_targets[..., 25:]  # (4, 5) fantasized outcomes
    for i in range(4):
        ref = dictionary_model(X, torch.cat([Y[:25, 0], Yf[i]]).unsqueeze(-1), S).posterior(Xq)
        assert close(post.mean[i], ref.mean, atol=1e-9)
        assert close(post.distribution.covariance_matrix[i], ref.distribution.covariance_matrix, atol=1e-9)
    # fantasies over a batch of candidate sets: (b, q, d) -> batch (s, b)
    fant2 = base.fantasize(torch.rand(3, 2, 2, dtype=torch.float64), sampler)
    assert fant2.batch_shape == torch.Size([4, 3])
    assert fant2.posterior(torch.rand(3, 5, 2, dtype=torch.float64)).mean.shape == (4, 3, 5, 1)


def test_hallucinate_keeps_mean_and_matches_conditioning_on_the_mean():
    X, Y, Xq = model_data(n=30)
    model = dictionary_model(X, Y, X[::3])
    P = torch.rand(3, 2, dtype=torch.float64)
    hal = model.hallucinate(P)
    mean_P = model.posterior(P).mean
    ref = model.condition_on_observations(P, mean_P.detach())
    assert close(hal.posterior(Xq).mean, model.posterior(Xq).mean, atol=1e-10)
    assert close(hal.posterior(Xq).variance, ref.posterior(Xq).variance, atol=1e-10)
    assert bool((hal.posterior(Xq.unsqueeze(-2)).variance <= model.posterior(Xq.unsqueeze(-2)).variance + 1e-12).all())


def test_bad_conditioning_and_batches():
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X[::3])
    with pytest.raises(InputDataError, match="Y: expected shape"):
        model.condition_on_observations(Xq, torch.zeros(7, 2, dtype=torch.float64))
    with pytest.raises(InputDataError, match="noise"):
        model.condition_on_observations(Xq, torch.zeros(7, 1, dtype=torch.float64),
                                        noise=torch.zeros(7, 1, dtype=torch.float64))
    fant = model.condition_on_observations(Xq[:2], torch.zeros(3, 2, 1, dtype=torch.float64))
    assert fant.batch_shape == torch.Size([3])
    with pytest.raises(InputDataError, match="broadcastable"):
        fant.posterior(torch.rand(5, 4, 2, dtype=torch.float64))
    with pytest.raises(InputDataError, match="output_indices"):
        model.posterior(Xq, output_indices=[1])


def test_likelihood_and_hallucinating_on_a_fantasy_model():
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X[::3])
    assert model.likelihood.noise.item() == pytest.approx(LAM, rel=1e-12)
    fant = model.condition_on_observations(Xq[:2], torch.zeros(3, 2, 1, dtype=torch.float64))
    hal = fant.hallucinate(Xq[2:4])
    assert hal.batch_shape == torch.Size([3])
    p0, p1 = fant.posterior(Xq), hal.posterior(Xq)
    assert close(p1.mean, p0.mean, atol=1e-10)
    assert bool((p1.variance <= p0.variance + 1e-12).all()) and bool((p1.variance < p0.variance).any())
    with pytest.raises(InputDataError, match="X_pending"):
        model.hallucinate(Xq.unsqueeze(0))
