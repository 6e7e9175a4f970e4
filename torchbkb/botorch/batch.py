"""BBKB's batches over a discrete candidate set, for BoTorch users: ``q`` distinct points, or 001's adaptive batch.

:func:`optimize_acqf_bbkb` is the BBKB counterpart of ``botorch.optim.optimize_acqf_discrete``. With ``q`` it
returns ``q`` distinct candidates, picked greedily by the UCB ``μ̃_fb + α̃ σ̃_t`` where each pick is conditioned
on exactly as a hallucinated observation of the DTC posterior (:mod:`torchbkb.bandits.fantasy_batch`: a pick lowers its
own and its neighbours' variance as an exact fantasy would; GP-BUCB's greedy batch when the dictionary holds every
training point). With ``q=None`` it returns the adaptive batch of 001 Algorithm 1 (lines 4-8): each pick
hallucinated into ``V`` by a rank-one update, UCBs recomputed lazily, the batch ended once
``1 + Σ σ̃²_fb(x_s) > C̃`` (:func:`torchbkb.bandits.batch_selection.select_batch`). Either way the candidates are
scored in chunks and their features read on demand (:class:`CandidateFeatures`): extra memory ``O(A + chunk·m)`` plus
``O(q·(m + q))``, no `(A, m)` tensor. The result says why the batch ended (:class:`BBKBBatch`).

Example:
    >>> import torch
    >>> from torchbkb.botorch import BKBModel, optimize_acqf_bbkb
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(30, 2, dtype=torch.float64, generator=g)
    >>> model = BKBModel(X, torch.sin(6 * X[:, :1]), seed=0)
    >>> choices = torch.rand(20_000, 2, dtype=torch.float64, generator=g)
    >>> cand, acq = optimize_acqf_bbkb(model, choices, q=10, beta=1.0)
    >>> cand.shape, torch.unique(cand, dim=0).shape[0]
    (torch.Size([10, 2]), 10)
    >>> batch = optimize_acqf_bbkb(model, choices, batch_bound=2.0, beta=1.0)     # 001's adaptive rule
    >>> batch.stop_reason in ("batch_bound", "max_batch_size", "stalled")
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchbkb.bandits.batch_selection import select_batch
from torchbkb.bandits.batch_stop_rule import check_batch_limits
from torchbkb.botorch.acquisition import beta_rls
from torchbkb.botorch.training_data import check_candidates
from torchbkb.errors import InputDataError
from torchbkb.bandits.fantasy_batch import FeatureReader, check_q, select_fixed_batch
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.botorch.model import BKBModel

__all__ = ["optimize_acqf_bbkb", "BBKBBatch", "CandidateFeatures"]


def optimize_acqf_bbkb(
    model,
    choices: Tensor,
    batch_bound: float = 2.0,
    max_batch_size: int | None = None,
    beta: str | float = "theory",
    *,
    q: int | None = None,
    unique: bool = True,
    F: float = 1.0,
    delta: float = 0.01,
    epsilon: float = 0.5,
    noise_std: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    lazy: bool = True,
    return_indices: bool = False,
) -> BBKBBatch:
    """Select a BBKB batch from a discrete set of candidates: ``q`` distinct points, or 001's adaptive batch.

    UCB on the RLS scale: ``μ̃_fb(x) + α̃·σ̃_t(x)``; ``beta="theory"`` gives ``α̃ = C̃·β̃ₜ`` with BKB's
    ``β̃ₜ`` of the model's data (:func:`~torchbkb.botorch.theory_beta`); a number is ``α̃`` itself.

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` without batch dimensions.
        choices: `(A, d)` candidates in the original input space (``A`` up to ``10⁶-10⁷``).
        batch_bound: ``C̃ >= 1``: with ``q=None`` the batch ends with the first pick for which
            ``1 + Σ σ̃²_fb > C̃``; it multiplies the ``"theory"`` width in both modes.
        max_batch_size: optional cap on an adaptive batch's length (``q=None``).
        beta: ``"theory"``, ``"vakili"`` (003 Theorem 3.5 with a union bound over ``choices``) or ``α̃ >= 0``.
        q: the batch size: ``q`` candidates, distinct with ``unique`` (BoTorch's ``optimize_acqf_discrete``
            convention), each an exact fantasy of the DTC posterior; ``None``: 001's adaptive batch.
        unique: with ``q``, no candidate twice (``q`` at most the number of candidates).
        F, delta, epsilon, noise_std: parameters of ``"theory"`` (see :func:`~torchbkb.botorch.theory_beta`).
        chunk_size: candidates transformed, embedded and scored at once.
        lazy: lazy UCB updates of the adaptive batch (``False`` recomputes every UCB after each pick; the same
            batch, slower).
        return_indices: also return the picked row indices of ``choices``.

    Returns:
        A :class:`BBKBBatch`, which unpacks as ``(candidates, acq_values)`` -- `(B, d)` picks in order and
        `(B,)` their UCB at pick time, mapped through the outcome transform's ``untransform`` (original outcome
        units for ``Standardize``) -- or, with ``return_indices=True``, also the `(B,)` long indices into
        ``choices``; ``.stop_reason`` says why it ended. An adaptive batch may repeat a candidate.
    """

    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
    check_candidates(model, choices)
    C, max_batch_size = check_batch_limits(batch_bound, max_batch_size)
    if q is not None:
        q = check_q(q, int(choices.shape[0]) if unique else 2**62)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InputDataError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    if isinstance(beta, str):
        alpha = float(beta_rls(model, beta, F, delta, epsilon, noise_std, num_points=int(choices.shape[-2]))) * C
    else:
        alpha = float(beta_rls(model, beta, F, delta, epsilon, noise_std))

    model.eval()
    post = model.dtc_posterior
    with torch.no_grad():
        mean, rls = _score(model, choices, int(chunk_size))
        mean = mean + model.mean_constant.to(mean)
        rows = CandidateFeatures(model, choices)
        if q is not None:
            sel = select_fixed_batch(FeatureReader(rows.__getitem__, rows.cross), mean, rls, post.V_inv, lam=post.lam,
                                     alpha=alpha, q=q, unique=unique, chunk_size=int(chunk_size))
            idx, in_batch, reason = sel.indices, sel.rls_in_batch, sel.stop_reason
        else:
            sel = select_batch(rows, mean, rls, post.V_inv, alpha, C, max_batch_size=max_batch_size, lazy=lazy,
                               validate=False, chunk_size=int(chunk_size))
            idx, in_batch = sel.indices, sel.rls_in_batch
            reason = "max_batch_size" if max_batch_size is not None and idx.numel() == max_batch_size else (
                "batch_bound" if 1.0 + float(sel.rls_start.sum()) > C else "stalled")
        ucb = mean[idx] + alpha * in_batch.to(mean).clamp_min(0.0).sqrt()  # (B,) transformed units
        if hasattr(model, "outcome_transform"):
            ucb = model.outcome_transform.untransform(ucb.unsqueeze(-1))[0].squeeze(-1)
    out = (choices[idx], ucb, idx) if return_indices else (choices[idx], ucb)
    return BBKBBatch(out, reason)


class BBKBBatch(tuple):
    """What :func:`optimize_acqf_bbkb` returns: a tuple ``(candidates, acq_values[, indices])`` with attributes.

    Attributes:
        candidates: `(B, d)`; acq_values: `(B,)`; indices: `(B,)` long or ``None`` (without ``return_indices``).
        stop_reason: ``"q"`` (``q`` picks), ``"exhausted"`` (every candidate picked), ``"batch_bound"``
            (``1 + Σ σ̃²_fb > C̃``), ``"max_batch_size"``, or ``"stalled"`` (a pick of ``σ̃²_fb ≈ 0``).
    """

    def __new__(cls, items: tuple, stop_reason: str):
        new = super().__new__(cls, items)
        new.stop_reason = stop_reason
        return new

    @property
    def candidates(self) -> Tensor:
        return self[0]

    @property
    def acq_values(self) -> Tensor:
        return self[1]

    @property
    def indices(self) -> Tensor | None:
        return self[2] if len(self) > 2 else None


class CandidateFeatures:
    """The Nyström features `(A, r)` of the candidates as :func:`~torchbkb.bandits.batch_selection.select_batch` reads
    them (``shape``, ``dtype``, ``device``, ``rows[idx]``), computed on demand: never all ``A`` rows at once.

    Args:
        model: the :class:`~torchbkb.botorch.BKBModel` (its input transform and DTC embedding are used).
        choices: `(A, d)` candidates in the original input space.
    """

    def __init__(self, model, choices: Tensor):
        self._model, self._choices = model, choices
        self._embedding = model.dtc_posterior.embedding
        self.shape = torch.Size((choices.shape[0], self._embedding.rank))
        self.dtype, self.device = choices.dtype, choices.device

    def __getitem__(self, idx: Tensor | slice) -> Tensor:
        # the candidates' transformed values were checked when they were scored: no read per call
        return self._embedding(self._model.transform_inputs(self._choices[idx]), validate=False)  # (M, r)

    def cross(self, idx: Tensor, other: Tensor) -> Tensor:
        """`(M, j)` kernel values between the candidates ``idx`` and ``other`` (transformed space)."""
        tf = self._model.transform_inputs
        return self._embedding.kernel(tf(self._choices[idx]), tf(self._choices[other]))


def _score(model, choices: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Mean `(A,)` (transformed, centered) and RLS variance `(A,)` of ``choices``, ``chunk`` rows at a time."""
    post = model.dtc_posterior
    mean, rls = choices.new_empty((choices.shape[0],)), choices.new_empty((choices.shape[0],))
    for i in range(0, choices.shape[0], chunk):
        m, var = post(model.transform_inputs(choices[i : i + chunk]))  # (c,), GP scale
        mean[i : i + chunk], rls[i : i + chunk] = m, var / post.lam
    return mean, rls
