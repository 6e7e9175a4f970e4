"""What the theorems of 000 (BKB) and 001 (BBKB) require, and what they promise.

``beta="theory"`` uses a width whose validity rests on a theorem's accuracy guarantee, and that guarantee holds
only for an oversampling ``q̄`` (and, for BBKB, a ``λ``) the theorem names. The defaults the papers' own
experiments use (``q̄ = 2``) are far below it; the bandits then emit a :class:`~torchbkb.errors.TheoryWarning`
that names the number (:func:`warn_unmet_preconditions`). Formulas, with ``α = (1 + ε)/(1 - ε)``:

=====================================  ==============================================================
000 Theorem 1 / 2 (BKB) requires       ``q̄ >= 6 α log(4T/δ) / ε²``, ``λ > 0``
000 Theorem 1 promises                 ``|S_t| <= 3 (1 + κ²/λ) α q̄ d_eff``
000 Theorem 2 promises                 ``R_T <= 2 (2α)^{3/2} √T (ξ d log(κ²T) + √(λ F² d log(κ²T))``
                                       ``+ ξ log 1/δ)``
001 Theorem 1 (BBKB) requires          ``q̄ >= 8 log(4T/δ)``, ``λ >= 1``, ``C̃ >= 1``
001 Theorem 2 (BBKB) requires          ``q̄ >= 72 C̃ log(4T/δ)``, ``λ >= 1``, ``C̃ >= 1``
001 Theorem 1 promises                 ``|S_t| <= 9 C̃ (1 + κ²/λ) q̄ d_eff``; resparsifications
                                       ``B <= C̃/(C̃ - 1) · 9 (1 + κ²/λ) Σ_t σ²_t(x_t)`` (its proof, App. B.1)
001 Theorem 2 promises                 ``R_T <= 55 C̃³ √T (ξ D + ξ log 1/δ + √(λ F² D))``,
                                       ``D = Σ_t σ²_{t-1}(x_t)``
=====================================  ==============================================================

``d`` is ``d_eff(λ, X_T)`` (000 Eq. 5; a bandit's ``deff`` estimates it) and ``D`` is at most ``log det(I + K/λ)``
(GP-UCB's ``log_det``). The regret bound of 001 Theorem 2 reads ``55 C̃² C̃`` in the statement: ``C̃³``.

Example:
    >>> from torchbkb.bandits.theorems import bkb_required_q_bar, bbkb_required_q_bar
    >>> round(bkb_required_q_bar(10_000, delta=1e-4, epsilon=0.5))        # 6·3·log(4·10⁸)/¼
    1426
    >>> round(bbkb_required_q_bar(10_000, delta=1e-4, batch_bound=2.0))    # 72·2·log(4·10⁸)
    2852
"""

from __future__ import annotations

import math
import warnings

from torchbkb.bandits.batch_stop_rule import check_batch_limits
from torchbkb.bandits.confidence import alpha_from_epsilon
from torchbkb.errors import InputDataError, TheoryWarning, check_int, check_positive

__all__ = [
    "bkb_required_q_bar",
    "bkb_dictionary_bound",
    "bkb_regret_bound",
    "bbkb_required_q_bar",
    "bbkb_required_lam",
    "bbkb_dictionary_bound",
    "bbkb_resparsification_bound",
    "bbkb_regret_bound",
    "warn_unmet_preconditions",
]

#: 001's theorems require ``λ >= 1``.
BBKB_MIN_LAM = 1.0


def _log_term(T: int, delta: float) -> float:
    check_int(T, "T")
    if not 0.0 < float(delta) < 1.0:
        raise InputDataError(f"delta: expected 0 < delta < 1, got {delta!r}")
    return math.log(4.0 * T / float(delta))


def _nonnegative(value: float, name: str) -> float:
    """``float(value)`` if it is a finite number ``>= 0``, else an :class:`~torchbkb.errors.InputDataError`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not 0.0 <= v < math.inf:
        raise InputDataError(f"{name}: expected a finite number >= 0, got {value!r}")
    return v


def bkb_required_q_bar(T: int, delta: float, epsilon: float = 0.5) -> float:
    """``6 α log(4T/δ) / ε²``: the oversampling 000 Theorems 1 and 2 require for a horizon ``T``."""
    return 6.0 * alpha_from_epsilon(epsilon) * _log_term(T, delta) / float(epsilon) ** 2


def bkb_dictionary_bound(d_eff: float, q_bar: float, lam: float, *, epsilon: float = 0.5, kappa2: float = 1.0) -> float:
    """``3 (1 + κ²/λ) α q̄ d_eff``: 000 Theorem 1's bound on ``|S_t|`` (when ``q̄`` meets the requirement)."""
    lam = check_positive(lam, "lam")
    return (3.0 * (1.0 + check_positive(kappa2, "kappa2") / lam) * alpha_from_epsilon(epsilon)
            * check_positive(q_bar, "q_bar") * _nonnegative(d_eff, "d_eff"))


def bkb_regret_bound(T: int, d_eff: float, *, noise_std: float, lam: float, F: float, delta: float,
                     epsilon: float = 0.5, kappa2: float = 1.0) -> float:
    """000 Theorem 2: ``2 (2α)^{3/2} √T (ξ d log(κ²T) + √(λ F² d log(κ²T)) + ξ log 1/δ)``,
    ``d = d_eff(λ, X_T)``."""
    _log_term(T, delta)
    a = alpha_from_epsilon(epsilon)
    d = _nonnegative(d_eff, "d_eff")
    xi, lam, F = _nonnegative(noise_std, "noise_std"), check_positive(lam, "lam"), _nonnegative(F, "F")
    log_t = max(math.log(check_positive(kappa2, "kappa2") * T), 0.0)
    return (2.0 * (2.0 * a) ** 1.5 * math.sqrt(T)
            * (xi * d * log_t + math.sqrt(lam * F**2 * d * log_t) + xi * math.log(1.0 / delta)))


