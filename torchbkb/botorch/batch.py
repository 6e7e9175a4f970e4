"""BBKB's adaptive batches over a discrete candidate set, for BoTorch users.

:func:`optimize_acqf_bbkb` is the BBKB counterpart of ``botorch.optim.optimize_acqf_discrete``: instead
of a fixed ``q`` it returns the adaptive batch of 001 Algorithm 1 (lines 4-8) -- the dictionary and the
mean are frozen at the batch start, each pick is hallucinated into the variance by a rank-one update,
UCBs are recomputed lazily, and the batch ends once ``1 + Σ σ̃²_fb(x_s) > C̃``. The selection itself is
:func:`torchbkb.batch_selection.select_batch`; this module embeds the candidates in chunks (peak memory
``O(chunk · m)`` besides the `(A, r)` embedding the lazy updates need) and converts the scales.

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
from torchbkb.botorch.acquisition import _beta_rls
from torchbkb.errors import InputDataError
from torchbkb.nystrom import DEFAULT_CHUNK

__all__ = ["optimize_acqf_bbkb"]


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
    from torchbkb.botorch.model import BKBModel

    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
    if model.batch_shape != torch.Size():
        raise InputDataError(f"model: expected a model without batch dimensions, got batch_shape {tuple(model.batch_shape)}")
    if not isinstance(choices, Tensor) or choices.dim() != 2 or choices.shape[0] < 1:
        got = tuple(choices.shape) if isinstance(choices, Tensor) else type(choices).__name__
        raise InputDataError(f"choices: expected shape (A >= 1, {model._input_dim}), got {got}")
    model._check_X(choices, "choices")
    C, _ = check_batch_limits(batch_bound)
    if int(chunk_size) < 1:
        raise InputDataError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    if isinstance(beta, str):
        alpha = float(_beta_rls(model, beta, F, delta, epsilon, noise_std, num_points=int(choices.shape[-2]))) * C
    else:
        alpha = float(_beta_rls(model, beta, F, delta, epsilon, noise_std))

    model.eval()
    post = model.dtc_posterior
    with torch.no_grad():
        Z, mean, rls = _embed_and_score(model, choices, int(chunk_size))
        mean = mean + model.mean_constant.to(mean)
        sel = select_batch(Z, mean, rls, post.V_inv, alpha, C, max_batch_size=max_batch_size, lazy=lazy)
        idx = sel.indices
        ucb = mean[idx] + alpha * sel.rls_in_batch.to(mean).clamp_min(0.0).sqrt()  # (B,) transformed units
        if hasattr(model, "outcome_transform"):
            ucb = model.outcome_transform.untransform(ucb.unsqueeze(-1))[0].squeeze(-1)
    out = (choices[idx], ucb)
    return (*out, idx) if return_indices else out


def _embed_and_score(model, choices: Tensor, chunk: int) -> tuple[Tensor, Tensor, Tensor]:
    """Transform, embed and score ``choices`` chunk by chunk.

    Returns:
        ``Z`` `(A, r)` in the choices' dtype, ``mean`` `(A,)` (transformed, centered) and ``rls`` `(A,)`.
    """
    post = model.dtc_posterior
    emb = post.embedding
    A = choices.shape[0]
    r = emb.rank
    Z = choices.new_empty((A, r))
    mean = choices.new_empty((A,))
    rls = choices.new_empty((A,))
    for i in range(0, A, chunk):
        Xc = model.transform_inputs(choices[i : i + chunk])  # (c, d)
        Zc = emb(Xc)  # (c, r)
        mc, rc = post.score_embedded(Zc, emb.kernel_diag(Xc))
        Z[i : i + chunk], mean[i : i + chunk], rls[i : i + chunk] = Zc, mc, rc
    return Z, mean, rls
