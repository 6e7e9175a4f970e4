"""A sketched bandit's update on fixed-capacity buffers: no data-dependent shape and no host read inside.

:meth:`~torchbkb.bandits.sketched.SketchedKernelBandit._update` -- resample the dictionary, refit, rescore -- built
from shapes that follow the data (``nonzero``, boolean masks, lists of slots, pivot checks read on the host). Here the
same update is one function of fixed shapes (:func:`fixed_update`, it compiles with ``torch.compile(fullgraph=True)``):

* the pulled arms, ascending, are padded to a capacity ``P`` (a power of two) with pull count 0 -- a padded arm adds
  nothing to ``V`` and is never drawn;
* the dictionary lives in ``m_cap`` slots, compacted in ascending arm order by a cumulative sum and one scatter (the
  order the bandit's own update uses while the rows fit :data:`~torchbkb.bandits.kernel_row_cache.REFILL_BYTES`); the
  unused slots hold an identity block in ``K_S``, zero features and zero rows and columns in the scoring operator, so
  they change no score while their rows are finite (they repeat the first slot's arm; 0·NaN is NaN), and their
  kernel rows are never cleared (that would be one more pass over `(m_cap, A)`);
* what the eager update checks on the host -- ``K_S``'s Cholesky pivots, ``V``'s factorization, the dictionary's
  size -- comes back as flags, read once per update with the dictionary (:class:`FixedCapacityEngine`), which grows
  ``m_cap`` (doubling) and runs the update again with the same draws when the dictionary outgrew it, and hands an
  update that needs the eigendecomposition back to the eager path;
* on a GPU the update is replayed from a CUDA graph (:mod:`~torchbkb.bandits.update_graph`): one launch, not many.

Example:
    >>> import torch
    >>> from torchbkb import BKB
    >>> from torchbkb.gp.kernels import GaussianKernel; arms = torch.rand(40, 2, dtype=torch.float64)
    >>> b = BKB(arms, GaussianKernel(0.3), noise=0.1, beta=0.5, seed=0); b.fixed_capacity = True
    >>> for _ in range(5):
    ...     i = b.ask(); b.tell(i, torch.sin(3 * arms[i, 0]))
    >>> b.engine.m_cap, b.dictionary_size <= b.engine.m_cap
    (16, True)
"""

from __future__ import annotations

import inspect
import warnings
from typing import NamedTuple

import torch

from torchbkb.bandits import capacity
from torchbkb.bandits.capacity import MIN_CAPACITY, capacity_for, compact_slots
from torchbkb.bandits.update_graph import UpdateGraphs
from torchbkb.bandits.pruning import PRUNE_MAX_FRACTION, survivor_mask
from torchbkb.gp.functional import fit_kernel_row_operator_ex, rls_kernel_columns, score_kernel_columns
from torchbkb.gp.linalg import compute_dtype
from torchbkb.gp.scoring_chunk import scoring_chunk
from torchbkb.sampling.rls_dictionary import RLSDictionary, inclusion_probability
from torchbkb.utils.host_copy import to_device

__all__ = ["FixedUpdate", "FixedCapacityEngine", "FixedCapacityUpdates", "LaunchedUpdate", "HEAD", "MIN_CAPACITY",
           "UPDATE_ARGUMENTS", "capacity_for", "padded_features", "compact_slots", "fixed_update"]

#: the flags before the slots in :attr:`FixedUpdate.flags`.
HEAD = 7


class FixedUpdate(NamedTuple):
    """One update on fixed-capacity buffers (``m`` valid slots of ``m_cap``; the rest zero or identity)."""

    K_SA: torch.Tensor  #: `(m_cap, A)` the dictionary's kernel rows in slot order (past ``m``: not to be read)
    slots: torch.Tensor  #: `(m_cap,)` long, the dictionary's arms ascending (0 past ``m``)
    W: torch.Tensor  #: `(m_cap, m_cap)` ``L⁻¹`` of the padded ``K_S`` (identity block past ``m``)
    V_inv: torch.Tensor  #: `(m_cap, m_cap)` ``V⁻¹``, ``1/λ`` on the padding
    Ma: torch.Tensor  #: `(m_cap + 1, m_cap)` ``[M; aᵀ]`` on kernel rows
    mean: torch.Tensor  #: `(A,)` ``μ̃``
    rls: torch.Tensor  #: `(A,)` ``σ̃²`` (RLS scale); pruned: the prior bound ``k/λ`` past the scored arms
    #: `(HEAD + m_cap,)` float64: ``m``, ``K_S`` factored by Cholesky, ``V`` factored, the dictionary changed, the
    #: next UCB pick (-1: none asked), every score finite, the arms that passed the pruning bound (-1: not pruned);
    #: then the slots
    flags: torch.Tensor
    scored: torch.Tensor  #: `(k_cap,)` long, pruned: the scored arms ascending (0 past their count); else `(0,)`


