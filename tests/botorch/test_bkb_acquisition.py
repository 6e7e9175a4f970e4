"""BKB/BBKB upper confidence bounds: scale conversion, β̃ₜ of 000 Theorem 2, X_pending hallucination,
and BBKB batches (optimize_acqf_bbkb) against independent float64 formulas."""

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf_discrete
from gpytorch.kernels import RBFKernel, ScaleKernel

from conftest import tol
from helpers import LargestOutput, close, rbf, titsias_dtc
from torchbkb.botorch import (
    BBKBUpperConfidenceBound, BKBModel, BKBUpperConfidenceBound, optimize_acqf_bbkb, theory_beta
)
from torchbkb.bandits.confidence import to_botorch_beta
from torchbkb.errors import InputDataError

LS, OS, LAM = 0.25, 1.3, 0.02


def _kernel(dtype=torch.float64, device=None):
    k = ScaleKernel(RBFKernel()).to(device=device, dtype=dtype)
    k.base_kernel.lengthscale = torch.tensor(LS, dtype=dtype)
    k.outputscale = torch.tensor(OS, dtype=dtype)
    return k


def _k(A, B):
    return OS * rbf(A, B, LS)


def _setup(n=25, seed=0, dtype=torch.float64, device="cpu", standardize=True):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    Y = (3.0 * torch.sin(6 * X[:, 0]) * X[:, 1] + 2.0).unsqueeze(-1)
    S = X[::2]
    C = torch.rand(60, 2, generator=g, dtype=torch.float64)
    model = BKBModel(
        X.to(device, dtype), Y.to(device, dtype), kernel=_kernel(dtype, device), noise=LAM,
        inducing_points=S.to(device, dtype),
        outcome_transform=Standardize(m=1) if standardize else None, exact_fraction=None,  # the DTC formulas
    )
    a, s = (Y.mean(), Y.std()) if standardize else (torch.tensor(0.0, dtype=torch.float64),
                                                    torch.tensor(1.0, dtype=torch.float64))
    return model, X, (Y[:, 0] - a) / s, S, C, a, s


def _ref_ucb(X, y, S, C, beta_rls, a, s):
    """a + s·(μ̃ + β̃·σ̃) from Titsias' DTC formulas (transformed space, σ̃ = σ_GP/√λ)."""
    m, cov = titsias_dtc(_k(S, S), _k(X, S), _k(C, S), _k(C, C), y, LAM)
    return a + s * (m + beta_rls * (cov.diagonal() / LAM).clamp_min(0).sqrt())


# ---------------------------------------------------------------------- BKBUpperConfidenceBound
def test_ucb_is_mu_plus_beta_sigma_rls(dtype, device):
    model, X, y, S, C, a, s = _setup(dtype=dtype, device=device)
    acq = BKBUpperConfidenceBound(model, beta=1.7)
    vals = acq(C.to(device, dtype).unsqueeze(-2))
    assert vals.shape == (60,)
    assert close(vals.double().cpu(), _ref_ucb(X, y, S, C, 1.7, a, s), atol=tol(dtype) * 100)
    assert float(acq.beta) == pytest.approx(1.7**2 / LAM)
    # the same as BoTorch's own UCB with b = β̃²/λ
    plain = UpperConfidenceBound(model, beta=to_botorch_beta(1.7, LAM))
    assert close(plain(C.to(device, dtype).unsqueeze(-2)).double().cpu(), vals.double().cpu(), atol=tol(dtype))
    low = BKBUpperConfidenceBound(model, beta=1.7, maximize=False)(C.to(device, dtype).unsqueeze(-2))
    ref_low = -_ref_ucb(X, y, S, C, -1.7, a, s)
    assert close(low.double().cpu(), ref_low, atol=tol(dtype) * 100)


def test_theory_beta_is_000_theorem_2():
    model, X, y, S, C, a, s = _setup()
    _, cov_train = titsias_dtc(_k(S, S), _k(X, S), _k(X, S), _k(X, X), y, LAM)
    rls_sum = float(cov_train.diagonal().sum()) / LAM
    t, xi, F, delta, eps = X.shape[0], math.sqrt(LAM), 2.0, 0.05, 0.5
    alpha = (1 + eps) / (1 - eps)
    ref = (2 * xi * math.sqrt(alpha * math.log(OS * t) * rls_sum + math.log(1 / delta))
           + (1 + 1 / math.sqrt(1 - eps)) * math.sqrt(LAM) * F)
    assert float(theory_beta(model, F=F, delta=delta)) == pytest.approx(ref, rel=1e-8)
    acq = BKBUpperConfidenceBound(model, beta="theory", F=F, delta=delta)
    assert float(acq.beta_rls) == pytest.approx(ref, rel=1e-8)
    assert close(acq(C.unsqueeze(-2)), _ref_ucb(X, y, S, C, ref, a, s), atol=1e-7)


