"""BKBModel: the DTC math against independent float64 formulas, BoTorch shapes, gradients, transforms,
conditioning, ``from_model`` and input validation."""


import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import RBFKernel, ScaleKernel
from hypothesis import given, settings, strategies as st

from conftest import tol
from helpers import close, exact_gp, rbf, titsias_dtc
from torchbkb.botorch import BKBModel, sample_dictionary
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

LS, OS, LAM = 0.3, 1.7, 0.05


def _kernel(device=None, dtype=torch.float64):
    k = ScaleKernel(RBFKernel()).to(device=device, dtype=dtype)  # set values in the final dtype (exact)
    k.base_kernel.lengthscale = torch.tensor(LS, dtype=dtype)  # a Python float would pass through float32
    k.outputscale = torch.tensor(OS, dtype=dtype)
    return k


def _k(A, B):
    return OS * rbf(A, B, LS)


def _data(n=30, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = (torch.sin(5 * X.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).unsqueeze(-1)
    Xq = torch.rand(7, d, generator=g, dtype=torch.float64)
    return X, Y, Xq


def _model(X, Y, S, device="cpu", dtype=torch.float64, **kw):
    kw.setdefault("outcome_transform", None)
    return BKBModel(X.to(device, dtype), Y.to(device, dtype), kernel=_kernel(device, dtype), noise=LAM,
                    inducing_points=S.to(device, dtype), **kw)


# ---------------------------------------------------------------------- the math
def test_posterior_is_titsias_dtc_with_joint_covariance(dtype, device):
    X, Y, Xq = _data()
    S = X[::3]
    model = _model(X, Y, S, device, dtype)
    post = model.posterior(Xq.to(device, dtype))
    m_ref, cov_ref = titsias_dtc(_k(S, S), _k(X, S), _k(Xq, S), _k(Xq, Xq), Y[:, 0], LAM)
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
    X, Y, Xq = _data()
    model = _model(X, Y, X)
    m_ref, cov_ref = exact_gp(_k(X, X), _k(X, Xq), _k(Xq, Xq), Y[:, 0], LAM)
    post = model.posterior(Xq)
    assert close(post.mean[:, 0], m_ref, atol=1e-9)
    assert close(post.distribution.covariance_matrix, cov_ref, atol=1e-9)


def test_rls_is_gp_variance_over_lambda():
    X, Y, Xq = _data()
    model = _model(X, Y, X[::2])
    var = model.posterior(Xq.unsqueeze(-2)).variance.reshape(-1)
    assert close(model.rls(Xq), var / LAM, atol=1e-9)


@pytest.mark.parametrize("shape", [(5, 2), (4, 5, 2), (3, 4, 1, 2)])
def test_posterior_shapes(shape):
    X, Y, _ = _data()
    model = _model(X, Y, X[::3])
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
    X, Y, _ = _data(n=15)
    model = _model(X, Y, X[::2])
    Xq = torch.rand(2, 3, 2, dtype=torch.float64, requires_grad=True)

    def f(x):
        p = model.posterior(x)
        return p.mean, p.variance, p.distribution.covariance_matrix

    assert torch.autograd.gradcheck(f, (Xq,), eps=1e-6, atol=1e-6)


def test_q1_fast_path_equals_the_joint_diagonal_and_is_differentiable():
    X, Y, Xq = _data(n=15)
    model = _model(X, Y, X[::2])
    joint = model.posterior(Xq)  # q = 7: joint covariance
    single = model.posterior(Xq.unsqueeze(-2))  # 7 batches of q = 1: the variance path
    assert single.distribution.covariance_matrix.shape == (7, 1, 1)
    assert close(single.mean.reshape(-1), joint.mean.reshape(-1), atol=1e-12)
    assert close(single.variance.reshape(-1), joint.variance.reshape(-1), atol=1e-12)
    x = torch.rand(4, 1, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: (model.posterior(z).mean, model.posterior(z).variance), (x,), eps=1e-6,
                                    atol=1e-6)


def test_batched_training_data_are_independent_posteriors():
    X, Y, Xq = _data()
    X2, Y2, _ = _data(seed=1)
    S = torch.cat([X[::3], X2[::3]])
    batched = _model(torch.stack([X, X2]), torch.stack([Y, Y2]), S)
    assert batched.batch_shape == torch.Size([2])
    post = batched.posterior(Xq)
    assert post.mean.shape == (2, 7, 1)
    for i, (Xi, Yi) in enumerate([(X, Y), (X2, Y2)]):
        single = _model(Xi, Yi, S).posterior(Xq)
        assert close(post.mean[i], single.mean, atol=1e-10)
        assert close(post.distribution.covariance_matrix[i], single.distribution.covariance_matrix, atol=1e-10)


# ---------------------------------------------------------------------- transforms and from_model
def test_transforms_are_honored(dtype):
    X, Y, Xq = _data()
    lo, hi = torch.tensor([-3.0, 10.0], dtype=torch.float64), torch.tensor([5.0, 12.0], dtype=torch.float64)
    X_raw, Xq_raw = lo + (hi - lo) * X, lo + (hi - lo) * Xq
    Y_raw = 40.0 + 7.0 * Y
    c = lambda t: t.to(dtype)
    model = BKBModel(
        c(X_raw), c(Y_raw), kernel=_kernel(dtype=dtype), noise=LAM, inducing_points=c(X_raw[::3]),
        input_transform=Normalize(2, bounds=c(torch.stack([lo, hi]))), outcome_transform=Standardize(m=1),
    )
    Ys = (Y - Y.mean()) / Y.std()
    m_ref, cov_ref = titsias_dtc(_k(X[::3], X[::3]), _k(X, X[::3]), _k(Xq, X[::3]), _k(Xq, Xq), Ys[:, 0], LAM)
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
    X, Y, Xq = _data()
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
    X, Y, Xq = _data(n=60)
    gp = _fitted_like_gp(X, Y)
    a, b = BKBModel.from_model(gp, seed=3), BKBModel.from_model(gp, seed=3)
    assert torch.equal(a.inducing_points, b.inducing_points)  # reproducible
    assert 1 <= a.num_inducing <= 60
    post = a.posterior(Xq.unsqueeze(-2))
    assert bool(torch.isfinite(post.mean).all()) and bool((post.variance > 0).all())


def test_from_model_rejects_what_it_cannot_copy():
    X, Y, _ = _data()
    with pytest.raises(InputDataError, match="single-output"):
        BKBModel.from_model(SingleTaskGP(X, torch.cat([Y, Y], -1)))
    with pytest.raises(InputDataError, match="GaussianLikelihood"):
        BKBModel.from_model(SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 0.1)))
    with pytest.raises(InputDataError, match="ExactGP"):
        BKBModel.from_model(_model(X, Y, X))


