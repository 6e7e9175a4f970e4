"""DTCApproximateGP ≡ DTCPosterior ≡ Titsias' closed form (003 Eq. 4-5); q*(u); the collapsed bound."""


import gpytorch
import pytest
import torch
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.variational import CholeskyVariationalDistribution, UnwhitenedVariationalStrategy
from hypothesis import given, settings, strategies as st

from conftest import tol
from helpers import ScaledRBF, close, exact_gp, titsias_dtc
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.errors import InputDataError
from torchbkb.gpytorch import DTCApproximateGP

LS, OS, NOISE, C0 = 0.3, 1.4, 0.05, 0.7


KERNEL = ScaledRBF(LS, OS)  # KERNEL(A, B) in closed form, KERNEL.gpytorch(device, dtype) as GPyTorch's


def _data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64) + C0
    Xq = torch.rand(9, d, generator=g, dtype=torch.float64)
    return X, y, Xq


def _model(Z, X, y, dtype=torch.float64, device="cpu", constant=True, **kw):
    mean = ConstantMean() if constant else ZeroMean()
    m = DTCApproximateGP(Z.to(device, dtype), X.to(device, dtype), y.to(device, dtype), noise=NOISE,
                         covar_module=KERNEL.gpytorch(device, dtype), mean_module=mean, **kw)
    if constant:
        m.mean_module.constant = torch.tensor(C0, dtype=dtype)
        m.to(device)
    m.likelihood.noise = torch.tensor(NOISE, dtype=dtype, device=device)
    return m.eval()


def test_predictive_is_titsias_dtc_and_dtc_posterior(dtype, device):
    X, y, Xq = _data()
    Z = X[::4]
    model = _model(Z, X, y, dtype, device)
    pred = model(Xq.to(device, dtype))
    m_ref, cov_ref = titsias_dtc(KERNEL(Z, Z), KERNEL(X, Z), KERNEL(Xq, Z), KERNEL(Xq, Xq), y - C0, NOISE)
    t = tol(dtype) * 10
    assert pred.mean.dtype == dtype and pred.mean.shape == (9,)
    assert close(pred.mean.double().cpu(), C0 + m_ref, atol=t)
    assert close(pred.covariance_matrix.double().cpu(), cov_ref, atol=t)
    assert close(pred.variance.double().cpu(), cov_ref.diagonal(), atol=t)
    # the same numbers as torchbkb's DTCPosterior on the residuals
    post = DTCPosterior(NystromEmbedding(KERNEL.gpytorch(device, dtype), Z.to(device, dtype)),
                        noise=NOISE).fit(X.to(device, dtype), (y - C0).to(device, dtype))
    mean, var = post(Xq.to(device, dtype))
    assert close(pred.mean.double().cpu(), C0 + mean.double().cpu(), atol=t)
    assert close(pred.variance.double().cpu(), var.double().cpu(), atol=t)
    # the likelihood adds the noise
    noisy = model.likelihood(pred)
    assert close(noisy.variance.double().cpu(), cov_ref.diagonal() + NOISE, atol=t)


def test_zero_mean_and_batched_queries():
    X, y, Xq = _data()
    Z = X[::3]
    model = _model(Z, X, y, constant=False)
    Xb = Xq.reshape(3, 3, 2)
    pred = model(Xb)
    assert pred.mean.shape == (3, 3) and pred.covariance_matrix.shape == (3, 3, 3)
    for i in range(3):
        m_ref, cov_ref = titsias_dtc(KERNEL(Z, Z), KERNEL(X, Z), KERNEL(Xb[i], Z), KERNEL(Xb[i], Xb[i]), y, NOISE)
        assert close(pred.mean[i], m_ref, atol=1e-9)
        assert close(pred.covariance_matrix[i], cov_ref, atol=1e-9)


def test_all_training_points_as_inducing_points_is_the_exact_gp():
    X, y, Xq = _data(n=25)
    model = _model(X, X, y, constant=False)
    m_ref, cov_ref = exact_gp(KERNEL(X, X), KERNEL(X, Xq), KERNEL(Xq, Xq), y, NOISE)
    pred = model(Xq)
    assert close(pred.mean, m_ref, atol=1e-9)
    assert close(pred.covariance_matrix, cov_ref, atol=1e-9)


