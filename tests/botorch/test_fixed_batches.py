"""Fixed-q BBKB batches (exact fantasies of the DTC posterior) and distinct Thompson batches: q distinct rows of the
candidate set, GP-BUCB's greedy batch when the dictionary holds every training point, BoTorch's conventions for
duplicates, bounded memory, and typed errors on bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchbkb.botorch import BKBModel, optimize_acqf_bbkb, optimize_acqf_thompson
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

F64 = torch.float64


def _problem(n=40, A=500, seed=0, d=2):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, dtype=F64, generator=g)
    y = torch.sin(6 * X[:, 0]) + X[:, 1:].sum(-1)
    return X, y, torch.rand(A, d, dtype=F64, generator=g)


def _gp_bucb(kernel, X, y, offset, C, lam, alpha, q):
    """GP-BUCB's greedy batch, written literally: exact posterior covariance, hallucinated picks with noise λ."""
    K = kernel(X, X) + lam * torch.eye(X.shape[0], dtype=F64)
    L = torch.linalg.cholesky(K)
    Kc = kernel(C, X)
    mu = Kc @ torch.cholesky_solve((y - offset).unsqueeze(-1), L).squeeze(-1) + offset
    W = torch.linalg.solve_triangular(L, Kc.T, upper=False)
    Sig = kernel(C, C) - W.T @ W
    picks = []
    for _ in range(q):
        ucb = mu + alpha * (Sig.diagonal().clamp_min(0) / lam).sqrt()
        ucb[picks] = -torch.inf
        p = int(ucb.argmax())
        picks.append(p)
        Sig = Sig - Sig[:, p : p + 1] @ Sig[p : p + 1, :] / (Sig[p, p] + lam)
    return picks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fixed_q_picks_are_gp_bucb_greedy_batch_with_a_complete_dictionary(seed):
    X, y, C = _problem(seed=seed)
    k, lam, alpha = GaussianKernel(0.25), 0.01, 1.5
    model = BKBModel(X, y.unsqueeze(-1), kernel=k, noise=lam, inducing_points=X, outcome_transform=None,
                     exact_fraction=None)
    out = optimize_acqf_bbkb(model, C, q=25, beta=alpha, return_indices=True, chunk_size=64)
    assert out.stop_reason == "q" and out.indices.unique().numel() == 25
    assert torch.equal(out.candidates, C[out.indices])
    assert out.indices.tolist() == _gp_bucb(k, X, y, model.mean_constant, C, lam, alpha, 25)


def test_a_pick_lowers_its_own_variance_as_an_exact_fantasy_and_may_repeat_without_unique():
    X, y, C = _problem(n=200, A=300)
    model = BKBModel(X, y.unsqueeze(-1), kernel=GaussianKernel(0.1), noise=1e-3, seed=0, exact_fraction=None)
    assert model.num_inducing < 200  # a sparse dictionary: candidates outside its span
    cand, acq = optimize_acqf_bbkb(model, C[:1], q=3, beta=5.0, unique=False)
    assert torch.equal(cand, C[:1].expand(3, 2))  # one candidate, picked again at its shrunken variance
    rls = model.rls(C[:1])
    assert acq[1] < acq[0] and acq[2] < acq[1]
    lam = model.noise
    var = float(rls) * lam
    expected = (model.posterior(C[:1]).mean.squeeze()
                + 5.0 * (var * lam / (var + lam) / lam) ** 0.5 * model.outcome_transform.stdvs.squeeze())
    assert float(acq[1]) == pytest.approx(float(expected), rel=1e-6)


def test_fixed_q_reads_candidates_in_chunks(monkeypatch):
    from torchbkb.gp.nystrom import NystromEmbedding

    X, y, _ = _problem(n=100)
    C = torch.rand(20_000, 2, dtype=F64, generator=torch.Generator().manual_seed(3))
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    rows = []
    forward = NystromEmbedding.forward
    monkeypatch.setattr(NystromEmbedding, "forward",
                        lambda self, Z, *a, **kw: rows.append(Z.shape[-2]) or forward(self, Z, *a, **kw))
    cand, _ = optimize_acqf_bbkb(model, C, q=200, beta=2.0, chunk_size=1024)
    assert cand.shape == (200, 2) and torch.unique(cand, dim=0).shape[0] == 200
    assert max(rows) <= 1024


def test_fixed_q_memory_is_bounded_by_the_candidates_themselves():
    """No `(A, m)` embedding and no `(A, q)` block: the largest intermediate of a fixed-q batch is the candidates'
    own `(A, d)` (the pool of bounds is `O(A)`, the picks' fantasies `O(q (m + q))`); the picks equal one chunk's."""
    from helpers import LargestOutput

    X, y, _ = _problem(n=60)
    A, q = 50_000, 100
    C = torch.rand(A, 2, dtype=F64, generator=torch.Generator().manual_seed(4))
    model = BKBModel(X, y.unsqueeze(-1), seed=0, inducing_points=X[:12], exact_fraction=None)
    whole = optimize_acqf_bbkb(model, C, q=q, beta=2.0, chunk_size=A, return_indices=True)
    with LargestOutput() as rec:
        out = optimize_acqf_bbkb(model, C, q=q, beta=2.0, chunk_size=500, return_indices=True)
    assert rec.numel <= A * 2 < A * model.num_inducing
    assert torch.equal(out.indices, whole.indices) and out.indices.unique().numel() == q