def fixed_update(K_P: torch.Tensor | None, asc_row: torch.Tensor, asc_arm: torch.Tensor, counts: torch.Tensor,
                 reward_sums: torch.Tensor, u: torch.Tensor, rls_prev: torch.Tensor, kdiag: torch.Tensor,
                 prev_slots: torch.Tensor, prev_m: torch.Tensor, q_bar: torch.Tensor, inclusion: str, lam: float,
                 m_cap: int, chunk: int, width: float | None = None, excluded: torch.Tensor | None = None,
                 kernel=None, arms: torch.Tensor | None = None, prune_width: float | None = None,
                 k_cap: int = 0) -> FixedUpdate:
    """Resample the dictionary from the pulled arms, refit the DTC posterior, score every arm: fixed shapes only.

    Args:
        K_P: `(B, A)` kernel rows of the pulled arms, each computed alone; or ``None``: the dictionary's rows are
            computed here as ``kernel(arms[slots], arms)`` (many arms, whose pulled rows are not cached).
        asc_row, asc_arm: `(P,)` long, the pulled arms ascending (padded) and their rows in ``K_P``.
        counts: `(A,)` pull counts (the padding's read as 0); reward_sums: `(A,)` float64.
        u: `(P,)` float64 draws, arm ``j`` kept when ``u_j < p_j``: 2 marks the padding, -1 forces an arm in and
            1.25 leaves a pulled arm out (``p_j <= 1``).
        rls_prev: `(A,)` ``σ̃²`` of the previous posterior; kdiag: `(A,)` ``k(a, a)``.
        prev_slots, prev_m: the previous dictionary (`(m_cap,)` slots, 0-d size), to flag a change.
        q_bar, inclusion: the dictionary's ``q̄`` (0-d) and inclusion rule
            (:func:`~torchbkb.sampling.rls_dictionary.inclusion_probability`).
        lam: ``λ``; m_cap: dictionary slots; chunk: arms per scoring product.
        width, excluded: with a width, the next UCB pick ``argmax μ̃ + width·σ̃`` over the arms not ``excluded``
            `(A,)` is made here too (BKB with a constant width: its next ``ask`` reads nothing more).
        kernel, arms: the kernel and the arms `(A, d)`, when ``K_P`` is ``None``.
        prune_width, k_cap: with a width, the variances of the arms that pass the UCB bound (and of the pulled
            arms; :mod:`~torchbkb.bandits.pruning`) only, in ``k_cap`` slots: the means first, then `(m_cap, k_cap)`
            columns; the arms that passed are counted in the flags (more than ``k_cap``: run again in more).
    """
    valid_p = u < 1.5  # the padding carries u = 2
    n = torch.where(valid_p, counts.index_select(0, asc_arm).to(torch.float64), 0.0)
    keep = u < inclusion_probability(rls_prev.index_select(0, asc_arm).to(torch.float64), n, q_bar, inclusion)
    keep = keep & valid_p
    positions, valid, m = compact_slots(keep, m_cap)
    slots = asc_arm.index_select(0, positions)
    slots = torch.where(valid, slots, slots[:1])  # (m_cap, A) rows: the unused slots repeat the first, never read
    if K_P is None:
        K_SA = kernel(arms.index_select(0, slots), arms)
    else:
        K_SA = K_P.index_select(0, asc_row.index_select(0, positions))
    dt = K_SA.dtype
    vf = valid.to(dt)
    cd = compute_dtype(dt, m_cap)
    vc = vf.to(cd)
    K_SS = K_SA.index_select(1, slots).T.to(cd) * (vc.unsqueeze(1) * vc) + torch.diag(1.0 - vc)
    L, info = torch.linalg.cholesky_ex(K_SS)  # the eager update's test: pivots well above rounding
    d = L.diagonal()
    lo = torch.where(valid, d, torch.inf).amin()
    hi = torch.where(valid, d, 0.0).amax()
    rtol = m.to(cd).clamp_min(1.0) * torch.finfo(dt).eps  # default_rtol(m, dtype), m on the device
    chol_ok = (info == 0) & (lo * lo > 100.0 * rtol * hi * hi)
    W = torch.linalg.solve_triangular(L, torch.eye(m_cap, dtype=cd, device=K_SA.device), upper=False)
    Zt = (W @ K_SA.index_select(1, asc_arm).to(cd)) * vc.unsqueeze(1)  # (m_cap, P) the pulled arms' features
    s = torch.where(valid_p, reward_sums.index_select(0, asc_arm), 0.0)
    Ma, V_inv, info_v = fit_kernel_row_operator_ex(W, Zt, n, s, lam)
    Ma = Ma * torch.cat([vc, vc.new_ones(1)]).unsqueeze(1) * vc  # exact zeros on the unused slots' rows and columns
    passed = torch.full_like(m, -1)
    scored = asc_arm[:0]
    if prune_width is None:
        mean, rls = score_kernel_columns(K_SA, kdiag, Ma.to(dt), lam, chunk)
    else:  # the eager update's pruned scoring, on fixed shapes
        Mad = Ma.to(dt)
        mean = Mad[-1] @ K_SA  # (A,)
        prior = kdiag / lam
        keep = survivor_mask(mean, prune_width * prior.sqrt(), excluded, asc_arm, valid_p)
        scored, valid_k, passed = compact_slots(keep, k_cap)
        part = rls_kernel_columns(K_SA.index_select(1, scored), kdiag.index_select(0, scored), Mad[:-1], lam, chunk)
        target = torch.where(valid_k, scored, kdiag.shape[0])  # the padding's to one slot past the arms
        rls = torch.cat([prior, prior[:1]]).index_copy(0, target, part)[:-1]
    changed = (m != prev_m) | ((slots != prev_slots) & valid).any()
    pick = torch.full_like(m, -1)
    if width is not None:  # the selection's own expression, so the same pick
        pick = torch.argmax((mean + width * rls.sqrt()).masked_fill(excluded, -torch.inf))
    finite = torch.isfinite(mean).all() & torch.isfinite(rls).all()  # no NaN enters the state, from any row
    head = torch.stack([m, chol_ok.long(), (info_v == 0).long(), changed.long(), pick, finite.long(), passed])
    flags = torch.cat([head, slots]).to(torch.float64)
    return FixedUpdate(K_SA, slots, W, V_inv, Ma, mean, rls, flags, scored)


