"""BBKB's adaptive batches over a discrete candidate set, for BoTorch users.

:func:`optimize_acqf_bbkb` is the BBKB counterpart of ``botorch.optim.optimize_acqf_discrete``: instead
of a fixed ``q`` it returns the adaptive batch of 001 Algorithm 1 (lines 4-8) -- the dictionary and the
mean are frozen at the batch start, each pick is hallucinated into the variance by a rank-one update,
UCBs are recomputed lazily, and the batch ends once ``1 + Σ σ̃²_fb(x_s) > C̃``. The selection itself is
:func:`torchbkb.batch_selection.select_batch`; this module scores the candidates in chunks and lets it read
their features on demand (:class:`CandidateFeatures`): extra memory ``O(A + chunk·(m + J))``, no `(A, m)`
tensor.

Example:
    >>> import torch
    >>> from torchbkb.botorch import BKBModel, optimize_acqf_bbkb
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(30, 2, dtype=torch.float64, generator=g)
    >>> model = BKBModel(X, torch.sin(6 * X[:, :1]), seed=0)
    >>> choices = torch.rand(20_000, 2, dtype=torch.float64, generator=g)
    >>> cand, acq = optimize_acqf_bbkb(model, choices, batch_bound=2.0, beta=1.0)
    >>> cand.shape[1], cand.shape[0] == acq.shape[0] >= 1
    (2, True)
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchbkb.batch_selection import check_batch_limits, select_batch
from torchbkb.botorch.acquisition import beta_rls
from torchbkb.botorch.training_data import check_candidates
from torchbkb.errors import InputDataError
from torchbkb.nystrom import DEFAULT_CHUNK
from torchbkb.botorch.model import BKBModel

__all__ = ["optimize_acqf_bbkb", "CandidateFeatures"]


def optimize_acqf_bbkb(
    model,
    choices: Tensor,
    batch_bound: float = 2.0,
    max_batch_size: int | None = None,
    beta: str | float = "theory",
    *,
    F: float = 1.0,
    delta: float = 0.01,
    epsilon: float = 0.5,
    noise_std: float | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    lazy: bool = True,
    return_indices: bool = False,
):
    """Select BBKB's adaptive batch from a discrete set of candidates.

    UCB on the RLS scale: ``μ̃_fb(x) + α̃·σ̃_t(x)``; ``beta="theory"`` gives ``α̃ = C̃·β̃ₜ`` with BKB's
    ``β̃ₜ`` of the model's data (:func:`~torchbkb.botorch.theory_beta`); a number is ``α̃`` itself.

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` without batch dimensions.
        choices: `(A, d)` candidates in the original input space (``A`` up to ``10⁶-10⁷``).
        batch_bound: ``C̃ >= 1``; the batch ends with the first pick for which ``1 + Σ σ̃²_fb > C̃``.
        max_batch_size: optional cap on the batch length.
        beta: ``"theory"``, ``"vakili"`` (003 Theorem 3.5 with a union bound over ``choices``) or ``α̃ >= 0``.
        F, delta, epsilon, noise_std: parameters of ``"theory"`` (see :func:`~torchbkb.botorch.theory_beta`).
        chunk_size: candidates transformed, embedded and scored at once.
        lazy: lazy UCB updates (``False`` recomputes every UCB after each pick; same result, slower).
        return_indices: also return the picked row indices of ``choices``.

    Returns:
        ``(candidates, acq_values)`` -- `(B, d)` picks in order (an arm may repeat: hallucination shrinks
        its variance but does not remove it) and `(B,)` their UCB at pick time, mapped through the outcome
        transform's ``untransform`` (original outcome units for ``Standardize``); with
        ``return_indices=True`` also the `(B,)` long indices into ``choices``.
    """

    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
    check_candidates(model, choices)
    C, _ = check_batch_limits(batch_bound)
    if int(chunk_size) < 1:
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
        sel = select_batch(rows, mean, rls, post.V_inv, alpha, C, max_batch_size=max_batch_size, lazy=lazy, validate=False, chunk_size=int(chunk_size))
        idx = sel.indices
        ucb = mean[idx] + alpha * sel.rls_in_batch.to(mean).clamp_min(0.0).sqrt()  # (B,) transformed units
        if hasattr(model, "outcome_transform"):
            ucb = model.outcome_transform.untransform(ucb.unsqueeze(-1))[0].squeeze(-1)
    out = (choices[idx], ucb)
    return (*out, idx) if return_indices else out


class CandidateFeatures:
    """The Nyström features `(A, r)` of the candidates as :func:`~torchbkb.batch_selection.select_batch` reads them
    (``shape``, ``dtype``, ``device``, ``rows[idx]``), computed on demand: never all ``A`` rows at once.

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
        return self._embedding(self._model.transform_inputs(self._choices[idx]))  # (M, r)


def _score(model, choices: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Mean `(A,)` (transformed, centered) and RLS variance `(A,)` of ``choices``, ``chunk`` rows at a time."""
    post = model.dtc_posterior
    mean, rls = choices.new_empty((choices.shape[0],)), choices.new_empty((choices.shape[0],))
    for i in range(0, choices.shape[0], chunk):
        m, var = post(model.transform_inputs(choices[i : i + chunk]))  # (c,), GP scale
        mean[i : i + chunk], rls[i : i + chunk] = m, var / post.lam
    return mean, rls
