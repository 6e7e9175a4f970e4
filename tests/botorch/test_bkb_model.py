"""BKBModel: the DTC math against independent float64 formulas, BoTorch shapes, gradients, transforms,
``from_model`` and input validation (conditioning: test_bkb_model_conditioning.py)."""


import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from hypothesis import given, settings, strategies as st

from bkb_model_cases import LAM, dictionary_model, gpytorch_kernel, krbf, model_data
from conftest import tol
from helpers import close, exact_gp, titsias_dtc
from torchbkb.botorch import BKBModel, sample_dictionary
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel


# ---------------------------------------------------------------------- the math
def test_posterior_is_titsias_dtc_with_joint_covariance(dtype, device):
    X, Y, Xq = model_data()
    S = X[::3]
    model = dictionary_model(X, Y, S, device, dtype)
    post = model.posterior(Xq.to(device, dtype))
    m_ref, cov_ref = titsias_dtc(krbf(S, S), krbf(X, S), krbf(Xq, S), krbf(Xq, Xq), Y[:, 0], LAM)
    t = tol(dtype) * 10
    assert post.mean.shape == (7, 1) and post.mean.dtype == dtype and post.mean.device.type == device.type
    assert close(post.mean[:, 0].double().cpu(), m_ref, atol=t)
    assert close(post.distribution.covariance_matrix.double().cpu(), cov_ref, atol=t)
    noisy = model.posterior(Xq.to(device, dtype), observation_noise=True)
    assert close(noisy.distribution.covariance_matrix.double().cpu(), cov_ref + LAM * torch.eye(7, dtype=torch.float64),
                 atol=t)
    # a tensor of observation noise adds exactly that noise
    nz = torch.linspace(0.1, 0.7, 7, dtype=dtype, device=device).unsqueeze(-1)
    noisy2 = model.posterior(Xq.to(device, dtype), observation_noise=nz)
    assert close(noisy2.variance.double().cpu()[:, 0], cov_ref.diagonal() + nz[:, 0].double().cpu(), atol=t)


def test_dictionary_of_all_points_is_the_exact_gp():
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X)
    m_ref, cov_ref = exact_gp(krbf(X, X), krbf(X, Xq), krbf(Xq, Xq), Y[:, 0], LAM)
    post = model.posterior(Xq)
    assert close(post.mean[:, 0], m_ref, atol=1e-9)
    assert close(post.distribution.covariance_matrix, cov_ref, atol=1e-9)


def test_rls_is_gp_variance_over_lambda():
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X[::2])
    var = model.posterior(Xq.unsqueeze(-2)).variance.reshape(-1)
    assert close(model.rls(Xq), var / LAM, atol=1e-9)


@pytest.mark.parametrize("shape", [(5, 2), (4, 5, 2), (3, 4, 1, 2)])
def test_posterior_shapes(shape):
    X, Y, _ = model_data()
    model = dictionary_model(X, Y, X[::3])
    Xq = torch.rand(*shape, dtype=torch.float64)
    post = model.posterior(Xq)
    q = shape[-2]
    assert post.mean.shape == (*shape[:-1], 1)
    assert post.variance.shape == (*shape[:-1], 1)
    assert post.distribution.covariance_matrix.shape == (*shape[:-2], q, q)
    assert post.rsample(torch.Size([3])).shape == (3, *shape[:-1], 1)
    # each batch is its own joint posterior
    flat = Xq.reshape(-1, q, 2)
    ref = model.posterior(flat[-1])
    assert close(post.distribution.covariance_matrix.reshape(-1, q, q)[-1], ref.distribution.covariance_matrix,
                 atol=1e-12)


def test_gradcheck_mean_and_variance():
    X, Y, _ = model_data(n=15)
    model = dictionary_model(X, Y, X[::2])
    Xq = torch.rand(2, 3, 2, dtype=torch.float64, requires_grad=True)

    def f(x):
        p = model.posterior(x)
        return p.mean, p.variance, p.distribution.covariance_matrix

    assert torch.autograd.gradcheck(f, (Xq,), eps=1e-6, atol=1e-6)


