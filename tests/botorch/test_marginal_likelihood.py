"""DTCMarginalLogLikelihood: Titsias' bound of BKBModel's DTC posterior, and fitting with it."""

import math

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood
from hypothesis import given, settings, strategies as st

from helpers import spy_factorizations
from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
from torchbkb.sampling.dictionary_replay import sample_dictionary
from torchbkb.botorch.fitting import (
    EXACT_FIT, FIT_INDUCING, FIT_POINTS, MAX_ROUNDS, ROUND_NATS, WARM_START, hyperparameter_change, hyperparameters
)
from torchbkb.errors import InputDataError
from torchbkb.gp.evidence_bound import dtc_evidence_bound, exact_evidence

F64 = torch.float64


def _data(n=60, d=2, seed=0, noise=0.05):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=F64)
    Y = torch.sin(5 * X[:, :1]) * torch.cos(3 * X[:, -1:]) + noise * torch.randn(n, 1, generator=g, dtype=F64)
    return X, Y


def _kernel():
    k = ScaleKernel(RBFKernel(ard_num_dims=2)).to(F64)
    k.base_kernel.lengthscale = torch.tensor([[0.3, 0.6]], dtype=F64)
    k.outputscale = torch.tensor(1.3, dtype=F64)
    return k


def _log_normal(X, y, noise, k):
    K = k(X, X).to_dense() + torch.diag(noise)
    return torch.distributions.MultivariateNormal(torch.zeros_like(y), K).log_prob(y)


@pytest.mark.parametrize("chunk", [7, 10_000])
def test_bound_with_every_point_in_the_dictionary_is_the_exact_evidence(chunk):
    X, Y = _data()
    y = Y.squeeze(-1)
    for noise in (torch.full_like(y, 0.05), torch.linspace(0.01, 0.3, y.shape[0], dtype=F64)):
        exact = _log_normal(X, y, noise, _kernel())
        assert abs(float(dtc_evidence_bound(_kernel(), X, y, noise, X, chunk_size=chunk) - exact)) < 1e-8
        assert abs(float(exact_evidence(_kernel(), X, y, noise) - exact)) < 1e-8


def test_bound_with_a_smaller_dictionary_is_titsias_formula_and_below_the_evidence():
    X, Y = _data()
    y, noise, k = Y.squeeze(-1), torch.full((60,), 0.05, dtype=F64), _kernel()
    S = X[:12]
    Kxs, Kss, Kxx = k(X, S).to_dense(), k(S, S).to_dense(), k(X, X).to_dense()
    Q = Kxs @ torch.linalg.solve(Kss, Kxs.T)
    ref = torch.distributions.MultivariateNormal(torch.zeros_like(y), Q + 0.05 * torch.eye(60, dtype=F64)).log_prob(y)
    ref = ref - 0.5 * (Kxx - Q).diagonal().sum() / 0.05
    bound = dtc_evidence_bound(k, X, y, noise, S, chunk_size=16)
    assert abs(float(bound - ref)) < 1e-8
    assert float(bound) < float(_log_normal(X, y, noise, k))


@pytest.mark.parametrize("exact_fraction", [0.5, None])
@pytest.mark.parametrize("known_noise", [False, True])
def test_mll_equals_single_task_gps_exact_mll_with_a_complete_dictionary(exact_fraction, known_noise):
    X, Y = _data(n=40)
    Yvar = torch.linspace(0.01, 0.1, 40, dtype=F64).unsqueeze(-1) if known_noise else None
    bkb = BKBModel(X, Y, train_Yvar=Yvar, inducing_points=X, exact_fraction=exact_fraction)
    gp = SingleTaskGP(X, Y, train_Yvar=Yvar)
    for model in (bkb, gp):  # the same non-default hyperparameters in both
        model.covar_module.lengthscale = torch.tensor([[0.25, 0.5]], dtype=F64)
        model.mean_module.constant = torch.tensor(0.3, dtype=F64)
        if not known_noise:
            model.likelihood.noise = torch.tensor([0.02], dtype=F64)
    mll, emll = DTCMarginalLogLikelihood(bkb.likelihood, bkb).train(), ExactMarginalLogLikelihood(gp.likelihood,
                                                                                                  gp).train()
    assert bkb.is_exact == (exact_fraction is not None)
    assert abs(float(mll() - emll(gp(*gp.train_inputs), gp.train_targets))) < 1e-8