# ---------------------------------------------------------------------- conditioning
def test_condition_on_observations_equals_refit(dtype):
    X, Y, Xq = _data(n=40)
    S = X[::4]
    it = lambda: Normalize(2, bounds=torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=dtype))
    c = lambda t: t.to(dtype)
    for k in (1, 3, 9):  # Sherman-Morrison steps and a refactorization
        base = _model(X[:30], Y[:30], S, dtype=dtype, input_transform=it())
        cond = base.condition_on_observations(c(X[30 : 30 + k]), c(Y[30 : 30 + k]))
        refit = _model(X[: 30 + k], Y[: 30 + k], S, dtype=dtype, input_transform=it())
        p1, p2 = cond.posterior(c(Xq)), refit.posterior(c(Xq))
        t = tol(dtype) * 10
        assert close(p1.mean.double(), p2.mean.double(), atol=t)
        assert close(p1.distribution.covariance_matrix.double(), p2.distribution.covariance_matrix.double(), atol=t)
        assert cond.train_inputs[0].shape == (30 + k, 2)
    # the original is unchanged
    assert base.train_inputs[0].shape == (30, 2)
    assert close(base.posterior(c(Xq)).mean.double(),
                 _model(X[:30], Y[:30], S, dtype=dtype).posterior(c(Xq)).mean.double(), atol=tol(dtype) * 10)


def test_condition_with_outcome_transform_uses_the_stored_statistics():
    X, Y, Xq = _data(n=40)
    base = _model(X[:30], Y[:30], X[::4], outcome_transform=Standardize(m=1))
    cond = base.condition_on_observations(X[30:], Y[30:])
    mu, sd = Y[:30].mean(), Y[:30].std()
    ref = _model(X, (Y - mu) / sd, X[::4])
    assert close(cond.posterior(Xq).mean, mu + sd * ref.posterior(Xq).mean, atol=1e-9)


def test_condition_with_noise_is_heteroskedastic_exact_gp():
    X, Y, Xq = _data(n=20)
    base = _model(X[:12], Y[:12], X)  # dictionary holds every point: exact GP
    noise = torch.linspace(0.01, 0.3, 8, dtype=torch.float64).unsqueeze(-1)
    cond = base.condition_on_observations(X[12:], Y[12:], noise=noise)
    D = torch.cat([torch.full((12,), LAM, dtype=torch.float64), noise[:, 0]])
    K = _k(X, X)
    M = K + torch.diag(D)
    Kq = _k(X, Xq)
    m_ref = Kq.T @ torch.linalg.solve(M, Y[:, 0])
    cov_ref = _k(Xq, Xq) - Kq.T @ torch.linalg.solve(M, Kq)
    post = cond.posterior(Xq)
    assert close(post.mean[:, 0], m_ref, atol=1e-8)
    assert close(post.distribution.covariance_matrix, cov_ref, atol=1e-8)