#: :func:`fixed_update`'s arguments in order.
UPDATE_ARGUMENTS = tuple(inspect.signature(fixed_update).parameters)


def padded_features(out: FixedUpdate, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Z, V⁻¹)`` of an update not read yet, in its ``m_cap`` slots: `(A, m_cap)` features in ``dtype``, zero past
    the dictionary's ``m`` (compared on the device), and `(m_cap, m_cap)` ``V⁻¹``: ``V⁻¹ z`` and ``zᵀ V⁻¹ z``
    are those of the first ``m`` columns, what a selection needs."""
    valid = torch.arange(out.W.shape[0], device=out.W.device) < out.flags[0]
    return (out.K_SA.T @ out.W.T.to(dtype)) * valid.to(dtype), out.V_inv


class LaunchedUpdate(NamedTuple):
    """An update queued on the device and not read yet (:meth:`FixedCapacityUpdates._launch_fixed`)."""

    out: FixedUpdate  #: its outputs, flags included
    inputs: tuple  #: the positional inputs of :meth:`FixedCapacityEngine.launch`, to run it again in more slots
    extra: dict  #: its keyword inputs
    pulled: torch.Tensor  #: `(p,)` the pulled arms ascending; n: `(p,)` their float64 counts
    n: torch.Tensor
    schedule: list  #: the pruning schedule before the launch (an update handed to the eager one decides again)


class FixedCapacityEngine:
    """The host side of :func:`fixed_update`: the padded pulled arms, the dictionary's capacity, one read per update.

    Args:
        compiled: run :func:`fixed_update` through ``torch.compile(fullgraph=True)``: a graph per arm set, ``λ`` and
            dtype (capacities become dynamic after their first change); past the compiler's recompile limit, or on
            any compiler failure, a warning and the eager update from then on.
        backend: the ``torch.compile`` backend.

    Attributes:
        m_cap: the dictionary's slots (doubling when a dictionary outgrows them).
        graphs: the :class:`~torchbkb.bandits.update_graph.UpdateGraphs` that replay the update on a GPU (``None``:
            every update launched operation by operation).
    """

    graphs: UpdateGraphs | None = None  # an engine pickled before the graphs has none

    def __init__(self, compiled: bool = False, backend: str = "inductor"):
        self.compiled, self.backend = bool(compiled), backend
        self.graphs = UpdateGraphs()
        self.m_cap = MIN_CAPACITY
        self.k_cap = 0  # the scored arms' slots of a pruned update (set at the first, doubling when outgrown)
        self._num_arms = 0
        self._pulled: tuple | None = None  # (p, asc_row, asc_arm) for the current pulled arms
        self._prev: tuple | None = None  # (slots, m) of the last adopted update
        self._fn = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_fn": None}  # a compiled function does not pickle; it is built again when needed

    def set_pulled(self, pulled: torch.Tensor, rows: torch.Tensor) -> None:
        """The pulled arms `(p,)` ascending and their rows `(p,)` in the pulled-row buffer."""
        p = pulled.numel()
        P = capacity_for(p)
        asc_arm = pulled.new_zeros(P)
        asc_row = pulled.new_zeros(P)
        asc_arm[:p] = pulled
        asc_row[:p] = rows
        self._pulled = (p, asc_row, asc_arm)

    def draws(self, u: torch.Tensor) -> torch.Tensor:
        """`(P,)` the draws ``u`` `(p,)` of the pulled arms, padded with 2 (never kept)."""
        p, _, asc_arm = self._pulled
        out = torch.full((asc_arm.shape[0],), 2.0, dtype=torch.float64, device=asc_arm.device)
        out[:p] = to_device(u, out.device)  # queued: the draws come from the host's generator
        return out

    def update(self, K_P: torch.Tensor | None, counts: torch.Tensor, reward_sums: torch.Tensor, u: torch.Tensor,
               rls_prev: torch.Tensor, kdiag: torch.Tensor, sampler: RLSDictionary, lam: float,
               chunk: int, *, width: float | None = None, excluded: torch.Tensor | None = None,
               kernel=None, arms: torch.Tensor | None = None,
               prune_width: float | None = None) -> tuple[FixedUpdate, list[float]]:
        """Run :func:`fixed_update` with ``u`` `(P,)` from :meth:`draws`, growing ``m_cap`` until the dictionary fits;
        returns it and its flags read on the host (``[m, cholesky ok, V ok, changed, pick, finite, slots...]``)."""
        while True:
            out = self.launch(K_P, counts, reward_sums, u, rls_prev, kdiag, sampler, lam, chunk, width=width,
                              excluded=excluded, kernel=kernel, arms=arms, prune_width=prune_width)
            flags = out.flags.tolist()  # the one host read of an update
            if not self.outgrown(flags):
                return out, flags

    def launch(self, K_P: torch.Tensor | None, counts: torch.Tensor, reward_sums: torch.Tensor, u: torch.Tensor,
               rls_prev: torch.Tensor, kdiag: torch.Tensor, sampler: RLSDictionary, lam: float, chunk: int, *,
               width: float | None = None, excluded: torch.Tensor | None = None, kernel=None,
               arms: torch.Tensor | None = None, prune_width: float | None = None) -> FixedUpdate:
        """:func:`fixed_update` at the current capacities, not read: its flags may say the dictionary or the
        arms that passed the pruning bound outgrew them (:meth:`outgrown`)."""
        _, asc_row, asc_arm = self._pulled
        prev_slots, prev_m = self._previous(asc_arm.device)
        self._num_arms = int(kdiag.shape[0])
        if prune_width is not None and self.k_cap == 0:
            self.k_cap = capacity_for(self._num_arms // 16)
        return self._run((K_P, asc_row, asc_arm, counts, reward_sums, u, rls_prev, kdiag, prev_slots, prev_m,
                          sampler.q_bar, sampler.inclusion, lam, self.m_cap, chunk, width, excluded, kernel, arms,
                          prune_width, self.k_cap))

    def outgrown(self, flags: list[float]) -> bool:
        """Whether the update whose flags were read on the host needs more slots; if so ``m_cap`` (or, for the arms
        that passed the pruning bound while few enough to score alone, ``k_cap``) grows to hold them (run it again
        with the same draws)."""
        if flags[0] > self.m_cap:
            self.m_cap = capacity_for(int(flags[0]))
            return True
        passed = flags[6]
        if self.k_cap < passed <= PRUNE_MAX_FRACTION * self._num_arms:
            self.k_cap = capacity_for(int(passed))
            return True
        if 0 <= 8 * passed < self.k_cap:  # far fewer than the slots: the next update gathers fewer columns
            self.k_cap = capacity_for(2 * int(passed))
        return False

    def remember(self, dictionary: torch.Tensor) -> None:
        """The dictionary `(m,)` ascending that the next update compares with (to flag a change)."""
        self._prev = (dictionary, int(dictionary.numel()))

    def _previous(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        slots = torch.zeros(self.m_cap, dtype=torch.long, device=device)
        m = 0
        if self._prev is not None:
            old, m = self._prev
            k = min(old.numel(), self.m_cap)
            slots[:k] = old[:k]
        return slots, torch.full((), m, dtype=torch.long, device=device)  # a fill, not a copy from the host

    def _run(self, args: tuple) -> FixedUpdate:
        """:func:`fixed_update`, compiled when asked; a compilation that fails (a graph break, the recompile limit)
        says so once and the engine runs eagerly from then on: the same update."""
        if not self.compiled:
            return self._call(fixed_update, args)
        if self._fn is None or self._fn[0] != self.backend:
            self._fn = (self.backend, torch.compile(fixed_update, fullgraph=True, backend=self.backend))
        try:
            return self._call(self._fn[1], args)
        except Exception as err:  # noqa: BLE001 - any compiler failure; the eager call below raises real errors
            self.compiled = False
            warnings.warn(f"FixedCapacityEngine: torch.compile failed ({type(err).__name__}: {str(err)[:200]}); "
                          f"updating eagerly from now on", RuntimeWarning, stacklevel=4)
            return self._call(fixed_update, args)

    def _call(self, fn, args: tuple) -> FixedUpdate:
        """``fn(*args)``, replayed from a CUDA graph where :attr:`graphs` serve the device and the rows' size."""
        kdiag, graphs = args[UPDATE_ARGUMENTS.index("kdiag")], self.graphs
        rows_bytes = self.m_cap * kdiag.numel() * kdiag.element_size()
        out = None if graphs is None else graphs.run(fn, dict(zip(UPDATE_ARGUMENTS, args)), kdiag.dtype, rows_bytes)
        return fn(*args) if out is None else out