def bbkb_required_q_bar(T: int, delta: float, batch_bound: float, *, guarantee: str = "regret") -> float:
    """The oversampling 001 requires: ``72 C̃ log(4T/δ)`` for the regret (Theorem 2, ``guarantee="regret"``) or
    ``8 log(4T/δ)`` for the dictionary size and run time (Theorem 1, ``guarantee="complexity"``)."""
    C = check_batch_limits(batch_bound)[0]
    if guarantee == "regret":
        return 72.0 * C * _log_term(T, delta)
    if guarantee == "complexity":
        return 8.0 * _log_term(T, delta)
    raise InputDataError(f"guarantee: expected 'regret' or 'complexity', got {guarantee!r}")


def bbkb_required_lam() -> float:
    """``1``: both theorems of 001 assume ``λ >= 1``."""
    return BBKB_MIN_LAM


def bbkb_dictionary_bound(d_eff: float, q_bar: float, lam: float, batch_bound: float, *, kappa2: float = 1.0) -> float:
    """``9 C̃ (1 + κ²/λ) q̄ d_eff``: 001 Theorem 1's bound on ``|S_t|``."""
    C = check_batch_limits(batch_bound)[0]
    lam = check_positive(lam, "lam")
    return (9.0 * C * (1.0 + check_positive(kappa2, "kappa2") / lam) * check_positive(q_bar, "q_bar")
            * _nonnegative(d_eff, "d_eff"))


def bbkb_resparsification_bound(variance_sum: float, lam: float, batch_bound: float, *, kappa2: float = 1.0) -> float:
    """``C̃/(C̃ - 1) · 9 (1 + κ²/λ) Σ_t σ²_t(x_t)``: the number of batches in the proof of 001 Theorem 1
    (``inf`` for ``C̃ = 1``, where every step is a batch)."""
    C = check_batch_limits(batch_bound)[0]
    if C == 1.0:
        return math.inf
    lam = check_positive(lam, "lam")
    return (C / (C - 1.0) * 9.0 * (1.0 + check_positive(kappa2, "kappa2") / lam)
            * _nonnegative(variance_sum, "variance_sum"))


def bbkb_regret_bound(T: int, variance_sum: float, *, noise_std: float, lam: float, F: float, delta: float,
                      batch_bound: float) -> float:
    """001 Theorem 2: ``55 C̃³ √T (ξ D + ξ log 1/δ + √(λ F² D))`` with ``D = Σ_t σ²_{t-1}(x_t)``."""
    _log_term(T, delta)
    C = check_batch_limits(batch_bound)[0]
    D = _nonnegative(variance_sum, "variance_sum")
    xi, lam, F = _nonnegative(noise_std, "noise_std"), check_positive(lam, "lam"), _nonnegative(F, "F")
    return 55.0 * C**3 * math.sqrt(T) * (xi * D + xi * math.log(1.0 / delta) + math.sqrt(lam * F**2 * D))


def warn_unmet_preconditions(algorithm: str, *, q_bar: float, lam: float, delta: float, horizon: int | None,
                             epsilon: float = 0.5, batch_bound: float = 1.0, stacklevel: int = 3) -> list[str]:
    """Emit one :class:`~torchbkb.errors.TheoryWarning` listing the preconditions of ``algorithm``'s (``"BKB"`` or
    ``"BBKB"``) regret theorem that the settings miss, each with the number it needs; return the list.

    Without a ``horizon`` the requirement is stated for ``T = 1``, the least any run needs (it grows as
    ``log T``).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     missed = warn_unmet_preconditions("BBKB", q_bar=2.0, lam=0.2, delta=1e-4, horizon=10_000,
        ...                                       batch_bound=2.0)
        >>> for line in missed:
        ...     print(line)
        q_bar >= 2853 (001 Theorem 2: 72·C̃·log(4T/δ), T = 10000), got 2
        noise (λ) >= 1 (001 Theorems 1-2), got 0.2
    """
    T = 1 if horizon is None else check_int(horizon, "horizon")
    t_note = f"T = {T}" if horizon is not None else "T = 1; pass horizon=T for a run's figure"
    missed = []
    if algorithm == "BKB":
        need = bkb_required_q_bar(T, delta, epsilon)
        if q_bar < need:
            missed.append(f"q_bar >= {math.ceil(need)} (000 Theorem 2: 6α·log(4T/δ)/ε², ε = {epsilon:g}, "
                          f"{t_note}), got {q_bar:g}")
    elif algorithm == "BBKB":
        need = bbkb_required_q_bar(T, delta, batch_bound)
        if q_bar < need:
            missed.append(f"q_bar >= {math.ceil(need)} (001 Theorem 2: 72·C̃·log(4T/δ), {t_note}), got {q_bar:g}")
        if lam < BBKB_MIN_LAM:
            missed.append(f"noise (λ) >= {BBKB_MIN_LAM:g} (001 Theorems 1-2), got {lam:g}")
    else:
        raise InputDataError(f"algorithm: expected 'BKB' or 'BBKB', got {algorithm!r}")
    if missed:
        warnings.warn(
            f"{algorithm}(beta='theory'): the width assumes the theorem's accuracy guarantee, which needs "
            + "; ".join(missed) + ". The width is computed as printed all the same.",
            TheoryWarning,
            stacklevel=stacklevel,
        )
    return missed
