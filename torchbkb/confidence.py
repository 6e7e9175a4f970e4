"""Confidence-width (β) schedules of the papers, all on the **RLS scale** (UCB = μ̃ + β σ̃).

* :func:`bkb_beta` -- BKB, 000 Theorem 2;
* :func:`bbkb_beta` -- BBKB, 001 Theorem 2 (the batch multiplier is ``α̃ = C̃ β̃``);
* :func:`gpucb_beta` -- exact GP-UCB with the same self-normalized bound (Abbasi-Yadkori et al.),
  ``log det(I + K/λ) = Σ_s log(1 + σ²_{s-1}(x_s))`` accumulated exactly;
* :func:`to_botorch_beta` -- BoTorch's ``UpperConfidenceBound(beta=b)`` computes ``μ + √b·σ_GP``;
  with ``σ_GP = √λ σ̃`` the same UCB needs ``b = β̃² / λ``.

Here ``ξ`` (``noise_std``) is the sub-Gaussian noise level of the rewards and ``λ`` the regularization;
in the GP reading ``λ = ξ²`` (the default when ``noise_std`` is not given to the bandits).

Example:
    >>> from torchbkb.confidence import bkb_beta, bbkb_beta, to_botorch_beta
    >>> round(bkb_beta(rls_sum=10.0, t=100, noise_std=0.1, lam=0.01, F=1.0, delta=0.01, epsilon=0.5), 4)
    2.6311
    >>> round(bbkb_beta(log_sum=5.0, noise_std=0.1, lam=0.01, F=1.0, delta=0.01), 4)
    0.8613
    >>> to_botorch_beta(2.0, lam=0.25)     # σ_GP = 0.5 σ̃, so μ + 2σ̃ = μ + 4σ_GP = μ + √16·σ_GP
    16.0
"""

from __future__ import annotations

import math

from torchbkb.errors import InputDataError

__all__ = ["bkb_beta", "bbkb_beta", "gpucb_beta", "to_botorch_beta", "alpha_from_epsilon"]


def alpha_from_epsilon(epsilon: float) -> float:
    """``α = (1 + ε) / (1 - ε)`` for ``0 < ε < 1`` (000 Theorem 1)."""
    if not 0.0 < epsilon < 1.0:
        raise InputDataError(f"epsilon: expected 0 < epsilon < 1, got {epsilon!r}")
    return (1.0 + epsilon) / (1.0 - epsilon)


def bkb_beta(
    rls_sum: float,
    t: int,
    *,
    noise_std: float,
    lam: float,
    F: float,
    delta: float,
    epsilon: float = 0.5,
    kappa2: float = 1.0,
) -> float:
    """β̃ₜ of 000 Theorem 2::

        β̃ₜ = 2ξ √(α log(κ² t) Σ_{s<=t} σ̃²ₜ(x_s) + log(1/δ)) + (1 + 1/√(1-ε)) √λ F

    Args:
        rls_sum: ``Σ_{s=1}^t σ̃²ₜ(x_s)`` over the pulls so far (RLS scale, current posterior).
        t: number of pulls so far (``log(κ² t)`` is clamped at 0 when ``κ² t < 1``).
        noise_std: ``ξ``.
        lam: ``λ``.
        F: bound on ``‖f‖_H``.
        delta: failure probability ``δ``.
        epsilon: accuracy ``ε`` of the dictionary (``α = (1+ε)/(1-ε)``).
        kappa2: ``κ² = max_x k(x, x)``.
    """
    _check_common(noise_std, lam, F, delta)
    alpha = alpha_from_epsilon(epsilon)
    log_term = max(math.log(kappa2 * max(t, 1)), 0.0)
    inner = alpha * log_term * max(rls_sum, 0.0) + math.log(1.0 / delta)
    return 2.0 * noise_std * math.sqrt(inner) + (1.0 + 1.0 / math.sqrt(1.0 - epsilon)) * math.sqrt(lam) * F


def bbkb_beta(log_sum: float, *, noise_std: float, lam: float, F: float, delta: float) -> float:
    """β̃_fb of 001 Theorem 2::

        β̃ = 2ξ √(Σ_{s<=fb} log(1 + 3 σ̃²_{fb[s-1]}(x_s)) + log(1/δ)) + (1 + √2) √λ F

    Args:
        log_sum: ``Σ_s log(1 + 3 σ̃²_{fb[s-1]}(x_s))`` accumulated at each batch start over the batch's picks.
    """
    _check_common(noise_std, lam, F, delta)
    return 2.0 * noise_std * math.sqrt(max(log_sum, 0.0) + math.log(1.0 / delta)) + (1.0 + math.sqrt(2.0)) * math.sqrt(lam) * F


def gpucb_beta(log_det: float, *, noise_std: float, lam: float, F: float, delta: float) -> float:
    """Exact GP-UCB width from the self-normalized bound used in BKB's proof::

        βₜ = 2ξ √(log det(I + K_t/λ) + log(1/δ)) + √λ F,   log det(I + K_t/λ) = Σ_s log(1 + σ²_{s-1}(x_s))
    """
    _check_common(noise_std, lam, F, delta)
    return 2.0 * noise_std * math.sqrt(max(log_det, 0.0) + math.log(1.0 / delta)) + math.sqrt(lam) * F


def to_botorch_beta(beta_rls: float, lam: float) -> float:
    """BoTorch ``UpperConfidenceBound`` ``beta`` giving the same UCB as ``μ + β̃ σ̃`` (RLS scale): ``β̃² / λ``."""
    if not lam > 0:
        raise InputDataError(f"lam: expected lam > 0, got {lam!r}")
    return float(beta_rls) ** 2 / float(lam)


def _check_common(noise_std: float, lam: float, F: float, delta: float) -> None:
    if not noise_std >= 0:
        raise InputDataError(f"noise_std: expected noise_std >= 0, got {noise_std!r}")
    if not lam > 0:
        raise InputDataError(f"lam: expected lam > 0, got {lam!r}")
    if not F >= 0:
        raise InputDataError(f"F: expected F >= 0, got {F!r}")
    if not 0.0 < delta < 1.0:
        raise InputDataError(f"delta: expected 0 < delta < 1, got {delta!r}")
