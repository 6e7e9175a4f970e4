"""Exact GP-UCB (Srinivas et al. 2010; Chowdhury & Gopalan 2017) -- the fair exact baseline.

The posterior of all ``A`` arms is kept current incrementally: each pull appends one row to the
Cholesky factor and one row to ``Q = L⁻¹ K_{X,A}`` (:meth:`torchbkb.ExactPosterior.watch`), so a step
costs ``O(A·n)`` time for ``n`` rows -- no refit, no ``n × n`` refactorization. Repeated pulls of the
same arm are merged: once the rows number ``2p`` (``p`` distinct pulled arms, and at least
:data:`COMPACT_MIN` rows more than ``p``) the posterior is refitted on the ``p`` distinct arms with their
pull counts and mean rewards (noise ``λ / n_i``, the same posterior exactly). That refit costs
``O(p³ + A·p²)`` once per ``≥ p`` pulls, so a step costs ``O(A·p)`` amortized, ``p <= min(t, A)`` --
the same use of pull counts as BKB's, so the exact baseline is not slowed by pulls it does not need
to remember one by one (GP-UCB on a finite arm set re-pulls its best arms most of the time). ``beta="theory"`` uses the
exact log-determinant ``log det(I + K_t/λ) = Σ_s log(1 + σ²_{s-1}(x_s))`` (RLS scale), accumulated as the
run goes, in the self-normalized width of :func:`torchbkb.bandits.confidence.gpucb_beta`. ``beta="practical"`` is the
width of the BKB authors' code with the exact variances (:func:`torchbkb.bandits.confidence.bkb_practical_beta`), so a
comparison with ``BKB(beta="practical")`` differs only in the posterior.

Example:
    >>> import torch
    >>> from torchbkb.bandits import GPUCB
    >>> from torchbkb.gp.kernels import GaussianKernel
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
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.bandits.base import KernelBandit
from torchbkb.bandits.confidence import bkb_practical_beta, gpucb_beta
from torchbkb.errors import NumericsError, nonfinite_rows_error
from torchbkb.gp.exact_posterior import ExactPosterior

__all__ = ["GPUCB", "COMPACT_MIN"]

#: Repeated pulls are merged only when they add at least this many rows beyond the distinct arms.
COMPACT_MIN = 16


class GPUCB(KernelBandit):
    """Exact GP-UCB over a finite arm set with incremental posterior updates.

    Args:
        arms: `(A, d)`.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        beta: constant width (RLS scale: ``UCB = μ + β σ``, ``σ² = var/λ``), ``"theory"`` or ``"practical"``.
        seed: generator seed (the first arm is uniform, as in BKB).
        noise_std, F, delta: parameters of the theory width (see :class:`~torchbkb.bandits.base.KernelBandit`).

    Attributes:
        log_det: ``Σ_s log(1 + σ²_{s-1}(x_s))`` so far.
        beta: the width used for the last selection.
        compactions: how many times repeated pulls were merged into counts (see the module docstring).
        nonfinite_arms: the arms whose kernel values ``k(a, ·)`` held NaN/inf: their rewards are counted (``counts``,
            ``history``) but left out of the posterior, and telling one again raises again.
    """

    beta_modes = ("theory", "practical")

    def __init__(self, arms: torch.Tensor, kernel: Callable, *, noise: float, beta: float | str = "theory",
                 seed: int | None = None, noise_std: float | None = None, F: float = 1.0, delta: float = 0.01):
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=noise_std, F=F, delta=delta)
        self.log_det = 0.0
        self.beta = float("nan")
        self.compactions = 0
        self._compacted_at = 0  # observations (history positions) folded into counts by the last compaction
        self.nonfinite_arms: set[int] = set()
        self._reset_posterior()

    def _reset_posterior(self) -> None:
        """The prior, watching every arm, with an empty tally of the observations it holds."""
        self._pulls: dict[int, list] = {}  # arm -> [count, reward sum] of the observations in the posterior
        self.posterior = ExactPosterior(self.kernel, noise=self.lam)
        empty = self.arms[:0]
        self.posterior.fit(empty, empty.new_zeros(0))
        with torch.no_grad():
            self.posterior.watch(self.arms)

    def current_beta(self) -> float:
        """The width for the next selection."""
        if self.beta_mode == "practical":
            rls = self.posterior.watched()[1].to(torch.float64) / self.lam
            n = self.counts.to(torch.float64)
            if self.nonfinite_arms:  # pulls the posterior does not hold
                n = n.index_fill(0, self._long(sorted(self.nonfinite_arms)), 0.0)
            deff = float((n * rls).sum())  # Σ_i n_i σ²ₜ(x_i) over the pulls the posterior holds
            return bkb_practical_beta(deff, self.t, noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta)
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
        start, bad = self.t - idx.numel(), []  # history position of the first told reward
        with torch.no_grad():
            for k, (i, yi) in enumerate(zip(idx.tolist(), y.tolist())):
                if not self._observe(i, yi):
                    bad.append(i)
                    continue
                self._tally(i, yi)
                self._compact_if_worth(start + k + 1)
        if bad:
            raise nonfinite_rows_error(bad)

    def _observe(self, arm: int, y: float | None) -> bool:
        """Condition the posterior on the reward ``y`` at ``arm`` (``None``: hallucinated) and, for a reward, add its
        term to :attr:`log_det`; ``False``, changing nothing, when the arm's kernel values hold NaN/inf (its reward
        is left out, as the sketched bandits leave out an arm whose kernel row is not finite)."""
        var = self.posterior.watched()[1][arm]
        yt = None if y is None else torch.tensor(y, dtype=self.arms.dtype, device=self.arms.device)
        try:
            self.posterior.update(self.arms[arm], yt)
        except NumericsError as err:
            if err.nonfinite:
                self.nonfinite_arms.add(arm)
                return False
            raise
        if y is not None:
            self.log_det += math.log1p(float(var) / self.lam)
        return True

    # ------------------------------------------------------------------ repeated pulls
    def _tally(self, arm: int, y: float) -> None:
        """Count one observation of ``arm`` (Python floats: the same sums live and on reloading)."""
        s = self._pulls.get(arm)
        if s is None:
            self._pulls[arm] = [1, y]
        else:
            s[0] += 1
            s[1] += y

    def _compact_if_worth(self, position: int) -> None:
        """Merge repeated pulls when the rows reach twice the distinct arms (``position``: observations so far)."""
        n, p = self.posterior.num_train, len(self._pulls)
        if n >= 2 * p and n - p >= COMPACT_MIN:
            self._fit_rows(self._distinct_rows())
            self.compactions += 1
            self._compacted_at = position

    def _distinct_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(arms (p,), mean rewards (p,), counts (p,))`` of the tallied observations, arms sorted."""
        arms = sorted(self._pulls)
        stats = torch.tensor([self._pulls[a] for a in arms], dtype=torch.float64).reshape(-1, 2)  # (p, 2)
        dev, dtype = self.arms.device, self.arms.dtype
        return self._long(arms), (stats[:, 1] / stats[:, 0]).to(dev, dtype), stats[:, 0].to(dev, dtype)

    def _fit_rows(self, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Refit the posterior on ``(arms, mean rewards, counts)`` and watch every arm again: ``O(n³ + A·n²)``."""
        idx, y, counts = rows
        with torch.no_grad():
            self.posterior.fit(self.arms[idx], y, counts)
            self.posterior.watch(self.arms)

    def _rows_from_history(self, done: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The posterior's rows after ``done`` told rewards: the compacted arms, then one row per later reward.

        Fills the (freshly reset) tally with the first ``done`` rewards as the run did (same order, same sums).
        """
        hist_i, hist_y = self.history["index"][:done], self.history["reward"][:done]
        c = min(self._compacted_at, done)
        if self.nonfinite_arms:  # left out of the posterior as they were told
            kept = [k for k, a in enumerate(hist_i) if a not in self.nonfinite_arms]
            c = sum(1 for k in kept if k < c)
            hist_i, hist_y = [hist_i[k] for k in kept], [hist_y[k] for k in kept]
        for i, yi in zip(hist_i[:c], hist_y[:c]):
            self._tally(i, yi)
        idx, y, counts = (self._distinct_rows() if c
                          else (self._long([]), self.arms.new_zeros(0), self.arms.new_zeros(0)))
        rest_i = self._long(hist_i[c:])
        rest_y = torch.tensor(hist_y[c:], dtype=torch.float64).to(self.arms.device, self.arms.dtype)
        for i, yi in zip(hist_i[c:], hist_y[c:]):
            self._tally(i, yi)
        return torch.cat([idx, rest_i]), torch.cat([y, rest_y]), torch.cat([counts, torch.ones_like(rest_y)])

    # ------------------------------------------------------------------ checkpoints
    def _algorithm_state(self) -> dict[str, Any]:
        return {"log_det": self.log_det, "beta": self.beta, "compactions": self.compactions,
                "compacted_at": self._compacted_at, "nonfinite_arms": sorted(self.nonfinite_arms)}

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.nonfinite_arms = {int(a) for a in state["nonfinite_arms"]}
        self.log_det, self.beta = float(state["log_det"]), float(state["beta"])
        self.compactions, self._compacted_at = int(state["compactions"]), int(state["compacted_at"])
        self._reset_posterior()
        told = len(self.history["index"])
        if told:  # the compacted arms with their counts, then the rows told since (rewards only)
            self._fit_rows(self._rows_from_history(told))