def test_q1_fast_path_equals_the_joint_diagonal_and_is_differentiable():
    X, Y, Xq = model_data(n=15)
    model = dictionary_model(X, Y, X[::2])
    joint = model.posterior(Xq)  # q = 7: joint covariance
    single = model.posterior(Xq.unsqueeze(-2))  # 7 batches of q = 1: the variance path
    assert single.distribution.covariance_matrix.shape == (7, 1, 1)
    assert close(single.mean.reshape(-1), joint.mean.reshape(-1), atol=1e-12)
    assert close(single.variance.reshape(-1), joint.variance.reshape(-1), atol=1e-12)
    x = torch.rand(4, 1, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: (model.posterior(z).mean, model.posterior(z).variance), (x,), eps=1e-6,
                                    atol=1e-6)


def test_batched_training_data_are_independent_posteriors():
    X, Y, Xq = model_data()
    X2, Y2, _ = model_data(seed=1)
    S = torch.cat([X[::3], X2[::3]])
    batched = dictionary_model(torch.stack([X, X2]), torch.stack([Y, Y2]), S)
    assert batched.batch_shape == torch.Size([2])
    post = batched.posterior(Xq)
    assert post.mean.shape == (2, 7, 1)
    for i, (Xi, Yi) in enumerate([(X, Y), (X2, Y2)]):
        single = dictionary_model(Xi, Yi, S).posterior(Xq)
        assert close(post.mean[i], single.mean, atol=1e-10)
        assert close(post.distribution.covariance_matrix[i], single.distribution.covariance_matrix, atol=1e-10)


# ---------------------------------------------------------------------- transforms and from_model
def test_transforms_are_honored(dtype):
    X, Y, Xq = model_data()
    lo, hi = torch.tensor([-3.0, 10.0], dtype=torch.float64), torch.tensor([5.0, 12.0], dtype=torch.float64)
    X_raw, Xq_raw = lo + (hi - lo) * X, lo + (hi - lo) * Xq
    Y_raw = 40.0 + 7.0 * Y
    c = lambda t: t.to(dtype)
    model = BKBModel(
        c(X_raw), c(Y_raw), kernel=gpytorch_kernel(dtype=dtype), noise=LAM, inducing_points=c(X_raw[::3]),
        input_transform=Normalize(2, bounds=c(torch.stack([lo, hi]))), outcome_transform=Standardize(m=1),
    )
    Ys = (Y - Y.mean()) / Y.std()
    m_ref, cov_ref = titsias_dtc(krbf(X[::3], X[::3]), krbf(X, X[::3]), krbf(Xq, X[::3]), krbf(Xq, Xq), Ys[:, 0], LAM)
    s, a = 7.0 * Y.std(), 40.0 + 7.0 * Y.mean()
    post = model.posterior(c(Xq_raw))
    t = tol(dtype) * 100
    assert close(post.mean[:, 0].double(), a + s * m_ref, atol=t * 50)
    assert close(post.distribution.covariance_matrix.double(), s**2 * cov_ref, atol=t * 50)
    assert close(model.train_inputs[0].double(), X, atol=t)  # stored transformed, as SingleTaskGP in eval mode


def _fitted_like_gp(X, Y, input_transform=None):
    gp = SingleTaskGP(X, Y, input_transform=input_transform, outcome_transform=Standardize(m=1))
    gp.covar_module.lengthscale = torch.tensor([[0.4, 0.7]])
    gp.likelihood.noise = torch.tensor([0.03])
    gp.mean_module.constant = torch.tensor(0.25)
    return gp