def test_gradients_match_finite_differences():
    X, Y = _data(n=80)
    model = BKBModel(X, Y, inducing_points=X[:20], exact_fraction=None)
    model.covar_module.lengthscale = torch.tensor([[0.3, 0.5]], dtype=F64)
    mll = DTCMarginalLogLikelihood(model.likelihood, model).train()
    params = dict(mll.named_parameters())
    assert {"likelihood.noise_covar.raw_noise", "model.covar_module.raw_lengthscale",
            "model.mean_module.raw_constant"} <= set(params)
    mll.zero_grad()
    mll().backward()
    h = 1e-6
    for name, p in params.items():
        for i in range(p.numel()):
            with torch.no_grad():
                p.view(-1)[i] += h
                up = float(mll())
                p.view(-1)[i] -= 2 * h
                down = float(mll())
                p.view(-1)[i] += h
            fd = (up - down) / (2 * h)
            assert (abs(float(p.grad.view(-1)[i]) - fd) < 1e-6 * max(1.0, abs(fd))), (name, i,
                                                                                      float(p.grad.view(-1)[i]), fd)


def test_only_m_by_m_matrices_are_factorized(monkeypatch):
    X, Y = _data(n=600)
    model = BKBModel(X, Y, inducing_points=X[:25], exact_fraction=None)
    mll = DTCMarginalLogLikelihood(model.likelihood, model).train()
    sizes = spy_factorizations(monkeypatch)
    mll().backward()
    assert sizes and max(max(s) for s in sizes) <= 25, sorted(set(sizes))


@pytest.mark.parametrize("fit_points", [None, EXACT_FIT])  # every point, or rounds on a subset of 1,000 of 1,300
def test_fit_recovers_the_hyperparameters_of_a_gp_sample(fit_points):
    g = torch.Generator().manual_seed(3)
    n, ls, noise = EXACT_FIT + 300, 0.15, 0.01  # past EXACT_FIT: the rounds maximize the bound
    X = torch.rand(n, 1, generator=g, dtype=F64)
    k = RBFKernel().to(F64)
    k.lengthscale = torch.tensor(ls, dtype=F64)
    f = torch.linalg.cholesky(k(X, X).to_dense() + 1e-8 * torch.eye(n, dtype=F64)) @ torch.randn(n, generator=g,
                                                                                                 dtype=F64)
    Y = (f + math.sqrt(noise) * torch.randn(n, generator=g, dtype=F64)).unsqueeze(-1)
    model = BKBModel(X, Y, outcome_transform=None, seed=0)
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model), fit_points=fit_points)
    assert not model.is_exact and model.dictionary_size < n / 4
    assert 1 <= model.fit_rounds <= MAX_ROUNDS
    assert float(model.covar_module.lengthscale) == pytest.approx(ls, rel=0.2)
    assert model.noise == pytest.approx(noise, rel=0.3)


def test_after_a_fit_the_dictionary_is_drawn_at_the_fitted_hyperparameters():
    X, Y = _data(n=WARM_START + 100, noise=0.1)  # past WARM_START: the warm start runs too
    model = BKBModel(X, Y, seed=4)
    mll = fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    assert not mll.training and not model.training
    fresh = BKBModel(X, Y, seed=4)
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh.inducing_points, model.inducing_points)
    Xq = torch.rand(5, 2, dtype=F64)
    assert torch.allclose(fresh.posterior(Xq).mean, model.posterior(Xq).mean, atol=1e-12)


def test_setting_a_hyperparameter_rebuilds_the_posterior_but_not_a_conditioned_copy():
    X, Y = _data(n=50)
    model = BKBModel(X, Y, seed=0)
    Xq = torch.rand(4, 2, dtype=F64)
    child = model.condition_on_observations(X[:2], Y[:2])
    before, child_before = model.posterior(Xq).mean, child.posterior(Xq).mean
    model.covar_module.lengthscale = torch.tensor([[0.9, 0.9]], dtype=F64)
    ref = BKBModel(X, Y, seed=0)
    ref.covar_module.lengthscale = torch.tensor([[0.9, 0.9]], dtype=F64)
    assert torch.allclose(model.posterior(Xq).mean, ref.posterior(Xq).mean, atol=1e-12)
    assert not torch.allclose(model.posterior(Xq).mean, before)
    assert torch.equal(child.posterior(Xq).mean, child_before)  # a snapshot


def test_a_fixed_noise_is_kept_by_the_fit():
    X, Y = _data(n=60)
    model = BKBModel(X, Y, noise=0.02)
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    assert model.noise == pytest.approx(0.02, rel=1e-12)


