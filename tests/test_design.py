"""Uncertainty-reduction design (003 Sec. 4.1): selection rule, rank-one path, regressor, L∞ error."""

import math

import pytest
import torch

from helpers import exact_gp, rbf, titsias_dtc
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.bandits.confidence import vakili_beta_finite
from torchbkb.bandits.design import UncertaintyExplorer, linf_error, theory_rls_delta, uncertainty_design
from torchbkb.errors import InputDataError, TorchBKBError
from torchbkb.gp.kernels import GaussianKernel


def _grid(n=41, d=1):
    g = torch.linspace(0, 1, n, dtype=torch.float64)
    if d == 1:
        return g[:, None]
    return torch.cartesian_prod(g, g)


def test_small_designs_follow_the_exact_max_variance_rule():
    """While the picks fit in the recursive-RLS base case, Z = all picks and σ̄ is the exact GP variance:
    the sequence is argmax of the exact posterior variance (independent formula), ties to the lowest index."""
    cand = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    ls, lam = 0.25, 0.01
    ex = UncertaintyExplorer(cand, GaussianKernel(ls), lam, base_size=32, generator=torch.Generator().manual_seed(0))
    picks = ex.run(12).tolist()
    ref = []
    for _ in range(12):
        if ref:
            Xp = cand[ref]
            _, cov = exact_gp(rbf(Xp, Xp, ls), rbf(Xp, cand, ls), rbf(cand, cand, ls),
                              torch.zeros(len(ref), dtype=torch.float64), lam)
            var = torch.diagonal(cov)
        else:
            var = torch.ones(150, dtype=torch.float64)
        ref.append(int(torch.argmax(var)))
    assert picks == ref
    assert ex.dictionary_size == 12 and ex.refreshes == 12


def test_variance_is_the_dtc_variance_of_the_current_dictionary():
    cand = _grid(60)
    ls, lam = 0.3, 0.01
    ex = UncertaintyExplorer(cand, GaussianKernel(ls), lam, base_size=4, oversample=0.3,
                             generator=torch.Generator().manual_seed(1))
    ex.run(30)
    Xp, Z = cand[ex.picks], ex.inducing_points
    assert ex.dictionary_size < 20  # the dictionary is really sparse here
    Zu = torch.unique(Z, dim=0)
    _, cov = titsias_dtc(rbf(Zu, Zu, ls), rbf(Xp, Zu, ls), rbf(cand, Zu, ls), rbf(cand, cand, ls),
                         torch.zeros(30, dtype=torch.float64), lam)
    assert torch.allclose(ex.variance(), torch.diagonal(cov), atol=1e-10)