@pytest.mark.parametrize("with_input_transform", [False, True])
def test_from_model_equals_single_task_gp_with_all_points(with_input_transform):
    X, Y, Xq = model_data()
    X_raw, Xq_raw = 2.0 + 3.0 * X, 2.0 + 3.0 * Xq
    it = Normalize(2) if with_input_transform else None  # learned bounds
    gp = _fitted_like_gp(X_raw if it else X, 5.0 * Y - 1.0, input_transform=it)
    Xt = Xq_raw if it else Xq
    bkb = BKBModel.from_model(gp, inducing_points=X_raw if it else X)
    for q_shape in [(7, 2), (3, 4, 2)]:
        Xtest = (Xt[: q_shape[-2]].expand(*q_shape) if len(q_shape) == 2
                 else Xt[:4].expand(3, 4, 2) + 0.1 * torch.rand(3, 4, 2, dtype=torch.float64))
        p_gp, p_bkb = gp.posterior(Xtest), bkb.posterior(Xtest)
        assert close(p_bkb.mean, p_gp.mean, atol=1e-8)
        assert close(p_bkb.distribution.covariance_matrix, p_gp.distribution.covariance_matrix, atol=1e-8)
        n_gp, n_bkb = gp.posterior(Xtest, observation_noise=True), bkb.posterior(Xtest, observation_noise=True)
        assert close(n_bkb.variance, n_gp.variance, atol=1e-8)
    # copies, not references: changing the gp afterwards does not change the BKB model
    before = bkb.posterior(Xt).mean.clone()
    gp.covar_module.lengthscale = torch.tensor([[0.1, 0.1]])
    assert close(bkb.posterior(Xt).mean, before, atol=0.0)


def test_from_model_samples_a_dictionary_and_keeps_conditioning_consistent():
    X, Y, Xq = model_data(n=60)
    gp = _fitted_like_gp(X, Y)
    a, b = BKBModel.from_model(gp, seed=3), BKBModel.from_model(gp, seed=3)
    assert torch.equal(a.inducing_points, b.inducing_points)  # reproducible
    assert 1 <= a.num_inducing <= 60
    post = a.posterior(Xq.unsqueeze(-2))
    assert bool(torch.isfinite(post.mean).all()) and bool((post.variance > 0).all())


def test_from_model_rejects_what_it_cannot_copy():
    X, Y, _ = model_data()
    with pytest.raises(InputDataError, match="single-output"):
        BKBModel.from_model(SingleTaskGP(X, torch.cat([Y, Y], -1)))
    with pytest.raises(InputDataError, match="GaussianLikelihood"):
        BKBModel.from_model(SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 0.1)))
    with pytest.raises(InputDataError, match="ExactGP"):
        BKBModel.from_model(dictionary_model(X, Y, X))


# ---------------------------------------------------------------------- dictionary sampling
def test_sample_dictionary_is_reproducible_and_adaptive():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(400, 1, generator=g, dtype=torch.float64)
    k = GaussianKernel(0.3)
    S1 = sample_dictionary(k, X, 0.01, generator=torch.Generator().manual_seed(5))
    S2 = sample_dictionary(k, X, 0.01, generator=torch.Generator().manual_seed(5))
    assert torch.equal(S1, S2)
    assert (S1.unsqueeze(1) == X.unsqueeze(0)).all(-1).any(-1).all()  # rows of X
    assert 2 <= S1.shape[0] < 60  # smooth 1-d: d_eff is small
    # a huge q̄ keeps every point whose variance is not negligible; rough kernel + tiny λ: all distinct points
    Xr = torch.rand(50, 3, generator=g, dtype=torch.float64)
    S3 = sample_dictionary(GaussianKernel(0.01), Xr, 1e-6, q_bar=10.0, generator=torch.Generator().manual_seed(1))
    assert S3.shape[0] == 50


