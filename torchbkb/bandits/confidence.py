"""Confidence-width (β) schedules of the papers, all on the **RLS scale** (UCB = μ̃ + β σ̃).

* :func:`bkb_beta` -- BKB, 000 Theorem 2;
* :func:`bbkb_beta` -- BBKB, 001 Theorem 2 (the batch multiplier is ``α̃ = C̃ β̃``);
* :func:`gpucb_beta` -- exact GP-UCB with the same self-normalized bound (Abbasi-Yadkori et al.),
  ``log det(I + K/λ) = Σ_s log(1 + σ²_{s-1}(x_s))`` accumulated exactly;
* :func:`bkb_practical_beta`, :func:`bbkb_practical_beta` -- the widths the authors' code (batch-bkb,
  ``bkb_lib.py``) uses, ``beta="practical"`` on the bandits;
* :func:`vakili_beta`, :func:`vakili_beta_finite`, :func:`vakili_beta_continuous` -- the sparse
  (DTC/SVGP) confidence widths of 003 Theorem 3.5 / Corollary 3.7; these are on the **GP scale**
  (``μ̄ ± β σ̄_GP``) unless called with ``scale="rls"``;
* :func:`to_botorch_beta` -- BoTorch's ``UpperConfidenceBound(beta=b)`` computes ``μ + √b·σ_GP``;
  with ``σ_GP = √λ σ̃`` the same UCB needs ``b = β̃² / λ``.

Here ``ξ`` (``noise_std``) is the sub-Gaussian noise level of the rewards and ``λ`` the regularization;
in the GP reading ``λ = ξ²`` (the default when ``noise_std`` is not given to the bandits).

Example:
    >>> from torchbkb.bandits.confidence import bkb_beta, bbkb_beta, to_botorch_beta
    >>> round(bkb_beta(rls_sum=10.0, t=100, noise_std=0.1, lam=0.01, F=1.0, delta=0.01, epsilon=0.5), 4)
    2.6311
    >>> round(bbkb_beta(log_sum=5.0, noise_std=0.1, lam=0.01, F=1.0, delta=0.01), 4)
    0.8613
    >>> to_botorch_beta(2.0, lam=0.25)     # σ_GP = 0.5 σ̃, so μ + 2σ̃ = μ + 4σ_GP = μ + √16·σ_GP
    16.0
"""

from __future__ import annotations

import math

from torchbkb.errors import InputDataError, check_int

__all__ = [
    "check_beta",
    "bkb_beta",
    "bbkb_beta",
    "gpucb_beta",
    "bkb_practical_beta",
    "bbkb_practical_beta",
    "to_botorch_beta",
    "alpha_from_epsilon",
    "vakili_beta",
    "vakili_beta_finite",
    "vakili_beta_continuous",
    "vakili_continuous_halfwidth",
]


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
    return (2.0 * noise_std * math.sqrt(max(log_sum, 0.0) + math.log(1.0 / delta))
            + (1.0 + math.sqrt(2.0)) * math.sqrt(lam) * F)


def gpucb_beta(log_det: float, *, noise_std: float, lam: float, F: float, delta: float) -> float:
    """Exact GP-UCB width from the self-normalized bound used in BKB's proof::

        βₜ = 2ξ √(log det(I + K_t/λ) + log(1/δ)) + √λ F,
        log det(I + K_t/λ) = Σ_s log(1 + σ²_{s-1}(x_s))
    """
    _check_common(noise_std, lam, F, delta)
    return 2.0 * noise_std * math.sqrt(max(log_det, 0.0) + math.log(1.0 / delta)) + math.sqrt(lam) * F


def bkb_practical_beta(rls_sum: float, t: int, *, noise_std: float, lam: float, F: float, delta: float) -> float:
    """BKB's width in the authors' code (``BKB._update_beta``)::

        βₜ = √λ F + ξ √(Σ_i n_i σ̃²ₜ(x_i) · log t + log(1/δ))

    Args:
        rls_sum: ``Σ_i n_i σ̃²ₜ(x_i)`` over the distinct pulled arms (pull counts ``n_i``, current posterior).
        t: number of pulls so far (``log t`` taken as 0 for ``t <= 1``).

    Example:
        >>> import math
        >>> b = bkb_practical_beta(3.0, 100, noise_std=0.5, lam=0.25, F=2.0, delta=0.01)
        >>> math.isclose(b, 0.5 * 2.0 + 0.5 * math.sqrt(3.0 * math.log(100) + math.log(100)))
        True
    """
    _check_common(noise_std, lam, F, delta)
    log_t = math.log(t) if t > 1 else 0.0
    return math.sqrt(lam) * F + noise_std * math.sqrt(max(rls_sum, 0.0) * log_t + math.log(1.0 / delta))


