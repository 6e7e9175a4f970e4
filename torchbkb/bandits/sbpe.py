"""S-BPE -- sparse batched pure exploration (003 Sec. 5.1, Appendix B Algorithm 1).

Over a budget of ``N`` evaluations, batches of lengths ``N_i = ⌈√(N · N_{i-1})⌉`` (``N_0 = 1``; the last
one truncated to what is left; ``B ≈ log log N + 1`` batches, :func:`sbpe_batch_sizes`). Batch ``i``:

1. **explore** the active set ``X_i`` (all arms at first): ``N_i`` picks
   ``x_j = argmax_{x ∈ X_i} σ̄_{j-1,i}(x)``, where ``σ̄_{j-1,i}`` is the sparse (DTC) posterior standard
   deviation given *only this batch's* previous picks and inducing points drawn by recursive RLS over
   them (:class:`~torchbkb.bandits.design.UncertaintyExplorer`). No reward enters -- the reason the intervals
   below stay valid (Remark 5.1) -- so the whole batch is known at once and :meth:`~SBPE.ask`
   returns it;
2. **observe** the batch's rewards (``tell``);
3. **eliminate** (Algorithm 1, lines 16-17): redraw the inducing points by recursive RLS over the
   batch's points, fit ``μ̄_{N_i,i}``, ``σ̄_{N_i,i}`` on this batch alone, and keep
   ``X_{i+1} = {x ∈ X_i : u_i(x) >= max_{x' ∈ X_i} l_i(x')}`` with, for ``interval="finite"`` (Eq. 13)::

       u_i, l_i = μ̄ ± β σ̄,        β = β(δ / (4B|X|))   of Theorem 3.5
                                  = vakili_beta_finite(δ/(2B), |X|, C_k, R, τ², λ_max)

   or, for ``interval="continuous"`` (Eq. 15, the arms a discretization of a continuous domain;
   Corollary 3.7 with the constant ``c`` of Assumption 3.6)::

       u_i, l_i = μ̄ ± (2/N_i + β̃ (σ̄ + 2/√N_i)),
       β̃ = β̃_{N_i}(δ/(4B)) = vakili_beta_continuous(δ/(2B), N_i, ...)

   ``λ_max`` is, by default, *measured* for the dictionary actually drawn (Lanczos on the residual
   ``K_X - K_XZ K_Z⁺ K_ZX`` of the batch, :func:`~torchbkb.sampling.recursive_rls.nystrom_lambda_max`), so the
   width is that of Theorem 3.5 whether or not the practical recursive-RLS constants achieved Lemma
   3.8's ``λ_max <= τ²``; ``lambda_max="lemma"`` plugs ``τ²`` (the paper's ``3 C_k``).

A float ``beta`` replaces β (resp. β̃) by that constant (GP scale), for practical runs.

Budget: :meth:`~SBPE.ask` never asks more than the remaining budget (asked points count, told or
discarded); once the budget is spent, ``ask()`` raises :class:`~torchbkb.errors.TorchBKBError` -- use
:meth:`~SBPE.recommend` for the final answer (the active arm with the largest lower bound).

Example:
    >>> import torch
    >>> from torchbkb.bandits import SBPE
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.linspace(0, 1, 60, dtype=torch.float64)[:, None]
    >>> f = torch.sin(6 * arms[:, 0])
    >>> bandit = SBPE(arms, GaussianKernel(0.2), noise=1e-4, budget=100, rkhs_norm=3.0, seed=0)
    >>> while bandit.remaining:
    ...     i = bandit.ask(); bandit.tell(i, f[i])
    >>> bandit.batch_sizes, int(bandit.active.sum()) < 10, float(f.max() - f[bandit.recommend()]) < 0.01
    ([10, 32, 57, 1], True, True)
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.bandits.base import KernelBandit
from torchbkb.bandits.confidence import vakili_beta_continuous, vakili_beta_finite, vakili_continuous_halfwidth
from torchbkb.bandits.design import UncertaintyExplorer, theory_rls_delta
from torchbkb.bandits.sketched_fit import sketched_fit
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.errors import (InputDataError, NumericsError, TorchBKBError, check_int, check_positive,
                             nonfinite_rows_error)
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.sampling.recursive_rls import DEFAULT_OVERSAMPLE, check_oversample, nystrom_lambda_max

__all__ = ["SBPE", "sbpe_batch_sizes"]


def sbpe_batch_sizes(budget: int) -> list[int]:
    """Batch lengths of Algorithm 1: ``N_0 = 1``, ``N_i = ⌈√(N · N_{i-1})⌉``, the last one truncated so
    that they sum to ``N`` (exact integer arithmetic).

    Args:
        budget: ``N >= 1``.

    Returns:
        The list ``[N_1, ..., N_B]`` (last one truncated), summing to ``N``.

    Example:
        >>> sbpe_batch_sizes(1000)            # 32, 179, 424, then 365 of 652
        [32, 179, 424, 365]
    """
    check_int(budget, "budget")
    sizes, prev, left = [], 1, budget
    while left > 0:
        x = budget * prev
        r = math.isqrt(x)
        nxt = r if r * r == x else r + 1  # ⌈√x⌉
        sizes.append(min(nxt, left))
        left -= sizes[-1]
        prev = nxt
    return sizes


class SBPE(KernelBandit):
    """Sparse batched pure exploration (003 Algorithm 1) over a finite arm set.

    Args:
        arms: `(A, d)` arm set.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``τ² > 0``, the regularization (GP noise variance) of the sparse posterior.
        budget: ``N``, the total number of evaluations (fixes the batch schedule and ``B``).
        rkhs_norm: ``C_k``, the bound on ``‖f‖_{H_k}`` (Assumption 3.3).
        subgaussian: ``R``, the noise's sub-Gaussian parameter (Assumption 3.4; default ``τ``).
        delta: ``δ``, the total failure probability of the intervals.
        seed: seed of the bandit's generator (the recursive-RLS draws).
        beta: ``"theory"`` (β of Eq. 13 / β̃ of Eq. 15) or a constant GP-scale width ``>= 0``.
        lambda_max: ``"measured"`` (default, Lanczos on the batch's Nyström residual), ``"lemma"``
            (``τ²``, Lemma 3.8) or a number ``>= 0``.
        interval: ``"finite"`` (Eq. 13, Theorem 5.2) or ``"continuous"`` (Eq. 15, Theorem 5.3).
        discretization_c: ``c`` of Assumption 3.6 (``"continuous"`` only).
        oversample: recursive-RLS oversampling, a float or ``"theory"`` (Algorithm 2's constants with
            Theorem 5.2's ``δ_j = 3δ/(π² B j²)``), see :func:`~torchbkb.sampling.recursive_rls.recursive_rls`.
        base_size: recursive-RLS base-case size (practical constants).
        refresh: in-batch picks between two recursive-RLS redraws (1 = Algorithm 1 line 6 verbatim; see
            :class:`~torchbkb.bandits.design.UncertaintyExplorer`).
        chunk_size: arms embedded/scored at once.

    Attributes:
        active: `(A,)` bool, the arms still potential maximizers (``X_i``).
        schedule: ``[N_1, ..., N_B]`` from :func:`sbpe_batch_sizes`.
        num_batches: ``B``.
        asked: evaluations asked so far; ``remaining = budget - asked``.
        upper, lower: `(A,)` ``u_i``, ``l_i`` of the last elimination (``nan`` for arms not active then).
        best_lower: `(A,)` ``max_i l_i`` over the finished batches (``-inf`` before any).
        betas, lambda_maxes, dictionary_sizes, active_sizes: per finished batch, the width used, the
            ``λ_max`` used, the final dictionary size and ``|X_{i+1}|``.
        posterior: the last batch's :class:`~torchbkb.DTCPosterior` (``None`` before the first
            elimination or after loading a checkpoint).
        nonfinite_arms: arms whose kernel values held NaN/inf (named by the ``NumericsError`` of the ``ask`` or
            ``tell`` that met them): left out of every later batch, fit and elimination (their ``upper``/``lower``
            stay ``nan``); a ``tell`` eliminates on the batch's other arms, then raises.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> b = SBPE(torch.rand(30, 2, dtype=torch.float64), GaussianKernel(0.3), noise=0.01, budget=20)
        >>> b.schedule, len(b.ask())
        ([5, 10, 5], 5)
    """

    nan_fields = ("upper", "lower")  #: ``nan`` for the arms the last elimination did not score

    def __init__(
        self,
        arms: torch.Tensor,
        kernel: Callable,
        *,
        noise: float,
        budget: int,
        rkhs_norm: float = 1.0,
        subgaussian: float | None = None,
        delta: float = 0.01,
        seed: int | None = None,
        beta: float | str = "theory",
        lambda_max: float | str = "measured",
        interval: str = "finite",
        discretization_c: float = 1.0,
        oversample: float | str = DEFAULT_OVERSAMPLE,
        base_size: int | None = None,
        refresh: int = 1,
        chunk_size: int = DEFAULT_CHUNK,
    ):
        self.schedule = sbpe_batch_sizes(budget)
        if isinstance(lambda_max, str):
            if lambda_max not in ("measured", "lemma"):
                raise InputDataError(f"lambda_max: expected 'measured', 'lemma' or a number >= 0, got {lambda_max!r}")
        elif (isinstance(lambda_max, bool) or not isinstance(lambda_max, (int, float))
              or not (0.0 <= float(lambda_max) < math.inf)):
            raise InputDataError(f"lambda_max: expected 'measured', 'lemma' or a number >= 0, got {lambda_max!r}")
        if interval not in ("finite", "continuous"):
            raise InputDataError(f"interval: expected 'finite' or 'continuous', got {interval!r}")
        check_positive(discretization_c, "discretization_c")
        check_oversample(oversample)
        check_int(refresh, "refresh")
        if (subgaussian is not None
            and not (isinstance(subgaussian, (int, float)) and 0.0 <= float(subgaussian) < math.inf)):
            raise InputDataError(f"subgaussian: expected a finite number >= 0, got {subgaussian!r}")
        if not (isinstance(rkhs_norm, (int, float)) and 0.0 <= float(rkhs_norm) < math.inf):
            raise InputDataError(f"rkhs_norm: expected a finite number >= 0, got {rkhs_norm!r}")
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=subgaussian, F=float(rkhs_norm),
                         delta=delta)
        self.budget = int(budget)
        self.num_batches = len(self.schedule)
        self.lambda_max_mode = lambda_max
        self.interval = interval
        self.discretization_c = float(discretization_c)
        self.oversample = oversample
        self.base_size = base_size
        self.refresh = int(refresh)
        self.chunk_size = int(chunk_size)
        self.active = torch.ones(self.num_arms, dtype=torch.bool, device=arms.device)
        self.asked = 0
        nan = torch.full((self.num_arms,), float("nan"), dtype=arms.dtype, device=arms.device)
        self.upper, self.lower = nan.clone(), nan.clone()
        self.best_lower = torch.full_like(nan, -math.inf)
        self.betas: list[float] = []
        self.lambda_maxes: list[float] = []
        self.dictionary_sizes: list[int] = []
        self.active_sizes: list[int] = []
        self.posterior: DTCPosterior | None = None
        self._dict_size = 0
        self._rls_delta = theory_rls_delta(self.delta, self.num_batches)
        self.nonfinite_arms: set[int] = set()

    # ------------------------------------------------------------------ properties
    @property
    def rkhs_norm(self) -> float:
        """``C_k``."""
        return self.F

    @property
    def subgaussian(self) -> float:
        """``R``."""
        return self.noise_std

    @property
    def remaining(self) -> int:
        """Evaluations left to ask."""
        return self.budget - self.asked

    @property
    def batch_sizes(self) -> list[int]:
        """Lengths of the batches asked so far."""
        return self.schedule[: self.batch_id]

    @property
    def dictionary_size(self) -> int:
        """Inducing points of the current batch's sparse posterior (exploration or final)."""
        return self._dict_size

    def recommend(self) -> torch.Tensor:
        """`(1,)` long: the active arm with the largest lower bound ``max_i l_i(x)`` over the finished
        batches (every ``l_i`` is valid on the same event, and a short truncated last batch alone gives
        loose bounds); before any elimination, the lowest active index."""
        act = self.active.nonzero().squeeze(1)
        best = self.best_lower[act]
        if bool(torch.isinf(best).all()):
            return act[:1]
        return act[torch.argmax(best)].reshape(1)

    # ------------------------------------------------------------------ algorithm
    def _select(self) -> torch.Tensor:
        if self.remaining <= 0:
            raise TorchBKBError(f"SBPE: budget of {self.budget} evaluations exhausted (expected ask() only while "
                                f"remaining > 0); use recommend()")
        n_i = self.schedule[self.batch_id]  # batch_id batches asked so far
        act = (self.active & ~self.excluded & ~self._nonfinite()).nonzero().squeeze(1)  # (A_i,): not failing arms
        if act.numel() == 0:
            self._allowed()  # raises: every arm was excluded
            raise TorchBKBError("SBPE: expected an active arm that is not excluded, got none (all remaining active "
                                "arms kept failing)")
        explorer = UncertaintyExplorer(
            self.arms[act],
            self.kernel,
            self.lam,
            oversample=self.oversample,
            base_size=self.base_size,
            rls_delta=self._rls_delta,
            refresh=self.refresh,
            generator=self.generator,
            chunk_size=self.chunk_size,
        )
        try:
            picks = explorer.run(n_i)  # (N_i,) variance-only: no reward used
        except NumericsError as err:  # named candidates: left out from now on, the ask raises naming them as arms
            if not err.arms:
                raise
            arms = act[list(err.arms)].tolist()
            self.nonfinite_arms.update(arms)
            raise nonfinite_rows_error(arms) from None
        self._dict_size = explorer.dictionary_size
        self.asked += n_i
        return act[picks]

    def _update(self) -> None:
        idx, y = self.last_told
        ids = self.last_told_ids
        named = {a for a in ids if a in self.nonfinite_arms}  # told after they were named: left out, then raised
        with torch.no_grad():
            while True:  # each failed fit names arms and leaves them out: at most one pass more per bad arm
                kept = [j for j, a in enumerate(ids) if a not in self.nonfinite_arms]
                if not kept or not bool((self.active & ~self._nonfinite()).any()):  # nothing to learn or score
                    if named:
                        raise nonfinite_rows_error(sorted(named))
                    return
                X, n_b = self.arms[idx[kept]], len(kept)  # (n_b, d): this batch only
                try:
                    indices, emb, post = sketched_fit(
                        X, y[kept].to(self.arms.dtype), self.kernel, self.lam, names=[ids[j] for j in kept],
                        oversample=self.oversample, base_size=self.base_size, delta=self._rls_delta(n_b),
                        generator=self.generator, chunk_size=self.chunk_size)
                    break
                except NumericsError as err:
                    if not err.arms:
                        raise
                    self.nonfinite_arms.update(err.arms)
                    named.update(err.arms)
            S = X[indices]
            act = (self.active & ~self._nonfinite()).nonzero().squeeze(1)
            mean, rls = post.score_embedded(emb(self.arms[act]), self.kdiag[act])
            ok = torch.isfinite(mean) & torch.isfinite(rls)
            if not bool(ok.all()):  # arms whose kernel values against this batch's dictionary are NaN/inf
                bad = act[~ok].tolist()
                self.nonfinite_arms.update(bad)
                named.update(bad)
                act, mean, rls = act[ok], mean[ok], rls[ok]
                if act.numel() == 0:
                    raise nonfinite_rows_error(sorted(named))
            std = (rls * self.lam).sqrt()  # GP-scale σ̄
            lam_max = self._lambda_max(X, S)
            beta = self._beta(n_b, lam_max)
            if self.interval == "finite":
                half = beta * std
            else:
                half = vakili_continuous_halfwidth(std, n_b, beta)
            upper, lower = mean + half, mean - half
            keep = upper >= lower.max()  # X_{i+1} = {x ∈ X_i : u_i(x) >= max l_i}
        self.upper.fill_(float("nan"))
        self.lower.fill_(float("nan"))
        self.upper[act], self.lower[act] = upper.to(self.upper.dtype), lower.to(self.lower.dtype)
        self.best_lower[act] = torch.maximum(self.best_lower[act], self.lower[act])
        self.active[act[~keep]] = False
        self.posterior = post
        self._dict_size = int(indices.numel())
        self.betas.append(beta)
        self.lambda_maxes.append(lam_max)
        self.dictionary_sizes.append(self._dict_size)
        self.active_sizes.append(int(self.active.sum()))
        if named:
            raise nonfinite_rows_error(sorted(named))

    def _nonfinite(self) -> torch.Tensor:
        """`(A,)` bool mask of :attr:`nonfinite_arms`."""
        mask = torch.zeros(self.num_arms, dtype=torch.bool, device=self.arms.device)
        if self.nonfinite_arms:
            mask[self._long(sorted(self.nonfinite_arms))] = True
        return mask

    def _lambda_max(self, X: torch.Tensor, S: torch.Tensor) -> float:
        if self.lambda_max_mode == "measured":
            return nystrom_lambda_max(X, self.kernel, S, chunk_size=min(self.chunk_size, 2048))
        if self.lambda_max_mode == "lemma":
            return self.lam
        return float(self.lambda_max_mode)

    def _beta(self, n_b: int, lam_max: float) -> float:
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        d = self.delta / (2.0 * self.num_batches)  # two-sided, union over B batches (Appendix H)
        if self.interval == "finite":
            return vakili_beta_finite(d, self.num_arms, self.F, self.noise_std, self.lam, lam_max)
        return vakili_beta_continuous(
            d, n_b, self.F, self.noise_std, self.lam, lam_max, dim=int(self.arms.shape[1]), c=self.discretization_c,
            kmax=self.kappa2
        )

    # ------------------------------------------------------------------ checkpoints
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of an SBPE built with the same arguments (same budget)."""
        got = state.get("algorithm", {}).get("budget") if isinstance(state, dict) else None
        if state.get("class") == type(self).__name__ and got != self.budget:
            raise InputDataError(f"state: expected an SBPE checkpoint with budget {self.budget}, got budget {got}")
        super().load_state_dict(state)

    def _algorithm_state(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "active": self.active.cpu().clone(),
            "asked": self.asked,
            "upper": self.upper.cpu().clone(),
            "lower": self.lower.cpu().clone(),
            "best_lower": self.best_lower.cpu().clone(),
            "betas": list(self.betas),
            "lambda_maxes": list(self.lambda_maxes),
            "dictionary_sizes": list(self.dictionary_sizes),
            "active_sizes": list(self.active_sizes),
            "dict_size": self._dict_size,
            "nonfinite_arms": sorted(self.nonfinite_arms),
        }

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.active = state["active"].to(self.arms.device)
        self.asked = int(state["asked"])
        self.upper = state["upper"].to(self.arms.device)
        self.lower = state["lower"].to(self.arms.device)
        self.best_lower = state["best_lower"].to(self.arms.device)
        self.betas = list(state["betas"])
        self.lambda_maxes = list(state["lambda_maxes"])
        self.dictionary_sizes = list(state["dictionary_sizes"])
        self.active_sizes = list(state["active_sizes"])
        self._dict_size = int(state["dict_size"])
        self.nonfinite_arms = {int(a) for a in state["nonfinite_arms"]}
        self.posterior = None
