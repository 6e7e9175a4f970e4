"""BKB's upper confidence bounds as BoTorch acquisition functions.

Scales: BKB's UCB is ``μ̃ + β̃·σ̃`` with ``σ̃`` on the RLS scale, ``σ̃ = σ_GP / √λ``. BoTorch's
``UpperConfidenceBound(beta=b)`` computes ``μ + √b·σ_GP``, so the same UCB is ``b = β̃² / λ``
(:func:`torchbkb.bandits.confidence.to_botorch_beta`). With an affine outcome transform (``Standardize``) both
are computed on the untransformed posterior: ``μ_orig + β̃ σ_orig/√λ = a + s·(μ̃ + β̃σ̃)`` is a positive
affine map of the transformed-space UCB, so the maximizer is the same.

* :class:`BKBUpperConfidenceBound` -- analytic (``q = 1``) UCB with BKB's ``β̃ₜ`` (000 Theorem 2) or a
  user constant.
* :class:`BBKBUpperConfidenceBound` -- the same with ``X_pending`` support: the variance is conditioned on
  the pending points with hallucinated rewards (mean unchanged), BBKB's in-batch UCB
  ``μ̃_fb + α̃·σ̃_t`` (001 Algorithm 1, ``α̃ = C̃·β̃``), so ``optimize_acqf_discrete(q > 1)`` builds a
  batch by sequential greedy selection.

Example:
    >>> import torch
    >>> from botorch.optim import optimize_acqf_discrete
    >>> from torchbkb.botorch import BKBModel, BKBUpperConfidenceBound, BBKBUpperConfidenceBound
    >>> X = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> model = BKBModel(X, torch.cos(5 * X[:, :1]), seed=0)
    >>> ucb = BKBUpperConfidenceBound(model, beta=2.0)
    >>> float(ucb.beta) == 2.0 ** 2 / model.noise               # BoTorch's b = β̃²/λ
    True
    >>> choices = torch.rand(100, 2, dtype=torch.float64)
    >>> cand, _ = optimize_acqf_discrete(BBKBUpperConfidenceBound(model, beta=2.0), q=3, choices=choices)
    >>> cand.shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import math

import torch
from botorch.acquisition.analytic import UpperConfidenceBound
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import Model
from torch import Tensor

from torchbkb.bandits.batch_stop_rule import check_batch_limits
from torchbkb.bandits.confidence import bkb_beta, vakili_beta, vakili_beta_finite
from torchbkb.errors import InputDataError
from torchbkb.botorch.model import BKBModel
from torchbkb.sampling.recursive_rls import nystrom_lambda_max

__all__ = ["BKBUpperConfidenceBound", "BBKBUpperConfidenceBound", "theory_beta", "vakili_theory_beta"]


def theory_beta(model, *, F: float = 1.0, delta: float = 0.01, epsilon: float = 0.5,
                noise_std: float | None = None) -> Tensor:
    """BKB's ``β̃ₜ`` (000 Theorem 2, RLS scale) for the data of a :class:`~torchbkb.botorch.BKBModel`.

    ``β̃ₜ = 2ξ √(α log(κ² t) Σ_s σ̃²ₜ(x_s) + log(1/δ)) + (1 + 1/√(1-ε)) √λ F`` with ``t`` the
    number of observations (sum of their weights), ``Σ_s σ̃²ₜ(x_s)`` the model's effective dimension over its
    training points, ``κ² = max_s k(x_s, x_s)`` (exact for stationary kernels), ``ξ = √λ`` unless given.

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel`.
        F: bound on ``‖f‖_H`` (transformed outcomes).
        delta: failure probability.
        epsilon: dictionary accuracy ``ε``.
        noise_std: sub-Gaussian noise level ``ξ`` of the transformed outcomes; default ``√λ``.

    Returns:
        `(*batch_shape)` tensor of ``β̃ₜ`` (one per model batch).

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(20, 1, dtype=torch.float64)
        >>> b = theory_beta(BKBModel(X, X ** 2, seed=0), F=2.0)
        >>> b.shape, bool(b > 0)
        (torch.Size([]), True)
    """

    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel for beta='theory', got {type(model).__name__}")
    post = model.dtc_posterior
    lam = post.lam
    xi = math.sqrt(lam) if noise_std is None else float(noise_std)
    with torch.no_grad():
        rls_sum = post.effective_dimension().reshape(-1)  # (B,)
        t = post.train_counts.sum(-1).expand(post.batch_shape).reshape(-1)
        X = post.train_X
        kappa2 = float(post.embedding.kernel_diag(X).max()) if X.shape[-2] > 0 else 1.0
    vals = [
        bkb_beta(float(r), int(round(float(n))), noise_std=xi, lam=lam, F=F, delta=delta, epsilon=epsilon,
                 kappa2=kappa2)
        for r, n in zip(rls_sum.tolist(), t.tolist())
    ]
    return torch.tensor(vals, dtype=model.mean_constant.dtype,
                        device=model.mean_constant.device).reshape(post.batch_shape)


def vakili_theory_beta(
    model,
    *,
    rkhs_norm: float = 1.0,
    delta: float = 0.01,
    subgaussian: float | None = None,
    num_points: int | None = None,
) -> Tensor:
    """The sparse confidence width of Vakili et al. (003 Theorem 3.5) for a :class:`~torchbkb.botorch.BKBModel`,
    converted to the RLS scale used by the acquisitions (``β·τ``, τ² = λ).

    ``β = (2 + √λ_max/τ)·C_k + (R/τ)·√(2 log(1/δ))`` with ``λ_max`` the top eigenvalue of the Nyström
    residual ``K_X - K_XS K_S⁺ K_SX`` of the model's training inputs and dictionary
    (:func:`torchbkb.sampling.recursive_rls.nystrom_lambda_max`, measured, not assumed). With ``num_points`` the
    union bound over a finite candidate set (:func:`torchbkb.bandits.confidence.vakili_beta_finite`). The theorem
    assumes the data and the dictionary were chosen independently of the noise (e.g. S-BPE's variance-only
    designs); for data collected by a UCB rule it is a heuristic width.

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` (single batch).
        rkhs_norm: ``C_k``, the bound on ``‖f‖_H`` (transformed outcomes).
        delta: failure probability.
        subgaussian: ``R`` of the (transformed) noise; default ``τ = √λ``.
        num_points: size of the candidate set for the union bound; ``None`` for a single point.

    Returns:
        0-d tensor, the RLS-scale width.

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(20, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> b = vakili_theory_beta(BKBModel(X, X ** 2, seed=0), rkhs_norm=1.0, num_points=100)
        >>> bool(b > 0)
        True
    """

    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel for beta='vakili', got {type(model).__name__}")
    post = model.dtc_posterior
    if len(post.batch_shape) > 0:
        raise InputDataError(f"model: expected a non-batched BKBModel for beta='vakili', got batch shape "
                             f"{tuple(post.batch_shape)}")
    lam = post.lam
    R = math.sqrt(lam) if subgaussian is None else float(subgaussian)
    with torch.no_grad():
        lmax = nystrom_lambda_max(post.train_X, post.embedding.kernel, post.embedding.inducing_points)
    if num_points is None:
        beta = vakili_beta(delta, rkhs_norm, R, lam, lmax, scale="rls")
    else:
        beta = vakili_beta_finite(delta, int(num_points), rkhs_norm, R, lam, lmax, scale="rls")
    return torch.tensor(beta, dtype=model.mean_constant.dtype, device=model.mean_constant.device)


def _noise_of(model: Model) -> float:

    if isinstance(model, BKBModel):
        return model.noise
    lik = getattr(model, "likelihood", None)
    noise = getattr(lik, "noise", None)
    if noise is None or noise.numel() != 1:
        raise InputDataError(
            f"model: expected a BKBModel or a model with a homoskedastic likelihood.noise, got {type(model).__name__}"
        )
    return float(noise.detach())


def beta_rls(model, beta, F, delta, epsilon, noise_std, num_points=None) -> Tensor:
    if isinstance(beta, str):
        if beta == "vakili":
            return vakili_theory_beta(model, rkhs_norm=F, delta=delta, subgaussian=noise_std, num_points=num_points)
        if beta != "theory":
            raise InputDataError(f"beta: expected 'theory', 'vakili' or a number >= 0, got {beta!r}")
        return theory_beta(model, F=F, delta=delta, epsilon=epsilon, noise_std=noise_std)
    b = torch.as_tensor(beta, dtype=torch.float64).detach()
    if not bool(torch.isfinite(b).all()) or bool((b < 0).any()):
        raise InputDataError(f"beta: expected 'theory' or a finite number >= 0, got {beta!r}")
    return b


class BKBUpperConfidenceBound(UpperConfidenceBound):
    """Analytic UCB ``μ̃(x) + β̃·σ̃(x)`` (RLS scale) as a BoTorch ``UpperConfidenceBound``.

    Evaluated on ``X`` of shape `(*batch, 1, d)`, returns `(*batch)`. Internally BoTorch's
    ``μ + √b·σ_GP`` with ``b = β̃²/λ`` (attribute :attr:`beta`; :attr:`beta_rls` holds ``β̃``).

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` (or, for a numeric ``beta``, any single-output model
            with a homoskedastic ``likelihood.noise`` λ).
        beta: ``"theory"`` for BKB's ``β̃ₜ`` of 000 Theorem 2 (:func:`theory_beta`, evaluated once at
            construction on the model's data), ``"vakili"`` for the sparse width of 003 Theorem 3.5
            (:func:`vakili_theory_beta`), or a number ``β̃ >= 0`` on the RLS scale.
        F: ``‖f‖_H`` bound for ``"theory"``/``"vakili"`` (transformed outcomes).
        delta: failure probability for ``"theory"``/``"vakili"``.
        epsilon: dictionary accuracy for ``"theory"``.
        noise_std: sub-Gaussian noise level for ``"theory"``/``"vakili"``; default ``√λ``.
        num_points: for ``"vakili"``, the candidate-set size of the union bound (``None``: pointwise).
        posterior_transform: optional BoTorch ``PosteriorTransform``.
        maximize: ``False`` gives the lower bound of ``-f`` like BoTorch's UCB.

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(25, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> model = BKBModel(X, X ** 2, seed=0)
        >>> acq = BKBUpperConfidenceBound(model, beta="theory")
        >>> acq(torch.rand(7, 1, 1, dtype=torch.float64)).shape
        torch.Size([7])
        >>> bool(acq.beta_rls > 0)
        True
    """

    def __init__(
        self,
        model: Model,
        beta: str | float = "theory",
        *,
        F: float = 1.0,
        delta: float = 0.01,
        epsilon: float = 0.5,
        noise_std: float | None = None,
        num_points: int | None = None,
        posterior_transform: PosteriorTransform | None = None,
        maximize: bool = True,
    ) -> None:
        lam = _noise_of(model)
        width = beta_rls(model, beta, F, delta, epsilon, noise_std, num_points)
        if width.dim() > 0:  # one β̃ per model batch: (*batch, 1) broadcasts against the (*batch, 1) mean
            width = width.unsqueeze(-1)
        super().__init__(model=model, beta=width**2 / lam, posterior_transform=posterior_transform, maximize=maximize)
        self.register_buffer("beta_rls", width)


class BBKBUpperConfidenceBound(BKBUpperConfidenceBound):
    """BBKB's in-batch UCB ``μ̃_fb(x) + α̃·σ̃_t(x)`` with ``X_pending`` support.

    ``σ̃_t`` is the RLS-scale deviation after conditioning on the pending points with hallucinated rewards
    (:meth:`~torchbkb.botorch.BKBModel.hallucinate`: the mean stays ``μ̃_fb``, the variance shrinks, exactly as
    BBKB's rank-one in-batch updates). With ``beta="theory"``, ``α̃ = C̃·β̃ₜ`` (``C̃ = batch_bound``,
    ``β̃ₜ`` from :func:`theory_beta`; 001 Theorem 2 scales the width by ``C̃`` to stay valid inside a batch); a
    numeric ``beta`` is ``α̃`` itself. ``optimize_acqf_discrete(acq, q, choices)`` then selects ``q`` points by
    sequential greedy maximization, setting ``X_pending`` after each pick (GP-BUCB / BBKB with a fixed batch
    size; :func:`~torchbkb.botorch.optimize_acqf_bbkb` chooses the batch size adaptively).

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel`.
        beta: ``"theory"`` or ``α̃ >= 0``.
        batch_bound: ``C̃ >= 1`` multiplying the theory width.
        X_pending: `(n, d)` points already selected but not yet evaluated (original input space).
        F, delta, epsilon, noise_std, posterior_transform, maximize: as in :class:`BKBUpperConfidenceBound`.

    Example:
        >>> import torch
        >>> from torchbkb.botorch import BKBModel
        >>> X = torch.rand(25, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> model = BKBModel(X, X ** 2, seed=0)
        >>> x = torch.tensor([[[0.37]]], dtype=torch.float64)
        >>> acq = BBKBUpperConfidenceBound(model, beta=1.0)
        >>> before = acq(x)
        >>> acq.set_X_pending(x[0])              # hallucinating x itself shrinks its width, not its mean
        >>> bool(acq(x) < before)
        True
    """

    def __init__(
        self,
        model: Model,
        beta: str | float = "theory",
        *,
        batch_bound: float = 1.0,
        X_pending: Tensor | None = None,
        F: float = 1.0,
        delta: float = 0.01,
        epsilon: float = 0.5,
        noise_std: float | None = None,
        posterior_transform: PosteriorTransform | None = None,
        maximize: bool = True,
    ) -> None:

        if not isinstance(model, BKBModel):
            raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
        C, _ = check_batch_limits(batch_bound)
        if isinstance(beta, str):
            beta = beta_rls(model, beta, F, delta, epsilon, noise_std) * C
        super().__init__(model, beta=beta, posterior_transform=posterior_transform, maximize=maximize)
        self.batch_bound = C
        self._pending_model = model
        self.X_pending = None
        self.set_X_pending(X_pending)

    def set_X_pending(self, X_pending: Tensor | None = None) -> None:
        """Condition the variance on ``X_pending`` `(n, d)` (hallucinated rewards); ``None`` clears it."""
        if X_pending is not None:
            d = self.model.input_dim
            if not isinstance(X_pending, Tensor) or X_pending.dim() != 2 or X_pending.shape[-1] != d:
                got = tuple(X_pending.shape) if isinstance(X_pending, Tensor) else type(X_pending).__name__
                raise InputDataError(f"X_pending: expected shape (n, {d}), got {got}")
            self.model.check_query(X_pending, "X_pending")
        if X_pending is None or X_pending.shape[-2] == 0:
            self.X_pending = None if X_pending is None else X_pending.detach().clone()
            self._pending_model = self.model
            return
        self.X_pending = X_pending.detach().clone()
        self._pending_model = self.model.hallucinate(self.X_pending)

    def _mean_and_sigma(self, X: Tensor, compute_sigma: bool = True, min_var: float = 1e-12):
        self.to(X)
        posterior = self._pending_model.posterior(X=X, posterior_transform=self.posterior_transform)
        mean = posterior.mean.squeeze(-2)  # (*b, 1)
        if not compute_sigma:
            return mean, None
        sigma = posterior.variance.clamp_min(min_var).sqrt().view(mean.shape)
        return mean, sigma
