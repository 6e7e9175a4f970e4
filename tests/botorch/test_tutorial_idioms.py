"""The idioms of BoTorch's and GPyTorch's own tutorials, each as a small test with ``SingleTaskGP`` swapped for
``BKBModel`` (and the exact MLL for ``DTCMarginalLogLikelihood``): ``model(X)`` and the torch-optimizer training loop,
GIBBON's batch path, ``SingleTaskGP``'s constructor keywords, its input shapes, batched models in
``batch_cross_validation``, BoTorch's fit protocol for numerical failures, and marginals without a joint
covariance. ``docs/botorch.md`` lists the tutorials themselves, as measured."""

import pytest
import torch
from botorch.acquisition.max_value_entropy_search import qLowerBoundMaxValueEntropy
from botorch.cross_validation import batch_cross_validation, gen_loo_cv_folds
from botorch.exceptions.warnings import OptimizationWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim.closures import get_loss_closure_with_grads
from botorch.optim.closures.core import NdarrayOptimizationClosure
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.constraints import GreaterThan, Interval
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.errors import NanError, NotPSDError

from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
from torchbkb.errors import InputDataError

F64 = torch.float64


def _data(n=30, d=2, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=dtype, generator=g)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:].sum(-1, keepdim=True) + 0.05 * torch.randn(n, 1, dtype=dtype, generator=g)
    return X, Y


def _pair(X, Y, **kw):
    """A BKBModel and a SingleTaskGP with the same (default) modules and values."""
    gp = SingleTaskGP(X, Y, **kw)
    bkb = BKBModel(X, Y, seed=0, **kw)
    bkb.load_state_dict(gp.state_dict())
    return bkb, gp


def test_model_of_x_is_the_prior_in_training_and_the_posterior_in_eval_mode():
    X, Y = _data()
    bkb, gp = _pair(X, Y)
    bkb.train(), gp.train()
    a, b = bkb(X), gp(X)
    assert torch.allclose(a.mean, b.mean) and torch.allclose(a.covariance_matrix, b.covariance_matrix)
    bkb.eval(), gp.eval()
    Xq = torch.rand(2, 5, 2, dtype=F64)
    gp.posterior(Xq)  # SingleTaskGP's eval-mode call reads its prediction caches
    a, b = bkb(Xq), gp(Xq)
    assert torch.allclose(a.mean, b.mean, atol=1e-8)
    assert torch.allclose(a.covariance_matrix, b.covariance_matrix, atol=1e-8)


def test_the_torch_optimizer_training_loop_of_the_tutorial():
    X, Y = _data()
    model = BKBModel(X, Y, seed=0)
    model.likelihood.noise_covar.register_constraint("raw_noise", GreaterThan(1e-5))  # the tutorial's, for SGD
    mll = DTCMarginalLogLikelihood(model.likelihood, model).to(X)
    optimizer = torch.optim.SGD([{"params": model.parameters()}], lr=0.025)  # the tutorial's settings
    model.train()
    losses = []
    for _ in range(50):
        optimizer.zero_grad()
        output = model(X)
        loss = -mll(output, model.train_targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    model.eval()
    assert losses[-1] < losses[0] - 0.1
    ref = BKBModel(X, Y, seed=0)
    ref.likelihood.noise_covar.register_constraint("raw_noise", GreaterThan(1e-5))
    ref.load_state_dict(model.state_dict())  # the posterior follows the trained values
    Xq = torch.rand(6, 1, 2, dtype=F64)
    assert torch.allclose(model.posterior(Xq).mean, ref.posterior(Xq).mean, atol=1e-12)


def test_gibbon_batch_path_calls_the_model():
    X, Y = _data()
    bkb, gp = _pair(X, Y)
    candidates = torch.rand(200, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    Xq, pending = torch.rand(4, 1, 2, dtype=F64), torch.rand(2, 2, dtype=F64)
    values = []
    for model in (bkb, gp):
        torch.manual_seed(0)
        acq = qLowerBoundMaxValueEntropy(model, candidate_set=candidates, num_mv_samples=8, X_pending=pending)
        values.append(acq(Xq))
    assert torch.isfinite(values[0]).all() and torch.allclose(values[0], values[1], atol=1e-6)


def test_single_task_gp_constructor_keywords():
    X, Y = _data()
    likelihood = GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))  # TuRBO's tutorial
    covar = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2, lengthscale_constraint=Interval(0.005, 4.0)))
    model = BKBModel(X, Y, covar_module=covar, likelihood=likelihood, mean_module=ConstantMean(),
                     input_transform=Normalize(2), outcome_transform=Standardize(1))
    assert model.likelihood is likelihood and model.covar_module is covar
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    assert 1e-8 <= float(model.likelihood.noise) <= 1e-3 and model.noise <= 1e-3
    with pytest.raises(InputDataError, match="likelihood"):
        BKBModel(X, Y, likelihood=GaussianLikelihood(), noise=0.1)
    with pytest.raises(InputDataError, match="mean_module"):
        BKBModel(X, Y, mean_module=LinearMean(2))