def test_bad_inputs_give_clear_errors():
    X, Y = _data(n=30)
    y, noise, k = Y.squeeze(-1), torch.full((30,), 0.1, dtype=F64), _kernel()
    with pytest.raises(InputDataError, match="X: expected shape"):
        dtc_evidence_bound(k, X[:0], y[:0], noise[:0], X[:3])
    with pytest.raises(InputDataError, match="finite"):
        dtc_evidence_bound(k, X, y.clone().index_fill_(0, torch.tensor([3]), float("nan")), noise, X[:3])
    with pytest.raises(InputDataError, match="noise: expected positive"):
        dtc_evidence_bound(k, X, y, -noise, X[:3])
    with pytest.raises(InputDataError, match="dictionary: expected shape"):
        dtc_evidence_bound(k, X, y, noise, X[:3, :1])
    model = BKBModel(X, Y)
    with pytest.raises(InputDataError, match="expected a BKBModel"):
        DTCMarginalLogLikelihood(model.likelihood, SingleTaskGP(X, Y))
    with pytest.raises(InputDataError, match="model.likelihood"):
        DTCMarginalLogLikelihood(SingleTaskGP(X, Y).likelihood, model)
    other = BKBModel(X, Y)
    with pytest.raises(InputDataError, match="for this BKBModel"):  # fit_gpytorch_mll calls model.custom_fit
        model.custom_fit(DTCMarginalLogLikelihood(other.likelihood, other))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 5), d=st.integers(1, 3), m=st.integers(0, 4), extra=st.integers(-1, 1))
def test_shapes_are_checked(n, d, m, extra):
    X = torch.rand(n, d, dtype=F64)
    y, noise, S = torch.rand(max(n + extra, 0), dtype=F64), torch.ones(n, dtype=F64), torch.rand(m, d, dtype=F64)
    if n >= 1 and m >= 1 and y.shape[0] == n:
        assert torch.isfinite(dtc_evidence_bound(RBFKernel().to(F64), X, y, noise, S))
    else:
        with pytest.raises(InputDataError):
            dtc_evidence_bound(RBFKernel().to(F64), X, y, noise, S)


def test_a_fit_past_exact_fit_factorizes_nothing_larger_than_its_warm_start(monkeypatch):
    X, Y = _data(n=EXACT_FIT + 200, noise=0.1)
    model = BKBModel(X, Y, seed=1)
    sizes = spy_factorizations(monkeypatch)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    assert sizes == []  # building the MLL never builds the posterior
    fit_gpytorch_mll(mll)
    assert sizes and max(max(s) for s in sizes) <= max(WARM_START, FIT_INDUCING)
    sizes.clear()
    again = BKBModel(X, Y, seed=1)
    again.load_state_dict(model.state_dict())
    fit_gpytorch_mll(DTCMarginalLogLikelihood(again.likelihood, again), warm_start=False)  # a BO loop's next fit
    assert sizes and max(max(s) for s in sizes) <= FIT_INDUCING  # no warm start: only the bound's inducing points
    assert hyperparameter_change(hyperparameters(model), hyperparameters(again)) < 0.5


def test_hyperparameter_change_is_relative_for_positive_values():
    X, Y = _data(n=30)
    model = BKBModel(X, Y)
    before = hyperparameters(model)
    assert hyperparameter_change(before, hyperparameters(model)) == 0.0
    model.covar_module.lengthscale = model.covar_module.lengthscale * 2
    assert hyperparameter_change(before, hyperparameters(model)) == pytest.approx(math.log(2), rel=1e-9)
    model.mean_module.constant = torch.tensor(3.0, dtype=F64)  # unconstrained: relative to max(1, |c|)
    assert hyperparameter_change(before, hyperparameters(model)) == pytest.approx(1.0, rel=1e-9)


def test_a_capped_draw_holds_at_most_max_size_training_points():
    X, _ = _data(n=400, d=2)
    k = _kernel()
    full = sample_dictionary(k, X, 1e-4, generator=torch.Generator().manual_seed(0))
    capped = sample_dictionary(k, X, 1e-4, generator=torch.Generator().manual_seed(0), max_size=20)
    assert full.shape[0] > 20 and 1 <= capped.shape[0] <= 20
    assert bool((capped.unsqueeze(1) == X.unsqueeze(0)).all(-1).any(-1).all())  # rows of X
    for bad in (0, -3):
        with pytest.raises(InputDataError, match="max_size"):
            sample_dictionary(k, X, 1e-4, max_size=bad)
    with pytest.raises(InputDataError, match="max_size"):
        sample_dictionary(k, X.expand(2, 400, 2), 1e-4, max_size=20)