def test_variational_distribution_is_the_titsias_optimum():
    X, y, Xq = _data()
    Z = X[::4]
    model = _model(Z, X, y)
    q = model.variational_strategy.variational_distribution
    Kzz, Kzx = KERNEL(Z, Z), KERNEL(Z, X)
    Sigma = Kzz + Kzx @ Kzx.T / NOISE
    m_ref = C0 + Kzz @ torch.linalg.solve(Sigma, Kzx @ (y - C0)) / NOISE
    S_ref = Kzz @ torch.linalg.solve(Sigma, Kzz)
    assert close(q.mean, m_ref, atol=1e-8)
    assert close(q.covariance_matrix, S_ref, atol=1e-8)
    # GPyTorch's own (unwhitened) strategy with q(u) set to this optimum predicts the same DTC posterior
    ref_model = _UnwhitenedGP(Z, q)
    ref_model.eval()
    ours, theirs = model(Xq), ref_model(Xq)
    assert close(ours.mean, theirs.mean, atol=1e-6)
    assert close(ours.covariance_matrix,
                 theirs.covariance_matrix.to_dense() if hasattr(theirs.covariance_matrix, "to_dense")
                 else theirs.covariance_matrix, atol=1e-6)
    # and its KL to the prior is finite
    assert bool(torch.isfinite(model.variational_strategy.kl_divergence()))


class _UnwhitenedGP(gpytorch.models.ApproximateGP):
    def __init__(self, Z, q):
        dist = CholeskyVariationalDistribution(Z.shape[0]).double()
        strategy = UnwhitenedVariationalStrategy(self, Z, dist, learn_inducing_locations=False, jitter_val=1e-12)
        super().__init__(strategy)
        self.mean_module = ConstantMean().double()
        self.mean_module.constant = torch.tensor(C0, dtype=torch.float64)
        self.covar_module = KERNEL.gpytorch()
        with torch.no_grad():
            dist.variational_mean.copy_(q.mean)
            dist.chol_variational_covar.copy_(torch.linalg.cholesky(q.covariance_matrix + 1e-12
                                                                    * torch.eye(Z.shape[0], dtype=torch.float64)))
        strategy.variational_params_initialized.fill_(1)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _ref_bound(Z, X, y):
    Q = KERNEL(X, Z) @ torch.linalg.solve(KERNEL(Z, Z), KERNEL(Z, X))
    mvn = torch.distributions.MultivariateNormal(torch.full_like(y, C0),
                                                 Q + NOISE * torch.eye(len(y), dtype=torch.float64))
    return mvn.log_prob(y) - (torch.diagonal(KERNEL(X, X)).sum() - torch.trace(Q)) / (2 * NOISE)


def test_titsias_bound_matches_the_formula_and_the_exact_likelihood():
    X, y, _ = _data()
    Z = X[::4]
    model = _model(Z, X, y)
    assert model.titsias_bound().item() == pytest.approx(_ref_bound(Z, X, y).item(), rel=1e-9)
    # Z = X: the bound is the exact log marginal likelihood
    full = _model(X, X, y)
    M = KERNEL(X, X) + NOISE * torch.eye(len(y), dtype=torch.float64)
    exact = torch.distributions.MultivariateNormal(torch.full_like(y, C0), M).log_prob(y)
    assert full.titsias_bound().item() == pytest.approx(exact.item(), rel=1e-8)


def test_titsias_bound_gradients_and_learning():
    X, y, Xq = _data(n=80)
    model = _model(X[::8], X, y, learn_inducing_locations=True)
    model.train()
    bound = model.titsias_bound()
    bound.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name in ("variational_strategy.inducing_points", "covar_module.raw_outputscale",
                 "covar_module.base_kernel.raw_lengthscale",
                 "mean_module.raw_constant", "likelihood.noise_covar.raw_noise"):
        assert (grads[name] is not None and bool(torch.isfinite(grads[name]).all()) and float(grads[name].abs().sum())
                > 0), name
    # finite-difference check on the noise (a raw parameter through a softplus)
    raw = model.likelihood.noise_covar.raw_noise
    h = 1e-6
    with torch.no_grad():
        raw += h
        up = float(model.titsias_bound())
        raw -= 2 * h
        down = float(model.titsias_bound())
        raw += h
    assert float(grads["likelihood.noise_covar.raw_noise"]) == pytest.approx((up - down) / (2 * h), rel=1e-4)
    # any torch optimizer improves the bound; predictions follow the new hyperparameters
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    start = bound.item()
    for _ in range(30):
        opt.zero_grad()
        loss = -model.titsias_bound()
        loss.backward()
        opt.step()
    assert model.titsias_bound().item() > start + 1.0
    model.eval()
    Z = model.variational_strategy.inducing_points.detach()
    post = DTCPosterior(NystromEmbedding(model.covar_module, Z), noise=model.likelihood.noise.item()).fit(X,
            y - model.mean_module.constant.detach())
    with torch.no_grad():
        pred = model(Xq)
        mean, var = post(Xq)
    assert close(pred.mean, mean + model.mean_module.constant.detach(), atol=1e-8)
    assert close(pred.variance, var, atol=1e-8)


