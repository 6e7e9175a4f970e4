"""Thompson sampling over a huge discrete candidate set, in chunks: ``q`` posterior function draws, each
maximized over the candidates, with extra memory ``O(A + chunk·(m + F) + q²)`` for ``A`` candidates, ``m``
dictionary points and ``F`` random prior features.

Each draw is a pathwise sample of the model's posterior (:mod:`torchbkb.botorch.pathwise`), so the picks are
exact Thompson draws of the DTC (or exact) posterior up to the random-feature prior, and the cost is linear in
``A``; a joint ``(A × A)`` posterior covariance (BoTorch's ``MaxPosteriorSampling``) is never formed. As
``MaxPosteriorSampling(replacement=False)`` (TuRBO's choice), a batch holds ``q`` distinct candidates by default:
draw ``i`` takes its best candidate that no earlier draw took (each draw's ``q`` best are kept across chunks);
``replacement=True`` lets every draw take its own maximizer. ``sampler="joint"`` draws the ``q`` functions exactly
from the joint posterior over the candidates instead (one `(A, A)` Cholesky factorization, ``O(A³)``: for up to
:data:`JOINT_MAX` candidates, such as TuRBO's trust-region candidates): inside a small region the posterior variance
is far below a random-feature prior's approximation error, which a pathwise draw then samples instead.

Example:
    >>> import torch
    >>> from torchbkb.botorch import BKBModel, optimize_acqf_thompson
    >>> X = torch.rand(40, 2, dtype=torch.float64); Y = -(X - 0.3).pow(2).sum(-1, keepdim=True)
    >>> choices = torch.rand(10_000, 2, dtype=torch.float64)
    >>> cand, values = optimize_acqf_thompson(BKBModel(X, Y, seed=0), choices, q=5, chunk_size=4096)
    >>> cand.shape, values.shape, torch.unique(cand, dim=0).shape[0]
    (torch.Size([5, 2]), torch.Size([5]), 5)
"""

from __future__ import annotations

import torch
from torch import Size, Tensor

from torchbkb.botorch.model import BKBModel
from torchbkb.botorch.pathwise import draw_bkb_paths
from torchbkb.botorch.training_data import check_candidates
from torchbkb.errors import InputDataError, NumericsError
from torchbkb.gp.exact_gp_state import ExactGPState

__all__ = ["optimize_acqf_thompson", "DEFAULT_CHUNK", "JOINT_MAX"]

#: Candidates evaluated at once.
DEFAULT_CHUNK = 4096
#: The most candidates of a joint draw (its `(A, A)` covariance: 800 MB in float64 at this size).
JOINT_MAX = 10_000