def test_theory_beta_per_model_batch():
    model, X, y, S, C, a, s = _setup()
    fant = model.condition_on_observations(C[:2], torch.zeros(3, 2, 1, dtype=torch.float64))
    b = theory_beta(fant)
    assert b.shape == (3,)
    acq = BKBUpperConfidenceBound(fant)
    assert acq.beta.shape == (3, 1)
    assert acq(C[:3].unsqueeze(-2)).shape == (3,)  # BoTorch's batch-mode UCB: one point per model batch


def test_ucb_bad_inputs():
    model, X, *_ = _setup()
    for bad in ("optimistic", -1.0, float("nan")):
        with pytest.raises(InputDataError, match="beta"):
            BKBUpperConfidenceBound(model, beta=bad)
    gp = SingleTaskGP(X, X[:, :1])
    with pytest.raises(InputDataError, match="BKBModel"):
        BKBUpperConfidenceBound(gp, beta="theory")
    acq = BKBUpperConfidenceBound(gp, beta=2.0)  # numeric β̃ only needs λ
    assert float(acq.beta) == pytest.approx(4.0 / gp.likelihood.noise.item())
    with pytest.raises(InputDataError, match="BKBModel"):
        BBKBUpperConfidenceBound(gp, beta=1.0)
    with pytest.raises(InputDataError, match="batch_bound"):
        BBKBUpperConfidenceBound(model, beta="theory", batch_bound=0.5)


# ---------------------------------------------------------------------- X_pending
def test_pending_points_hallucinate_the_variance_only():
    model, X, y, S, C, a, s = _setup()
    P = C[:3]
    acq = BBKBUpperConfidenceBound(model, beta=1.3, X_pending=P)
    # mean: no pending (frozen μ̃_fb); variance: DTC of the design X ∪ P (variance does not depend on y)
    m_ref, _ = titsias_dtc(_k(S, S), _k(X, S), _k(C, S), _k(C, C), y, LAM)
    XP = torch.cat([X, P])
    _, cov_ref = titsias_dtc(_k(S, S), _k(XP, S), _k(C, S), _k(C, C), torch.zeros(len(XP), dtype=torch.float64), LAM)
    ref = a + s * (m_ref + 1.3 * (cov_ref.diagonal() / LAM).sqrt())
    assert close(acq(C.unsqueeze(-2)), ref, atol=1e-8)
    acq.set_X_pending(None)
    assert close(acq(C.unsqueeze(-2)), _ref_ucb(X, y, S, C, 1.3, a, s), atol=1e-8)
    acq.set_X_pending(C[:0])
    assert close(acq(C.unsqueeze(-2)), _ref_ucb(X, y, S, C, 1.3, a, s), atol=1e-8)


def test_theory_alpha_is_batch_bound_times_beta():
    model, X, y, S, C, a, s = _setup()
    beta = float(theory_beta(model))
    acq = BBKBUpperConfidenceBound(model, beta="theory", batch_bound=3.0)
    assert float(acq.beta_rls) == pytest.approx(3.0 * beta)


def test_optimize_acqf_discrete_q_gt_1_is_sequential_hallucinated_greedy():
    model, X, y, S, C, a, s = _setup()
    cand, vals = optimize_acqf_discrete(BBKBUpperConfidenceBound(model, beta=2.0), q=4, choices=C)
    # manual greedy with the independent formula
    m_ref, _ = titsias_dtc(_k(S, S), _k(X, S), _k(C, S), _k(C, C), y, LAM)
    design, left, picks = X.clone(), list(range(len(C))), []
    for _ in range(4):
        _, cov = titsias_dtc(_k(S, S), _k(design, S), _k(C, S), _k(C, C), torch.zeros(len(design), dtype=torch.float64),
                             LAM)
        ucb = m_ref + 2.0 * (cov.diagonal() / LAM).sqrt()
        j = max(left, key=lambda i: float(ucb[i]))
        picks.append(j)
        left.remove(j)
        design = torch.cat([design, C[j : j + 1]])
    assert torch.equal(cand, C[picks])


# ---------------------------------------------------------------------- optimize_acqf_bbkb
def test_bbkb_batch_is_hallucinated_greedy_with_the_sum_stop_rule():
    model, X, y, S, C, a, s = _setup()
    C = torch.cat([C, torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9))])
    first = optimize_acqf_bbkb(model, C, batch_bound=1e9, beta=1.5, max_batch_size=4, return_indices=True)[2]
    level = 1.0 + torch.cumsum(model.rls(C[first]), 0)  # 1 + Σ σ̃²_fb(x_s) along the picks
    bound = float(level[2] + level[3]) / 2
    cand, vals, idx = optimize_acqf_bbkb(model, C, batch_bound=bound, beta=1.5, return_indices=True)
    B = len(idx)
    # the stop rule: the batch ends with the first pick that takes the level past C̃
    assert B == 4 and torch.equal(idx, first) and torch.equal(cand, C[idx])
    assert bool((level[:-1] <= bound).all()) and float(level[-1]) > bound
    # the same picks as BoTorch's sequential greedy with hallucinated pending points (repeats allowed)
    ref, ref_vals = optimize_acqf_discrete(BBKBUpperConfidenceBound(model, beta=1.5), q=B, choices=C, unique=False)
    assert torch.equal(cand, ref)
    assert close(vals, ref_vals, atol=1e-8)


