"""A BKBModel over its whole life, as a BoTorch/Ax user lives it: condition then refit, fit left in training mode,
share between threads, pickle/deep-copy/torch.save after use, load state dicts (good, bad, corrupt), query with odd
arguments, condition point by point. Each promise is checked against a fresh model or a sequential run."""

import copy
import io
import pickle
import threading

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.sampling import SobolQMCNormalSampler
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbkb.botorch import (
    BBKBUpperConfidenceBound,
    BKBModel,
    BKBUpperConfidenceBound,
    DTCMarginalLogLikelihood,
    optimize_acqf_bbkb,
    theory_beta,
)
from torchbkb.errors import InputDataError

F64 = torch.float64


def _data(n, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=F64, generator=g)
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:].sum(-1, keepdim=True) + 0.05 * torch.randn(n, 1, dtype=F64, generator=g)
    return X, Y


def _fit(model):
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    return model


@pytest.mark.parametrize("n", [30, 300])  # exact outright, and a sparse dictionary
def test_a_fitted_conditioned_model_is_a_fresh_model_on_its_data_and_the_original_is_untouched(n):
    X, Y = _data(n)
    Xn, Yn = _data(6, seed=1)
    Xq = torch.rand(9, 1, 2, dtype=F64)
    model = _fit(BKBModel(X, Y, seed=0))
    before = model.posterior(Xq)
    state = copy.deepcopy(model.state_dict())
    child = model.condition_on_observations(Xn, Yn)
    _fit(child)
    after = model.posterior(Xq)
    assert torch.equal(after.mean, before.mean) and torch.equal(after.variance, before.variance)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    fresh = BKBModel(torch.cat([X, Xn]), torch.cat([Y, Yn]), seed=0)
    fresh.load_state_dict(child.state_dict())  # BoTorch's keep_transforms: the data re-standardized alike
    pc, pf = child.posterior(Xq), fresh.posterior(Xq)
    assert torch.allclose(pc.mean, pf.mean, atol=1e-10) and torch.allclose(pc.variance, pf.variance, atol=1e-10)
    assert child.num_inducing == fresh.num_inducing


def test_the_same_holds_for_single_task_gp_which_is_the_reference():
    X, Y = _data(30)
    Xn, Yn = _data(6, seed=1)
    Xq = torch.rand(9, 1, 2, dtype=F64)
    from gpytorch.mlls import ExactMarginalLogLikelihood

    gp = SingleTaskGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    gp.posterior(Xq)  # SingleTaskGP conditions only after a prediction
    child = gp.condition_on_observations(Xn, Yn)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(child.likelihood, child))
    bkb = BKBModel(torch.cat([X, Xn]), torch.cat([Y, Yn]), seed=0)
    bkb.load_state_dict(child.state_dict())  # SingleTaskGP's modules: the same hyperparameters
    assert torch.allclose(bkb.posterior(Xq).mean, child.posterior(Xq).mean, atol=1e-8)


def test_every_hyperparameter_change_reaches_every_reading_in_training_mode():
    X, Y = _data(60)
    model = BKBModel(X, Y, seed=0)
    model.posterior(X[:2, None])  # built at the default noise
    model.train()
    model.likelihood.noise = 0.05  # e.g. a fit that ended in training mode
    ref = BKBModel(X, Y, seed=0)
    ref.load_state_dict(model.state_dict())
    assert model.noise == pytest.approx(0.05)
    assert float(BKBUpperConfidenceBound(model, beta=2.0).beta) == pytest.approx(4.0 / 0.05)
    assert float(theory_beta(model)) == pytest.approx(float(theory_beta(ref)), rel=1e-12)
    model.covar_module.lengthscale = torch.full((1, 2), 0.3, dtype=F64)  # a kernel change, still in training mode
    ref.covar_module.lengthscale = torch.full((1, 2), 0.3, dtype=F64)
    Xq = torch.rand(5, 1, 2, dtype=F64)
    assert torch.allclose(model.posterior(Xq).variance, ref.posterior(Xq).variance, atol=1e-12)