def test_the_input_shapes_single_task_gp_accepts():
    X, Y = _data(d=1)
    bkb, gp = _pair(X, Y)
    for Xq in (torch.rand(100, dtype=F64), torch.rand(7, 1, dtype=F64), torch.rand(3, 4, 1, dtype=F64)):
        a, b = bkb.posterior(Xq), gp.posterior(Xq)
        assert a.mean.shape == b.mean.shape and torch.allclose(a.mean, b.mean, atol=1e-8)
    with pytest.raises(InputDataError):
        BKBModel(*_data(d=2)).posterior(torch.rand(2, dtype=F64))  # (d,) is not a query when d > 1


def test_batch_cross_validation_fits_one_model_per_fold():
    X, Y = _data(n=12)
    folds = gen_loo_cv_folds(train_X=X, train_Y=Y)
    results = {}
    for cls, mll in ((BKBModel, DTCMarginalLogLikelihood), (SingleTaskGP, ExactMarginalLogLikelihood)):
        cv = batch_cross_validation(model_cls=cls, mll_cls=mll, cv_folds=folds)
        results[cls] = cv
        assert cv.posterior.mean.shape == (12, 1, 1) and cv.model.batch_shape == (12,)
    a, b = results[BKBModel].posterior, results[SingleTaskGP].posterior
    assert torch.allclose(a.mean, b.mean, atol=1e-3) and torch.allclose(a.variance, b.variance, rtol=1e-2, atol=1e-5)


def test_a_non_finite_bound_is_a_nan_loss_for_bo_torch_closures():
    X, Y = _data()
    model = BKBModel(X, Y, seed=0)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        model.covar_module.raw_lengthscale.fill_(float("nan"))  # an extreme L-BFGS step
    mll.train()
    with pytest.raises(NanError):
        mll()
    params = {n: p for n, p in mll.named_parameters() if p.requires_grad}
    closure = NdarrayOptimizationClosure(get_loss_closure_with_grads(mll, params), params)
    value, grads = closure()
    assert value != value and (grads != grads).all()  # NaN: scipy's line search backs off


def test_a_failed_fit_attempt_is_retried_from_the_prior():
    X, Y = _data()
    model = BKBModel(X, Y, seed=0)
    calls = []

    def flaky(mll, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise NotPSDError("not positive definite")
        if len(calls) == 2:
            import warnings

            warnings.warn("ABNORMAL line search", OptimizationWarning, stacklevel=2)
        return fit_gpytorch_mll_scipy(mll, **kwargs)

    with pytest.warns(OptimizationWarning, match="ABNORMAL"):
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model), optimizer=flaky)
    assert len(calls) == 3 and not model.training


def test_a_float32_fit_with_a_user_kernel_without_priors():
    X, Y = _data(n=40, d=6, dtype=torch.float32)
    model = BKBModel(X, Y, covar_module=ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=6)))
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    post = model.posterior(torch.rand(5, 1, 6))
    assert torch.isfinite(post.mean).all() and (post.variance > 0).all()


