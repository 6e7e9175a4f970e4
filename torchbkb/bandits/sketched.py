"""The sketched-bandit engine: an RLS dictionary, the DTC posterior on it, every arm scored from kernel rows.

What BKB and BBKB share. At every :meth:`~SketchedKernelBandit._update` (the end of a step for BKB, of a batch for
BBKB):

1. the dictionary ``S`` is resampled from the pulled arms (:class:`~torchbkb.RLSDictionary`) with the RLS
   variances of the posterior the last selection used; at ``t = 1``, ``S = {x_1}``;
2. if ``S`` changed, its kernel rows ``k(S, arms)`` `(m, A)` are brought up to date
   (:class:`~torchbkb.bandits.kernel_row_cache.KernelRowCache`) and ``K_S`` is factored once (``Wᵀ W = K_S⁺``);
3. the DTC posterior is refit from the pull counts and every arm is scored from its kernel row
   (:mod:`torchbkb.gp.functional`): ``μ̃`` and ``σ̃²`` (RLS scale) in one `(m + 1, m)·(m, A)` product -- or, when
   the next selection's width is known, the means first and the variances only of the arms whose UCB can still be
   the largest (:mod:`torchbkb.bandits.pruning`; the same choices).

A bandit built on it implements ``_select`` from the public read-outs: :attr:`~SketchedKernelBandit.arm_means`,
:attr:`~SketchedKernelBandit.arm_rls`, :attr:`~SketchedKernelBandit.scored_arms`, :meth:`~SketchedKernelBandit.scores`,
:meth:`~SketchedKernelBandit.feature_rows`, :meth:`~SketchedKernelBandit.V_inverse` and
:attr:`~SketchedKernelBandit.posterior`. Precision: kernel rows and scoring run in the arms' dtype, the `m × m`
factorizations in float64; with float32 arms, a small ``λ`` and an ill-conditioned ``K_S`` the subtraction
``k/λ - k_Sᵀ M k_S`` cancels (a :class:`~torchbkb.errors.NumericsWarning` says so).

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> class Greedy(SketchedKernelBandit):          # a new bandit: the posterior mean, no exploration
    ...     def _select(self):
    ...         return self._random_arm() if self.t == 0 else self._mask_excluded(self.arm_means).argmax().reshape(1)
    >>> arms = torch.rand(100, 2, dtype=torch.float64)
    >>> bandit = Greedy(arms, GaussianKernel(0.3), noise=0.1, seed=0)
    >>> for _ in range(5):
    ...     i = bandit.ask(); bandit.tell(i, -arms[i].sum(-1))
    >>> bandit.dictionary_size >= 1, tuple(bandit.scores()[1].shape)
    (True, (100,))
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torchbkb.bandits.base import KernelBandit
from torchbkb.bandits.deferred_update import SettlingReadouts
from torchbkb.bandits.fixed_capacity import FixedCapacityEngine, FixedCapacityUpdates
from torchbkb.bandits.sketched_checkpoint import SketchedCheckpoint
from torchbkb.bandits.kernel_row_cache import ROW_CACHE_BYTES, KernelRowCache
from torchbkb.bandits.kernel_rows import FeatureRows, on_host
from torchbkb.bandits.pruning import PruningSchedule, ucb_survivors
from torchbkb.bandits.update_rollback import UpdateRollback, rolled_back
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.errors import TorchBKBError, check_int, check_positive
from torchbkb.gp.functional import rls_kernel_columns
from torchbkb.gp.kernel_row_posterior import KernelRowPosterior, checked_once
from torchbkb.gp.nystrom import DEFAULT_CHUNK, NystromEmbedding
from torchbkb.gp.scoring_chunk import check_chunk_size, scoring_chunk
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION, RLSDictionary, check_inclusion
from torchbkb.gp.stable_scoring import AccuracyMonitor
from torchbkb.gp.linalg import cholesky_whitening_ex, inv_sqrt_factor, whitening
from torchbkb.utils.host_copy import to_device, to_dtype

__all__ = ["SketchedKernelBandit"]


class SketchedKernelBandit(SettlingReadouts, FixedCapacityUpdates, SketchedCheckpoint, UpdateRollback, KernelBandit):
    """A kernel bandit on the DTC posterior of an adaptively resampled dictionary (subclasses: ``_select``).

    Args:
        arms: `(A, d)` arm set.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling.
        beta: a name in :attr:`beta_modes` or a constant width (RLS scale).
        seed, F, delta, noise_std: see :class:`~torchbkb.bandits.base.KernelBandit`.
        chunk_size: arms scored at once; ``None`` (default) sizes it for the device
            (:func:`~torchbkb.gp.scoring_chunk.scoring_chunk`), an ``int`` is used as given.
        row_cache_bytes: memory for the pulled arms' kernel rows, past which entering rows are computed
            (:class:`~torchbkb.bandits.kernel_row_cache.KernelRowCache`).
        prune: score the variance only of the arms whose UCB bound reaches the largest mean when the width is
            known before scoring (:mod:`torchbkb.bandits.pruning`; ``False`` scores every arm: the same choices).
        inclusion: ``"count_scaled"`` (default, ``min(1, q̄·n·σ̃²)``, the authors' code) or ``"per_pull"``
            (``1 - (1 - p)^n``, 000 Algorithm 1 read literally); see :mod:`torchbkb.sampling.rls_dictionary`.
        kernel_cache_bytes: memory for the dictionary's kernel rows `(m, A)`; past it they are recomputed chunk by
            chunk at every update. Default ``max(256 MiB, 10 × the arms' bytes)``.

    Attributes:
        dictionary: `(m,)` long, arm indices of the current dictionary (ascending).
        rows: the :class:`~torchbkb.bandits.kernel_row_cache.KernelRowCache`.
        pruning: the :class:`~torchbkb.bandits.pruning.PruningSchedule`.
        beta: the width used for the last selection.
        embeddings_computed: how many times the dictionary changed (kernel rows updated, ``K_S`` refactored).
        arms_scored: how many arm variances the last update computed (``A`` when nothing was skipped).
        arms_scored_total: the same, summed over all updates.
        fixed_capacity: update through :class:`~torchbkb.bandits.fixed_capacity.FixedCapacityEngine` (fixed shapes,
            one host read per update; default on every device but the CPU, where the eager update prunes).
        engine: that engine (``engine.compiled = True`` compiles its update with ``fullgraph=True``).
        row_posterior: the DTC state both updates write, a :class:`~torchbkb.gp.kernel_row_posterior.KernelRowPosterior`
            (``W``, ``V⁻¹``, the scoring operator, the arms' scores); :attr:`posterior` is this state as a
            :class:`~torchbkb.DTCPosterior`.
        nonfinite_arms: the arms whose kernel rows ``k(a, ·)`` held NaN/inf: their rewards are counted (``counts``,
            ``history``) but left out of the posterior, and telling one again raises again
            (:mod:`~torchbkb.bandits.update_rollback`).
    """

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
        noise_std: float | None = None,
        chunk_size: int | None = None,
        row_cache_bytes: int = ROW_CACHE_BYTES,
        prune: bool = True,
        inclusion: str = DEFAULT_INCLUSION,
        kernel_cache_bytes: int | None = None,
    ):
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=noise_std, F=F, delta=delta)
        if kernel_cache_bytes is not None:
            check_int(kernel_cache_bytes, "kernel_cache_bytes", minimum=0)
        self.prune = bool(prune)
        self.inclusion = check_inclusion(inclusion)
        self.q_bar = check_positive(q_bar, "q_bar")
        self.score_chunk_size = check_chunk_size(chunk_size)  # None: sized for the device at every scoring
        self.chunk_size = self.score_chunk_size or DEFAULT_CHUNK  # kernel rows computed at once
        self.rows = KernelRowCache(self.kernel, self.arms, chunk_size=self.score_chunk_size,
                                   row_cache_bytes=check_int(row_cache_bytes, "row_cache_bytes", minimum=0),
                                   kernel_cache_bytes=kernel_cache_bytes)
        self.pruning = PruningSchedule()
        self.sampler = RLSDictionary(self.q_bar, generator=self.generator, inclusion=self.inclusion)
        self.dictionary = self._long([])
        self.beta = float("nan")
        self._deff, self._deff_inputs = 0.0, None  # _deff None: computed from _deff_inputs when read
        self.embeddings_computed = self.arms_scored_total = 0  # (arms_scored: set with the empty posterior below)
        self._pulled = self._pulled_host = None  # (p,) the pulled arms, ascending, on the device and the CPU
        self._pulled_set, self.nonfinite_arms = set(), set()  # (_pulled None: found again from the counts)
        self._dictionary_host: tuple[torch.Tensor, torch.Tensor | None] = (self.dictionary, None)
        self.row_posterior = KernelRowPosterior(self.kdiag, self.lam)
        self._bonus_cache: tuple[float, torch.Tensor] | None = None  # (width, width·√(k/λ)) for the UCB bound
        # variances vs a float64 reference, as the dictionary grows
        self._accuracy = AccuracyMonitor(type(self).__name__)
        self.fixed_capacity = self.arms.device.type != "cpu"
        self.engine, self._fixed_pulled, self._fused_pick = FixedCapacityEngine(), None, None
        self._clear_posterior()

    def _scoring_chunk(self) -> int:
        """Arms per `(m, m)·(m, c)` scoring product at the current dictionary size."""
        return scoring_chunk(self.score_chunk_size, len(self.rows.order), self.arms.device, self.arms.dtype)

    def _clear_posterior(self) -> None:
        """The prior: an empty dictionary, ``z ≡ 0``."""
        self.rows.clear()
        self.engine.remember(self._long([]))
        self.row_posterior.clear()
        self._posterior: DTCPosterior | None = None  # built on demand

    # ------------------------------------------------------------------ read-outs
    @property
    def dictionary_size(self) -> int:
        """``m = |S_t|``."""
        return int(self.dictionary.numel())

    @property
    def deff(self) -> float:
        """``Σ_i n_i σ̃²_t(x_i)`` over the pulled arms at the last update, the estimate of ``d_eff`` (000 Eq. 5)."""
        if self._owed_update:
            self._settle()
        if self._deff is None:
            pulled, n, rls = self._deff_inputs
            self._deff = float((n * rls[pulled].to(torch.float64)).sum())
        return self._deff

    @property
    def streams_kernel_rows(self) -> bool:
        """Whether the dictionary's kernel rows are recomputed on demand (they exceed ``kernel_cache_bytes``)."""
        if self._owed_update:
            self._settle()
        return self.rows.streams

    @property
    def arm_means(self) -> torch.Tensor:
        """`(A,)` ``μ̃_t`` of every arm."""
        return self.row_posterior.mean

    @property
    def arm_rls(self) -> torch.Tensor:
        """`(A,)` ``σ̃²_t`` (RLS scale) of the :attr:`scored_arms`; the others hold the prior bound ``k(a,a)/λ``
        (:meth:`scores` fills them in)."""
        return self.row_posterior.rls

    @property
    def scored_arms(self) -> torch.Tensor | None:
        """`(k,)` ascending, the arms whose variance the last update computed (``None``: every arm)."""
        return self.row_posterior.scored

    @property
    def arms_scored(self) -> int:
        """How many arm variances the last update computed (``A`` when nothing was skipped)."""
        return self.row_posterior.arms_scored

    @property
    def posterior(self) -> DTCPosterior | None:
        """The current DTC posterior as a :class:`~torchbkb.DTCPosterior` on the dictionary and all pulls (``None``
        while the dictionary is empty). After an update it is the bandit's own state (:attr:`row_posterior`'s
        ``W``, ``V⁻¹`` and operator, copied so that nothing done to the posterior reaches the bandit), formed on
        first access with no factorization and no refit; while a batch is told in parts
        (:attr:`~torchbkb.bandits.base.Bandit.told_since_update`), a fit on every pull so far."""
        if self._owed_update:
            self._settle()
        if not self.row_posterior.fitted:
            return None
        S = self.arms[self.rows.order_index]
        if self.told_since_update:  # rewards the state does not hold yet: fitted afresh, not kept
            pulled = (self.counts > 0).nonzero().squeeze(1)
            emb = NystromEmbedding(self.kernel, S, chunk_size=self.chunk_size)
            return self._dictionary_posterior(pulled, None, emb)
        if self._posterior is None:
            pulled = self._pulled_arms([])
            state = self.row_posterior.dtc_state(self.rows.rows(), pulled, self.counts[pulled].to(torch.float64),
                                                 self.reward_sums[pulled])
            emb = NystromEmbedding(self.kernel, S, chunk_size=self.chunk_size, projection=self.row_posterior.W)
            self._posterior = self._dictionary_posterior(pulled, state, emb)
        return self._posterior

    def _dictionary_posterior(self, pulled: torch.Tensor, state, emb: NystromEmbedding) -> DTCPosterior:
        """The :class:`~torchbkb.DTCPosterior` on ``emb`` of the pulled arms `(p,)` (their mean rewards, their counts
        as weights): given its ``state``, or fitted when that is ``None``."""
        n = self.counts[pulled]
        y_mean, n = (self.reward_sums[pulled] / n).to(self.arms.dtype), n.to(self.arms.dtype)
        post, X = DTCPosterior(emb, noise=self.lam, chunk_size=self.chunk_size), self.arms[pulled]
        return post.fit(X, y_mean, n) if state is None else post.set_state(X, y_mean, n, state)

    def scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ̃_t, σ̃²_t)`` of all arms, `(A,)` each (RLS scale); the variances the last update skipped are
        computed here, once per update."""
        if self.row_posterior.scored is None:
            return self.row_posterior.mean, self.row_posterior.rls
        return self.row_posterior.full_scores(self.rows.rows(), self._scoring_chunk())

    def arm_features(self) -> torch.Tensor:
        """`(A, r)` Nyström features ``z(arms)`` of the current dictionary (one `(A × m)·(m × r)` product, kept
        until the dictionary changes)."""
        return self.row_posterior.features(lambda: self.feature_rows()[:])  # (A, r)

    def feature_rows(self, index: torch.Tensor | None = None) -> FeatureRows:
        """The arms' features as :class:`~torchbkb.bandits.kernel_rows.FeatureRows`: ``rows[idx]`` is ``z(arms[idx])``
        `(M, r)`, computed on demand (`M·m·r`); with ``index`` `(k,)`, row ``i`` is ``z(arms[index[i]])``."""
        self.row_posterior.require_fit(type(self).__name__)
        return FeatureRows(self.rows.rows(), self.row_posterior.W, index)

    def scored_features(self) -> torch.Tensor:
        """`(k, r)` features of the :attr:`scored_arms`, from the kernel columns the update kept."""
        if self.row_posterior.scored is None:
            raise TorchBKBError(f"{type(self).__name__}: expected an update that skipped arms (prune), got none")
        return self.row_posterior.scored_features(lambda K, W: FeatureRows(K, W)[:])  # (k, r)

    def candidate_features(self) -> tuple[FeatureRows | torch.Tensor, torch.Tensor]:
        """``(Z, V⁻¹)`` for a selection: the features of the arms it may pick -- the :attr:`scored_arms` in order, or
        every arm -- formed at once when their kernel columns are kept, else read on demand; and the `(r, r)`
        ``V⁻¹``. With an empty dictionary, `(A, 0)` zeros and a `(0, 0)` ``V⁻¹`` (``z ≡ 0``)."""
        if self.dictionary_size == 0:
            return self.arms.new_zeros((self.num_arms, 0)), self.arms.new_zeros((0, 0), dtype=torch.float64)
        scored = self.scored_arms
        if scored is None:
            return self.feature_rows(), self.V_inverse()
        if self.streams_kernel_rows:
            return self.feature_rows(scored), self.V_inverse()
        return self.scored_features(), self.V_inverse()

    def V_inverse(self) -> torch.Tensor:
        """`(r, r)` ``V⁻¹`` of the current posterior (``V = Zᵀ N Z + λ I`` on the pulled arms' features)."""
        self.row_posterior.require_fit(type(self).__name__)
        return self.row_posterior.V_inv

    # ------------------------------------------------------------------ resparsification
    @rolled_back  # a NumericsError leaves the state as before it
    def _update(self) -> None:
        told = self.last_told_ids
        added = self._add_pulled(told)  # on a device: checked with the update's read
        pulled = self._pulled_arms(told)
        n = self.counts[pulled].to(torch.float64)  # (p,) their pull counts
        first = self.dictionary.numel() == 0 and self.t <= len(told)
        if self._fixed_applies():
            return self._update_fixed(pulled, n, self.last_told[0][:1] if first else None, added)
        if first:
            if added is not None and not bool(added[1]):  # the first row's finiteness, read alone
                self._reject_rows(added[0])
            new_dict, host = self.last_told[0][:1], None  # S_1 = {x_1}
        else:
            keep = self.sampler.resample(to_dtype(self.row_posterior.rls[pulled], torch.float64), n, validate=False)
            host = self._pulled_host[self._read_with_rows(keep, added)]  # ascending, like pulled
            new_dict = to_device(host, self.arms.device)  # (the same tensor on the CPU)
        self._rebuild(new_dict, pulled=pulled, counts=n, host=host)

    def _rebuild(self, new_dict: torch.Tensor, order=None, blocks=None, *, pulled: torch.Tensor | None = None,
                 counts: torch.Tensor | None = None, host: torch.Tensor | None = None) -> None:
        """Set the dictionary, update kernel rows and ``W`` if it changed, refit ``V`` from all pulls, rescore the arms.

        ``order`` and ``blocks`` (checkpoint loading) are the saved slot order and kernel blocks; ``pulled`` (the
        ascending pulled arms, with their float64 ``counts``) comes with a ``new_dict`` that is already sorted;
        ``host`` is ``new_dict`` on the CPU, which the comparison with the last dictionary and the row cache read
        instead of the device.
        """
        if pulled is None:
            new_dict = torch.sort(new_dict).values
            pulled = self._pulled_arms([])
        n = self.counts[pulled].to(torch.float64) if counts is None else counts
        with torch.no_grad():
            if new_dict.numel() == 0:  # S = ∅: z ≡ 0, the DTC posterior is the prior
                self._clear_posterior()
            else:
                changed = not self.row_posterior.fitted or not self._same_dictionary(new_dict, host)
                if changed:
                    self.rows.set_dictionary(new_dict, order, blocks, ids=None if host is None else host.tolist())
                K_SA, sums = self.rows.rows(), self.reward_sums[pulled]  # (m, A), cached or streamed
                if changed:
                    Ma = self._refactor(K_SA, pulled, n, sums)
                    self.embeddings_computed += 1
                    self._check_accuracy(K_SA, to_dtype(Ma[:-1], K_SA.dtype), pulled, n, self.row_posterior.W)
                else:
                    Ma = self.row_posterior.refit(K_SA, self.row_posterior.W, pulled, n, sums)
                self._score(K_SA, to_dtype(Ma, K_SA.dtype), pulled)
                self._posterior = None
        self.dictionary, self._dictionary_host = new_dict, (new_dict, host)
        self._deff, self._deff_inputs = None, (pulled, n, self.row_posterior.rls)  # read by the widths that need it

    def _refactor(self, K_SA, pulled: torch.Tensor, n: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
        """A new dictionary's ``W`` (one `m × m` factorization of ``K_S``) and the refit on it. On a device both
        Cholesky flags are read at once (streamed rows' finiteness one more read); either one off runs the checked
        ``inv_sqrt_factor`` and refit, which the CPU runs outright (fewer operations; its reads are free)."""
        S = self.rows.order_index  # K_S: a row gather of the rows' transposed view
        if on_host(self.arms):
            return self.row_posterior.refit(K_SA, inv_sqrt_factor(K_SA.T[S], name="K_S"), pulled, n, sums)
        with checked_once(K_SA):
            K_SS = K_SA.T[S]  # (m, m)
            W, flags = cholesky_whitening_ex(K_SS)  # (m, m) L⁻¹, taken when the flags say so
            fit, info = self.row_posterior.fit_unchecked(K_SA, W, pulled, n, sums)
        host = torch.cat([flags, info.to(flags.dtype).reshape(1)]).tolist()
        W_S = whitening(K_SS, W, host[:3], name="K_S")  # W itself when its flags hold, else eigh's
        if W_S is W and host[3] == 0:
            return self.row_posterior.take_fit(fit)
        return self.row_posterior.refit(K_SA, W_S, pulled, n, sums)

    def _exclusions_added(self) -> None:
        """Arms excluded by a direct write of :attr:`excluded`: the UCB bound the last update pruned with may have
        taken its level from one of them, so the variances it skipped are computed now (every arm a candidate)."""
        if self._owed_update:  # the update still to run reads the mask as it is now
            return
        if self.row_posterior.scored is not None:
            self.row_posterior.restore_scores(self.scores()[1], None, None)

    def _same_dictionary(self, new_dict: torch.Tensor, host: torch.Tensor | None) -> bool:
        """Whether ``new_dict`` is :attr:`dictionary`: compared on the host when both have a host copy."""
        last, last_host = self._dictionary_host
        if host is not None and last_host is not None and last is self.dictionary:
            return torch.equal(host, last_host)
        return torch.equal(new_dict, self.dictionary)

    def _check_accuracy(self, K_SA, M: torch.Tensor, pulled: torch.Tensor, n: torch.Tensor, W: torch.Tensor) -> None:
        """Warn once (:class:`~torchbkb.errors.NumericsWarning`) when the variances at the dictionary points, scored as
        the bandit scores them, are off the float64 reference (:mod:`torchbkb.gp.stable_scoring`); checked when the
        dictionary has grown by a quarter since the last check, changing no state. ``W`` `(r, m)`: the whitening the
        scores were formed with (float64 rows and ``W`` are the reference's own kernel values)."""
        if not self._accuracy.due(len(self.rows.order)):
            return
        S = self.rows.order_index  # (m,) the dictionary's arms in slot order
        K_SS = K_SA.index_select(1, S)  # (m, m)
        fast = rls_kernel_columns(K_SS, self.kdiag[S], M, self.lam, self._scoring_chunk())
        values = None  # float64 rows at hand are the reference's kernel values: not evaluated again
        if isinstance(K_SA, torch.Tensor) and K_SA.dtype == torch.float64 and W.dtype == torch.float64:
            values = (K_SS, K_SA.index_select(1, pulled).T, W)
        self._accuracy.check(self.kernel, fast, self.arms[S], self.arms[pulled], n, self.lam, self.arms.dtype,
                             stacklevel=None, values=values)  # the user's line, whatever the call path

    def _ucb_width(self) -> float | None:
        """The multiplier of ``σ̃`` in the next selection's UCB when it is known before scoring (``None``: it
        depends on the scores, and every arm is scored)."""
        return None

    def _score(self, K_SA, Ma: torch.Tensor, pulled: torch.Tensor) -> None:
        """``μ̃`` of every arm and ``σ̃²`` of the arms that can still be selected and of the pulled ones: every arm
        in one `(m + 1, m)·(m, A)` product, or the means first and the variances of the arms that pass the bound."""
        width = self._ucb_width() if self.prune else None
        attempt = self.pruning.should_attempt(width is not None)
        idx = mean = None
        if attempt:
            mean = Ma[-1] @ K_SA  # (A,)
            if self._bonus_cache is None or self._bonus_cache[0] != width:  # width·√(k/λ), the largest bonus
                self._bonus_cache = (width, width * self.row_posterior.prior_rls.sqrt())
            idx = ucb_survivors(mean, self._bonus_cache[1], self.excluded, pulled)  # (k,) ascending
            if not self.pruning.record_attempt(idx.numel(), self.num_arms):
                idx = None
        self.row_posterior.score(K_SA, Ma, self._scoring_chunk(), survivors=idx, mean=mean)
        self.arms_scored_total += self.arms_scored