@pytest.mark.parametrize("n", [60, 400])
def test_threads_sharing_one_model_get_the_sequential_answers(n):
    X, Y = _data(n)
    choices = torch.rand(3000, 2, dtype=F64, generator=torch.Generator().manual_seed(5))
    Xq = torch.rand(50, 1, 2, dtype=F64)

    def work(model):
        idx = optimize_acqf_bbkb(model, choices, batch_bound=3.0, beta=1.0, return_indices=True)[2]
        return idx, model.posterior(Xq).mean, UpperConfidenceBound(model, beta=2.0)(Xq)

    ref = work(BKBModel(X, Y, seed=0))
    for _ in range(8):
        model = BKBModel(X, Y, seed=0)  # lazy: the first calls race to build it
        out, errors = [None] * 6, []

        def run(i, model=model, out=out, errors=errors):
            try:
                out[i] = work(model)
            except Exception as err:  # noqa: BLE001 - collected and reported below
                errors.append(err)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for got in [*out, work(model)]:
            assert all(torch.equal(a, b) for a, b in zip(got, ref))


def _round_trips(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return {
        "pickle": pickle.loads(pickle.dumps(obj)),
        "deepcopy": copy.deepcopy(obj),
        "torch.save": torch.load(buf, weights_only=False),
    }


@pytest.mark.parametrize("n", [40, 400])
def test_pickle_deepcopy_and_torch_save_after_use(n):
    X, Y = _data(n)
    model = _fit(BKBModel(X, Y, seed=0))
    Xq = torch.rand(6, 3, 2, dtype=F64)
    post = model.posterior(Xq)
    optimize_acqf_bbkb(model, X, beta=1.0)  # the DTC form and the dictionary made
    fantasy = model.fantasize(X[:2], SobolQMCNormalSampler(torch.Size([3])))  # an engine with autograd history
    for name, copy_ in _round_trips(model).items():
        got = copy_.posterior(Xq)
        assert torch.equal(got.mean, post.mean) and torch.equal(got.variance, post.variance), name
        assert torch.equal(copy_.inducing_points, model.inducing_points), name
    for name, copy_ in _round_trips(fantasy).items():
        assert copy_.batch_shape == fantasy.batch_shape, name
        assert torch.allclose(copy_.posterior(Xq[0]).mean, fantasy.posterior(Xq[0]).mean, atol=1e-8), name


def _corrupt(state, kind, key):
    bad = dict(state)
    if kind == "missing":
        del bad[key]
    elif kind == "unexpected":
        bad["something.else"] = torch.zeros(1, dtype=F64)
    elif kind == "shape":
        bad[key] = torch.zeros(*state[key].shape, 2, dtype=F64)
    elif kind == "nan":
        bad[key] = torch.full_like(state[key], float("nan")) if state[key].is_floating_point() else state[key]
    elif kind == "not a tensor":
        bad[key] = 1.5
    return bad


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["missing", "unexpected", "shape", "nan", "not a tensor", "fine"]), pick=st.integers(0, 50))
def test_a_corrupt_state_dict_loads_or_raises_and_changes_nothing(kind, pick):
    X, Y = _data(40)
    model = BKBModel(X, Y, seed=0)
    donor = BKBModel(X, Y, seed=0)
    donor.likelihood.noise = 0.03
    state = donor.state_dict()
    key = sorted(state)[pick % len(state)]
    bad = _corrupt(state, kind, key)
    Xq = torch.rand(4, 1, 2, dtype=F64)
    before, params = model.posterior(Xq), copy.deepcopy(model.state_dict())
    try:
        model.load_state_dict(bad)
    except InputDataError:
        after = model.posterior(Xq)
        assert torch.equal(after.mean, before.mean) and torch.equal(after.variance, before.variance)
        assert all(torch.equal(v, params[k]) for k, v in model.state_dict().items())
    else:
        assert kind in ("fine", "nan") and (kind == "fine" or not state[key].is_floating_point())


def test_state_dicts_of_another_dimension_or_kernel_raise_and_change_nothing():
    from gpytorch.kernels import MaternKernel, ScaleKernel

    X, Y = _data(40)
    model = BKBModel(X, Y, seed=0)
    Xq = torch.rand(4, 1, 2, dtype=F64)
    before = model.posterior(Xq).mean
    for other in (BKBModel(*_data(40, d=3), seed=0), BKBModel(X, Y, kernel=ScaleKernel(MaternKernel(ard_num_dims=2)))):
        state = other.state_dict()
        with pytest.raises(InputDataError, match="state_dict"):
            model.load_state_dict(state)
        assert torch.equal(model.posterior(Xq).mean, before)


