"""Pathwise posterior samples of BKBModel: the update rule is exact (statistical test with an exact prior),
BoTorch's pathwise consumers accept the model, and the chunked Thompson batch is memory-bounded."""

import pytest
import torch
from botorch.acquisition.joint_entropy_search import qJointEntropySearch
from botorch.acquisition.utils import get_optimal_samples
from botorch.models.transforms.input import Normalize
from botorch.sampling.pathwise import draw_matheron_paths
from botorch.sampling.pathwise.paths import SamplePath

import torchbkb.botorch.thompson as thompson
from helpers import LargestOutput
from torchbkb.botorch import BKBModel, draw_bkb_paths, optimize_acqf_thompson
from torchbkb.errors import InputDataError

D = 2


class ExactPriorPath(SamplePath):
    """Exact joint prior draws on a fixed point set ``U``; evaluating it elsewhere is an error."""

    def __init__(self, kernel, U, num):
        super().__init__()
        K = kernel(U, U).to_dense() + 1e-10 * torch.eye(U.shape[0], dtype=U.dtype)
        g = torch.Generator().manual_seed(7)
        self.U = U
        self.values = torch.randn(num, U.shape[0], generator=g, dtype=U.dtype) @ torch.linalg.cholesky(K).T  # (S, k)

    def forward(self, x, **kwargs):
        dist, idx = (x.unsqueeze(-2) - self.U).abs().sum(-1).min(dim=-1)  # (…, q): exact row matches
        assert float(dist.max()) == 0.0, "exact prior evaluated off its point set"
        return self.values[:, idx]

    def set_ensemble_as_batch(self, ensemble_as_batch):
        pass


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, D, generator=g, dtype=torch.float64)
    Y = torch.sin(5 * X.sum(-1, keepdim=True)) + 0.05 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return X, Y, torch.rand(6, D, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("mode", ["dtc", "exact"])
def test_paths_have_the_posterior_mean_and_covariance(mode):
    X, Y, Xq = _data()
    kw = {"inducing_points": X[:10], "exact_fraction": None} if mode == "dtc" else {"inducing_points": X}
    model = BKBModel(X, Y, noise=0.01, **kw)
    assert model.is_exact == (mode == "exact")
    U = torch.cat([X, Xq])  # training points (hence the dictionary) and queries, transformed = original here
    num = 20_000
    torch.manual_seed(0)
    paths = draw_bkb_paths(model, torch.Size([num]), prior_sampler=
                           lambda model, sample_shape: ExactPriorPath(model.covar_module, U, num))
    f = paths(Xq)  # (S, q)
    post = model.posterior(Xq)
    mean, cov = post.mean.squeeze(-1), post.distribution.covariance_matrix
    var = cov.diagonal()
    # Monte Carlo error only (the prior is exact): 5 standard errors
    assert bool(((f.mean(0) - mean).abs() <= 5 * (var / num).sqrt()).all())
    emp = torch.cov(f.T)
    se = ((var[:, None] * var[None, :] + cov**2) / num).sqrt()
    assert bool(((emp - cov).abs() <= 5 * se).all()), float(((emp - cov).abs() / se).max())


def test_random_feature_paths_through_botorch_and_transforms():
    X, Y, Xq = _data()
    X10 = 10 * X  # original space [0, 10]^2, normalized by the model
    model = BKBModel(X10, Y, noise=0.01, inducing_points=X10[:12], exact_fraction=None, input_transform=Normalize(D))
    torch.manual_seed(0)
    paths = draw_matheron_paths(model, sample_shape=torch.Size([4000]))
    f = paths(10 * Xq)
    post = model.posterior(10 * Xq)
    assert f.shape == (4000, 6)
    # random Fourier prior (1024 features): agreement to a few percent of the prior scale
    assert float((f.mean(0) - post.mean.squeeze(-1)).abs().max()) < 0.05
    assert float((f.var(0) - post.variance.squeeze(-1)).abs().max()) < 0.05 * float(Y.var())


def test_joint_entropy_search_with_optimal_samples_from_paths():
    X, Y, _ = _data()
    model = BKBModel(X, Y, noise=0.01, inducing_points=X[:10], exact_fraction=None)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    torch.manual_seed(0)
    inputs, outputs = get_optimal_samples(model, bounds=bounds, num_optima=4)
    assert inputs.shape == (4, D) and outputs.shape == (4, 1)
    jes = qJointEntropySearch(model, inputs, outputs, estimation_type="LB")
    Xc = torch.rand(3, 1, D, dtype=torch.float64, requires_grad=True)
    jes(Xc).sum().backward()
    assert bool(torch.isfinite(Xc.grad).all()) and float(Xc.grad.abs().max()) > 0


def test_pathwise_needs_a_gpytorch_kernel():
    from torchbkb.gp.kernels import GaussianKernel

    X, Y, _ = _data()
    model = BKBModel(X, Y, kernel=GaussianKernel(0.3), inducing_points=X[:5], exact_fraction=None)
    with pytest.raises(InputDataError, match="GPyTorch kernel"):
        draw_matheron_paths(model, sample_shape=torch.Size([2]))


def test_thompson_batch_is_chunked_and_exact():
    X, Y, _ = _data(n=60)
    model = BKBModel(X, Y, noise=0.01, seed=0, exact_fraction=None)
    m = model.num_inducing
    A = 20_000
    choices = torch.rand(A, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.manual_seed(3)
    whole = optimize_acqf_thompson(model, choices, q=4, chunk_size=A, num_features=64, return_indices=True)
    torch.manual_seed(3)
    with LargestOutput() as rec:
        chunked = optimize_acqf_thompson(model, choices, q=4, chunk_size=500, num_features=64, return_indices=True)
    assert torch.equal(whole[2], chunked[2]) and torch.allclose(whole[1], chunked[1])
    # no (A, m)-sized intermediate: the largest is the candidates themselves (A·d) or a chunk
    biggest = rec.numel
    assert biggest <= max(A * D, 500 * max(m, 64) * 4), (biggest, A * m)
    # each pick is the argmax of its draw over all candidates
    torch.manual_seed(3)
    paths = draw_bkb_paths(model, torch.Size([4]), num_features=64)
    assert torch.equal(paths(choices).argmax(-1), chunked[2])


def test_thompson_bad_inputs():
    X, Y, _ = _data()
    model = BKBModel(X, Y, seed=0)
    with pytest.raises(InputDataError, match="choices"):
        optimize_acqf_thompson(model, torch.rand(10, 3, dtype=torch.float64), q=2)
    with pytest.raises(InputDataError, match="q"):
        optimize_acqf_thompson(model, torch.rand(10, D, dtype=torch.float64), q=0)
    with pytest.raises(InputDataError, match="choices"):
        optimize_acqf_thompson(model, torch.full((10, D), float("nan"), dtype=torch.float64), q=2)
    assert thompson.DEFAULT_CHUNK >= 1
