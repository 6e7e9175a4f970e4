"""Sparse confidence widths of Vakili et al. (003 Theorem 3.5, Corollary 3.7): formulas and coverage."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import rbf, titsias_dtc
from torchbkb import nystrom_lambda_max, recursive_rls
from torchbkb.bandits.confidence import (
    to_botorch_beta,
    vakili_beta,
    vakili_beta_continuous,
    vakili_beta_finite,
    vakili_continuous_halfwidth,
)
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel


# ----------------------------------------------------------------------------- formulas
def test_theorem_3_5_formula():
    delta, C, R, tau2, lm = 0.03, 2.5, 0.2, 0.04, 0.01
    tau = 0.2
    ref = (2 + math.sqrt(lm) / tau) * C + R / tau * math.sqrt(2 * math.log(1 / delta))
    assert vakili_beta(delta, C, R, tau2, lm) == pytest.approx(ref, rel=1e-14)
    # Lemma 3.8 regime λ_max = τ²: the RKHS term is 3 C_k
    assert vakili_beta(delta, C, 0.0, tau2, tau2) == pytest.approx(3 * C)
    # keyword form, as the BoTorch wiring will call it; 0-d tensors are numbers too
    assert vakili_beta(delta=delta, rkhs_norm=C, subgaussian=R, noise=tau2, lambda_max=lm) == pytest.approx(ref)
    assert vakili_beta(delta, torch.tensor(C), R, torch.tensor(tau2), lm) == pytest.approx(ref)


def test_scales_and_botorch_conversion():
    b = vakili_beta(0.1, 1.0, 0.1, 0.01, 0.0)
    b_rls = vakili_beta(0.1, 1.0, 0.1, 0.01, 0.0, scale="rls")
    assert b_rls == pytest.approx(b * 0.1)  # μ̄ + β σ̄ = μ̄ + (βτ) σ̃
    assert to_botorch_beta(b_rls, 0.01) == pytest.approx(b**2)  # BoTorch: μ + √b σ_GP


def test_finite_union_bound():
    args = (1.5, 0.1, 0.01, 0.002)
    assert vakili_beta_finite(0.1, 40, *args) == pytest.approx(vakili_beta(0.1 / 80, *args))
    assert vakili_beta_finite(0.1, 40, *args, two_sided=False) == pytest.approx(vakili_beta(0.1 / 40, *args))
    # Eq. 13 of S-BPE: β(δ/(4B|X|)) = vakili_beta_finite(δ/(2B), |X|)
    B, X = 4, 500
    assert vakili_beta_finite(0.05 / (2 * B), X, *args) == pytest.approx(vakili_beta(0.05 / (4 * B * X), *args))


def test_corollary_3_7_formula():
    delta, n, C, R, tau2, lm, d, c, kmax = 0.05, 64, 2.0, 0.1, 0.01, 0.003, 2, 3.0, 1.5
    tau = 0.1
    C_mu = C * (1 + math.sqrt(n) * kmax / tau) + math.sqrt(n) * R / tau * math.sqrt(2 * math.log(2 * n / (delta / 2)))
    gamma = c * C_mu**d * n**d
    ref = (2 + math.sqrt(lm) / tau) * C + R / tau * math.sqrt(2 * math.log(2 * gamma / delta))
    got = vakili_beta_continuous(delta, n, C, R, tau2, lm, dim=d, c=c, kmax=kmax, two_sided=False)
    assert got == pytest.approx(ref, rel=1e-12)
    two = vakili_beta_continuous(2 * delta, n, C, R, tau2, lm, dim=d, c=c, kmax=kmax)
    assert two == pytest.approx(ref, rel=1e-12)  # two-sided at 2δ = each side at δ
    # huge dimensions stay finite (Γ_n is handled in logs)
    assert math.isfinite(vakili_beta_continuous(0.01, 10**6, 10.0, 1.0, 1e-4, 0.0, dim=200))
    half = vakili_continuous_halfwidth(torch.tensor([0.0, 1.0]), 16, 2.0)
    assert torch.allclose(half, torch.tensor([2 / 16 + 2 * 0.5, 2 / 16 + 2 * 1.5]))


def test_widths_are_monotone():
    base = dict(rkhs_norm=1.0, subgaussian=0.1, noise=0.01, lambda_max=0.001)
    assert vakili_beta(0.01, **base) > vakili_beta(0.1, **base)
    assert vakili_beta_finite(0.1, 1000, **base) > vakili_beta_finite(0.1, 10, **base)
    lo = vakili_beta_continuous(0.1, 10, **base, dim=1)
    assert vakili_beta_continuous(0.1, 1000, **base, dim=1) > lo
    assert vakili_beta_continuous(0.1, 10, **base, dim=3) > lo


# ----------------------------------------------------------------------------- coverage
def _rkhs_function(X_c, alpha, C, ls):
    """f = Σ α_j k(·, c_j) rescaled to ‖f‖_H = √(αᵀ K_c α) = C exactly."""
    alpha = alpha / torch.sqrt(alpha @ rbf(X_c, X_c, ls) @ alpha) * C
    return lambda X: rbf(X, X_c, ls) @ alpha


def test_sparse_intervals_cover_f():
    """Theorem 3.5 on RKHS functions of known norm: per-point coverage >= 1 - δ (empirical over 20 noise
    draws x 200 points), the finite-set union bound holds in every run, and the intervals are not vacuous."""
    ls, tau2, R, C, delta = 0.25, 0.01, 0.1, 1.0, 0.1
    k = GaussianKernel(ls)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(200, 2, dtype=torch.float64, generator=g)  # the finite domain
    covered, ratios, uniform = [], [], []
    for _ in range(20):
        f = _rkhs_function(torch.rand(8, 2, dtype=torch.float64, generator=g),
                           torch.randn(8, dtype=torch.float64, generator=g), C, ls)
        idx = torch.randint(0, 200, (60,), generator=g)  # design independent of the noise
        Xn = X[idx]
        y = f(Xn) + R * torch.randn(60, dtype=torch.float64, generator=g)
        res = recursive_rls(Xn, k, tau2, oversample=0.5, base_size=8, generator=g)  # a deliberately coarse dictionary
        Z = Xn[res.indices]
        lam_max = nystrom_lambda_max(Xn, k, Z)
        # posterior from the independent formula of 003 Eq. 4-5
        Zu = torch.unique(Z, dim=0)
        mu, cov = titsias_dtc(rbf(Zu, Zu, ls), rbf(Xn, Zu, ls), rbf(X, Zu, ls), rbf(X, X, ls), y, tau2)
        sd = torch.diagonal(cov).clamp_min(0).sqrt()
        err = (f(X) - mu).abs()
        beta = vakili_beta(delta, C, R, tau2, lam_max)
        covered.append(float((err <= beta * sd).double().mean()))
        ratios.append(float((err / (beta * sd)).max()))
        uniform.append(bool((err <= vakili_beta_finite(delta, 200, C, R, tau2, lam_max) * sd).all()))
    assert sum(covered) / len(covered) >= 1 - delta
    assert min(covered) >= 1 - 2 * delta
    assert sum(uniform) >= (1 - delta) * len(uniform)
    assert max(ratios) > 0.2  # the width is within a factor 5 of the worst error seen: not vacuous


# ----------------------------------------------------------------------------- bad inputs
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(
        [
            (dict(delta=0.0), "delta"),
            (dict(delta=1.0), "delta"),
            (dict(delta=float("nan")), "delta"),
            (dict(rkhs_norm=-1.0), "rkhs_norm"),
            (dict(subgaussian=-0.1), "subgaussian"),
            (dict(noise=0.0), "noise"),
            (dict(noise=float("inf")), "noise"),
            (dict(lambda_max=-1e-3), "lambda_max"),
            (dict(lambda_max="big"), "lambda_max"),
            (dict(lambda_max=torch.ones(2)), "lambda_max"),
            (dict(rkhs_norm=True), "rkhs_norm"),
            (dict(scale="log"), "scale"),
        ]
    ),
    st.sampled_from(["plain", "finite", "continuous"]),
)
def test_bad_parameters(case, which):
    kw, msg = case
    args = dict(delta=0.1, rkhs_norm=1.0, subgaussian=0.1, noise=0.01, lambda_max=0.0)
    args.update(kw)
    with pytest.raises(InputDataError, match=msg):
        if which == "plain":
            vakili_beta(**args)
        elif which == "finite":
            vakili_beta_finite(num_points=10, **args)
        else:
            vakili_beta_continuous(n=10, dim=2, **args)


@pytest.mark.parametrize(
    "call,msg",
    [
        (lambda: vakili_beta_finite(0.1, 0, 1.0, 0.1, 0.01, 0.0), "num_points"),
        (lambda: vakili_beta_finite(0.1, 2.5, 1.0, 0.1, 0.01, 0.0), "num_points"),
        (lambda: vakili_beta_continuous(0.1, 0, 1.0, 0.1, 0.01, 0.0, dim=1), "n:"),
        (lambda: vakili_beta_continuous(0.1, 5, 1.0, 0.1, 0.01, 0.0, dim=0), "dim"),
        (lambda: vakili_beta_continuous(0.1, 5, 1.0, 0.1, 0.01, 0.0, dim=1, c=0.0), "c:"),
        (lambda: vakili_beta_continuous(0.1, 5, 1.0, 0.1, 0.01, 0.0, dim=1, kmax=-1.0), "kmax"),
        (lambda: vakili_continuous_halfwidth(0.1, 0, 1.0), "n:"),
    ],
)
def test_bad_counts(call, msg):
    with pytest.raises(InputDataError, match=msg):
        call()