def test_inducing_limit_is_checked_and_bounds_the_fit(monkeypatch):
    X, Y = _data(n=EXACT_FIT + 50, noise=0.1)
    model = BKBModel(X, Y, seed=2)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    for bad in (0, 2.5, True):
        with pytest.raises(InputDataError, match="inducing_limit"):
            fit_gpytorch_mll(mll, inducing_limit=bad)
    sizes = spy_factorizations(monkeypatch)
    fit_gpytorch_mll(mll, warm_start=False, inducing_limit=40)
    assert sizes and max(max(s) for s in sizes) <= 40


def test_fit_points_is_checked_and_bounds_the_rounds(monkeypatch):
    import torchbkb.botorch.marginal_likelihood as ml

    X, Y = _data(n=EXACT_FIT + 150, noise=0.1)
    model = BKBModel(X, Y, seed=3)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    before = model.state_dict()
    for bad in (0, -5, 2.5, True, "all"):
        with pytest.raises(InputDataError, match="fit_points"):
            fit_gpytorch_mll(mll, fit_points=bad)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing changed
    seen = []
    bound = ml.dtc_evidence_bound
    monkeypatch.setattr(ml, "dtc_evidence_bound",
                        lambda k, X, *a, **kw: seen.append(X.shape[0]) or bound(k, X, *a, **kw))
    fit_gpytorch_mll(mll, warm_start=False, fit_points=EXACT_FIT)
    assert seen and set(seen) == {EXACT_FIT}  # every evaluation of every round: the subset
    assert model.train_inputs[0].shape[0] == EXACT_FIT + 150  # the model keeps (and its posterior uses) every point
    seen.clear()
    fit_gpytorch_mll(mll, warm_start=False, fit_points=None)
    assert seen and set(seen) == {EXACT_FIT + 150}
    assert FIT_POINTS > EXACT_FIT


def test_bound_rounds_stop_at_round_nats_unless_told_otherwise(monkeypatch):
    import torchbkb.botorch.fitting as fitting

    X, Y = _data(n=EXACT_FIT + 150, noise=0.1)
    model = BKBModel(X, Y, seed=3)
    mll = DTCMarginalLogLikelihood(model.likelihood, model)
    seen, real = [], fitting.fit_gpytorch_mll_scipy
    monkeypatch.setattr(fitting, "fit_gpytorch_mll_scipy",
                        lambda mll, **kw: seen.append(kw.get("options")) or real(mll, **kw))
    fit_gpytorch_mll(mll, warm_start=False)  # every point: ftol per point of n
    assert seen and all(o == {"ftol": ROUND_NATS / (EXACT_FIT + 150)} for o in seen)
    seen.clear()
    fit_gpytorch_mll(mll, warm_start=False, fit_points=EXACT_FIT)  # a subset: per point of the subset
    assert seen and all(o == {"ftol": ROUND_NATS / EXACT_FIT} for o in seen)
    seen.clear()
    # the user's wins
    fit_gpytorch_mll(mll, warm_start=False, optimizer_kwargs={"options": {"ftol": 1e-12, "maxiter": 30}})
    assert seen and all(o == {"ftol": 1e-12, "maxiter": 30} for o in seen)


def test_a_dense_dictionary_fits_the_exact_evidence_of_a_subset_not_a_loose_bound():
    """Past EXACT_FIT points, where the dictionary would hold most of them (a rough, noise-free function in 8-d), a
    bound over FIT_INDUCING points learns a large noise and long lengthscales; the fit uses the exact evidence of a
    random subset instead, and lands where an exact fit on another random subset lands."""
    from botorch.test_functions import Ackley

    from torchbkb.botorch.fitting import EXACT_FIT

    g = torch.Generator().manual_seed(0)
    X = torch.rand(1100, 8, dtype=F64, generator=g)
    Y = Ackley(dim=8, negate=True).to(F64)(-10 + 20 * X).unsqueeze(-1)
    model = BKBModel(X, Y, seed=0)
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    assert model.fit_objective == "exact subset"
    other = torch.randperm(1100, generator=g)[:EXACT_FIT]
    ref = BKBModel(X[other], Y[other], seed=0)
    fit_gpytorch_mll(DTCMarginalLogLikelihood(ref.likelihood, ref))
    assert ref.fit_objective == "exact"
    ratio = float(model.likelihood.noise / ref.likelihood.noise)
    assert 1 / 3 < ratio < 3
    assert torch.allclose(model.covar_module.lengthscale, ref.covar_module.lengthscale, rtol=0.3)
