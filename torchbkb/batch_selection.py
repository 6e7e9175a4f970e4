"""BBKB's in-batch selection (001 Algorithm 1, lines 4-8): adaptive batch, hallucinated variances, lazy UCB.

Inside a batch the dictionary and the mean ``μ̃_fb`` are frozen; each pick ``x`` is hallucinated into
``V`` by a rank-one update, so every RLS variance can only decrease::

    σ̃²_t(a) = σ̃²_fb(a) - Σ_{j<=t} c_j (z(a)ᵀ u_j)²,   u_j = V_{j-1}⁻¹ z(x_j),  c_j = 1 / (1 + z(x_j)ᵀ u_j)

and so can every UCB ``μ̃_fb + α̃ σ̃_t``. After a pick we therefore only recompute the arms whose *stale*
UCB is at least the chosen arm's *new* UCB (lazy UCB): every other arm's true UCB is below it and
cannot be the next argmax. The batch ends with the first pick for which
``1 + Σ_{s in batch} σ̃²_fb(x_s) > C̃`` (that pick is the last one of the batch), or at ``max_batch_size``.

Example:
    >>> import torch
    >>> from torchbkb.batch_selection import select_batch
    >>> Z = torch.eye(3, dtype=torch.float64)                  # three orthogonal arms, r = 3
    >>> V_inv = torch.eye(3, dtype=torch.float64)              # V = I (λ = 1, nothing pulled)
    >>> mean = torch.tensor([0.0, 0.1, 0.2], dtype=torch.float64)
    >>> rls = torch.ones(3, dtype=torch.float64)
    >>> sel = select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=2.5)
    >>> sel.indices.tolist(), sel.rls_start.tolist()             # 1 + 1 <= 2.5 goes on, 1 + 2 > 2.5 ends
    ([2, 1], [1.0, 1.0])
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from torchbkb.errors import InputDataError, check_finite

__all__ = ["BatchSelection", "select_batch"]


class BatchSelection(NamedTuple):
    """Result of :func:`select_batch`.

    Attributes:
        indices: `(B,)` long, the arms of the batch in pick order (repeats allowed).
        rls_start: `(B,)` ``σ̃²_fb`` of the picks at the batch start (RLS scale).
        rls_in_batch: `(B,)` ``σ̃²_{t-1}`` of each pick at the moment it was picked (after the previous
            hallucinations) -- what GP-BUCB-style rules and diagnostics need.
        ucb_evaluations: number of arm UCBs recomputed after the batch start (lazy: usually ``<< A·B``).
        V_inv: `(r, r)` ``V⁻¹`` with all picks but the last hallucinated in.
    """

    indices: torch.Tensor
    rls_start: torch.Tensor
    rls_in_batch: torch.Tensor
    ucb_evaluations: int
    V_inv: torch.Tensor


def select_batch(
    Z: torch.Tensor,
    mean: torch.Tensor,
    rls: torch.Tensor,
    V_inv: torch.Tensor,
    alpha: float,
    batch_bound: float,
    max_batch_size: int | None = None,
    lazy: bool = True,
    stop_rule: str = "sum",
    *,
    validate: bool = True,
) -> BatchSelection:
    """Select one BBKB batch over embedded candidates.

    Args:
        Z: `(A, r)` embedded candidates ``z(a)`` (any float dtype; scoring runs in it).
        mean: `(A,)` frozen mean ``μ̃_fb``.
        rls: `(A,)` RLS-scale variances ``σ̃²_fb`` at the batch start.
        V_inv: `(r, r)` ``V_fb⁻¹`` at the batch start (not modified).
        alpha: the multiplier ``α̃`` of ``σ̃`` in the UCB (``C̃·β̃`` for the theory; a user float as is).
        batch_bound: ``C̃ >= 1``.
        max_batch_size: optional cap on the batch length.
        lazy: recompute only the arms that could win (``False``: recompute all, for testing).
        stop_rule: ``"sum"`` -- BBKB, stop once ``1 + Σ σ̃²_fb(x_s) > C̃``; ``"product"`` -- GP-BUCB,
            stop once ``Π (1 + σ̃²_fb(x_s)) > C̃``.
        validate: check shapes, finiteness and ranges (``False`` skips the ``O(A·r)`` scans; for callers
            such as :class:`~torchbkb.BBKB` whose inputs come from their own posterior).

    Returns:
        A :class:`BatchSelection`.
    """
    if validate:
        _check(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size, stop_rule)
    r = Z.shape[1]
    dt = Z.dtype
    work = V_inv.dtype
    alpha = float(alpha)
    V_t = V_inv.clone()
    mean_c, rls0 = mean.to(dt), rls.to(dt)
    ucb = mean_c + alpha * rls0.clamp_min(0.0).sqrt()  # stale upper bounds, exact now
    U_buf = torch.empty((r, r), dtype=work, device=Z.device)  # downdate directions u_j as columns (first r)
    coef_buf = torch.empty((r,), dtype=work, device=Z.device)
    b = 0  # hallucinated picks so far
    picks: list[int] = []
    in_batch: list[torch.Tensor] = []
    level = 1.0  # 1 + Σ σ̃²_fb   or   Π (1 + σ̃²_fb)
    evaluations = 0
    cur_rls = rls0.clone()
    while True:
        i = int(torch.argmax(ucb))  # lowest index among ties
        picks.append(i)
        in_batch.append(cur_rls[i].clone())  # a copy: cur_rls keeps changing
        s = float(rls0[i])
        level = level + s if stop_rule == "sum" else level * (1.0 + s)
        if level > batch_bound or (max_batch_size is not None and len(picks) >= max_batch_size):
            break
        z = Z[i].to(work)  # (r,)
        u = V_t @ z
        c = 1.0 / (1.0 + z @ u)
        V_t = V_t - c * torch.outer(u, u)  # hallucinate x_i: Sherman-Morrison, O(r²)
        if b < r:  # past r picks the direct form is cheaper and the directions are not needed
            U_buf[:, b], coef_buf[b] = u, c
        b += 1
        U, coefs = U_buf[:, :b], coef_buf[:b]  # (r, b), (b,) -- only read while b <= r
        u_i = _refresh(Z, [i], rls0, U, coefs, b, V_t, V_inv, mean_c, alpha)
        new_rls_i, new_ucb_i = u_i[0][0], u_i[1][0]
        if s <= 0.0 and not bool(new_ucb_i < ucb[i]):
            # σ̃²_fb of the pick is 0 (to rounding): the stop rule does not move and its UCB cannot drop,
            # so every later pick would be this arm again, forever -- end the batch here
            break
        cur_rls[i], ucb[i] = new_rls_i, new_ucb_i
        mask = ucb >= new_ucb_i if lazy else torch.ones_like(ucb, dtype=torch.bool)
        idx = mask.nonzero().squeeze(1)  # (M,)
        evaluations += 1 + int(idx.numel())
        rls_m, ucb_m = _refresh(Z, idx, rls0, U, coefs, b, V_t, V_inv, mean_c, alpha)
        cur_rls[idx], ucb[idx] = rls_m, ucb_m
    dev = Z.device
    return BatchSelection(
        indices=torch.tensor(picks, dtype=torch.long, device=dev),
        rls_start=rls0[torch.tensor(picks, dtype=torch.long, device=dev)].to(rls.dtype),
        rls_in_batch=torch.stack(in_batch).to(rls.dtype),
        ucb_evaluations=evaluations,
        V_inv=V_t,
    )


def check_batch_limits(batch_bound: float, max_batch_size: int | None = None) -> tuple[float, int | None]:
    """Validate BBKB/GP-BUCB's batch limits: a finite ``C̃ >= 1`` and ``None`` or an integer ``>= 1``.

    Returns:
        ``(C̃, max_batch_size)`` as ``(float, int | None)``.
    """
    try:
        C = float(batch_bound)
    except (TypeError, ValueError):
        raise InputDataError(f"batch_bound: expected a float C̃ >= 1, got {batch_bound!r}") from None
    if not 1.0 <= C < math.inf:
        raise InputDataError(f"batch_bound: expected a finite C̃ >= 1, got {batch_bound!r}")
    if max_batch_size is not None and (isinstance(max_batch_size, bool) or int(max_batch_size) != max_batch_size or int(max_batch_size) < 1):
        raise InputDataError(f"max_batch_size: expected an integer >= 1 or None, got {max_batch_size!r}")
    return C, None if max_batch_size is None else int(max_batch_size)


def _refresh(Z, idx, rls0, U, coefs, b, V_t, V_0, mean, alpha):
    """Current RLS variance and UCB of the arms ``idx``: ``σ̃²_fb - Σ_j c_j (zᵀu_j)²`` while the batch
    is shorter than ``r`` (cost ``|idx|·r·b``), else ``σ̃²_fb - zᵀV_0⁻¹z + zᵀV_t⁻¹z`` (cost ``|idx|·r²``)."""
    Zi = Z[idx]  # (M, r)
    if b <= Z.shape[1]:
        proj = Zi @ U.to(Z.dtype)  # (M, b)
        drop = (proj * proj) @ coefs.to(Z.dtype)  # (M,)
    else:
        drop = ((Zi @ V_0.to(Z.dtype)) * Zi).sum(-1) - ((Zi @ V_t.to(Z.dtype)) * Zi).sum(-1)
    rls_i = (rls0[idx] - drop).clamp_min(0.0)
    return rls_i, mean[idx] + alpha * rls_i.sqrt()


def _check(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size, stop_rule):
    if not isinstance(Z, torch.Tensor) or Z.dim() != 2:
        raise InputDataError(f"Z: expected shape (A, r), got {tuple(Z.shape) if isinstance(Z, torch.Tensor) else type(Z).__name__}")
    A, r = Z.shape
    if A == 0:
        raise InputDataError("Z: expected at least one candidate, got A = 0")
    for name, t in (("mean", mean), ("rls", rls)):
        if not isinstance(t, torch.Tensor) or t.shape != (A,):
            raise InputDataError(f"{name}: expected shape ({A},), got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        check_finite(t, name)
    if not isinstance(V_inv, torch.Tensor) or V_inv.shape != (r, r):
        raise InputDataError(f"V_inv: expected shape ({r}, {r}), got {tuple(V_inv.shape) if isinstance(V_inv, torch.Tensor) else type(V_inv).__name__}")
    check_finite(Z, "Z")
    if bool((rls < 0).any()):
        raise InputDataError(f"rls: expected non-negative variances, got min {float(rls.min()):.3e}")
    if not float(alpha) >= 0:
        raise InputDataError(f"alpha: expected alpha >= 0, got {alpha!r}")
    if not float(batch_bound) >= 1.0:
        raise InputDataError(f"batch_bound: expected C̃ >= 1, got {batch_bound!r}")
    if max_batch_size is not None and int(max_batch_size) < 1:
        raise InputDataError(f"max_batch_size: expected an integer >= 1 or None, got {max_batch_size!r}")
    if stop_rule not in ("sum", "product"):
        raise InputDataError(f"stop_rule: expected 'sum' or 'product', got {stop_rule!r}")
    return A, r
