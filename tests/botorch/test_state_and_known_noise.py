"""BKBModel's state_dict follows BoTorch's convention (hyperparameters, not data) and known noise
(``train_Yvar``) is the heteroskedastic GP."""

import copy
import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.utils.datasets import SupervisedDataset

from torchbkb.botorch import BKBModel, default_kernel
from torchbkb.errors import InputDataError


def _data(n, seed=0, d=2):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    return X, torch.sin(4 * X.sum(-1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)


def test_state_dict_holds_no_data_and_loads_into_a_model_on_other_data():
    X1, Y1 = _data(80, seed=1)
    X2, Y2 = _data(35, seed=2)
    a = BKBModel(X1, Y1, seed=0, input_transform=Normalize(2))  # SingleTaskGP's modules, as after a fit
    a.covar_module.lengthscale = torch.tensor([[0.3, 0.5]], dtype=torch.float64)
    a.likelihood.noise = 0.02
    k = a.covar_module
    state = a.state_dict()
    assert all(v.numel() <= 4 for v in state.values()), {key: tuple(v.shape) for key, v in state.items()}
    assert not any(80 in v.shape or a.num_inducing in v.shape for v in state.values() if v.dim() > 0)
    b = BKBModel(X2, Y2, seed=5, input_transform=Normalize(2))  # default hyperparameters, another draw
    before = b.inducing_points.clone()
    b.load_state_dict(state, keep_transforms=False)
    # b now has a's hyperparameters (and transforms' statistics) on its own data, transformed as before
    ref = BKBModel(X2, Y2, kernel=copy.deepcopy(k), noise=0.02, seed=5, input_transform=Normalize(2))
    ref.input_transform.load_state_dict(a.input_transform.state_dict())  # the same transforms' statistics as b
    ref.outcome_transform.load_state_dict(a.outcome_transform.state_dict())
    ref.mean_module.load_state_dict(a.mean_module.state_dict())
    Xq = torch.rand(5, 2, dtype=torch.float64)
    assert b.noise == pytest.approx(0.02)
    assert torch.allclose(b.covar_module.lengthscale, k.lengthscale)
    assert torch.allclose(b.posterior(Xq).mean, ref.posterior(Xq).mean, atol=1e-12)
    assert b.train_inputs[0].shape == (35, 2)
    assert torch.equal(b.inducing_points, ref.inducing_points)  # re-drawn with the loaded hyperparameters
    assert before.shape[0] <= 35


def test_state_dict_round_trip_is_exact():
    X, Y = _data(50)
    a = BKBModel(X, Y, noise=0.05, seed=3)
    b = BKBModel(X, Y, noise=0.5, seed=3)  # the same modules, other values
    b.load_state_dict(a.state_dict())
    Xq = torch.rand(4, 3, 2, dtype=torch.float64)
    pa, pb = a.posterior(Xq), b.posterior(Xq)
    assert torch.equal(a.inducing_points, b.inducing_points)
    assert torch.allclose(pa.mean, pb.mean, atol=1e-13)
    assert torch.allclose(pa.distribution.covariance_matrix, pb.distribution.covariance_matrix, atol=1e-13)


@pytest.mark.parametrize("exact_fraction", [0.9, None])
def test_known_noise_with_a_complete_dictionary_is_the_heteroskedastic_exact_gp(exact_fraction):
    X, Y = _data(25)
    Yvar = torch.linspace(0.01, 0.2, 25, dtype=torch.float64).unsqueeze(-1)
    model = BKBModel(X, Y, train_Yvar=Yvar, inducing_points=X, exact_fraction=exact_fraction)
    assert model.is_exact == (exact_fraction is not None)
    gp = SingleTaskGP(X, Y, train_Yvar=Yvar).eval()  # the same default modules
    Xq = torch.rand(6, 2, dtype=torch.float64)
    pm, pg = model.posterior(Xq), gp.posterior(Xq)
    assert torch.allclose(pm.mean, pg.mean, atol=1e-9)
    assert torch.allclose(pm.distribution.covariance_matrix, pg.distribution.covariance_matrix.to_dense(), atol=1e-9)
    # observation noise for new points: the mean of the known noise (BoTorch's rule for fixed noise)
    noisy = model.posterior(Xq, observation_noise=True).variance - pm.variance
    std2 = Y.var()
    assert torch.allclose(noisy, (Yvar / std2).mean() * std2 * torch.ones_like(noisy), atol=1e-9)


def test_construct_inputs_passes_the_known_noise():
    X, Y = _data(20)
    Yvar = torch.full_like(Y, 0.05)
    inputs = BKBModel.construct_inputs(SupervisedDataset(X, Y, Yvar=Yvar, feature_names=["a", "b"],
                                                         outcome_names=["y"]))
    model = BKBModel(**inputs)
    assert torch.equal(inputs["train_Yvar"], Yvar) and model.noise == pytest.approx(0.05 / float(Y.var()))


@pytest.mark.parametrize(
    "Yvar, match",
    [
        (torch.full((20,), 0.1, dtype=torch.float64), "train_Yvar: expected shape"),
        (torch.full((19, 1), 0.1, dtype=torch.float64), "train_Yvar: expected shape"),
        (torch.full((20, 1), -0.1, dtype=torch.float64), "non-negative"),
        (torch.full((20, 1), float("nan"), dtype=torch.float64), "train_Yvar"),
        (torch.full((20, 1), 0.1, dtype=torch.float32), "dtype"),
    ],
)
def test_bad_known_noise_is_refused(Yvar, match):
    X, Y = _data(20)
    with pytest.raises(InputDataError, match=match):
        BKBModel(X, Y, train_Yvar=Yvar)


def test_bad_conditioning_noise_leaves_the_model_as_it_was():
    X, Y = _data(20)
    model = BKBModel(X, Y, seed=0, exact_fraction=None)
    Xq = torch.rand(4, 2, dtype=torch.float64)
    before = model.posterior(Xq).mean.clone(), model.train_inputs[0].clone()
    for noise in (torch.full((3, 1), -1.0, dtype=torch.float64), torch.full((3, 1), float("nan"), dtype=torch.float64),
                  torch.full((2, 1), 0.1, dtype=torch.float64)):
        with pytest.raises(InputDataError, match="noise"):
            model.condition_on_observations(X[:3], Y[:3], noise=noise)
    assert torch.equal(model.posterior(Xq).mean, before[0]) and torch.equal(model.train_inputs[0], before[1])
    with pytest.raises(InputDataError, match="noise: expected None"):
        BKBModel(X, Y, train_Yvar=torch.full_like(Y, 0.1), noise=0.1)
    with pytest.raises(InputDataError, match="covar_module"):
        BKBModel(X, Y, kernel=default_kernel(2), covar_module=default_kernel(2))


def test_exact_models_dictionary_is_drawn_once_whatever_the_moves():
    # BoTorch's analytic acquisitions call model.to(X) on every forward: the pending draw must not pile up
    X, Y = _data(100)
    model = BKBModel(X, Y, seed=0)
    assert model.is_exact
    for _ in range(3000):
        model.to(X)
    assert 1 <= model.num_inducing <= 100 and model.inducing_points.dtype == torch.float64
    assert BKBModel(X, Y, seed=0).to(torch.float32).inducing_points.dtype == torch.float32