def bbkb_practical_beta(log_det: float, *, noise_std: float, lam: float, F: float, delta: float,
                        batch_bound: float) -> float:
    """BBKB's width in the authors' code (``Batch_BKB.update``); it multiplies ``σ̃`` as it is (no ``C̃`` factor)::

        β = √λ F + ξ √(C̃ · L + log(1/δ)),   L = Σ_s log(1 + σ̃²_fb[s](x_s))

    Args:
        log_det: ``L``, summed at every batch end over the batch's picks with their batch-start variances; the
            first batch (the single uniform arm, the authors' initialization with ``t = 1``) adds nothing.
        batch_bound: ``C̃``.

    Example:
        >>> import math
        >>> b = bbkb_practical_beta(2.0, noise_std=0.5, lam=0.25, F=2.0, delta=0.01, batch_bound=3.0)
        >>> math.isclose(b, 1.0 + 0.5 * math.sqrt(3.0 * 2.0 + math.log(100)))
        True
    """
    _check_common(noise_std, lam, F, delta)
    return math.sqrt(lam) * F + noise_std * math.sqrt(float(batch_bound) * max(log_det, 0.0) + math.log(1.0 / delta))


def to_botorch_beta(beta_rls: float, lam: float) -> float:
    """BoTorch ``UpperConfidenceBound`` ``beta`` giving the same UCB as ``μ + β̃ σ̃`` (RLS scale):
    ``β̃² / λ``."""
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


# ---------------------------------------------------------------------------------------- Vakili et al. (003)
# Sparse confidence widths for the DTC/SVGP posterior (μ̄, σ̄) of 003 Eq. 4 with inducing points Z and
# regularization τ² = noise. Unlike the functions above they multiply the **GP-scale** standard deviation
# σ̄ = √(DTC variance) = √(λ·σ̃²): the interval is μ̄ ± β σ̄. With ``scale="rls"`` they return β·τ,
# the width of the same interval on the RLS scale (μ̄ ± (βτ)·σ̃); BoTorch's ``UpperConfidenceBound(beta=b)``
# gets the same UCB with ``b = β²`` (= ``to_botorch_beta(vakili_beta(..., scale="rls"), lam)``).


def vakili_beta(
    delta: float,
    rkhs_norm: float,
    subgaussian: float,
    noise: float,
    lambda_max: float,
    *,
    scale: str = "gp",
) -> float:
    """β(δ) of 003 Theorem 3.5: for a *fixed* ``x``, each of ``f(x) <= μ̄(x) + β σ̄(x)`` and
    ``f(x) >= μ̄(x) - β σ̄(x)`` holds with probability ``>= 1 - δ``, where::

        β(δ) = (2 + √λ_max / τ) · C_k + (R / τ) · √(2 log(1/δ)),     τ² = noise

    Assumptions (003): ``‖f‖_{H_k} <= C_k`` (3.3); the noise is ``R``-sub-Gaussian and independent (3.4);
    the data ``X_n`` and inducing points ``Z_m`` are chosen independently of the noise (e.g. by
    variance-only rules and recursive RLS, as in S-BPE). ``λ_max`` is the top eigenvalue of
    ``K_X - K_XZ K_Z⁻¹ K_ZX`` (:func:`torchbkb.sampling.recursive_rls.nystrom_lambda_max`); Lemma 3.8's recursive RLS
    gives ``λ_max <= τ²``, i.e. the first term becomes ``3 C_k``.

    Args:
        delta: ``δ ∈ (0, 1)`` (per point and per side).
        rkhs_norm: ``C_k >= 0``, the bound on ``‖f‖_{H_k}``.
        subgaussian: ``R >= 0``, the sub-Gaussian parameter of the noise (``= τ`` in the GP reading).
        noise: ``τ² > 0``, the regularization (the posterior's ``noise``).
        lambda_max: ``λ_max >= 0``.
        scale: ``"gp"`` (multiplies ``σ̄ = √var``) or ``"rls"`` (returns ``β·τ``, multiplies
            ``σ̃ = √(var/τ²)``).

    Returns:
        β as a Python float.

    Example:
        >>> from torchbkb.bandits.confidence import vakili_beta
        >>> round(vakili_beta(0.05, rkhs_norm=1.0, subgaussian=0.1, noise=0.01, lambda_max=0.01), 4) # 3 + √(2 log 20)
        5.4477
        >>> round(vakili_beta(0.05, 1.0, 0.1, 0.01, 0.01, scale="rls"), 5)                         # × τ = 0.1
        0.54477
    """
    tau = _check_vakili(delta, rkhs_norm, subgaussian, noise, lambda_max)
    beta = ((2.0 + math.sqrt(float(lambda_max)) / tau) * float(rkhs_norm)
            + float(subgaussian) / tau * math.sqrt(2.0 * math.log(1.0 / float(delta))))
    return _vakili_scale(beta, tau, scale)


