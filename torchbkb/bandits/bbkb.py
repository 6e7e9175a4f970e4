"""BBKB -- batch budgeted kernel bandit (001, Algorithm 1): adaptive batches, delayed resparsification.

A batch starts from the posterior of the last resparsification (dictionary ``S_fb``, mean ``μ̃_fb``,
RLS variances ``σ̃²_fb``, all cached for every arm). Inside the batch
(:func:`~torchbkb.bandits.batch_selection.select_batch`):

* the dictionary and the mean stay fixed; each pick is hallucinated into ``V`` by a rank-one update
  (no reward), so the in-batch variances ``σ̃²_t`` are exactly those of a DTC posterior on ``S_fb``
  refitted with the picks (``DTCPosterior.update(x, y=None)``);
* the UCB is ``μ̃_fb + α̃ σ̃_t``; UCBs only decrease, so after a pick only the arms whose stale UCB is at
  least the chosen arm's new UCB are recomputed (lazy UCB: ``O(A·m)`` at most, usually far less); a run
  of repeated picks of one arm (most of a late batch) is decided at once in closed form, and only the
  features of the arms read are computed (:class:`~torchbkb.bandits.kernel_rows.FeatureRows`);
* the batch goes on while ``1 + Σ_{s in batch} σ̃²_fb(x_s) <= C̃``; the pick that crosses ``C̃`` is
  the last one of the batch (Algorithm 1, line 5).

When every point of the batch is told (or discarded), the dictionary is resampled from the pulled
arms with probabilities ``min(1, q̄ σ̃²_fb)`` (per pull), the kernel rows are updated (only if the
dictionary changed), ``V`` and the mean are refitted from the pull counts and the arms are rescored --
the same code as BKB (:class:`~torchbkb.bandits.sketched.SketchedKernelBandit`). Since the batch's multiplier
``α̃`` is known at that point, only the arms whose UCB bound ``μ̃ + α̃ √(k/λ)`` reaches the largest mean get
a variance, and the batch is selected among them: an in-batch UCB never falls below the mean, so no
other arm can be picked (``prune``; on Cadata about a tenth of the arms). The first batch is one
uniform arm and ``S_1 = {x_1}``.

Memory: the kernel rows ``k(s, arms)`` of the dictionary and the embedding ``z(arms)`` are cached,
`(m, A)` and `(A, m)` in the arms' dtype (so only the points entering the dictionary cost kernel
evaluations at a resparsification); float32 arms halve it, the `m × m` factorizations stay float64.

Checkpoints: :meth:`state_dict` can be taken at any time, including between ``ask`` and the last
``tell`` of a batch (the pending arms are restored and the batch completes identically);
:func:`torchbkb.run` writes one after every batch.

Example:
    >>> import torch
    >>> from torchbkb.bandits import BBKB
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(500, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = 1 - ((arms - 0.3) ** 2).sum(-1)
    >>> bandit = BBKB(arms, GaussianKernel(0.3), noise=0.01, beta=0.05, batch_bound=2.0, seed=0)
    >>> while bandit.t < 300:
    ...     batch = bandit.ask(); bandit.tell(batch, f[batch])
    >>> max(bandit.batch_sizes) > 10, bandit.num_resparsifications < 100    # batches grow
    (True, True)
    >>> float(f.max() - f[bandit.ask()].min()) < 0.05
    True
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.bandits.kernel_row_cache import ROW_CACHE_BYTES
from torchbkb.bandits.sketched import SketchedKernelBandit
from torchbkb.bandits.batch_selection import BatchSelection, select_batch
from torchbkb.bandits.batch_stop_rule import check_batch_limits
from torchbkb.bandits.confidence import bbkb_beta, bbkb_practical_beta
from torchbkb.bandits import device_batch
from torchbkb.bandits.pick_graph import PickGraphs
from torchbkb.bandits.deferred_update import DeferredBatchUpdate, SettledAttribute
from torchbkb.bandits.fantasy_batch import FeatureReader, check_q, select_fixed_batch
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION
from torchbkb.bandits.theorems import warn_unmet_preconditions

__all__ = ["BBKB"]


class BBKB(DeferredBatchUpdate, SketchedKernelBandit):
    """Batch budgeted kernel bandit (BBKB).

    Args:
        arms: `(A, d)` arm set (only `(A, m)` features and a few `(A,)` vectors are kept).
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling (001 Theorem 2 asks
            ``q̄ >= 72 C̃ log(4T/δ)``; the paper's experiments use ``q̄ = 2``).
        beta: ``"theory"`` -- the batch multiplier is ``α̃ = C̃ β̃_fb`` with ``β̃_fb`` of 001 Theorem 2
            (:func:`torchbkb.bandits.confidence.bbkb_beta`); or a float, which **is** the multiplier ``α̃`` of
            ``σ̃`` in the in-batch UCB ``μ̃_fb + α̃ σ̃_t`` (RLS scale; ``C̃`` does not multiply it, so a
            user tunes the exploration actually used). A GP-scale multiplier ``b`` (``μ + b·σ_GP``) is
            ``α̃ = b·√λ`` since ``σ_GP = √λ σ̃``.
            ``"practical"``: the authors' code, ``√λ F + ξ √(C̃ L + log 1/δ)`` with ``L`` the attribute
            :attr:`practical_sum` (:func:`~torchbkb.bandits.confidence.bbkb_practical_beta`), used as ``α̃`` as it is.
        batch_bound: ``C̃ >= 1``; a batch continues while ``1 + Σ_{s in batch} σ̃²_fb(x_s) <= C̃``
            (``C̃ = 1`` gives batches of one).
        max_batch_size: optional cap on the batch length. Without it a pick
            whose ``σ̃²_fb`` is 0, or ≈ 0 next to ``C̃`` (the rule would need more than 2²⁴ picks of it), ends
            the batch (see :func:`~torchbkb.bandits.batch_selection.select_batch`).
        batch_size: a fixed batch size (a fixed pool of workers) instead of 001's adaptive rule: every batch
            (after the uniform first one) is ``batch_size`` distinct arms, picked greedily by the same UCB with
            each pick an exact fantasy of the DTC posterior (:mod:`torchbkb.bandits.fantasy_batch`); ``C̃`` then only
            scales the ``"theory"`` width.
        seed: generator seed (first arm, dictionary draws).
        F: bound on ``‖f‖_H`` (theory β).
        delta: failure probability (theory β).
        noise_std: ``ξ`` of the theory β (default ``√λ``).
        lazy: lazy UCB updates inside a batch (``False`` recomputes every arm after each pick: the
            same batches, slower -- for testing). On a GPU a batch over features held in memory is selected by
            :func:`~torchbkb.bandits.device_batch.run_batch_on_device` instead (every arm per pick, no host read;
            the attribute ``device_loop`` switches it).
        chunk_size: arms scored at once (``None``: sized for the device, see
            :func:`~torchbkb.gp.scoring_chunk.scoring_chunk`).
        row_cache_bytes: memory for the kernel rows of the pulled arms (see
            :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`).
        prune: at a resparsification, score the variance only of the arms whose UCB bound
            ``μ̃ + α̃ √(k/λ)`` reaches the largest mean, and select the batch among them: no other arm can
            be picked in the batch, since in-batch UCBs never fall below the mean (see
            :class:`~torchbkb.bandits.sketched.SketchedKernelBandit`; ``False`` scores every arm -- the same
            batches, slower).
        inclusion: how an arm pulled ``n`` times enters the dictionary: ``"count_scaled"`` (default,
            ``min(1, q̄·n·σ̃²)``, the authors' code) or ``"per_pull"`` (``1 - (1 - p)^n``, 000 Algorithm 1 read
            literally); see :mod:`torchbkb.sampling.rls_dictionary`.
        horizon: the run's length ``T``, if known: ``beta="theory"`` warns
            (:class:`~torchbkb.errors.TheoryWarning`) when ``q̄`` or ``λ`` is below 001 Theorem 2's requirement
            (:func:`~torchbkb.bandits.theorems.bbkb_required_q_bar`; without it, for ``T = 1``).

    Attributes:
        dictionary: `(m,)` long, arm indices of the dictionary ``S_fb``.
        beta: the multiplier ``α̃`` used for the last batch.
        beta_tilde: ``β̃_fb`` of the last batch (``nan`` with a constant ``beta``).
        log_sum: ``Σ_s log(1 + 3 σ̃²_{fb[s-1]}(x_s))`` over the told points (the theory β's sum).
        practical_sum: ``L = Σ_s log(1 + σ̃²_fb(x_s))`` over the told points after the first batch (the practical
            width's sum; the authors' initialization with one arm adds ``n σ̃² log 1 = 0``).
        batch_sizes: length of every batch asked, in order.
        num_resparsifications: dictionary resamplings (one per completed batch).
        embeddings_computed: dictionary changes (kernel rows updated, ``K_S`` refactored) at batch ends.
        ucb_evaluations: UCBs recomputed inside batches, in total (lazy: far below ``A·T``).
        time_in_batch: seconds spent selecting batches (hallucinated updates, lazy UCB).
        time_resparsify: seconds spent at batch ends (resampling, kernel rows and ``K_S``, refit, rescoring).
        last_selection: the :class:`~torchbkb.bandits.batch_selection.BatchSelection` of the last batch
            (in-batch variances of the picks, UCB evaluations; ``None`` for the uniform first batch).
        device_loop: select batches with :func:`~torchbkb.bandits.device_batch.run_batch_on_device` (default on
            every device but the CPU; the same batches).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> arms = torch.linspace(0, 1, 200)[:, None]
        >>> bandit = BBKB(arms, GaussianKernel(0.1), noise=0.1, beta="theory", batch_bound=3.0, seed=0)
        >>> first = bandit.ask(); len(first)               # x_1 is uniform: a batch of one
        1
        >>> bandit.tell(first, torch.sin(6 * arms[first, 0]))
        >>> bandit.dictionary_size, bandit.num_resparsifications             # S_1 = {x_1}
        (1, 1)
        >>> batch = bandit.ask()
        >>> bandit.beta == 3.0 * bandit.beta_tilde                              # α̃ = C̃ β̃_fb
        True
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
        batch_bound: float = 2.0,
        max_batch_size: int | None = None,
        batch_size: int | None = None,
        seed: int | None = None,
        F: float = 1.0,
        delta: float = 0.01,
        noise_std: float | None = None,
        lazy: bool = True,
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
        self.batch_bound, self.max_batch_size = check_batch_limits(batch_bound, max_batch_size)
        self.batch_size = None if batch_size is None else check_q(batch_size, self.num_arms)
        self.lazy = bool(lazy)
        self.device_loop = device_batch.use_device_loop(self.arms.device)
        #: the device loop's CUDA graphs over every arm (``None``: eager picks); unused off CUDA and for pruned
        #: candidates (their number changes from batch to batch: a graph each)
        self.pick_graphs: PickGraphs | None = PickGraphs()
        if self.beta_mode == "theory":
            warn_unmet_preconditions("BBKB", q_bar=self.q_bar, lam=self.lam, delta=self.delta, horizon=horizon,
                                     batch_bound=self.batch_bound)
        self.beta_tilde = float("nan")
        self._sums = [0.0, 0.0]  # log_sum, practical_sum: floats, or 0-d tensors on the device read when needed
        self.batch_sizes: list[int] = []
        self.num_resparsifications = 0
        self.ucb_evaluations = 0
        self.time_in_batch = 0.0
        self.time_resparsify = 0.0
        self.last_selection: BatchSelection | None = None

    num_resparsifications = SettledAttribute("dictionary resamplings (one per completed batch)")
    time_resparsify = SettledAttribute("seconds spent at batch ends (resampling, kernel rows and ``K_S``, refit, "
                                       "rescoring)")

    # ------------------------------------------------------------------ widths
    @property
    def log_sum(self) -> float:
        if self._owed_update:
            self._settle()
        self._sums[0] = float(self._sums[0])  # read once (a float from then on)
        return self._sums[0]

    @log_sum.setter
    def log_sum(self, value: float) -> None:
        self._sums[0] = float(value)

    @property
    def practical_sum(self) -> float:
        if self._owed_update:
            self._settle()
        self._sums[1] = float(self._sums[1])
        return self._sums[1]

    @practical_sum.setter
    def practical_sum(self, value: float) -> None:
        self._sums[1] = float(value)

    def current_beta(self) -> float:
        """The multiplier ``α̃`` of the next batch: ``C̃ β̃_fb`` (theory), the authors' width (practical) or the
        user's constant."""
        if self.beta_mode == "practical":
            return bbkb_practical_beta(self.practical_sum, noise_std=self.noise_std, lam=self.lam, F=self.F,
                                       delta=self.delta, batch_bound=self.batch_bound)
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        return self.batch_bound * self.current_beta_tilde()

    def _ucb_width(self) -> float:
        return self.current_beta()  # the next batch's α̃, known at the resparsification (log_sum is updated first)

    def current_beta_tilde(self) -> float:
        """``β̃_fb`` of 001 Theorem 2 from the told points so far."""
        return bbkb_beta(self.log_sum, noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta)

    # ------------------------------------------------------------------ algorithm
    def _prunes_fixed(self) -> bool:
        """The fixed-capacity update prunes unless the picks replay from CUDA graphs, which take every arm."""
        return self.pick_graphs is None or self.arms.device.type not in self.pick_graphs.devices

    def _select(self) -> torch.Tensor:
        start = time.perf_counter()
        self.beta_tilde = self.current_beta_tilde() if self.beta_mode == "theory" else float("nan")
        self.beta = self.current_beta()
        if self.t == 0:  # Algorithm 1, line 1: x_1 uniform
            idx = self._random_arm()
            self.last_selection = None
        elif self._owed_update and (sel := self._update_and_select()) is not None:
            idx = sel.indices
            self.last_selection = sel
            self.ucb_evaluations += sel.ucb_evaluations
        else:
            scored = self.scored_arms  # the arms that can be picked (prune), or None: every arm
            Z, V_inv = self.candidate_features()
            mean, rls = self._mask_excluded(self.arm_means), self.arm_rls
            if scored is not None:  # (k,) ascending: lowest index first on ties, as over all arms
                mean, rls = mean[scored], rls[scored]
            with torch.no_grad():
                if self.batch_size is not None:  # arm indices
                    sel = self._fixed_batch(Z, mean, rls, V_inv, scored)
                else:
                    out, cap = None, device_batch.DEVICE_PICKS_MAX
                    last = self.batch_sizes[-1] if self.batch_sizes else 0
                    if self.device_loop and self.lazy and last <= cap and (isinstance(Z, torch.Tensor)
                                                                           or not self.streams_kernel_rows):
                        Z = Z if isinstance(Z, torch.Tensor) else self.arm_features()  # (A, r), every arm per pick
                        # no host read per pick; the first read after a little more than the last batch's length
                        first = min(int(1.25 * last) + 2, cap) if last else None
                        out = device_batch.run_batch_on_device(Z, mean, rls, V_inv, self.beta, self.batch_bound,
                                                               self.max_batch_size, first_check=first, pick_limit=cap,
                                                               graphs=self.pick_graphs if scored is None else None)
                    if out is not None:
                        sel, ids = out
                        self._selected_ids = ids if scored is None else None  # ask reads no more
                    else:  # the lazy loop: on the CPU, and for a long batch (given to it from the start)
                        chunk = self.chunk_size if self.streams_kernel_rows else None
                        sel = select_batch(Z, mean, rls, V_inv, self.beta, self.batch_bound, self.max_batch_size,
                                           lazy=self.lazy, validate=False, chunk_size=chunk)
                    if scored is not None:
                        sel = sel._replace(indices=scored[sel.indices])
            idx = sel.indices
            self.last_selection = sel
            self.ucb_evaluations += sel.ucb_evaluations
        self.batch_sizes.append(int(idx.numel()))
        self.time_in_batch += time.perf_counter() - start
        return idx

    def _fixed_batch(self, Z, mean, rls, V_inv, scored) -> BatchSelection:
        """``batch_size`` distinct arms (arm indices) with exact fantasies among ``mean``/``rls`` (of the ``scored``
        arms, or of all). Should a pick's UCB fall below the best UCB bound of the arms the update skipped (or the
        scored arms run out), those arms could win: the batch is selected again over every arm."""
        out = self._fantasy_batch(Z, mean, rls, V_inv, self.arms if scored is None else self.arms[scored])
        if scored is not None:
            rest = torch.ones(self.num_arms, dtype=torch.bool, device=mean.device)
            rest[scored] = False
            bound = self._mask_excluded(self.arm_means)[rest] + self.beta * self.arm_rls[rest].clamp_min(0.0).sqrt()
            picked = mean[out.indices] + self.beta * out.rls_in_batch.to(mean).clamp_min(0.0).sqrt()
            if out.indices.numel() < self.batch_size or (bound.numel() and float(picked.min()) < float(bound.max())):
                all_mean, all_rls = self.scores()
                all_mean = self._mask_excluded(all_mean)
                out = self._fantasy_batch(self.feature_rows(), all_mean, all_rls, V_inv, self.arms)
                return BatchSelection(out.indices, all_rls[out.indices], out.rls_in_batch, out.ucb_evaluations, V_inv)
            return BatchSelection(scored[out.indices], rls[out.indices], out.rls_in_batch, out.ucb_evaluations, V_inv)
        return BatchSelection(out.indices, rls[out.indices], out.rls_in_batch, out.ucb_evaluations, V_inv)

    def _fantasy_batch(self, Z, mean, rls, V_inv, arms):
        reader = FeatureReader(lambda idx: Z[idx], lambda idx, other: self.kernel(arms[idx], arms[other]))
        return select_fixed_batch(reader, mean, rls, V_inv, lam=self.lam, alpha=self.beta, q=self.batch_size,
                                  excluded=~torch.isfinite(mean))

    def _update(self) -> None:
        if self._defers_update():  # the next ask runs it with its batch: one host read for both
            self._owed_update = True
            return
        self._run_update()

    def _run_update(self) -> None:
        start = time.perf_counter()
        self._add_told_to_sums()
        super()._update()  # resample S with q̄ σ̃²_fb, update kernel rows if S changed, refit, rescore
        self.num_resparsifications += 1
        self.time_resparsify += time.perf_counter() - start

    def _add_told_to_sums(self) -> None:
        told = self.last_told[0]
        if told.numel():  # σ̃²_fb of the told picks: their variance when the batch started (summed on the device)
            rls = self.arm_rls[told].to(torch.float64)
            self._sums[0] = self._sums[0] + torch.log1p(3.0 * rls).sum()
            if self.t > told.numel():  # not the first told batch (the initialization)
                self._sums[1] = self._sums[1] + torch.log1p(rls).sum()

    # ------------------------------------------------------------------ checkpoints
    def _algorithm_state(self) -> dict[str, Any]:
        state = super()._algorithm_state()
        state.update(
            beta_tilde=self.beta_tilde,
            log_sum=self.log_sum,
            practical_sum=self.practical_sum,
            batch_sizes=list(self.batch_sizes),
            num_resparsifications=self.num_resparsifications,
            ucb_evaluations=self.ucb_evaluations,
            time_in_batch=self.time_in_batch,
            time_resparsify=self.time_resparsify,
        )
        return state

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.log_sum = float(state["log_sum"])  # before the refit: they set the width the arms are pruned with
        self.practical_sum = float(state["practical_sum"])
        super()._load_algorithm_state(state)
        self.beta_tilde = float(state["beta_tilde"])
        self.batch_sizes = list(state["batch_sizes"])
        self.num_resparsifications = int(state["num_resparsifications"])
        self.ucb_evaluations = int(state["ucb_evaluations"])
        self.time_in_batch = float(state["time_in_batch"])
        self.time_resparsify = float(state["time_resparsify"])