def test_sampled_dictionary_gives_an_accurate_posterior():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(300, 2, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X.sum(-1, keepdim=True))
    Xq = torch.rand(50, 2, generator=g, dtype=torch.float64)
    model = BKBModel(X, Y, kernel=gpytorch_kernel(), noise=LAM, q_bar=4.0, seed=0, outcome_transform=None)
    assert model.num_inducing < 150
    m_ref, cov_ref = exact_gp(krbf(X, X), krbf(X, Xq), krbf(Xq, Xq), Y[:, 0], LAM)
    post = model.posterior(Xq.unsqueeze(-2))
    assert close(post.mean.reshape(-1), m_ref, atol=0.05)
    v = post.variance.reshape(-1)
    # 000 Theorem 1: the DTC variance is within constant factors of the exact one
    assert bool((v >= cov_ref.diagonal() / 3).all()) and bool((v <= 3 * cov_ref.diagonal() + 1e-6).all())


def test_seed_controls_the_dictionary():
    X, Y, _ = model_data(n=80)
    a = BKBModel(X, Y, seed=1).inducing_points
    b = BKBModel(X, Y, seed=1).inducing_points
    assert torch.equal(a, b)


# ---------------------------------------------------------------------- dtype / device plumbing
def test_to_keeps_float64_factorizations():
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X[::3], dtype=torch.float32)
    assert model.dtc_posterior.V_inv.dtype == torch.float64
    ref = model.posterior(Xq.float()).mean
    model.to(torch.float32)  # what BoTorch acquisitions do with ``self.to(X)``
    assert model.dtc_posterior.V_inv.dtype == torch.float64
    assert model.dtc_posterior.embedding.projection.dtype == torch.float64
    assert torch.equal(model.posterior(Xq.float()).mean, ref)
    m64 = model.to(torch.float64)
    assert m64.posterior(Xq).mean.dtype == torch.float64


# ---------------------------------------------------------------------- bad inputs
def test_bad_training_data_give_clear_errors():
    X, Y, _ = model_data()
    with pytest.raises(InputDataError, match="one output column"):
        BKBModel(X, torch.cat([Y, Y], -1))
    with pytest.raises(InputDataError, match="explicit output dimension"):
        BKBModel(X, Y[:, 0])
    Xn = X.clone()
    Xn[3, 1] = float("nan")
    with pytest.raises(InputDataError, match="train_X: expected finite"):
        BKBModel(Xn, Y)
    Yn = Y.clone()
    Yn[0, 0] = float("inf")
    with pytest.raises(InputDataError, match="train_Y: expected finite"):
        BKBModel(X, Yn)
    with pytest.raises(InputDataError, match="dtype"):
        BKBModel(X, Y.float())
    with pytest.raises(InputDataError, match="noise"):
        BKBModel(X, Y, noise=-1.0)
    with pytest.raises(InputDataError, match="inducing_points"):
        BKBModel(X, Y, inducing_points=X[:, :1])


def _bad_query_cases():
    return [
        ((5,), torch.float64, False, "shape"),
        ((5, 3), torch.float64, False, "shape"),
        ((2, 5, 1), torch.float64, False, "shape"),
        ((5, 2), torch.float32, False, "dtype"),
        ((5, 2), torch.float64, True, "finite"),
    ]


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(_bad_query_cases()), st.integers(0, 2))
def test_bad_queries_give_clear_errors_and_leave_the_model_usable(case, extra_batch):
    shape, dtype, nan, msg = case
    X, Y, Xq = model_data()
    model = dictionary_model(X, Y, X[::3])
    before = model.posterior(Xq).mean.clone()
    bad = torch.rand(*([2] * extra_batch), *shape, dtype=dtype)
    if nan:
        bad.view(-1)[0] = float("nan")
    with pytest.raises(InputDataError, match=msg):
        model.posterior(bad)
    with pytest.raises(InputDataError):
        model.condition_on_observations(bad, torch.zeros(*bad.shape[:-1], 1, dtype=torch.float64))
    assert torch.equal(model.posterior(Xq).mean, before)
