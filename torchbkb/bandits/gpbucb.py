"""GP-BUCB (Desautels, Krause & Burdick 2014) with adaptive batches -- the exact batch baseline of 001.

Inside a batch the posterior mean is frozen at ``μ_fb`` and every pick is hallucinated into the exact
GP (``ExactPosterior.update(x, None)``: the Cholesky factor grows, the mean stays), so the in-batch
variances ``σ²_t`` are exact. The next pick is ``argmax μ_fb + α σ_t`` (RLS scale, ``σ² = var/λ``) and
the batch goes on while a product rule holds (the pick that crosses ``C̃`` is the batch's last), one of two:

* ``stop_rule="batch_start"`` -- ``Π_{s in batch} (1 + σ²_fb(x_s)) <= C̃`` with the variances at the batch
  start: 001 Sec. 3's statement of GP-BUCB's rule, the one it compares with BBKB's sum rule (by the
  Weierstrass product inequality it never gives longer batches than BBKB's for the same variances);
* ``stop_rule="in_batch"`` -- ``Π_{s in batch} (1 + σ²_{s-1}(x_s)) <= C̃`` with each pick's hallucinated
  variance when it was picked: Desautels et al.'s GP-AUCB, whose batch ends when the conditional mutual
  information ``½ Σ log(1 + σ²_{s-1}(x_s))`` exceeds their ``C`` (``C̃ = e^{2C}``). It gives longer batches.

Consecutive picks of the same arm (a batch that keeps choosing its best arm) share one hallucinated
row whose count grows (:meth:`~torchbkb.ExactPosterior.repeat_last`, ``O(A)`` instead of a new row's
``O(A·n)``). When the rewards arrive the hallucinated rows keep their place in the Cholesky factor and only get
their (mean) rewards (:meth:`~torchbkb.ExactPosterior.observe`, ``O(n² + A·n)``); if some picks were
discarded the hallucinations are undone (:meth:`~torchbkb.ExactPosterior.truncate`) and the told
rows are added again.

Cost: every in-batch pick is an eager ``O(A·n)`` update of all arms' exact variances (no lazy UCB:
the exact variance of an arm needs its whole column of ``L⁻¹ K_{X,A}``), like GP-UCB's step -- fine
for an exact baseline, not for large ``n``. As in :class:`~torchbkb.bandits.GPUCB`, repeated pulls are
merged into pull counts at a batch end once the rows reach twice the distinct arms, so ``n <= 2p``
(``p`` distinct pulled arms) plus the open batch.

``beta="theory"``: ``α = C̃ β`` with ``β`` of :func:`torchbkb.bandits.confidence.gpucb_beta` on the exact
``log det(I + K_t/λ) = Σ_s log(1 + σ²_{s-1}(x_s))`` (``σ²_{s-1}`` with the earlier picks of the batch
hallucinated) -- the same rescaling by ``C̃`` that 001 Theorem 2 applies to BBKB. A float ``beta`` is
``α`` itself.

Example:
    >>> import torch
    >>> from torchbkb.bandits import GPBUCB
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.linspace(0, 1, 100, dtype=torch.float64)[:, None]
    >>> f = torch.sin(6 * arms[:, 0])
    >>> bandit = GPBUCB(arms, GaussianKernel(0.2), noise=0.01, beta=0.1, batch_bound=2.0, seed=0)
    >>> while bandit.t < 40:
    ...     batch = bandit.ask(); bandit.tell(batch, f[batch])
    >>> bandit.batch_sizes[0], max(bandit.batch_sizes) > 1
    (1, True)
    >>> float(f.max() - f[bandit.ask()].min()) < 0.01
    True
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from itertools import groupby
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.bandits.gpucb import GPUCB
from torchbkb.bandits.batch_stop_rule import check_batch_limits, stop_rule_stalls
from torchbkb.bandits.confidence import bbkb_practical_beta
from torchbkb.errors import InputDataError, nonfinite_rows_error

__all__ = ["GPBUCB", "GPBUCB_STOP_RULES"]

#: the termination rules offered (see the module docstring)
GPBUCB_STOP_RULES = ("batch_start", "in_batch")


class GPBUCB(GPUCB):
    """Exact GP-BUCB with the adaptive product termination rule.

    Args:
        arms: `(A, d)`.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        beta: a float -- the multiplier ``α`` of ``σ`` (RLS scale) in the in-batch UCB --, ``"theory"``
            (``α = C̃ β_t``, see the module docstring) or ``"practical"`` (BBKB's width in the authors' code with
            the exact batch-start variances, :func:`~torchbkb.bandits.confidence.bbkb_practical_beta`).
        batch_bound: ``C̃ >= 1``; a batch continues while the product rule is ``<= C̃``.
        stop_rule: ``"batch_start"`` (001's statement, the default) or ``"in_batch"`` (Desautels et al.).
        max_batch_size: optional cap on the batch length. A pick with ``σ²_fb = 0`` ends the batch (every
            later pick would be that arm again), and so does one with ``σ²_fb`` so small that the rule would
            need more than 2²⁴ picks of it when there is no cap (as in
            :func:`~torchbkb.bandits.batch_selection.select_batch`).
        seed: generator seed (the first arm is uniform).
        noise_std, F, delta: parameters of the theory width.

    Attributes:
        beta: the multiplier ``α`` of the last batch.
        practical_sum: ``Σ_s log(1 + σ²_fb(x_s))`` over the told picks after the first batch (practical width).
        batch_sizes: length of every batch asked.
        time_in_batch: seconds spent selecting batches (hallucinated exact updates).
        time_update: seconds spent incorporating rewards.
    """

    def __init__(
        self,
        arms: torch.Tensor,
        kernel: Callable,
        *,
        noise: float,
        beta: float | str = "theory",
        batch_bound: float = 2.0,
        max_batch_size: int | None = None,
        seed: int | None = None,
        noise_std: float | None = None,
        F: float = 1.0,
        delta: float = 0.01,
        stop_rule: str = "batch_start",
    ):
        if stop_rule not in GPBUCB_STOP_RULES:
            raise InputDataError(f"stop_rule: expected one of {list(GPBUCB_STOP_RULES)}, got {stop_rule!r}")
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=noise_std, F=F, delta=delta)
        self.batch_bound, self.max_batch_size = check_batch_limits(batch_bound, max_batch_size)
        self.stop_rule = stop_rule
        self.practical_sum = 0.0
        self._batch_fb: list[float] = []  # σ²_fb(x_t) of each pick (RLS scale)
        self.batch_sizes: list[int] = []
        self.time_in_batch = 0.0
        self.time_update = 0.0
        self._batch: list[int] = []  # picks of the open batch, in order
        self._batch_rls: list[float] = []  # σ²_{t-1}(x_t) of each pick when it was picked (RLS scale)
        self._n_fb = 0  # rows of the posterior at the batch start

    @property
    def in_batch_rls(self) -> list[float]:
        """``σ²_{t-1}(x_t)`` (RLS scale) of each pick of the last batch, at the moment it was picked."""
        return list(self._batch_rls)

    def current_beta(self) -> float:
        """The multiplier ``α`` of the next batch."""
        if self.beta_mode == "practical":
            return bbkb_practical_beta(self.practical_sum, noise_std=self.noise_std, lam=self.lam, F=self.F,
                                       delta=self.delta, batch_bound=self.batch_bound)
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        return self.batch_bound * super().current_beta()

    def _select(self) -> torch.Tensor:
        start = time.perf_counter()
        self.beta = self.current_beta()
        post = self.posterior
        self._n_fb = post.num_train
        if self.t == 0:
            picks = [int(self._random_arm())]
            self._batch_rls = [float(self.kdiag[picks[0]]) / self.lam]
            self._batch_fb = list(self._batch_rls)
        else:
            mean_fb, var_fb = post.watched()
            mean_fb = self._mask_excluded(mean_fb.clone())  # frozen; hallucinations leave it unchanged anyway
            rls_fb = (var_fb / self.lam).tolist()
            picks, in_batch, level = [], [], 1.0
            with torch.no_grad():
                while True:
                    rls_t = post.watched()[1] / self.lam  # exact, with the earlier picks hallucinated
                    i = int(torch.argmax(mean_fb + self.beta * rls_t.sqrt()))  # lowest index on ties
                    picks.append(i)
                    in_batch.append(float(rls_t[i]))
                    s_i = rls_fb[i] if self.stop_rule == "batch_start" else in_batch[-1]
                    # a term 0, or ≈ 0 and no cap: the product would (practically) never pass C̃ and the
                    # picks would be x_i again and again (in-batch terms only shrink) -- the batch ends here
                    stalled = (s_i <= 0.0
                               or (self.max_batch_size is None
                                   and stop_rule_stalls(level, s_i, self.batch_bound, "product")))
                    level *= 1.0 + s_i
                    if (stalled or level > self.batch_bound
                        or (self.max_batch_size is not None and len(picks) >= self.max_batch_size)):
                        break
                    if len(picks) >= 2 and picks[-2] == i:
                        post.repeat_last()  # the same arm again: its hallucinated row's count + 1, O(A)
                    elif not self._observe(i, None):  # hallucinate: O(A·n)
                        break  # its kernel values hold NaN/inf: the batch ends with it, and its tell raises
            self._batch_rls = in_batch
            self._batch_fb = [rls_fb[i] for i in picks]
        self._batch = picks
        self.batch_sizes.append(len(picks))
        self.time_in_batch += time.perf_counter() - start
        return self._long(picks)

    def _update(self) -> None:
        start = time.perf_counter()
        idx, y = self.last_told
        told = list(zip(idx.tolist(), y.tolist()))
        if told and self.t > len(told):  # the practical width's sum, from the second told batch on
            fb = dict(zip(self._batch, self._batch_fb))
            self.practical_sum += sum(math.log1p(max(fb[a], 0.0)) for a, _ in told)
        hallucinated = _runs(self._batch[:-1])  # rows n_fb, n_fb + 1, ...: (arm, picks merged in the row)
        where: dict[int, deque[int]] = defaultdict(deque)  # arm -> its positions in told, in order
        for k, (a, _) in enumerate(told):
            where[a].append(k)
        matched: set[int] = set()
        rows_y: list[float] = []
        for arm, c in hallucinated:  # match each hallucinated row with the first c unmatched told rewards of its arm
            if len(where[arm]) < c:
                break
            ks = [where[arm].popleft() for _ in range(c)]
            matched.update(ks)
            rows_y.append(sum(told[k][1] for k in ks) / c)  # the row's mean reward
        told = [t for k, t in enumerate(told) if k not in matched]  # O(k) for a batch of k, told in any order
        post, dtype = self.posterior, self.arms.dtype
        with torch.no_grad():
            if len(rows_y) == len(hallucinated):  # every hallucinated pick was told: keep the rows
                if rows_y:
                    rows = torch.arange(self._n_fb, self._n_fb + len(rows_y))
                    post.observe(rows, torch.tensor(rows_y, dtype=dtype, device=self.arms.device))
                self.log_det += sum(math.log1p(max(r, 0.0)) for r in self._batch_rls[: len(self._batch) - 1])
            else:  # some pick was discarded: undo the hallucinations, add the told rows
                post.truncate(self._n_fb)
                told = list(zip(idx.tolist(), y.tolist()))
            bad = [arm for arm, yi in told if not self._observe(arm, yi)]  # the last pick (and any not hallucinated)
            for arm, yi in zip(idx.tolist(), y.tolist()):
                if arm not in bad:  # an arm with NaN/inf kernel values is left out
                    self._tally(arm, yi)
            self._compact_if_worth(self.t)  # no hallucinated row is left: merge repeated pulls if worth it
        self._batch, self._batch_rls, self._batch_fb = [], [], []
        self.time_update += time.perf_counter() - start
        if bad:
            raise nonfinite_rows_error(bad)

    # ------------------------------------------------------------------ checkpoints
    def _algorithm_state(self) -> dict[str, Any]:
        state = super()._algorithm_state()
        state.update(
            batch=list(self._batch),
            batch_rls=list(self._batch_rls),
            batch_fb=list(self._batch_fb),
            practical_sum=self.practical_sum,
            batch_sizes=list(self.batch_sizes),
            time_in_batch=self.time_in_batch,
            time_update=self.time_update,
        )
        return state

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.nonfinite_arms = {int(a) for a in state["nonfinite_arms"]}
        self.log_det, self.beta = float(state["log_det"]), float(state["beta"])
        self._batch, self._batch_rls = list(state["batch"]), list(state["batch_rls"])
        self._batch_fb = list(state["batch_fb"])
        self.practical_sum = float(state["practical_sum"])
        self.batch_sizes = list(state["batch_sizes"])
        self.time_in_batch, self.time_update = float(state["time_in_batch"]), float(state["time_update"])
        # the rows of the completed batches: the history minus what was told of the open batch
        done = len(self.history["index"]) - len(self._told_idx)
        self.compactions, self._compacted_at = int(state["compactions"]), int(state["compacted_at"])
        self._reset_posterior()
        with torch.no_grad():
            if done:  # the compacted arms with their counts, then one row per reward told since
                self._fit_rows(self._rows_from_history(done))
            self._n_fb = self.posterior.num_train
            if self._pending or self._told_idx:  # an open batch: hallucinate its picks again
                for arm, c in _runs(self._batch[:-1]):
                    self.posterior.update(self.arms[arm], None)
                    for _ in range(c - 1):
                        self.posterior.repeat_last()


def _runs(picks: list[int]) -> list[tuple[int, int]]:
    """``[(arm, count), ...]``: the runs of equal consecutive picks (one hallucinated row each)."""
    return [(a, sum(1 for _ in run)) for a, run in groupby(picks)]
