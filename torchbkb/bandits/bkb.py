"""BKB -- budgeted kernel bandit (000, Algorithm 1): GP-UCB on a DTC posterior with adaptive sketching.

One step, after the reward of ``x_t`` arrives:

1. resample the dictionary ``S_t`` from the pulled arms, each arm ``i`` independently with probability
   ``1 - (1 - min(1, q̄ σ̃²_{t-1}(x_i)))^{n_i}`` (``n_i`` its pull count, ``σ̃²_{t-1}`` the RLS variance of
   the previous posterior, already computed for the previous selection); at ``t = 1``, ``S_1 = {x_1}``;
2. if ``S_t`` changed, bring the cached kernel rows ``k(s, arms)`` `(m, A)` up to date (rows of arms that
   enter are copied from the pulled-arm row cache or computed) and factor ``K_S`` once (``Wᵀ W = K_S⁺``);
   otherwise reuse both -- the arms' features ``z_t(X_A) = W k_S(X_A)`` are never stored, only derived
   on demand (:meth:`SketchedKernelBandit.arm_features`, BBKB's in-batch updates);
3. rebuild ``V_t`` from the pulled arms and their counts (000 Sec. 3.2), score every arm:
   ``μ̃_t``, ``σ̃²_t`` (RLS scale) from its kernel row in one `(m × m)·(m × A)` product;
4. ``x_{t+1} = argmax μ̃_t + β̃_t σ̃_t`` (lowest index on ties), with ``β̃_t`` of 000 Theorem 2 for
   ``beta="theory"``, or a constant.

The first arm is uniform. With ``q̄`` so large that every pulled arm stays in the dictionary, BKB makes
exactly GP-UCB's choices ("BKB transforms back into exact GP-UCB").

Example:
    >>> import torch
    >>> from torchbkb.bandits import BKB
    >>> from torchbkb.kernels import GaussianKernel
    >>> arms = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = 1 - ((arms - 0.3) ** 2).sum(-1)
    >>> bandit = BKB(arms, GaussianKernel(0.3), noise=0.01, q_bar=1.0, beta=0.05, seed=0)
    >>> for _ in range(40):
    ...     i = bandit.ask(); bandit.tell(i, f[i])
    >>> bandit.dictionary_size < 20, float(f.max() - f[bandit.ask()]) < 0.05
    (True, True)
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from torchbkb.bandits.base import KernelBandit
from torchbkb.confidence import alpha_from_epsilon, bkb_beta, bkb_practical_beta
from torchbkb.dtc_posterior import DTCPosterior, fit_kernel_row_operator, rls_kernel_columns, score_kernel_columns
from torchbkb.errors import InputDataError, TorchBKBError, check_int, check_positive
from torchbkb.nystrom import DEFAULT_CHUNK, NystromEmbedding
from torchbkb.rls_dictionary import DEFAULT_INCLUSION, RLSDictionary, check_inclusion
from torchbkb.bandits.kernel_rows import FeatureRows, StreamedKernelRows, finite_rows
from torchbkb.stable_scoring import AccuracyMonitor
from torchbkb.theorems import warn_unmet_preconditions
from torchbkb.utils.linalg import inv_sqrt_factor

__all__ = ["BKB", "FeatureRows", "SketchedKernelBandit"]

#: default memory for the kernel rows of the pulled arms (:class:`SketchedKernelBandit`).
ROW_CACHE_BYTES = 256 * 2**20
#: the dictionary's kernel rows are cached up to ``max(KERNEL_CACHE_BYTES, 10 × the arms' bytes)`` by default.
KERNEL_CACHE_BYTES = 256 * 2**20
#: dictionary kernel rows up to this size are refilled whole from the pulled-row cache when the dictionary changes.
REFILL_BYTES = 4 * 2**20
#: arms skipped by the UCB bound are scored anyway when the arms left to score exceed this fraction of ``A``.
PRUNE_MAX_FRACTION = 0.5
#: after a pruning attempt that left most arms to score, up to this many updates score every arm in one pass first.
PRUNE_MAX_BACKOFF = 16


class SketchedKernelBandit(KernelBandit):
    """What BKB and BBKB share: the RLS dictionary, the cached kernel rows ``k(S, arms)`` and the DTC refit.

    At every :meth:`_update` (the end of a step for BKB, of a batch for BBKB) the dictionary is
    resampled from the pulled arms with the RLS variances of the posterior the selection used
    (``self._rls``), the kernel rows and the factorization of ``K_S`` are updated only if the dictionary
    changed, ``V`` is rebuilt from the pull counts and the arms are rescored. Subclasses implement ``_select`` and their confidence width.

    Skipping arms that cannot be selected (``prune=True``): when the width ``w`` of the next selection is
    known before scoring (a constant ``beta``; BBKB's theory multiplier too), only the mean ``μ̃`` of every
    arm is computed (one `(m,)·(m, A)` product) and the variance only of the arms whose UCB could reach the
    top. A DTC variance never exceeds the prior's (``V ⪰ λ I``, so ``σ̃²(a) <= k(a,a)/λ``), so
    ``μ̃(a) + w √(k(a,a)/λ)`` bounds the UCB of arm ``a``; an arm whose bound is below ``max_b μ̃(b)`` (a lower
    bound of the largest UCB, and of every UCB BBKB's batch can reach, since in-batch UCBs never fall
    below the mean) is never the argmax, and its `m × m` quadratic form is skipped. The choices are
    those of scoring every arm (``prune=False``; in exact arithmetic, and in the tests). It pays when the
    bonus at the prior, ``w √(k/λ)``, is small next to the spread of the means: on Cadata (raw house
    values, zero prior mean, "2σ" width) BBKB scores about a tenth of the arms (median 8 %); with the
    DESIGN §6 anchor's wide width nearly every arm passes and all are scored. The pulled arms are
    always scored (the dictionary resampling and ``d_eff`` read them); :meth:`scores` fills in the
    others on demand. An attempt costs one more pass over the kernel rows (the mean alone) than scoring
    every arm (mean and variance in one product), so after an attempt in which more than half of the arms
    passed, the next 1, 2, 4, ... (at most :data:`PRUNE_MAX_BACKOFF`) updates score every arm without trying.

    Precision: the kernel rows and the scoring ``k/λ - k_Sᵀ M k_S`` run in the arms' dtype (the `m × m`
    factorizations and the refit in float64). float32 arms halve memory and scoring time, but the
    subtraction cancels: with a small ``λ`` and an ill-conditioned ``K_S`` the variances lose accuracy
    (measured on the DESIGN §6 anchor, ``λ = 0.01``, BKB with the theory width: dictionary ≈ 115 instead
    of ≈ 93, ``R_T/R_unif`` 0.85 instead of 0.65, and no faster); there, use float64 arms. On Cadata
    (``λ = 0.2``, BBKB, constant width, T = 10⁴) the small variances of well-pulled arms are off by up to
    36-62 % on two of three seeds (``benchmarks/batch.py``'s float32 check against the float64 DTC
    posterior on the same dictionary; 0.008 % on the third): the kernel values' own float32 rounding is
    amplified by ``cond(K_S) ≈ 10⁶`` -- computing the quadratic form in float64 from the float32 kernel
    values still left 31 % -- so float32 is for speed where the variances' last digits do not matter, and
    the benchmarks use float64 arms.

    Args:
        arms: `(A, d)` arm set (only `(A, m)` features are kept).
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling.
        beta: ``"theory"`` or a constant width (RLS scale).
        seed, F, delta, noise_std: see :class:`~torchbkb.bandits.base.KernelBandit`.
        chunk_size: arms embedded/scored at once.
        row_cache_bytes: memory for the kernel rows ``k(x, arms)`` `(A,)` of every pulled arm, computed
            once at its first pull: a point re-entering the dictionary (with Bernoulli resampling at
            every step a large part of it changes) is then copied instead of re-evaluated. When the
            pulled arms no longer fit, the cache is dropped and entering rows are computed.
        prune: score the variance only of the arms whose UCB bound reaches the largest mean (see above;
            ``False`` scores every arm at every update: the same choices, slower -- for testing).
        inclusion: how an arm pulled ``n`` times enters the dictionary: ``"count_scaled"`` (default,
            ``min(1, q̄·n·σ̃²)``, the authors' code) or ``"per_pull"`` (``1 - (1 - p)^n``, 000 Algorithm 1 read literally); see
            :mod:`torchbkb.rls_dictionary`.
        kernel_cache_bytes: memory for the dictionary's kernel rows `(m, A)`; past it they are recomputed chunk by
            chunk at every update (:class:`~torchbkb.bandits.kernel_rows.StreamedKernelRows`: extra memory
            ``O(A + chunk·m)``, more kernel evaluations). Default ``max(KERNEL_CACHE_BYTES, 10 × the arms' bytes)``.

    Attributes:
        dictionary: `(m,)` long, arm indices of the current dictionary.
        beta: the width used for the last selection.
        deff: ``Σ_i n_i σ̃²_t(x_i)``, the estimate of ``d_eff`` (000 Eq. 5).
        embeddings_computed: how many times the dictionary changed (kernel rows updated, ``K_S`` refactored).
        arms_scored: how many arm variances the last update computed (``A`` when nothing was skipped).
        arms_scored_total: the same, summed over all updates (``arms_scored_total / (updates · A)`` is the
            fraction of the scoring work done).
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
        chunk_size: int = DEFAULT_CHUNK,
        row_cache_bytes: int = ROW_CACHE_BYTES,
        prune: bool = True,
        inclusion: str = DEFAULT_INCLUSION,
        kernel_cache_bytes: int | None = None,
    ):
        super().__init__(arms, kernel, noise=noise, beta=beta, seed=seed, noise_std=noise_std, F=F, delta=delta)
        default_cache = max(KERNEL_CACHE_BYTES, 10 * arms.numel() * arms.element_size())
        self.kernel_cache_bytes = default_cache if kernel_cache_bytes is None else check_int(kernel_cache_bytes, "kernel_cache_bytes", minimum=0)
        self.prune = bool(prune)
        self.inclusion = check_inclusion(inclusion)
        self.q_bar = check_positive(q_bar, "q_bar")
        self.chunk_size = int(chunk_size)
        self.row_cache_bytes = check_int(row_cache_bytes, "row_cache_bytes", minimum=0)
        self._P_buf: torch.Tensor | None = None  # (capacity, A) k(x, arms) of the pulled arms, by first pull
        self._P_pos: dict[int, int] | None = {}  # arm -> row of _P_buf; None once the cache is dropped
        self._P_row = torch.full((self.num_arms,), -1, dtype=torch.long, device=arms.device)  # _P_pos as a tensor (-1: none)
        self._pulled: torch.Tensor | None = None  # (p,) the pulled arms, ascending (None: to be found again)
        self._pulled_set: set[int] = set()
        self.sampler = RLSDictionary(self.q_bar, generator=self.generator, inclusion=self.inclusion)
        self.dictionary = self._long([])
        self.beta = float("nan")
        self.deff = 0.0
        self.embeddings_computed = 0
        self._posterior: DTCPosterior | None = None  # built on demand from the state below
        self._W: torch.Tensor | None = None  # (r, m) whitening of K_S in cache-slot order (Wᵀ W = K_S⁺)
        self._V_inv: torch.Tensor | None = None  # (r, r) V⁻¹, V = Zᵀ N Z + λ I on the pulled arms
        self._Z: torch.Tensor | None = None  # (A, r) cached embedding of all arms
        self._K_buf: torch.Tensor | None = None  # (capacity, A) cached kernel rows k(s, arms), first m used
        self._order: list[int] = []  # the dictionary's arms in cache-slot order (the embedding's order)
        self._order_idx = self._long([])  # the same as a tensor
        self._slot_block: list[int] = []  # for each slot, the id of the kernel block its row was computed in (-1: alone)
        self._blocks: dict[int, list[int]] = {}  # block id -> the arms evaluated together in that call
        self._next_block = 0
        self._mean = torch.zeros(self.num_arms, dtype=arms.dtype, device=arms.device)
        self._prior_rls = self.kdiag / self.lam  # (A,) prior σ̃² = k(a, a)/λ, the largest σ̃² can be
        self._rls = self._prior_rls.clone()  # σ̃² (RLS scale); exact for the arms in _scored, the prior for the others
        self._bonus_cache: tuple[float, torch.Tensor] | None = None  # (width, width·√(k/λ)) for the UCB bound
        self._scored: torch.Tensor | None = None  # (k,) ascending arms whose σ̃² is computed (None: all)
        self._rls_full: torch.Tensor | None = None  # _rls filled in for every arm (scores(), on demand)
        self._M: torch.Tensor | None = None  # (m, m) scoring operator of the current posterior, K's dtype
        self._K_scored: torch.Tensor | None = None  # (m, k) kernel columns of the scored arms (with _scored)
        self.arms_scored = self.arms_scored_total = 0
        self._prune_wait = self._prune_backoff = 0  # updates to score in one pass before the next pruning attempt
        self._last_attempt = False  # whether the last update tried to prune (a checkpoint repeats its path)
        self._force_attempt: bool | None = None  # set while a checkpoint is loaded
        self._accuracy = AccuracyMonitor(type(self).__name__)  # variances vs a float64 reference, as the dictionary grows

    # ------------------------------------------------------------------ diagnostics
    @property
    def dictionary_size(self) -> int:
        """``m = |S_t|``."""
        return int(self.dictionary.numel())

    @property
    def streams_kernel_rows(self) -> bool:
        """Whether the dictionary's kernel rows are recomputed on demand (they exceed ``kernel_cache_bytes``)."""
        return self._K_buf is None and bool(self._order)

    def _kernel_rows(self):
        """The `(m, A)` kernel rows of the dictionary in slot order: the cache, or a :class:`StreamedKernelRows`."""
        if self._K_buf is not None:
            return self._K_buf[: len(self._order)]
        return StreamedKernelRows(self.kernel, self.arms[self._order_idx], self.arms, chunk_size=self.chunk_size)

    def _fits_cache(self, m: int) -> bool:
        return m * self.num_arms * self.arms.element_size() <= self.kernel_cache_bytes

    @property
    def posterior(self) -> DTCPosterior | None:
        """The current DTC posterior as a :class:`~torchbkb.DTCPosterior` on the dictionary and all pulls
        (``None`` while the dictionary is empty). The bandit itself scores from cached kernel rows and
        never needs it; it is built (one embedding and one fit) on first access after each update.
        """
        if self._posterior is None and self._W is not None:
            pulled = (self.counts > 0).nonzero().squeeze(1)
            emb = NystromEmbedding(self.kernel, self.arms[self._long(self._order)], chunk_size=self.chunk_size)
            n = self.counts[pulled].to(self.arms.dtype)
            y_mean = (self.reward_sums[pulled] / self.counts[pulled]).to(self.arms.dtype)
            self._posterior = DTCPosterior(emb, noise=self.lam, chunk_size=self.chunk_size).fit(self.arms[pulled], y_mean, n)
        return self._posterior

    def scores(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ̃_t, σ̃²_t)`` of all arms, `(A,)` each (RLS-scale variance). The variances the last update
        skipped (arms that could not be selected, see ``prune``) are computed here, once per update."""
        if self._scored is None:
            return self._mean, self._rls
        if self._rls_full is None:
            with torch.no_grad():
                rest = torch.ones_like(self.excluded)
                rest[self._scored] = False
                rest = rest.nonzero().squeeze(1)  # (A - k,)
                rls = self._rls.clone()
                K_SA = self._kernel_rows()
                rls[rest] = rls_kernel_columns(K_SA[:, rest], self.kdiag[rest], self._M, self.lam, self.chunk_size)
                self._rls_full = rls
        return self._mean, self._rls_full

    def arm_features(self) -> torch.Tensor:
        """`(A, r)` Nyström features ``z(arms)`` of the current dictionary, computed from the cached kernel
        rows on first use after each dictionary change (one `(A × m)·(m × r)` product)."""
        if self._W is None:
            raise TorchBKBError(f"{type(self).__name__}: expected a dictionary (after the first reward), got none")
        if self._Z is None:
            self._Z = self.feature_rows()[:]  # (A, r)
        return self._Z

    def feature_rows(self, index: torch.Tensor | None = None) -> "FeatureRows":
        """The arms' features as :class:`FeatureRows`: ``rows[idx]`` is ``z(arms[idx])`` `(M, r)`, computed on
        demand from the cached kernel rows (`M·m·r`) -- for a consumer that reads a few arms, such as BBKB's
        in-batch selection, instead of the `(A, r)` :meth:`arm_features`. With ``index`` `(k,)` the rows are
        those of the arms ``index`` (row ``i`` is ``z(arms[index[i]])``)."""
        if self._W is None:
            raise TorchBKBError(f"{type(self).__name__}: expected a dictionary (after the first reward), got none")
        return FeatureRows(self._kernel_rows(), self._W, index)

    def scored_features(self) -> torch.Tensor:
        """`(k, r)` features ``z(a)`` of the arms the last update scored (``self._scored``, ascending), from their
        kernel columns kept by the update -- BBKB's batch is selected among them."""
        if self._scored is None or self._W is None:
            raise TorchBKBError(f"{type(self).__name__}: expected an update that skipped arms (prune), got none")
        if isinstance(self._K_scored, StreamedKernelRows):
            return FeatureRows(self._K_scored, self._W)[:]  # (k, r)
        return self._K_scored.T @ self._W.T.to(self._K_scored.dtype)  # (k, m)·(m, r)

    def V_inverse(self) -> torch.Tensor:
        """`(r, r)` ``V⁻¹`` of the current posterior (``V = Zᵀ N Z + λ I`` on the pulled arms' features)."""
        if self._V_inv is None:
            raise TorchBKBError(f"{type(self).__name__}: expected a dictionary (after the first reward), got none")
        return self._V_inv

    # ------------------------------------------------------------------ resparsification
    def _update(self) -> None:
        told = self.last_told[0].tolist()
        self._cache_pulled_rows(told)
        pulled = self._pulled_arms(told)
        n = self.counts[pulled].to(torch.float64)  # (p,) their pull counts
        if self.dictionary.numel() == 0 and self.t <= len(told):
            new_dict = self.last_told[0][:1]  # S_1 = {x_1}
        else:
            keep = self.sampler.resample(self._rls[pulled].to(torch.float64), n, validate=False)
            new_dict = pulled[keep]  # ascending, like pulled
        self._rebuild(new_dict, pulled=pulled, counts=n)

    def _pulled_arms(self, told: list[int]) -> torch.Tensor:
        """`(p,)` long, the arms pulled so far, ascending; found again only after a first pull (in ``told``)."""
        if self._pulled is None or any(a not in self._pulled_set for a in told):
            self._pulled = (self.counts > 0).nonzero().squeeze(1)
            self._pulled_set = set(self._pulled.tolist())
        return self._pulled

    def _rebuild(
        self,
        new_dict: torch.Tensor,
        order: list[int] | None = None,
        blocks: list[list[int]] | None = None,
        *,
        pulled: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
    ) -> None:
        """Set the dictionary, update kernel rows and ``W`` if it changed, refit V from all pulls, rescore all arms.

        ``order`` and ``blocks`` (checkpoint loading only) are the slot order of the kernel-row cache and
        the kernel blocks its rows were computed in; ``pulled`` (the ascending pulled arms, from
        :meth:`_update`, with their float64 ``counts``) comes with a ``new_dict`` that is already sorted.
        """
        if pulled is None:
            new_dict = torch.sort(new_dict).values
            pulled = self._pulled_arms([])
        n = self.counts[pulled].to(torch.float64) if counts is None else counts
        with torch.no_grad():
            if new_dict.numel() == 0:  # S = ∅: z ≡ 0, the DTC posterior is the prior
                self._posterior, self._Z, self._K_buf, self._order = None, None, None, []
                self._order_idx = self._long([])
                self._W = self._V_inv = None
                self._slot_block, self._blocks = [], {}
                self._mean = torch.zeros_like(self._mean)
                self._rls = self._prior_rls.clone()
                self._scored = self._rls_full = self._M = self._K_scored = None
                self.arms_scored = 0
            else:
                changed = self._W is None or not torch.equal(new_dict, self.dictionary)
                if changed:
                    if not self._fits_cache(new_dict.numel()):  # streamed: no rows kept, slot order = the dictionary's
                        self._K_buf, self._order = None, list(order) if order is not None else new_dict.tolist()
                        self._order_idx, self._slot_block, self._blocks = self._long(self._order), [-1] * len(self._order), {}
                    elif order is None:
                        if self._K_buf is None:  # cached again after streaming: every row enters
                            self._order, self._slot_block, self._blocks = [], [], {}
                        self._update_kernel_rows(new_dict.tolist(), new_dict)
                    else:
                        self._K_buf, self._order, self._slot_block, self._blocks = None, [], [], {}
                        self._update_kernel_rows(list(order), blocks=blocks)
                    K_SS = self._kernel_rows().T[self._order_idx]  # (m, m) from the cached rows (rows of the
                    # transposed view: a row gather, much cheaper than a column gather)
                    self._W = inv_sqrt_factor(K_SS, name="K_S")  # (r, m): one m×m factorization
                    self._Z = None  # the arms' features z(arms) are derived on demand (arm_features)
                    self.embeddings_computed += 1
                K_SA = self._kernel_rows()  # (m, A) view of the cached kernel rows (or streamed)
                W = self._W
                Zt = W @ K_SA.T[pulled].to(W.dtype).T  # (r, p) features of the pulled arms
                # V = Zᵀ N Z + λ I from the counts, O(min(t, A)·m²); rewards validated by tell()
                Ma, self._V_inv = fit_kernel_row_operator(W, Zt, n, self.reward_sums[pulled], self.lam)
                if changed:
                    self._check_accuracy(K_SA, Ma[:-1].to(K_SA.dtype), pulled, n)
                self._score(K_SA, Ma.to(K_SA.dtype), pulled)
                self._posterior = None  # built on demand (the posterior property)
        self.dictionary = new_dict
        self.deff = float((n * self._rls[pulled].to(torch.float64)).sum())

    def _check_accuracy(self, K_SA: torch.Tensor, M: torch.Tensor, pulled: torch.Tensor, n: torch.Tensor) -> None:
        """Warn once (:class:`~torchbkb.errors.NumericsWarning`) when the variances at the dictionary points, scored
        as the bandit scores them, are off the float64 feature-form reference (:mod:`torchbkb.stable_scoring`):
        float32 kernel rows with an ill-conditioned ``K_S``, or a tiny ``λ``. Checked when the dictionary has
        grown by a quarter since the last check; it reads the state and changes none of it."""
        if not self._accuracy.due(len(self._order)):
            return
        S = self._order_idx  # (m,) the dictionary's arms in slot order
        fast = rls_kernel_columns(K_SA.index_select(1, S), self.kdiag[S], M, self.lam, self.chunk_size)
        self._accuracy.check(self.kernel, fast, self.arms[S], self.arms[pulled], n, self.lam, self.arms.dtype, stacklevel=7)

    def _prior_width(self, width: float) -> torch.Tensor:
        """`(A,)` ``width · √(k(a,a)/λ)``, the largest UCB bonus an arm can have; kept while ``width`` is unchanged."""
        if self._bonus_cache is None or self._bonus_cache[0] != width:
            self._bonus_cache = (width, width * self._prior_rls.sqrt())
        return self._bonus_cache[1]

    def _ucb_width(self) -> float | None:
        """The multiplier of ``σ̃`` in the next selection's UCB when it is known before scoring (``None``: it
        depends on the scores, and every arm is scored)."""
        return None

    def _score(self, K_SA: torch.Tensor, Ma: torch.Tensor, pulled: torch.Tensor) -> None:
        """``μ̃`` of every arm from its kernel row and ``σ̃²`` of the arms that can still be selected and of the
        pulled ones: every arm in one `(m + 1, m)·(m, A)` product when the width is unknown (or pruning is off or
        backing off), else the means first (one `(m,)·(m, A)` product) and the variances of the arms that pass."""
        M, a = Ma[:-1], Ma[-1]
        width = self._ucb_width() if self.prune else None
        attempt = width is not None and (self._prune_wait == 0 if self._force_attempt is None else self._force_attempt)
        idx = K_scored = None
        if attempt:
            mean = a @ K_SA  # (A,)
            best = (mean.masked_fill(self.excluded, -torch.inf) if bool(self.excluded.any()) else mean).max()  # <= the largest UCB
            keep = mean + self._prior_width(width) >= best  # the UCB bound (computed as the selections compute a UCB)
            keep[pulled] = True
            idx = keep.nonzero().squeeze(1)  # (k,) ascending
            if idx.numel() > PRUNE_MAX_FRACTION * self.num_arms:  # most arms pass: back off before trying again
                idx = None
                self._prune_backoff = min(max(2 * self._prune_backoff, 1), PRUNE_MAX_BACKOFF)
            else:
                self._prune_backoff = 0
            self._prune_wait = self._prune_backoff
        else:
            self._prune_wait = max(self._prune_wait - 1, 0)
        if idx is not None:
            rls = self._prior_rls.clone()  # σ̃² <= k/λ for the arms not scored
            K_scored = K_SA.index_select(1, idx)  # (m, k): kept for the scored arms' features
            rls[idx] = rls_kernel_columns(K_scored, self.kdiag[idx], M, self.lam, self.chunk_size)
        elif attempt:  # the means are there already
            rls = rls_kernel_columns(K_SA, self.kdiag, M, self.lam, self.chunk_size)
        else:
            mean, rls = score_kernel_columns(K_SA, self.kdiag, Ma, self.lam, self.chunk_size)
        self._mean, self._rls, self._scored, self._K_scored = mean, rls, idx, K_scored
        self._M, self._rls_full, self._last_attempt = M, None, attempt
        self.arms_scored = self.num_arms if idx is None else int(idx.numel())
        self.arms_scored_total += self.arms_scored

    def _cache_pulled_rows(self, arms: list[int]) -> None:
        """Add ``k(x, arms)`` of newly pulled arms to the pulled-row cache, each row computed alone (so a
        resumed run recomputes it bitwise); drop the cache when it would outgrow ``row_cache_bytes``."""
        if self._P_pos is None:
            return
        new = [a for a in dict.fromkeys(arms) if a not in self._P_pos]
        if not new:
            return
        A = self.num_arms
        n = len(self._P_pos) + len(new)
        if n * A * self.arms.element_size() > self.row_cache_bytes:
            self._P_buf, self._P_pos = None, None
            self._P_row.fill_(-1)
            return
        buf = self._P_buf
        if buf is None or buf.shape[0] < n:  # grow geometrically, within the budget
            cap = min(max(16, 2 * n), max(n, self.row_cache_bytes // (A * self.arms.element_size())))
            grown = self.arms.new_empty((cap, A))
            if buf is not None:
                grown[: len(self._P_pos)] = buf[: len(self._P_pos)]
            buf = self._P_buf = grown
        with torch.no_grad():
            first = len(self._P_pos)
            for a in new:
                row = len(self._P_pos)
                buf[row] = finite_rows(self.kernel(self.arms[a : a + 1], self.arms), [a])[0]
                self._P_pos[a] = row
            self._P_row[self._long(new)] = torch.arange(first, first + len(new), device=self.arms.device)

    def _update_kernel_rows(self, new_dict: list[int], new_idx: torch.Tensor | None = None, *, blocks: list[list[int]] | None = None) -> None:
        """Make the cache ``self._K_buf[:m]`` hold ``k(s, arms)`` `(A,)` for every dictionary point ``s``
        (``new_idx``: ``new_dict`` as a tensor, if the caller has it), and ``self._order_idx`` the slot order.

        Rows of points that stay are not touched; a leaving point's slot is given to an entering point
        (or to the last row, to keep the cache compact). Entering points whose row is in the pulled-row
        cache are copied from it; the others are evaluated together in one ``k(X_entering, arms)``
        `(e, A)` call, and the cache remembers these blocks: a kernel block can differ in the last bits
        from its rows computed alone, so a run resumed from a checkpoint recomputes every row inside the
        very block it was computed in (``blocks``, checkpoint loading only) and rebuilds the same cache,
        the same embedding and the same choices, bitwise. A row computed alone (a copied pulled-arm row)
        is recorded as block ``-1``. Cost: ``O(A·d·e)`` for ``e`` evaluated points plus one ``(A,)`` copy
        per copied or compacted slot.

        When every point's row is in the pulled-row cache (the usual case: only pulled arms enter a
        dictionary), the cache is simply refilled from it in ``new_dict``'s order, one ``index_select``
        of ``m`` rows with no slot bookkeeping -- if the ``(m, A)`` rows are small (at most
        :data:`REFILL_BYTES`) or at least half of the points are new; otherwise patching the slots of
        the entering points copies less.
        """
        if blocks is None and self._P_pos is not None:
            m, A = len(new_dict), self.num_arms
            small = m * A * self.arms.element_size() <= REFILL_BYTES
            wanted = set(new_dict)
            if self._P_pos.keys() >= wanted and (small or 2 * len(wanted - set(self._order)) >= m):
                buf = self._K_buf
                if buf is None or buf.shape[0] < m:  # grow geometrically (every row is rewritten below)
                    buf = self.arms.new_empty((max(16, 2 * m), A))
                idx = self._long(new_dict) if new_idx is None else new_idx
                torch.index_select(self._P_buf, 0, self._P_row[idx], out=buf[:m])
                self._K_buf, self._order, self._order_idx, self._slot_block, self._blocks = buf, list(new_dict), idx, [-1] * m, {}
                return
        want = set(new_dict)
        order, slot_block = list(self._order), list(self._slot_block)  # state changes only at the end
        have = set(order)
        entering = [a for a in new_dict if a not in have]  # ascending (new_dict is sorted or a saved order)
        holes = [p for p, a in enumerate(order) if a not in want]
        n_fill = min(len(holes), len(entering))
        compute = holes[:n_fill]  # slots to (re)fill
        for p, a in zip(compute, entering):
            order[p] = a
        buf = self._K_buf
        for p in reversed(holes[n_fill:]):  # no entering point left for these: compact
            last = len(order) - 1
            if p != last:
                buf[p] = buf[last]
                order[p], slot_block[p] = order[last], slot_block[last]
            order.pop()
            slot_block.pop()
        for a in entering[n_fill:]:  # the rest go to the end
            compute.append(len(order))
            order.append(a)
            slot_block.append(-1)
        m, A = len(order), self.num_arms
        if buf is None or buf.shape[0] < m:  # grow the cache geometrically
            grown = self.arms.new_empty((max(16, 2 * m), A))
            if buf is not None:
                keep = min(buf.shape[0], m)
                grown[:keep] = buf[:keep]
            buf = grown
        if compute and blocks is None and self._P_pos is not None and all(order[p] in self._P_pos for p in compute):
            # every entering point is a pulled arm with a cached row (computed alone): copy the rows
            buf.index_copy_(0, self._long(compute), self._P_buf[self._long([self._P_pos[order[p]] for p in compute])])
            for p in compute:
                slot_block[p] = -1  # a block of one: the row as computed alone
            compute = []
        if compute:
            if blocks is None:  # one block: the points entering now
                block_list = [[order[p] for p in compute]]
                slot_of = {order[p]: p for p in compute}
            else:  # resuming: each row from the block it was first computed in
                block_list = blocks
                slot_of = {a: p for p, a in enumerate(order)}
            for members in block_list:
                if len(members) == 1:
                    bid = -1
                else:
                    bid = self._next_block
                    self._next_block += 1
                    self._blocks[bid] = list(members)
                rows = finite_rows(self.kernel(self.arms[self._long(members)], self.arms), members)  # (e, A): one call per block
                js = [j for j, a in enumerate(members) if a in slot_of]
                slots = [slot_of[members[j]] for j in js]
                if len(js) < len(members):
                    rows = rows[self._long(js)]
                buf.index_copy_(0, self._long(slots), rows)  # one scatter for the whole block
                for p in slots:
                    slot_block[p] = bid
        if self._blocks:
            live = set(slot_block)
            self._blocks = {b: mem for b, mem in self._blocks.items() if b in live}
        self._K_buf, self._order, self._order_idx, self._slot_block = buf, order, self._long(order), slot_block

    # ------------------------------------------------------------------ checkpoints
    def _algorithm_state(self) -> dict[str, Any]:
        return {
            "dictionary": self.dictionary.cpu().clone(),
            "order": list(self._order),
            "blocks": [self._blocks[b] for b in sorted(set(self._slot_block) - {-1})] + [[a] for a, b in zip(self._order, self._slot_block) if b == -1],
            "beta": self.beta,
            "rls": self._rls.cpu().clone(),
            "scored": None if self._scored is None else self._scored.cpu().clone(),
            "embeddings_computed": self.embeddings_computed,
            "arms_scored_total": self.arms_scored_total,
            "prune": [self._last_attempt, self._prune_wait, self._prune_backoff],
        }

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self._P_buf, self._P_pos = None, {}
        self._P_row.fill_(-1)
        self._pulled = None
        self._cache_pulled_rows(list(dict.fromkeys(self.history["index"])))  # each row alone, as first computed
        self._posterior, self._Z, self._K_buf, self._order = None, None, None, []
        self._order_idx = self._long([])
        self._W = self._V_inv = None
        self._slot_block, self._blocks = [], {}
        self.dictionary = self._long([])
        last_attempt, wait, backoff = state.get("prune", (False, 0, 0))  # absent before pruning
        if self.t > 0:  # no order/blocks: an older checkpoint (rows recomputed one block)
            self._force_attempt = bool(last_attempt)  # the refit takes the scoring path the saved one took
            try:
                self._rebuild(state["dictionary"].to(self.arms.device), order=state.get("order"), blocks=state.get("blocks"))
            finally:
                self._force_attempt = None
        self._last_attempt, self._prune_wait, self._prune_backoff = bool(last_attempt), int(wait), int(backoff)
        self._rls = state["rls"].to(self.arms.device)
        scored = state.get("scored")  # absent in checkpoints written before pruning: every arm was scored
        self._scored = None if scored is None else scored.to(self.arms.device)
        if self._scored is not None:  # the refit above found the same arms; their kernel columns, to be sure
            self._K_scored = self._kernel_rows().index_select(1, self._scored)
        self._rls_full = None
        self.beta = float(state["beta"])
        self.embeddings_computed = int(state["embeddings_computed"])
        self.arms_scored_total = int(state.get("arms_scored_total", 0))  # absent before pruning


class BKB(SketchedKernelBandit):
    """Budgeted kernel bandit.

    Args:
        arms: `(A, d)` arm set (A up to 10⁶; only `(A, m)` features are kept).
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄`` of the dictionary resampling.
        beta: ``"theory"`` (β̃ₜ of 000 Theorem 2), ``"practical"`` (the authors' code:
            ``√λ F + ξ √(Σ_i n_i σ̃²ₜ(x_i) log t + log 1/δ)``, :func:`~torchbkb.confidence.bkb_practical_beta`)
            or a constant width (RLS scale).
        seed: generator seed (first arm, dictionary draws).
        F: bound on ``‖f‖_H`` (theory β).
        delta: failure probability (theory β).
        epsilon: dictionary accuracy ``ε`` (theory β, ``α = (1+ε)/(1-ε)``); or give ``alpha`` instead.
        alpha: ``α > 1``, overrides ``epsilon``.
        noise_std: ``ξ`` of the theory β (default ``√λ``).
        chunk_size: arms embedded/scored at once.
        row_cache_bytes: memory for the kernel rows of the pulled arms (see :class:`SketchedKernelBandit`).
        kernel_cache_bytes: memory for the dictionary's kernel rows; past it they are streamed (see
            :class:`SketchedKernelBandit`).
        prune: with a constant ``beta``, score the variance only of the arms whose UCB can still be the
            largest (see :class:`SketchedKernelBandit`; the same choices as ``False``). The theory width
            depends on the scores, so with ``beta="theory"`` every arm is scored.
        inclusion: how an arm pulled ``n`` times enters the dictionary: ``"count_scaled"`` (default,
            ``min(1, q̄·n·σ̃²)``, the authors' code) or ``"per_pull"`` (``1 - (1 - p)^n``, 000 Algorithm 1 read literally); see
            :mod:`torchbkb.rls_dictionary`.
        horizon: the run's length ``T``, if known: ``beta="theory"`` warns
            (:class:`~torchbkb.errors.TheoryWarning`) when ``q̄`` is below 000 Theorem 2's requirement for it
            (:func:`~torchbkb.theorems.bkb_required_q_bar`; without it, for ``T = 1``).

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
        chunk_size: int = DEFAULT_CHUNK,
        row_cache_bytes: int = ROW_CACHE_BYTES,
        prune: bool = True,
        inclusion: str = DEFAULT_INCLUSION,
        kernel_cache_bytes: int | None = None,
        horizon: int | None = None,
    ):
        super().__init__(
            arms, kernel, noise=noise, q_bar=q_bar, beta=beta, seed=seed, F=F, delta=delta, noise_std=noise_std, chunk_size=chunk_size, row_cache_bytes=row_cache_bytes,
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
            warn_unmet_preconditions("BKB", q_bar=self.q_bar, lam=self.lam, delta=self.delta, horizon=horizon, epsilon=self.epsilon)

    def _select(self) -> torch.Tensor:
        if self.t == 0:
            self.beta = self.current_beta()
            return self._random_arm()
        self.beta = self.current_beta()
        ucb = self._mask_excluded(self._mean + self.beta * self._rls.sqrt())
        return torch.argmax(ucb).reshape(1)

    def _ucb_width(self) -> float | None:
        return None if isinstance(self.beta_mode, str) else float(self.beta_mode)

    def current_beta(self) -> float:
        """The width of the next selection: β̃ₜ (theory), the authors' βₜ (practical) or the constant."""
        if self.beta_mode == "practical":
            return bkb_practical_beta(self.deff, self.t, noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta)
        if self.beta_mode != "theory":
            return float(self.beta_mode)
        return bkb_beta(self.deff, max(self.t, 1), noise_std=self.noise_std, lam=self.lam, F=self.F, delta=self.delta, epsilon=self.epsilon, kappa2=self.kappa2)