def test_gradients_flow_to_the_query_points():
    X, y, _ = _data(n=20)
    model = _model(X[::3], X, y)
    Xq = torch.rand(4, 2, dtype=torch.float64, requires_grad=True)

    def f(x):
        p = model(x)
        return p.mean, p.variance

    assert torch.autograd.gradcheck(f, (Xq,), eps=1e-6, atol=1e-6)


def test_set_train_data_and_one_dimensional_inputs():
    x = torch.linspace(0, 1, 30, dtype=torch.float64)
    y = torch.cos(4 * x)
    model = DTCApproximateGP(x[::5], x, y, noise=0.01).eval()
    assert model.train_inputs[0].shape == (30, 1)
    model.set_train_data(x[:10], y[:10])
    ref = DTCApproximateGP(x[::5], x[:10], y[:10], noise=0.01).eval()
    ref.load_state_dict(model.state_dict())
    q = torch.rand(5, dtype=torch.float64)
    assert close(model(q).mean, ref(q).mean, atol=1e-12)
    with pytest.raises(InputDataError, match="train_x"):
        model.set_train_data(torch.rand(5, 3, dtype=torch.float64), torch.rand(5, dtype=torch.float64))


def _bad_cases():
    X, y, _ = _data(n=10)
    nan = X.clone()
    nan[0, 0] = float("nan")
    ynan = y.clone()
    ynan[1] = float("inf")
    return [
        (X[:3], X, y[:5], {}, "train_y"),
        (X[:3], X, y.unsqueeze(-1), {}, "train_y"),
        (X[:3], nan, y, {}, "finite"),
        (X[:3], X, ynan, {}, "finite"),
        (X[:3, :1], X, y, {}, "inducing_points"),
        (X[:3].float(), X, y, {}, "dtype"),
        (X[:3], X, y.float(), {}, "dtype"),
        (X[:3], X, y, {"noise": 0.0}, "noise"),
        (X[:3], X.unsqueeze(0), y.unsqueeze(0), {}, "train_x"),
    ]


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(range(9)))
def test_bad_inputs_give_clear_errors(i):
    Z, X, y, kw, msg = _bad_cases()[i]
    with pytest.raises(InputDataError, match=msg):
        DTCApproximateGP(Z, X, y, **kw)


@pytest.mark.parametrize("learn_inducing", [False, True])
def test_variational_elbo_has_the_collapsed_bounds_value_and_gradients(learn_inducing):
    # GPyTorch's standard recipe (VariationalELBO in training mode) must train the same model as titsias_bound
    g = torch.Generator().manual_seed(3)
    x = torch.rand(150, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(150, generator=g, dtype=torch.float64)
    model = DTCApproximateGP(x[:15], x, y, noise=0.05, learn_inducing_locations=learn_inducing)
    model.covar_module.base_kernel.lengthscale = 0.3
    model.train()
    elbo = gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=150)(model(x), y)
    elbo.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    bound = model.titsias_bound() / 150
    bound.backward()
    assert close(elbo, bound, 1e-10)
    assert len(grads) == len(list(model.parameters())) >= 4
    for name, p in model.named_parameters():
        assert close(grads[name], p.grad, 1e-8), name


def test_variational_elbo_training_improves_the_collapsed_bound():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(120, 1, generator=g, dtype=torch.float64)
    y = torch.sin(8 * x[:, 0]) + 0.05 * torch.randn(120, generator=g, dtype=torch.float64)
    model = DTCApproximateGP(x[:12], x, y, noise=0.5)
    model.train()
    mll = gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=120)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    start = float(model.titsias_bound())
    for _ in range(40):
        opt.zero_grad()
        (-mll(model(x), y)).backward()
        opt.step()
    assert float(model.titsias_bound()) > start + 10.0