def vakili_beta_finite(
    delta: float,
    num_points: int,
    rkhs_norm: float,
    subgaussian: float,
    noise: float,
    lambda_max: float,
    *,
    two_sided: bool = True,
    scale: str = "gp",
) -> float:
    """Theorem 3.5 made uniform over a finite set ``X`` by a union bound.

    * ``two_sided=True`` (default): ``l(x) <= f(x) <= u(x)`` for **all** ``x ∈ X``, both sides, with
      probability ``>= 1 - δ``: ``β(δ / (2|X|))``. This is how 003 uses it: the event ``E_1`` in the proof of
      Theorem 4.1 (Appendix G) is ``β(δ/(4|X|))`` = ``vakili_beta_finite(δ/2, |X|)`` with probability
      ``1 - δ/2``, and S-BPE's Eq. 13 / the proof of Theorem 5.2 (Appendix H) is ``β(δ/(4B|X|))`` =
      ``vakili_beta_finite(δ/(2B), |X|)`` (``B`` batches).
    * ``two_sided=False``: the remark after Theorem 3.5 verbatim, ``β(δ/|X|)``: *each* one-sided bound
      holds uniformly over ``X`` with probability ``>= 1 - δ``.

    Args:
        delta: ``δ ∈ (0, 1)``.
        num_points: ``|X| >= 1``.
        rkhs_norm, subgaussian, noise, lambda_max, scale: as in :func:`vakili_beta`.
        two_sided: see above.

    Returns:
        β as a Python float.

    Example:
        >>> from torchbkb.bandits.confidence import vakili_beta, vakili_beta_finite
        >>> vakili_beta_finite(0.1, 50, 2.0, 0.1, 0.01, 0.0) == vakili_beta(0.1 / 100, 2.0, 0.1, 0.01, 0.0)
        True
    """
    check_int(num_points, "num_points")
    _check_vakili(delta, rkhs_norm, subgaussian, noise, lambda_max)
    d = float(delta) / (num_points * (2 if two_sided else 1))
    return vakili_beta(d, rkhs_norm, subgaussian, noise, lambda_max, scale=scale)


def vakili_beta_continuous(
    delta: float,
    n: int,
    rkhs_norm: float,
    subgaussian: float,
    noise: float,
    lambda_max: float,
    *,
    dim: int,
    c: float = 1.0,
    kmax: float = 1.0,
    two_sided: bool = True,
    scale: str = "gp",
) -> float:
    """β̃_n(δ) of 003 Corollary 3.7 (continuous domains, Assumption 3.6)::

        β̃_n(δ) = β(δ / (2Γ_n)),      Γ_n = c · (C^μ̄_n(δ/2))^d · n^d,
        C^μ̄_n(δ) = C_k (1 + √n · k_max / τ) + (√n R / τ) √(2 log(2n/δ))

    with which, for ``n`` data points, uniformly over the whole domain,
    ``|f(x) - μ̄(x)| <= 2/n + β̃_n(δ) (σ̄(x) + 2/√n)`` (:func:`vakili_continuous_halfwidth`).

    Parameters of Assumption 3.6 (a kernel/domain property: a discretization ``𝕏`` of the domain with
    ``|𝕏| <= c C^d n^d`` points such that ``|g(x) - g([x])| <= 1/n`` for every ``‖g‖_H <= C``): ``dim`` is
    ``d`` and ``c`` its constant; it holds for SE and Matérn (ν > 1) kernels on compact domains, with a
    ``c`` that depends on the domain's diameter and the kernel's Lipschitz constant -- the default
    ``c = 1`` is a convention, not a derived value. ``k_max = sup_x k(x, x)``. ``C^μ̄`` is taken as in
    the statement of Corollary 3.7 (``√n·k_max``; Appendix H writes ``√(n k_max)``, equal for
    ``k_max = 1``).

    ``two_sided=True`` returns ``β̃_n(δ/2)``, so that both bounds hold simultaneously with probability
    ``>= 1 - δ`` (the Corollary states each side at ``1 - δ``); S-BPE's Eq. 15 ``β̃_{N_i}(δ/(4B))`` is
    ``vakili_beta_continuous(δ/(2B), N_i, ...)``.

    Args:
        delta: ``δ ∈ (0, 1)``.
        n: number of data points ``n >= 1``.
        rkhs_norm, subgaussian, noise, lambda_max, scale: as in :func:`vakili_beta`.
        dim: the input dimension ``d >= 1``.
        c: the constant of Assumption 3.6, ``> 0``.
        kmax: ``k_max > 0``.
        two_sided: see above.

    Returns:
        β̃ as a Python float.

    Example:
        >>> import math
        >>> from torchbkb.bandits.confidence import vakili_beta, vakili_beta_continuous
        >>> C = 1.0 * (1 + 10 / 0.1) + 10 * 0.1 / 0.1 * math.sqrt(2 * math.log(2 * 100 / 0.05))
        >>> ref = vakili_beta(0.1 / (2 * 1.0 * C**2 * 100**2), 1.0, 0.1, 0.01, 0.0)
        >>> math.isclose(vakili_beta_continuous(0.1, 100, 1.0, 0.1, 0.01, 0.0, dim=2, two_sided=False), ref)
        True
    """
    check_int(n, "n")
    check_int(dim, "dim")
    for name, v in (("c", c), ("kmax", kmax)):
        if not (isinstance(v, (int, float)) and 0.0 < float(v) < math.inf):
            raise InputDataError(f"{name}: expected a finite number > 0, got {v!r}")
    tau = _check_vakili(delta, rkhs_norm, subgaussian, noise, lambda_max)
    d = float(delta) / (2.0 if two_sided else 1.0)
    C, R = float(rkhs_norm), float(subgaussian)
    rn = math.sqrt(n)
    C_mu = C * (1.0 + rn * float(kmax) / tau) + rn * R / tau * math.sqrt(2.0 * math.log(2.0 * n / (d / 2.0)))
    # log Γ_n, to keep huge d-th powers finite
    log_gamma = math.log(float(c)) + dim * (math.log(max(C_mu, 1e-300)) + math.log(n))
    log_inv = math.log(2.0 / d) + log_gamma  # log(1 / (δ / (2Γ_n)))
    beta = (2.0 + math.sqrt(float(lambda_max)) / tau) * C + R / tau * math.sqrt(2.0 * max(log_inv, 0.0))
    return _vakili_scale(beta, tau, scale)