def test_fantasize_batches_each_sample_like_a_refit():
    X, Y, Xq = _data(n=30)
    S = X[::3]
    base = _model(X[:25], Y[:25], S)
    sampler = SobolQMCNormalSampler(torch.Size([4]), seed=0)
    fant = base.fantasize(X[25:], sampler)
    assert fant.batch_shape == torch.Size([4])
    post = fant.posterior(Xq)
    assert post.mean.shape == (4, 7, 1)
    Yf = fant.train_targets[..., 25:]  # (4, 5) fantasized outcomes
    for i in range(4):
        ref = _model(X, torch.cat([Y[:25, 0], Yf[i]]).unsqueeze(-1), S).posterior(Xq)
        assert close(post.mean[i], ref.mean, atol=1e-9)
        assert close(post.distribution.covariance_matrix[i], ref.distribution.covariance_matrix, atol=1e-9)
    # fantasies over a batch of candidate sets: (b, q, d) -> batch (s, b)
    fant2 = base.fantasize(torch.rand(3, 2, 2, dtype=torch.float64), sampler)
    assert fant2.batch_shape == torch.Size([4, 3])
    assert fant2.posterior(torch.rand(3, 5, 2, dtype=torch.float64)).mean.shape == (4, 3, 5, 1)


def test_hallucinate_keeps_mean_and_matches_conditioning_on_the_mean():
    X, Y, Xq = _data(n=30)
    model = _model(X, Y, X[::3])
    P = torch.rand(3, 2, dtype=torch.float64)
    hal = model.hallucinate(P)
    mean_P = model.posterior(P).mean
    ref = model.condition_on_observations(P, mean_P.detach())
    assert close(hal.posterior(Xq).mean, model.posterior(Xq).mean, atol=1e-10)
    assert close(hal.posterior(Xq).variance, ref.posterior(Xq).variance, atol=1e-10)
    assert bool((hal.posterior(Xq.unsqueeze(-2)).variance <= model.posterior(Xq.unsqueeze(-2)).variance + 1e-12).all())


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
    model = BKBModel(X, Y, kernel=_kernel(), noise=LAM, q_bar=4.0, seed=0, outcome_transform=None)
    assert model.num_inducing < 150
    m_ref, cov_ref = exact_gp(_k(X, X), _k(X, Xq), _k(Xq, Xq), Y[:, 0], LAM)
    post = model.posterior(Xq.unsqueeze(-2))
    assert close(post.mean.reshape(-1), m_ref, atol=0.05)
    v = post.variance.reshape(-1)
    # 000 Theorem 1: the DTC variance is within constant factors of the exact one
    assert bool((v >= cov_ref.diagonal() / 3).all()) and bool((v <= 3 * cov_ref.diagonal() + 1e-6).all())


def test_seed_controls_the_dictionary():
    X, Y, _ = _data(n=80)
    a = BKBModel(X, Y, seed=1).inducing_points
    b = BKBModel(X, Y, seed=1).inducing_points
    assert torch.equal(a, b)


# ---------------------------------------------------------------------- dtype / device plumbing
def test_to_keeps_float64_factorizations():
    X, Y, Xq = _data()
    model = _model(X, Y, X[::3], dtype=torch.float32)
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
    X, Y, _ = _data()
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
    X, Y, Xq = _data()
    model = _model(X, Y, X[::3])
    before = model.posterior(Xq).mean.clone()
    bad = torch.rand(*([2] * extra_batch), *shape, dtype=dtype)
    if nan:
        bad.view(-1)[0] = float("nan")
    with pytest.raises(InputDataError, match=msg):
        model.posterior(bad)
    with pytest.raises(InputDataError):
        model.condition_on_observations(bad, torch.zeros(*bad.shape[:-1], 1, dtype=torch.float64))
    assert torch.equal(model.posterior(Xq).mean, before)


def test_bad_conditioning_and_batches():
    X, Y, Xq = _data()
    model = _model(X, Y, X[::3])
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
    X, Y, Xq = _data()
    model = _model(X, Y, X[::3])
    assert model.likelihood.noise.item() == pytest.approx(LAM, rel=1e-12)
    fant = model.condition_on_observations(Xq[:2], torch.zeros(3, 2, 1, dtype=torch.float64))
    hal = fant.hallucinate(Xq[2:4])
    assert hal.batch_shape == torch.Size([3])
    p0, p1 = fant.posterior(Xq), hal.posterior(Xq)
    assert close(p1.mean, p0.mean, atol=1e-10)
    assert bool((p1.variance <= p0.variance + 1e-12).all()) and bool((p1.variance < p0.variance).any())
    with pytest.raises(InputDataError, match="X_pending"):
        model.hallucinate(Xq.unsqueeze(0))