def test_bbkb_first_pick_is_the_ucb_argmax_and_options_agree():
    model, X, y, S, C, a, s = _setup()
    cand, vals = optimize_acqf_bbkb(model, C, beta=0.8, max_batch_size=1)
    ucb = _ref_ucb(X, y, S, C, 0.8, a, s)
    assert cand.shape == (1, 2) and torch.equal(cand[0], C[int(ucb.argmax())])
    assert close(vals, ucb.max().reshape(1), atol=1e-8)
    base = optimize_acqf_bbkb(model, C, batch_bound=4.0, beta=0.8, return_indices=True)[2]
    for kw in (dict(chunk_size=7), dict(lazy=False)):
        assert torch.equal(optimize_acqf_bbkb(model, C, batch_bound=4.0, beta=0.8, return_indices=True, **kw)[2], base)
    capped = optimize_acqf_bbkb(model, C, batch_bound=1e9, beta=0.8, max_batch_size=5)[0]
    assert capped.shape == (5, 2)
    # theory: α̃ = C̃·β̃
    beta = float(theory_beta(model))
    th = optimize_acqf_bbkb(model, C, batch_bound=2.0, max_batch_size=1)[1]
    assert close(th, _ref_ucb(X, y, S, C, 2.0 * beta, a, s).max().reshape(1), atol=1e-7)


def test_bbkb_streams_the_candidates_in_chunks():
    # no (A, m) tensor is ever formed: the largest intermediate is the candidates themselves (A·d)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    model = BKBModel(X, X[:, :1] - X[:, 1:], kernel=_kernel(torch.float64), noise=LAM, inducing_points=X[:12],
                     outcome_transform=None, exact_fraction=None)
    A, m = 50_000, model.num_inducing
    choices = torch.rand(A, 2, generator=g, dtype=torch.float64)
    whole = optimize_acqf_bbkb(model, choices, batch_bound=3.0, beta=1.0, chunk_size=A, return_indices=True)
    with LargestOutput() as rec:
        cand, vals, idx = optimize_acqf_bbkb(model, choices, batch_bound=3.0, beta=1.0, chunk_size=500,
                                             return_indices=True)
    assert rec.numel <= A * 2 < A * m
    assert torch.equal(idx, whole[2]) and torch.allclose(vals, whole[1])
    assert bool(torch.isfinite(vals).all()) and cand.shape == (idx.numel(), 2)


def test_bbkb_bad_inputs():
    model, X, y, S, C, a, s = _setup()
    with pytest.raises(InputDataError, match="choices"):
        optimize_acqf_bbkb(model, C[:, :1])
    with pytest.raises(InputDataError, match="choices"):
        optimize_acqf_bbkb(model, C[:0])
    with pytest.raises(InputDataError, match="dtype"):
        optimize_acqf_bbkb(model, C.float())
    with pytest.raises(InputDataError, match="batch_bound"):
        optimize_acqf_bbkb(model, C, batch_bound=0.9)
    with pytest.raises(InputDataError, match="batch_shape"):
        optimize_acqf_bbkb(model.condition_on_observations(C[:1], torch.zeros(2, 1, 1, dtype=torch.float64)), C)
    with pytest.raises(InputDataError, match="BKBModel"):
        optimize_acqf_bbkb(SingleTaskGP(X, X[:, :1]), C)


def test_vakili_width_is_theorem_3_5_with_the_measured_lambda_max():
    from torchbkb.botorch import BKBModel, BKBUpperConfidenceBound
    from torchbkb.bandits.confidence import vakili_beta, vakili_beta_finite
    from torchbkb.sampling.recursive_rls import nystrom_lambda_max

    X = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    model = BKBModel(X, torch.sin(4 * X[:, :1]), seed=0)
    post = model.dtc_posterior
    lmax = nystrom_lambda_max(post.train_X, post.embedding.kernel, post.embedding.inducing_points)
    lam = model.noise
    acq = BKBUpperConfidenceBound(model, beta="vakili", F=2.0, delta=0.05, num_points=500)
    expected = vakili_beta_finite(0.05, 500, 2.0, lam**0.5, lam, lmax, scale="rls")
    assert float(acq.beta_rls) == pytest.approx(expected, rel=1e-10)
    assert float(acq.beta) == pytest.approx(expected**2 / lam, rel=1e-10)  # BoTorch's b = (β·τ)²/λ = β²
    point = BKBUpperConfidenceBound(model, beta="vakili", F=2.0, delta=0.05)
    assert float(point.beta_rls) == pytest.approx(vakili_beta(0.05, 2.0, lam**0.5, lam, lmax, scale="rls"), rel=1e-10)
    with pytest.raises(InputDataError, match="'theory', 'vakili'"):
        BKBUpperConfidenceBound(model, beta="wrong")