@settings(max_examples=30, deadline=None)
@given(q=st.one_of(st.integers(-3, 0), st.just(501), st.floats(0.5, 3.5), st.just(True), st.just("3")))
def test_bad_q_raises_and_changes_nothing(q):
    X, y, C = _problem()
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    before = model.posterior(C[:5, None]).mean
    with pytest.raises(InputDataError, match="q"):
        optimize_acqf_bbkb(model, C, q=q, beta=1.0)
    with pytest.raises(InputDataError, match="q"):
        optimize_acqf_thompson(model, C, q=q)
    assert torch.equal(model.posterior(C[:5, None]).mean, before)


def test_nan_candidates_raise():
    X, y, C = _problem()
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    C = C.clone()
    C[3, 1] = float("nan")
    for call in (lambda: optimize_acqf_bbkb(model, C, q=3, beta=1.0), lambda: optimize_acqf_thompson(model, C, q=3)):
        with pytest.raises(InputDataError, match="finite"):
            call()


def test_the_adaptive_batch_says_why_it_ended():
    X, y, C = _problem()
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    assert optimize_acqf_bbkb(model, C, batch_bound=1.0, beta=1.0).stop_reason == "batch_bound"
    capped = optimize_acqf_bbkb(model, C, batch_bound=1e6, max_batch_size=4, beta=1.0)
    assert capped.stop_reason == "max_batch_size" and capped.candidates.shape[0] == 4


def test_thompson_batches_are_distinct_by_default_as_max_posterior_sampling():
    X, y, C = _problem(n=30, A=200)
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    torch.manual_seed(0)
    cand, values, idx = optimize_acqf_thompson(model, C, q=50, return_indices=True, chunk_size=64)
    assert idx.unique().numel() == 50
    torch.manual_seed(0)
    same, again, idx_r = optimize_acqf_thompson(model, C, q=50, replacement=True, return_indices=True, chunk_size=64)
    assert idx_r.unique().numel() < 50  # with replacement draws share maximizers (a smooth posterior, 200 candidates)
    assert idx[0] == idx_r[0] and values[0] == again[0]  # the first draw takes its own maximizer either way
    # the rule: draw i takes its best candidate not taken by draws 1..i-1 (BoTorch's replacement=False)
    torch.manual_seed(0)
    from torchbkb.botorch import draw_bkb_paths

    paths = draw_bkb_paths(model, torch.Size([50]))
    with torch.no_grad():
        full = paths(C)  # (50, 200)
    taken = []
    for row in full:
        order = row.argsort(descending=True).tolist()
        taken.append(next(c for c in order if c not in taken))
    assert idx.tolist() == taken


def test_joint_thompson_draws_follow_the_joint_posterior():
    """With replacement, the share of draws whose maximizer is candidate 0 of two is P(f₀ > f₁) under the joint
    posterior, Φ((μ₀ − μ₁)/√(σ₀² + σ₁² − 2c)), within 4 standard errors."""
    import math

    X, y, _ = _problem(n=15, A=1)
    model = BKBModel(X, y.unsqueeze(-1), seed=0)
    C = torch.tensor([[0.3, 0.3], [0.35, 0.32]], dtype=F64)
    post = model.posterior(C)
    mu, cov = post.mean.squeeze(-1), post.distribution.covariance_matrix
    z = float((mu[0] - mu[1]) / (cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]).sqrt())
    p = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    torch.manual_seed(0)
    _, _, idx = optimize_acqf_thompson(model, C, q=4000, replacement=True, sampler="joint", return_indices=True)
    share = float((idx == 0).double().mean())
    assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / 4000) + 1e-3
    cand, _ = optimize_acqf_thompson(model, C, q=2, sampler="joint")
    assert torch.unique(cand, dim=0).shape[0] == 2
    with pytest.raises(InputDataError, match="sampler"):
        optimize_acqf_thompson(model, C, q=1, sampler="cholesky")


def test_joint_thompson_draws_of_a_float32_exact_model_in_a_small_region_are_the_float64_models():
    """A TuRBO region 0.02 wide, noise 4e-7 against an outputscale of 14: float32 kernel values round far above the
    posterior variances, and the float32 covariance was indefinite past every jitter (a NumericsError mid-run in
    float32 TuRBO loops). It is computed again from the same inputs in float64: the float64 model's picks."""
    from torchbkb.botorch.trust_region import turbo_modules

    g = torch.Generator().manual_seed(0)
    centre = torch.full((5,), 0.5, dtype=torch.float64)
    X = centre + 0.02 * (torch.rand(30, 5, generator=g, dtype=torch.float64) - 0.5)
    Y = -((X - 0.3) ** 2).sum(-1, keepdim=True)
    cand = centre + 0.02 * (torch.rand(1500, 5, generator=g, dtype=torch.float64) - 0.5)
    picks = {}
    for dtype in (torch.float64, torch.float32):
        model = BKBModel(X.to(dtype), Y.to(dtype), seed=0, **turbo_modules(5))
        model.covar_module.outputscale = 14.0
        model.covar_module.base_kernel.lengthscale = torch.tensor([0.5, 0.4, 3.9, 0.47, 1.7])
        model.likelihood.noise = 4e-7
        torch.manual_seed(1)
        _, values, picks[dtype] = optimize_acqf_thompson(model.eval(), cand.to(dtype), 5, sampler="joint",
                                                         return_indices=True)
        assert values.dtype == dtype
    assert torch.equal(picks[torch.float32], picks[torch.float64])