def vakili_continuous_halfwidth(std, n: int, beta: float):
    """Half-width ``2/n + β̃ (σ̄ + 2/√n)`` of Corollary 3.7's uniform interval (GP-scale ``σ̄``).

    Args:
        std: GP-scale posterior standard deviation ``σ̄(x)`` (a float or a tensor of any shape).
        n: number of data points ``n >= 1``.
        beta: ``β̃_n`` from :func:`vakili_beta_continuous` (GP scale).

    Returns:
        Same type/shape as ``std``.

    Example:
        >>> vakili_continuous_halfwidth(0.5, 4, 2.0)     # 2/4 + 2 (0.5 + 2/2)
        3.5
    """
    check_int(n, "n")
    return 2.0 / n + float(beta) * (std + 2.0 / math.sqrt(n))


def _check_vakili(delta, rkhs_norm, subgaussian, noise, lambda_max) -> float:
    """Validate Theorem 3.5's parameters; return ``τ = √noise``."""
    for name, v in (("delta", delta), ("rkhs_norm", rkhs_norm), ("subgaussian", subgaussian), ("noise", noise),
                    ("lambda_max", lambda_max)):
        try:  # Python/NumPy numbers and 0-d tensors
            ok = not isinstance(v, (bool, str)) and math.isfinite(float(v))
        except (TypeError, ValueError, RuntimeError):
            ok = False
        if not ok:
            raise InputDataError(f"{name}: expected a finite number, got {v!r}")
    if not 0.0 < float(delta) < 1.0:
        raise InputDataError(f"delta: expected 0 < delta < 1, got {delta!r}")
    if not float(rkhs_norm) >= 0:
        raise InputDataError(f"rkhs_norm: expected rkhs_norm >= 0, got {rkhs_norm!r}")
    if not float(subgaussian) >= 0:
        raise InputDataError(f"subgaussian: expected subgaussian >= 0, got {subgaussian!r}")
    if not float(noise) > 0:
        raise InputDataError(f"noise: expected noise (τ²) > 0, got {noise!r}")
    if not float(lambda_max) >= 0:
        raise InputDataError(f"lambda_max: expected lambda_max >= 0, got {lambda_max!r}")
    return math.sqrt(float(noise))


def _vakili_scale(beta: float, tau: float, scale: str) -> float:
    if scale == "gp":
        return beta
    if scale == "rls":
        return beta * tau
    raise InputDataError(f"scale: expected 'gp' or 'rls', got {scale!r}")


def check_beta(beta, modes: tuple[str, ...] = ("theory",)) -> float | str:
    """One of the named ``modes`` or a float ``>= 0``; anything else is an :class:`~torchbkb.errors.InputDataError`."""
    names = " or ".join(repr(m) for m in modes)
    if isinstance(beta, str):
        if beta not in modes:
            raise InputDataError(f"beta: expected {names} or a float >= 0, got {beta!r}")
        return beta
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise InputDataError(f"beta: expected {names} or a float >= 0, got {beta!r}") from None
    if not (b >= 0.0) or b == float("inf"):
        raise InputDataError(f"beta: expected {names} or a finite float >= 0, got {beta!r}")
    return b