def test_dtc_approximate_gp_loads_state_dicts_atomically():
    from torchbkb.gpytorch import DTCApproximateGP

    X, Y = _data(50)
    model = DTCApproximateGP(X[:8], X, Y.squeeze(-1), noise=0.01).eval()
    x = torch.rand(5, 2, dtype=F64)
    before = model(x).mean
    bad = dict(model.state_dict())
    bad["likelihood.noise_covar.raw_noise"] = torch.zeros(3, dtype=F64)
    bad["mean_module.raw_constant"] = torch.tensor(9.0, dtype=F64)
    with pytest.raises(InputDataError, match="state_dict"):
        model.load_state_dict(bad)
    assert torch.equal(model(x).mean, before)
    model.train()
    with pytest.raises(InputDataError, match="finite"):
        model(torch.full((3, 2), float("nan"), dtype=F64))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3", 1, 2, 10**9, None])
def test_every_max_batch_size_returns_in_bounded_time(value):
    X, Y = _data(30)
    model = BKBModel(X, Y, seed=0)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        cand, acq = optimize_acqf_bbkb(model, X, batch_bound=2.0, max_batch_size=value, beta=1.0)
        assert 1 <= cand.shape[0] <= (value or 10**9)
    else:
        with pytest.raises(InputDataError, match="max_batch_size"):
            optimize_acqf_bbkb(model, X, max_batch_size=value)


def test_queries_with_bad_arguments_raise_typed_errors():
    X, Y = _data(20)
    model = BKBModel(X, Y, seed=0)
    Xq = torch.rand(4, 2, dtype=F64)
    for noise in (-1, 0.5, torch.full((4, 1), -1.0, dtype=F64), torch.full((4, 1), float("nan"), dtype=F64),
                  torch.ones(5, 1, dtype=F64)):
        with pytest.raises(InputDataError, match="observation_noise"):
            model.posterior(Xq, observation_noise=noise)
    assert torch.allclose(model.posterior(Xq, observation_noise=torch.zeros(4, 1, dtype=F64)).variance,
                          model.posterior(Xq).variance)
    with pytest.raises(InputDataError, match="d >= 1"):
        BKBModel(torch.rand(5, 0, dtype=F64), torch.rand(5, 1, dtype=F64))
    acq = BBKBUpperConfidenceBound(model, beta=1.0)
    with pytest.raises(InputDataError, match="X_pending"):
        acq.set_X_pending(torch.rand(2, dtype=F64))
    with pytest.raises(InputDataError, match="X_pending"):
        acq.set_X_pending(torch.full((2, 2), float("nan"), dtype=F64))
    assert acq.X_pending is None


def test_point_by_point_conditioning_keeps_one_solve_per_query(monkeypatch):
    X, Y = _data(40)
    model = BKBModel(X, Y, seed=0)
    assert model.is_exact
    for i in range(30):
        model = model.condition_on_observations(*_data(1, seed=100 + i))
    calls = []
    real = torch.linalg.solve_triangular
    monkeypatch.setattr(torch.linalg, "solve_triangular", lambda *a, **k: calls.append(1) or real(*a, **k))
    model.posterior(torch.rand(3, 1, 2, dtype=F64))
    assert len(calls) <= 2  # one block: not one solve per conditioning
    monkeypatch.undo()
    new = [_data(1, seed=100 + i) for i in range(30)]
    at_once = BKBModel(X, Y, seed=0).condition_on_observations(torch.cat([x for x, _ in new]),
                                                               torch.cat([y for _, y in new]))
    Xq = torch.rand(6, 1, 2, dtype=F64)
    assert torch.allclose(model.train_inputs[0], at_once.train_inputs[0])
    assert torch.allclose(model.posterior(Xq).mean, at_once.posterior(Xq).mean, atol=1e-9)
    assert torch.allclose(model.posterior(Xq).variance, at_once.posterior(Xq).variance, atol=1e-9)