def optimize_acqf_thompson(
    model: BKBModel,
    choices: Tensor,
    q: int,
    *,
    replacement: bool = False,
    sampler: str = "pathwise",
    chunk_size: int = DEFAULT_CHUNK,
    num_features: int = 1024,
    return_indices: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """A batch of ``q`` Thompson picks from ``choices``: the maximizer of each of ``q`` posterior draws.

    Args:
        model: a :class:`~torchbkb.botorch.BKBModel` without batch dimensions.
        choices: `(A, d)` candidates in the model's original input space.
        q: number of picks (draws); at most ``A`` without replacement.
        replacement: ``False`` (default, as ``MaxPosteriorSampling(replacement=False)``): ``q`` distinct
            candidates, draw ``i`` taking its best candidate not taken by draws ``1..i-1``; ``True``: each draw's
            own maximizer (two draws may pick the same candidate).
        sampler: ``"pathwise"`` (default: random-feature prior plus the model's update, linear in ``A``) or
            ``"joint"`` (exact draws from the joint posterior over at most :data:`JOINT_MAX` candidates).
        chunk_size: candidates evaluated at once.
        num_features: random features of the prior draws.
        return_indices: also return the `(q,)` indices into ``choices``.

    Returns:
        ``(candidates, values)``: `(q, d)` picks and `(q,)` the value of each draw at its pick (original
        outcome units); with ``return_indices=True`` also the indices.
    """
    if not isinstance(model, BKBModel):
        raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
    check_candidates(model, choices)
    for name, value in (("q", q), ("chunk_size", chunk_size), ("num_features", num_features)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputDataError(f"{name}: expected an integer >= 1, got {value!r}")
    if not isinstance(replacement, bool):
        raise InputDataError(f"replacement: expected a bool, got {replacement!r}")
    if not replacement and q > choices.shape[0]:
        raise InputDataError(f"q: expected at most {choices.shape[0]} distinct candidates (the number given), got {q}")
    if sampler not in ("pathwise", "joint"):
        raise InputDataError(f"sampler: expected 'pathwise' or 'joint', got {sampler!r}")
    if sampler == "joint" and choices.shape[0] > JOINT_MAX:
        raise InputDataError(f"choices: expected at most {JOINT_MAX} candidates for joint draws, got {len(choices)}")
    model.eval()
    keep = 1 if replacement else q  # each draw's best `keep` candidates
    with torch.no_grad():
        best = torch.full((q, 0), -torch.inf, dtype=choices.dtype, device=choices.device)
        idx = torch.zeros((q, 0), dtype=torch.long, device=choices.device)
        if sampler == "joint":
            joint = _joint_draws(model, choices, q)  # (q, A)
            draw = lambda start: joint[:, start : start + chunk_size]  # noqa: E731
        else:
            paths = draw_bkb_paths(model, Size([q]), num_features=num_features)
            draw = lambda start: paths(choices[start : start + chunk_size])  # noqa: E731 - (q, c)
        for start in range(0, choices.shape[0], chunk_size):
            values = draw(start)
            v, i = values.topk(min(keep, values.shape[-1]), dim=-1)  # (q, k) each chunk's best of every draw
            best, order = torch.cat([best, v], -1).topk(min(keep, best.shape[-1] + v.shape[-1]), dim=-1)
            idx = torch.cat([idx, i + start], -1).gather(-1, order)
        if replacement:
            best, idx = best[:, 0], idx[:, 0]
        else:
            best, idx = _distinct(best, idx)
    out = (choices[idx], best)
    return (*out, idx) if return_indices else out


def _distinct(values: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """Draw ``i`` in order takes the first of its ranked candidates `(q, k)` that no earlier draw took."""
    taken: set[int] = set()
    rows = indices.tolist()
    pick = []
    for ranked in rows:
        j = next(j for j, c in enumerate(ranked) if c not in taken)  # draw i ranks q >= i + 1 candidates: one is free
        taken.add(ranked[j])
        pick.append(j)
    col = torch.tensor(pick, dtype=torch.long, device=indices.device).unsqueeze(-1)
    return values.gather(-1, col).squeeze(-1), indices.gather(-1, col).squeeze(-1)


def _joint_draws(model: BKBModel, choices: Tensor, q: int) -> Tensor:
    """`(q, A)` exact draws of the posterior over the candidates (original outcome units), from its dense joint
    covariance in the model's transformed space. An exact model's covariance is formed from float64 kernel values,
    whatever the inputs' dtype: from float32 ones it can be indefinite far beyond a jitter (a small region, a tiny
    noise: float32 kernel values round at 10⁻⁷ of the prior)."""
    X_tf = model.transform_inputs(choices)
    state = model.engine.exact_state
    if state is not None and X_tf.dtype != torch.float64:  # the same inputs in float64: a float64 model's covariance
        f64 = [t.to(torch.float64) for t in (state.train_X, state.train_y, state.train_noise)]
        mean, cov = ExactGPState(state.kernel, *f64).joint(X_tf.to(torch.float64))
    else:
        mean, cov = model.engine.joint(X_tf)  # (A,), (A, A): centered, transformed outcomes
    L = _jittered_cholesky(cov)
    if L is None:
        raise NumericsError(f"joint draws: expected a positive semidefinite posterior covariance over {len(choices)} "
                            "candidates, got one that fails with a jitter of 1e-4 of its mean variance")
    eps = torch.randn(L.shape[-1], q, dtype=L.dtype, device=L.device)
    draws = (mean.to(L) + model.mean_constant.to(L)).unsqueeze(-1) + L @ eps  # (A, q)
    if hasattr(model, "outcome_transform"):
        return model.outcome_transform.untransform(draws.T.unsqueeze(-1).to(choices))[0].squeeze(-1)  # (q, A)
    return draws.T.to(choices)


def _jittered_cholesky(cov: Tensor) -> Tensor | None:
    """The float64 Cholesky factor of ``cov`` plus the least jitter that works, from 10⁻¹⁰ of its mean variance up
    to 10⁻⁴ in tenfold steps (a jitter far below the posterior variances changes no draw); ``None`` if none does."""
    cov = cov.to(torch.float64)
    scale = float(cov.diagonal().mean().clamp_min(torch.finfo(torch.float64).tiny))
    added = 0.0
    for jitter in (1e-10, 1e-8, 1e-6, 1e-4):
        cov.diagonal().add_((jitter - added) * scale)  # in place: no second (A, A) matrix
        added = jitter
        L, info = torch.linalg.cholesky_ex(cov)
        if not bool(info.any()):
            return L
    return None