class FixedCapacityUpdates:
    """The update of a :class:`~torchbkb.bandits.sketched.SketchedKernelBandit` through :class:`FixedCapacityEngine`
    while ``fixed_capacity`` is on (the default on every device but the CPU), an arm was pulled, the dictionary's rows
    fit ``kernel_cache_bytes`` and, for an update that prunes, :data:`~torchbkb.bandits.capacity.FIXED_ROWS_MAX`:
    gathered from the pulled arms' cached rows, or, once those outgrew ``row_cache_bytes``, computed from the arms at
    every update; otherwise (before any pull, or for a ``K_S`` that needs ``eigh``) the eager update runs from the same
    draws. It prunes as the eager one does (:class:`~torchbkb.bandits.pruning.PruningSchedule`), in ``k_cap`` slots."""

    def _fixed_applies(self) -> bool:  # the row limit, measured for an update that prunes: not for replayed picks
        m_cap, small = self.engine.m_cap, self.engine.m_cap * self.num_arms <= capacity.FIXED_ROWS_MAX
        return self.fixed_capacity and self.t > 0 and self.rows.caches(m_cap) and (small or not self._prunes_fixed())

    def _update_fixed(self, pulled: torch.Tensor, n: torch.Tensor, forced: torch.Tensor | None, added=None) -> None:
        """Resample (or take ``forced`` `(k,)`: the first update, a checkpoint), refit, rescore; ``added``: new rows
        (``_add_pulled``) whose finiteness is read with the update's flags."""
        launched = self._launch_fixed(pulled, n, forced)
        self._complete_fixed(launched, self._read_with_rows(launched.out.flags, added).tolist())  # the one read

    def _launch_fixed(self, pulled: torch.Tensor, n: torch.Tensor, forced: torch.Tensor | None) -> LaunchedUpdate:
        """:meth:`_update_fixed` up to its host read: the update queued on the device, nothing adopted."""
        self._fused_pick = None
        if self.rows.caches_pulled_rows:  # the dictionary's rows gathered from the pulled arms' rows
            K_P, where, kernel, arms = *self.rows.pulled_rows(pulled), None, None
        else:  # computed from the arms (many arms: the pulled rows outgrew row_cache_bytes)
            K_P, where, kernel, arms = None, torch.zeros_like(pulled), self.kernel, self.arms
        if self._fixed_pulled is not pulled:
            self.engine.set_pulled(pulled, where)
            self._fixed_pulled = pulled
        if forced is None:
            u = self.sampler.draw(pulled.numel())
        else:
            u = torch.where(torch.isin(pulled, forced), -1.0, 1.25).to(torch.float64)  # in, or out but observed
        chunk = scoring_chunk(self.score_chunk_size, self.engine.m_cap, self.arms.device, self.arms.dtype)
        width = None if self.exclusions else self._fused_pick_width()
        prune_width = self._ucb_width() if self.prune and self._prunes_fixed() else None
        schedule = self.pruning.state()
        if prune_width is not None and not self.pruning.should_attempt(True):
            prune_width = None
        inputs = (K_P, self.counts, self.reward_sums, self.engine.draws(u), self.row_posterior.rls, self.kdiag,
                   self.sampler, self.lam, chunk)
        extra = {"width": width, "excluded": self.excluded, "kernel": kernel, "arms": arms, "prune_width": prune_width}
        return LaunchedUpdate(self.engine.launch(*inputs, **extra), inputs, extra, pulled, n, schedule)

    def _complete_fixed(self, launched: LaunchedUpdate, flags: list[float]) -> bool:
        """Adopt a launched update given its flags read on the host: ``True`` when adopted as launched, ``False``
        when it was run again in more slots (reading again) or handed to the eager update."""
        out, pulled, n, width = launched.out, launched.pulled, launched.n, launched.extra["width"]
        as_launched = not self.engine.outgrown(flags)
        if not as_launched:
            out, flags = self.engine.update(*launched.inputs, **launched.extra)
        post = self.row_posterior
        if not flags[5]:
            self._raise_nonfinite_scores([int(a) for a in flags[HEAD : HEAD + int(flags[0])]])
        m = int(flags[0])
        if m == 0 or not (flags[1] and flags[2]) or not self.rows.caches(m):
            self.engine.remember(out.slots[:m])
            self.pruning.load(launched.schedule)  # the eager update decides on pruning itself
            self._rebuild(out.slots[:m], pulled=pulled, counts=n)  # the eager update, on the dictionary drawn here
            return False
        if flags[6] >= 0 and not self.pruning.record_attempt(int(flags[6]), self.num_arms):
            out, flags = self.engine.update(*launched.inputs, **(launched.extra | {"prune_width": None}))
            as_launched = False  # most arms passed: every arm scored, as the eager update does
        new_dict = out.slots[:m]
        self.engine.remember(new_dict)
        with torch.no_grad():
            self.rows.adopt([int(a) for a in flags[HEAD : HEAD + m]], new_dict, out.K_SA)
            M = out.Ma[:m, :m].to(self.arms.dtype)
            if flags[3]:
                self.embeddings_computed += 1
                self._check_accuracy(self.rows.rows(), M, pulled, n, out.W[:m, :m])
            pruned = flags[6] >= 0
            scored = out.scored[: int(flags[6])] if pruned else None
            post.adopt(out.W[:m, :m], out.V_inv[:m, :m], M, out.mean, out.rls, scored, self.rows.rows())
            self._posterior = None
            self.arms_scored_total += post.arms_scored
        self.dictionary = new_dict
        self._deff, self._deff_inputs = None, (pulled, n, post.rls)
        if width is not None:  # ask takes it while nothing it depends on has changed
            pick = out.flags[4:5].long()  # (1,) on the device: no copy from the host
            self._fused_pick = (int(flags[4]), pick, width, self.excluded._version, post.mean, post.rls)
        return as_launched

    def _prunes_fixed(self) -> bool:  # BBKB: not while its picks replay from CUDA graphs (every arm a candidate)
        return True

    def _fused_pick_width(self) -> float | None:
        """The width of a next selection that is one UCB argmax, known at the update (``None``: none)."""
        return None

    def _take_fused_pick(self, width: float) -> torch.Tensor | None:
        """`(1,)` the pick the last update made for a selection of this ``width``, its host copy handed to ``ask``;
        ``None`` when there is none or anything it depends on changed since."""
        fused, self._fused_pick = self._fused_pick, None
        if fused is None or self.exclusions:
            return None
        host, pick, w, version, mean, rls = fused
        post = self.row_posterior
        if w != width or version != self.excluded._version or mean is not post.mean or rls is not post.rls:
            return None
        self._selected_ids = [host]
        return pick