@pytest.mark.parametrize("n", [30, 300])  # exact outright, and a sparse dictionary
def test_set_train_data_is_a_fresh_model_on_the_new_data_with_the_same_hyperparameters(n):
    X, Y = _data(n)
    model = _fit(BKBModel(X, Y, seed=0, outcome_transform=None))
    X2, Y2 = _data(n + 7, seed=1)
    fresh = BKBModel(X2, Y2, seed=0, outcome_transform=None)
    fresh.load_state_dict(model.state_dict())
    model.set_train_data(X2, Y2.squeeze(-1), strict=False)  # no transforms: the training spaces are the originals
    assert torch.equal(model.train_inputs[0], X2) and torch.equal(model.train_targets, Y2.squeeze(-1))
    Xq = torch.rand(5, 1, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(model.posterior(Xq).mean, fresh.posterior(Xq).mean, atol=1e-12)
    assert torch.allclose(model.posterior(Xq).variance, fresh.posterior(Xq).variance, atol=1e-12)
    model.set_train_data(targets=-Y2.squeeze(-1))  # strict: the same shapes; the inputs kept
    fresh = BKBModel(X2, -Y2, seed=0, outcome_transform=None)
    fresh.load_state_dict(model.state_dict())
    assert torch.allclose(model.posterior(Xq).mean, fresh.posterior(Xq).mean, atol=1e-12)


def test_set_train_data_with_bad_data_raises_and_changes_nothing():
    X, Y = _data(30)
    model = BKBModel(X, Y, seed=0)
    Xq = torch.rand(4, 1, 2, dtype=F64)
    before = model.posterior(Xq).mean
    nan = X.clone()
    nan[3, 0] = float("nan")
    bad = [((X[:20], Y[:20, 0]), {}, "inputs: expected shape"),  # strict: another shape
           ((X.float(), Y[:, 0].float()), {"strict": False}, "dtype torch.float64"),
           ((torch.rand(30, 3, dtype=F64), Y[:, 0]), {"strict": False}, r"n >= 1, 2\)"),
           ((X, Y), {"strict": False}, r"targets: expected shape \(30,\)"),
           ((nan, Y[:, 0]), {}, "inputs: expected finite values"),
           (([1.0], Y[:, 0]), {}, "expected a torch.Tensor")]
    for args, kwargs, match in bad:
        with pytest.raises(InputDataError, match=match):
            model.set_train_data(*args, **kwargs)
        assert torch.equal(model.train_inputs[0], X) and torch.equal(model.posterior(Xq).mean, before)
    known = BKBModel(X, Y, train_Yvar=torch.full_like(Y, 0.01), seed=0)
    with pytest.raises(InputDataError, match="expected 30 points"):
        known.set_train_data(X[:10], Y[:10, 0], strict=False)
    known.set_train_data(X.flip(0), Y[:, 0].flip(0))  # the same number of points: the known noise stays


def test_model_list_condition_on_observations_through_get_fantasy_model_is_single_task_gps():
    """``ModelListGP.condition_on_observations`` calls GPyTorch's ``get_fantasy_model`` on each model: with every
    training point in the dictionary, BKBModels condition as ``SingleTaskGP``s do (outcome transforms included)."""
    X, Y = _data(20)
    gps = [SingleTaskGP(X, Y * s) for s in (1.0, -2.0)]
    for gp in gps:
        gp.eval()
        gp.posterior(X[:1])  # ExactGP's fantasy needs its prediction caches
    bkbs = [BKBModel.from_model(gp, inducing_points=X) for gp in gps]
    Xn, Yn = torch.rand(3, 2, dtype=F64), torch.randn(3, 2, dtype=F64)
    Xq = torch.rand(4, 2, dtype=F64)
    means = [ModelListGP(*models).condition_on_observations([Xn, Xn], Yn).posterior(Xq).mean for models in (gps, bkbs)]
    assert torch.allclose(means[0], means[1], atol=1e-9)
    with pytest.raises(InputDataError, match=r"targets: expected a tensor of shape \(\*batch, 3\)"):
        bkbs[0].get_fantasy_model(Xn, torch.zeros(2, dtype=F64))
    with pytest.raises(InputDataError, match="expected no keyword besides noise, got"):
        bkbs[0].get_fantasy_model(Xn, torch.zeros(3, dtype=F64), likelihood_kwargs={})
