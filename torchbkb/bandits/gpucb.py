"""Exact GP-UCB (Srinivas et al. 2010; Chowdhury & Gopalan 2017) -- the fair exact baseline.

The posterior of all ``A`` arms is kept current incrementally: each pull appends one row to the
Cholesky factor and one row to ``Q = L⁻¹ K_{X,A}`` (:meth:`torchbkb.ExactPosterior.watch`), so a step
costs ``O(A·t)`` time -- no refit, no ``t × t`` refactorization. ``beta="theory"`` uses the exact
log-determinant ``log det(I + K_t/λ) = Σ_s log(1 + σ²_{s-1}(x_s))`` (RLS scale), accumulated as the
run goes, in the self-normalized width of :func:`torchbkb.confidence.gpucb_beta`.

Example:
    >>> import torch
    >>> from torchbkb.bandits import GPUCB
    >>> from torchbkb.kernels import GaussianKernel
    >>> arms = torch.linspace(0, 1, 50, dtype=torch.float64)[:, None]
    >>> f = torch.sin(6 * arms[:, 0])
    >>> bandit = GPUCB(arms, GaussianKernel(0.2), noise=0.01, beta=0.1, seed=0)
    >>> for _ in range(15):
    ...     i = bandit.ask(); bandit.tell(i, f[i])
    >>> float(f.max() - f[bandit.ask()]) < 0.01      # sin(6x) peaks at x = π/12
    True
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from torchbkb.bandits.base import KernelBandit
from torchbkb.confidence import gpucb_beta
from torchbkb.exact_posterior import ExactPosterior

__all__ = ["GPUCB"]


class GPUCB(KernelBandit):
    """Exact GP-UCB over a finite arm set with incremental posterior updates.

    Args:
        arms: `(A, d)`.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        beta: constant width (RLS scale: ``UCB = μ + β σ``, ``σ² = var/λ``) or ``"theory"``.
        seed: generator seed (the first arm is uniform, as in BKB).
        noise_std, F, delta: parameters of the theory width (see :class:`~torchbkb.bandits.base.KernelBandit`).

    Attributes:
        log_det: ``Σ_s log(1 + σ²_{s-1}(x_s))`` so far.
        beta: the width used for the last selection.
    """

    def __init__(self, arms: torch.Tensor, kernel: Callable, *, noise: float, beta: float | str = "theory", seed: int | None = None, noise_std: float | None = None, F: float = 1.0, delta: float = 0.01):
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=noise_std, F=F, delta=delta)
        self.log_det = 0.0
        self.beta = float("nan")
        self._reset_posterior()

    def _reset_posterior(self) -> None:
        self.posterior = ExactPosterior(self.kernel, noise=self.lam)
        empty = self.arms[:0]
        self.posterior.fit(empty, empty.new_zeros(0))
        with torch.no_grad():
            self.posterior.watch(self.arms)

    def current_beta(self) -> float:
        """The width for the next selection."""
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        return gpucb_beta(self.log_det, noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta)

    def _select(self) -> torch.Tensor:
        if self.t == 0:
            self.beta = self.current_beta()
            return self._random_arm()
        mean, var = self.posterior.watched()
        self.beta = self.current_beta()
        ucb = self._mask_excluded(mean + self.beta * (var / self.lam).sqrt())
        return torch.argmax(ucb).reshape(1)

    def _update(self) -> None:
        idx, y = self.last_told
        with torch.no_grad():
            for i, yi in zip(idx.tolist(), y.tolist()):
                var_i = self.posterior.watched()[1][i]
                self.log_det += math.log1p(float(var_i) / self.lam)
                self.posterior.update(self.arms[i], torch.tensor(yi, dtype=self.arms.dtype, device=self.arms.device))

    def _algorithm_state(self) -> dict[str, Any]:
        return {"log_det": self.log_det, "beta": self.beta}

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.log_det, self.beta = float(state["log_det"]), float(state["beta"])
        self._reset_posterior()
        idx = torch.as_tensor(self.history["index"], dtype=torch.long, device=self.arms.device)
        told = idx.numel()
        if told:  # the rows conditioned on so far, in order (told rewards only)
            y = torch.as_tensor(self.history["reward"], dtype=self.arms.dtype, device=self.arms.device)
            with torch.no_grad():
                self.posterior.fit(self.arms[idx], y)
                self.posterior.watch(self.arms)
