"""torchbkb.bandits.theorems against the theorems' formulas typed from the papers, and the TheoryWarning."""

import math
import warnings

import pytest
import torch

from torchbkb import BBKB, BKB, TheoryWarning
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.bandits.theorems import (
    bbkb_dictionary_bound,
    bbkb_regret_bound,
    bbkb_required_lam,
    bbkb_required_q_bar,
    bbkb_resparsification_bound,
    bkb_dictionary_bound,
    bkb_regret_bound,
    bkb_required_q_bar,
)


@pytest.mark.parametrize("T, delta, eps", [(1, 0.5, 0.5), (10_000, 1e-4, 0.5), (1000, 0.01, 0.25)])
def test_bkb_requirement_and_promises(T, delta, eps):
    a = (1 + eps) / (1 - eps)
    assert math.isclose(bkb_required_q_bar(T, delta, eps), 6 * a * math.log(4 * T / delta) / eps**2)
    assert math.isclose(bkb_dictionary_bound(7.0, 3.0, 0.5, epsilon=eps, kappa2=2.0),
                        3 * (1 + 2.0 / 0.5) * a * 3.0 * 7.0)
    d, xi, lam, F = 12.0, 0.1, 0.3, 2.0
    lt = math.log(T) if T > 1 else 0.0
    ref = 2 * (2 * a) ** 1.5 * math.sqrt(T) * (xi * d * lt + math.sqrt(lam * F * F * d * lt) + xi * math.log(1 / delta))
    assert math.isclose(bkb_regret_bound(T, d, noise_std=xi, lam=lam, F=F, delta=delta, epsilon=eps), ref)


def test_the_issue_figure_for_bkb():
    # ≈ 1.4·10³ for ε = ½, T = 10⁴, δ = 1/T
    assert 1400 < bkb_required_q_bar(10_000, 1e-4, 0.5) < 1450


@pytest.mark.parametrize("C", [1.0, 2.0, 5.0])
def test_bbkb_requirements_and_promises(C):
    T, delta = 10_000, 1e-4
    L = math.log(4 * T / delta)
    assert math.isclose(bbkb_required_q_bar(T, delta, C), 72 * C * L)
    assert math.isclose(bbkb_required_q_bar(T, delta, C, guarantee="complexity"), 8 * L)
    assert bbkb_required_lam() == 1.0
    assert math.isclose(bbkb_dictionary_bound(5.0, 2.0, 0.2, C), 9 * C * (1 + 1 / 0.2) * 2.0 * 5.0)
    B = bbkb_resparsification_bound(30.0, 1.0, C)
    assert B == math.inf if C == 1.0 else math.isclose(B, C / (C - 1) * 9 * 2 * 30.0)
    D, xi, lam, F = 40.0, 0.5, 1.0, 20.0
    ref = 55 * C**3 * math.sqrt(T) * (xi * D + xi * math.log(1 / delta) + math.sqrt(lam * F * F * D))
    assert math.isclose(bbkb_regret_bound(T, D, noise_std=xi, lam=lam, F=F, delta=delta, batch_bound=C), ref)


@pytest.mark.parametrize("call", [
    lambda: bkb_required_q_bar(0, 0.1),
    lambda: bkb_required_q_bar(10, 1.5),
    lambda: bkb_required_q_bar(10, 0.1, epsilon=1.0),
    lambda: bbkb_required_q_bar(10, 0.1, 0.5),
    lambda: bbkb_required_q_bar(10, 0.1, 2.0, guarantee="speed"),
    lambda: bkb_dictionary_bound(1.0, 2.0, -1.0),
    lambda: bbkb_regret_bound(10, float("nan"), noise_std=1.0, lam=1.0, F=1.0, delta=0.1, batch_bound=2.0),
])
def test_bad_arguments_are_typed_errors(call):
    with pytest.raises(InputDataError, match="expected"):
        call()


def _arms():
    return torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_bkb_theory_width_warns_with_the_number():
    with pytest.warns(TheoryWarning, match=r"q_bar >= 1427 .*T = 10000\), got 2"):
        BKB(_arms(), GaussianKernel(0.3), noise=0.1, beta="theory", q_bar=2.0, delta=1e-4, horizon=10_000)
    with pytest.warns(TheoryWarning, match=r"T = 1; pass horizon=T"):
        BKB(_arms(), GaussianKernel(0.3), noise=0.1, beta="theory")


def test_bbkb_theory_width_warns_about_q_bar_and_lambda():
    with pytest.warns(TheoryWarning) as rec:
        BBKB(_arms(), GaussianKernel(0.3), noise=0.2, beta="theory", batch_bound=2.0, delta=1e-4, horizon=10_000)
    msg = str(rec[0].message)
    assert f"q_bar >= {math.ceil(72 * 2 * math.log(4e8))}" in msg and "noise (λ) >= 1" in msg and "got 0.2" in msg


@pytest.mark.parametrize("make", [
    lambda: BKB(_arms(), GaussianKernel(0.3), noise=0.1, beta="theory", q_bar=1500.0, delta=1e-4, horizon=10_000),
    lambda: BKB(_arms(), GaussianKernel(0.3), noise=0.1, beta=0.5),
    lambda: BKB(_arms(), GaussianKernel(0.3), noise=0.1, beta="practical"),
    lambda: BBKB(_arms(), GaussianKernel(0.3), noise=1.0, beta="theory", q_bar=3000.0, delta=1e-4, horizon=10_000),
    lambda: BBKB(_arms(), GaussianKernel(0.3), noise=0.2, beta=1.0),
])
def test_no_warning_when_the_preconditions_hold_or_no_theorem_is_used(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TheoryWarning)
        make()