def test_marginals_of_many_points_never_form_the_joint_covariance(monkeypatch):
    X, Y = _data(n=200)
    for model in (BKBModel(X, Y, seed=0), BKBModel(X, Y, seed=0, exact_fraction=None)):
        Xq = torch.rand(4096, 2, dtype=F64)
        ref_mean = torch.cat([model.posterior(Xq[i : i + 64]).mean for i in range(0, 4096, 64)])
        ref_var = model.posterior(Xq.unsqueeze(-2)).variance.reshape(-1, 1)
        shapes = []
        monkeypatch.setattr(type(model.covar_module), "forward", _spy(type(model.covar_module).forward, shapes))
        post = model.posterior(Xq)
        assert not isinstance(post.distribution.lazy_covariance_matrix, DenseLinearOperator)
        mean, var = post.mean, post.variance
        monkeypatch.undo()
        assert not any(a == b == 4096 and not diag for a, b, diag in shapes)
        assert torch.allclose(mean, ref_mean, atol=1e-10) and torch.allclose(var, ref_var, rtol=1e-8, atol=1e-12)


def _spy(forward, shapes):
    def spy(self, x1, x2, *args, **kwargs):
        shapes.append((x1.shape[-2], x2.shape[-2], bool(kwargs.get("diag"))))
        return forward(self, x1, x2, *args, **kwargs)

    return spy


def test_the_exact_mll_of_bo_torch_loops_fits_with_the_bound():
    """``fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))``, as BoTorch's loops write it, fits
    a BKBModel with its bound: the hyperparameters of the DTC MLL's fit, the exact MLL handed back in eval mode."""
    X, Y = _data(n=40)
    fitted = []
    for mll_cls in (ExactMarginalLogLikelihood, DTCMarginalLogLikelihood):
        model = BKBModel(X, Y, seed=0)
        mll = mll_cls(model.likelihood, model)
        assert fit_gpytorch_mll(mll) is mll and not model.training
        fitted.append(model.state_dict())
    assert fitted[0].keys() == fitted[1].keys() and all(torch.equal(fitted[0][k], fitted[1][k]) for k in fitted[0])
    model = BKBModel(X, Y, seed=0)
    with pytest.raises(InputDataError, match="likelihood: expected model.likelihood"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(GaussianLikelihood().to(X), model))
    models = ModelListGP(BKBModel(X, Y, seed=0), BKBModel(X, -Y, seed=0))  # the multi-objective tutorials' fit
    fit_gpytorch_mll(SumMarginalLogLikelihood(models.likelihood, models))
    assert all(m.fit_rounds >= 1 and not m.training for m in models.models)


def test_the_exact_mll_of_model_of_x_is_single_task_gps_exact_evidence():
    """The torch-optimizer loop with the exact MLL: the exact evidence of the same hyperparameters, and its gradient."""
    X, Y = _data()
    bkb, gp = _pair(X, Y)
    losses, grads = [], []
    for model in (bkb, gp):
        model.train()
        loss = -ExactMarginalLogLikelihood(model.likelihood, model)(model(X), model.train_targets)
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert torch.allclose(losses[0], losses[1], rtol=1e-10)
    copied = BKBModel.from_model(gp).train()  # built without __init__: a GPyTorch GP all the same
    assert torch.allclose(-ExactMarginalLogLikelihood(copied.likelihood, copied)(copied(X), copied.train_targets),
                          losses[1], rtol=1e-10)
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.allclose(grads[0][k], grads[1][k], rtol=1e-8, atol=1e-12) for k in grads[1])


def test_model_of_x_in_training_mode_takes_torchbkbs_own_kernel():
    """``model(train_X)`` in training mode (a user's own fitting loop) with ``kernel=GaussianKernel(...)``: the prior
    with covariance ``k(X, X)``, as with a GPyTorch kernel (it called ``k(X)`` with one argument, which torchbkb's
    kernel refused)."""
    from torchbkb.gp.kernels import GaussianKernel

    X = torch.rand(40, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = BKBModel(X, torch.sin(5 * X).sum(-1, keepdim=True), kernel=GaussianKernel(0.4), noise=0.05)
    model.train()
    prior = model(X)
    assert torch.allclose(prior.covariance_matrix, GaussianKernel(0.4)(X, X), rtol=0, atol=1e-12)
    assert torch.isfinite(ExactMarginalLogLikelihood(model.likelihood, model)(prior, model.train_targets))