def test_rank_one_path_between_refreshes_equals_a_refit():
    cand = torch.rand(120, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ls, lam = 0.3, 0.01
    ex = UncertaintyExplorer(cand, GaussianKernel(ls), lam, refresh=5, base_size=4,
                             generator=torch.Generator().manual_seed(3))
    ex.run(13)  # refreshes after picks 1, 6, 11; picks 12, 13 are hallucinated rank-one updates
    assert ex.refreshes == 3
    Xp = cand[ex.picks]
    post = DTCPosterior(NystromEmbedding(GaussianKernel(ls), ex.inducing_points), noise=lam).fit(Xp,
            torch.zeros(13, dtype=torch.float64))
    assert torch.allclose(ex.variance(), post(cand)[1], atol=1e-10)
    ex.finalize()
    assert ex.refreshes == 4 and ex.finalize().refreshes == 4  # finalize redraws once, over all 13 picks


def test_regressor_is_the_sparse_posterior_mean():
    cand = _grid(80)
    f = torch.sin(5 * cand[:, 0])
    ls, lam = 0.2, 1e-3
    res = uncertainty_design(cand, GaussianKernel(ls), lam, 15, f, base_size=6, seed=0)
    Xn = cand[res.indices]
    Z = torch.unique(cand[res.inducing_indices], dim=0)
    mu, _ = titsias_dtc(rbf(Z, Z, ls), rbf(Xn, Z, ls), rbf(cand, Z, ls), rbf(cand, cand, ls), res.y, lam)
    assert torch.allclose(res.regressor(cand)[0], mu, atol=1e-8)
    assert torch.equal(res.y, f[res.indices])
    assert math.isnan(res.lambda_max)


def test_linf_error_decreases_with_n_and_is_covered_by_the_theorem_4_1_width():
    """On a 2-d grid, for an RKHS function of known norm with noise, ‖f - μ̄_n‖_∞ shrinks with n and the
    uniform interval β(δ/(2|X|)) σ̄_n (Theorem 3.5 + union bound, as in Theorem 4.1's proof) holds."""
    ls, lam, R, C = 0.3, 0.01, 0.1, 1.0
    cand = _grid(21, d=2)  # 441 points
    centers = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    alpha = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    alpha = alpha / torch.sqrt(alpha @ rbf(centers, centers, ls) @ alpha) * C
    f = rbf(cand, centers, ls) @ alpha
    noise = torch.Generator().manual_seed(7)

    def objective(idx):
        return f[idx] + R * torch.randn(idx.shape, dtype=torch.float64, generator=noise)

    errors = []
    for n in (5, 20, 60):
        res = uncertainty_design(cand, GaussianKernel(ls), lam, n, objective, seed=n, compute_lambda_max=True)
        err = linf_error(res.regressor, f, cand)
        beta = vakili_beta_finite(0.05, cand.shape[0], C, R, lam, res.lambda_max)
        mean, var = res.regressor(cand)
        assert bool(((f - mean).abs() <= beta * var.sqrt()).all())
        errors.append(err)
    assert errors[2] < errors[0] / 2
    # ~20 % of max|f| at n = 60; which of the tied grid points the argmax takes moves with rounding (0.19-0.21)
    assert errors[2] < 0.25 * float(f.abs().max())


def test_linf_error_formula_and_callables():
    X = _grid(11)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.3), X[::2]), noise=0.01).fit(X, torch.cos(3 * X[:, 0]))
    ref = float((torch.cos(3 * X[:, 0]) - post.mean(X)).abs().max())
    assert linf_error(post, lambda Z: torch.cos(3 * Z[:, 0]), X) == pytest.approx(ref)
    assert linf_error(post, torch.cos(3 * X[:, 0]), X, chunk_size=3) == pytest.approx(ref)
    with pytest.raises(InputDataError, match="f: expected values"):
        linf_error(post, torch.zeros(4, dtype=torch.float64), X)


def test_theory_rls_delta_schedule_sums_below_half_delta():
    sched = theory_rls_delta(0.01, batches=3)
    assert sum(sched(j) for j in range(1, 10**5)) * 3 <= 0.005
    assert theory_rls_delta(0.9)(1) < 1 / 32  # clamped into Lemma 3.8's range


@pytest.mark.parametrize(
    "call,exc,msg",
    [
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.0), InputDataError, "noise"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1, refresh=0), InputDataError, "refresh"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1, oversample="x"), InputDataError, "oversample"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1, rls_delta=0.5), InputDataError, "rls_delta"),
        (lambda c: UncertaintyExplorer(c[0], GaussianKernel(0.3), 0.1), InputDataError, "candidates"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1).run(-1), InputDataError, "n:"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1).finalize(), TorchBKBError, "at least one pick"),
        (lambda c: UncertaintyExplorer(c, GaussianKernel(0.3), 0.1).regressor(torch.zeros(0)), TorchBKBError,
         "at least one pick"),
        (lambda c: uncertainty_design(c, GaussianKernel(0.3), 0.1, 0, torch.zeros(10, dtype=torch.float64)),
         InputDataError, "num_points"),
        (lambda c: uncertainty_design(c, GaussianKernel(0.3), 0.1, 3, torch.zeros(9, dtype=torch.float64)),
         InputDataError, "objective"),
        (lambda c: uncertainty_design(c, GaussianKernel(0.3), 0.1, 3, "f"), InputDataError, "objective"),
        (lambda c: uncertainty_design(c, GaussianKernel(0.3), 0.1, 3, lambda i: torch.zeros(2, dtype=torch.float64)),
         InputDataError, "3 rewards"),
    ],
)
def test_bad_inputs(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(torch.rand(10, 2, dtype=torch.float64))
