"""BKB -- budgeted kernel bandit (000, Algorithm 1): GP-UCB on a DTC posterior with adaptive sketching.

One step, after the reward of ``x_t`` arrives:

1. resample the dictionary ``S_t`` from the pulled arms, each arm ``i`` independently with probability
   ``1 - (1 - min(1, q̄ σ̃²_{t-1}(x_i)))^{n_i}`` (``n_i`` its pull count, ``σ̃²_{t-1}`` the RLS variance of
   the previous posterior, already computed for the previous selection); at ``t = 1``, ``S_1 = {x_1}``;
2. if ``S_t`` changed, bring the cached kernel rows ``k(s, arms)`` `(m, A)` up to date (rows of arms that
   enter are copied from the pulled-arm row cache or computed) and factor ``K_S`` once (``Wᵀ W = K_S⁺``);
   otherwise reuse both -- the arms' features ``z_t(X_A) = W k_S(X_A)`` are never stored, only derived
   on demand (BBKB's in-batch updates);
3. rebuild ``V_t`` from the pulled arms and their counts (000 Sec. 3.2), score every arm:
   ``μ̃_t``, ``σ̃²_t`` (RLS scale) from its kernel row in one `(m × m)·(m × A)` product;
4. ``x_{t+1} = argmax μ̃_t + β̃_t σ̃_t`` (lowest index on ties), with ``β̃_t`` of 000 Theorem 2 for
   ``beta="theory"``, or a constant.

The first arm is uniform. With ``q̄`` so large that every pulled arm stays in the dictionary, BKB makes
exactly GP-UCB's choices ("BKB transforms back into exact GP-UCB").

Example:
    >>> import torch
    >>> from torchbkb.bandits import BKB
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = 1 - ((arms - 0.3) ** 2).sum(-1)
    >>> bandit = BKB(arms, GaussianKernel(0.3), noise=0.01, q_bar=1.0, beta=0.05, seed=0)
    >>> for _ in range(40):
    ...     i = bandit.ask(); bandit.tell(i, f[i])
    >>> bandit.dictionary_size < 20, float(f.max() - f[bandit.ask()]) < 0.05
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchbkb.bandits.kernel_row_cache import ROW_CACHE_BYTES
from torchbkb.bandits.sketched import SketchedKernelBandit
from torchbkb.bandits.confidence import alpha_from_epsilon, bkb_beta, bkb_practical_beta
from torchbkb.errors import InputDataError, check_positive
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION
from torchbkb.bandits.theorems import warn_unmet_preconditions

__all__ = ["BKB"]


class BKB(SketchedKernelBandit):
    """Budgeted kernel bandit.

    Args:
        arms: `(A, d)` arm set (A up to 10⁶; only `(A, m)` features are kept).
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling.
        beta: ``"theory"`` (β̃ₜ of 000 Theorem 2), ``"practical"`` (the authors' code:
            ``√λ F + ξ √(Σ_i n_i σ̃²ₜ(x_i) log t + log 1/δ)``,
            :func:`~torchbkb.bandits.confidence.bkb_practical_beta`) or a constant width (RLS scale).
        seed: generator seed (first arm, dictionary draws).
        F: bound on ``‖f‖_H`` (theory β).
        delta: failure probability (theory β).
        epsilon: dictionary accuracy ``ε`` (theory β, ``α = (1+ε)/(1-ε)``); or give ``alpha`` instead.
        alpha: ``α > 1``, overrides ``epsilon``.
        noise_std: ``ξ`` of the theory β (default ``√λ``).
        chunk_size: arms scored at once (``None``: sized for the device, see
            :func:`~torchbkb.gp.scoring_chunk.scoring_chunk`).
        row_cache_bytes: memory for the kernel rows of the pulled arms (see
            :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`).
        kernel_cache_bytes: memory for the dictionary's kernel rows; past it they are streamed (see
            :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`).
        prune: with a constant ``beta``, score the variance only of the arms whose UCB can still be the
            largest (:mod:`torchbkb.bandits.pruning`; the same choices as ``False``). The theory width
            depends on the scores, so with ``beta="theory"`` every arm is scored.
        inclusion: how an arm pulled ``n`` times enters the dictionary: ``"count_scaled"`` (default,
            ``min(1, q̄·n·σ̃²)``, the authors' code) or ``"per_pull"`` (``1 - (1 - p)^n``, 000 Algorithm 1 read
            literally); see :mod:`torchbkb.sampling.rls_dictionary`.
        horizon: the run's length ``T``, if known: ``beta="theory"`` warns
            (:class:`~torchbkb.errors.TheoryWarning`) when ``q̄`` is below 000 Theorem 2's requirement for it
            (:func:`~torchbkb.bandits.theorems.bkb_required_q_bar`; without it, for ``T = 1``).

    Attributes:
        dictionary: `(m,)` long, arm indices of the current dictionary.
        beta: the width used for the last selection.
        deff: ``Σ_i n_i σ̃²_t(x_i)``, the estimate of ``d_eff`` used by the theory β.
        embeddings_computed: how many times the dictionary changed (kernel rows updated, ``K_S`` refactored).
        arms_scored: arm variances computed at the last update (``arms_scored_total``: over all updates).
    """

    beta_modes = ("theory", "practical")

    def __init__(
        self,
        arms: torch.Tensor,
        kernel: Callable,
        *,
        noise: float,
        q_bar: float = 2.0,
        beta: float | str = "theory",
        seed: int | None = None,
        F: float = 1.0,
        delta: float = 0.01,
        epsilon: float = 0.5,
        alpha: float | None = None,
        noise_std: float | None = None,
        chunk_size: int | None = None,
        row_cache_bytes: int = ROW_CACHE_BYTES,
        prune: bool = True,
        inclusion: str = DEFAULT_INCLUSION,
        kernel_cache_bytes: int | None = None,
        horizon: int | None = None,
    ):
        super().__init__(
            arms, kernel, noise=noise, q_bar=q_bar, beta=beta, seed=seed, F=F, delta=delta, noise_std=noise_std,
            chunk_size=chunk_size, row_cache_bytes=row_cache_bytes,
            prune=prune, inclusion=inclusion, kernel_cache_bytes=kernel_cache_bytes,
        )
        if alpha is not None:
            a = check_positive(alpha, "alpha")
            if a <= 1.0:
                raise InputDataError(f"alpha: expected alpha > 1, got {alpha!r}")
            epsilon = (a - 1.0) / (a + 1.0)
        alpha_from_epsilon(epsilon)  # validates 0 < ε < 1
        self.epsilon = float(epsilon)
        if self.beta_mode == "theory":
            warn_unmet_preconditions("BKB", q_bar=self.q_bar, lam=self.lam, delta=self.delta, horizon=horizon,
                                     epsilon=self.epsilon)

    def _select(self) -> torch.Tensor:
        if self.t == 0:
            self.beta = self.current_beta()
            return self._random_arm()
        self.beta = self.current_beta()
        fused = self._take_fused_pick(self.beta)  # the fixed-capacity update made this argmax already
        if fused is not None:
            return fused
        ucb = self._mask_excluded(self.arm_means + self.beta * self.arm_rls.sqrt())
        return torch.argmax(ucb).reshape(1)

    def _ucb_width(self) -> float | None:
        return None if isinstance(self.beta_mode, str) else float(self.beta_mode)

    def _fused_pick_width(self) -> float | None:
        return self._ucb_width()

    def current_beta(self) -> float:
        """The width of the next selection: β̃ₜ (theory), the authors' βₜ (practical) or the constant."""
        if self.beta_mode == "practical":
            return bkb_practical_beta(self.deff, self.t, noise_std=self.noise_std, lam=self.lam, F=self.F,
                                      delta=self.delta)
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        return bkb_beta(self.deff, max(self.t, 1), noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta,
                        epsilon=self.epsilon, kappa2=self.kappa2)
