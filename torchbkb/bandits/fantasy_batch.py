"""A fixed-size batch of ``q`` distinct picks, greedy by UCB, each pick an exact fantasy of the DTC posterior.

BBKB's rank-one update of ``V`` (001 Algorithm 1) hallucinates a pick only inside the dictionary's span: the
residual ``(k(x, x) - ‖z(x)‖²)/λ`` of a candidate outside it is untouched, so a pick barely lowers its own
variance and a forced long batch repeats it. Here the batch's posterior is the DTC posterior *as a Gaussian
process* -- covariance ``c₀(x, x') = k(x, x') - z(x)ᵀ(I - λV⁻¹)z(x')`` (GP scale) -- and every pick ``p`` is
conditioned on exactly, as an observation with noise ``λ`` and the posterior mean as outcome (GP-BUCB's
hallucination)::

    σ²_j(x) = c₀(x, x) - c₀(x, P)(C_PP + λI)⁻¹c₀(P, x),    P = the j picks so far,  C_PP = c₀(P, P)

so a pick lowers its own variance to ``σ²λ/(σ² + λ)`` and its neighbours' as an exact fantasy does, and the mean
stays ``μ̃_fb``. With a dictionary that holds every training point ``c₀`` is the exact GP's posterior covariance
and the batch is GP-BUCB's greedy batch (Desautels et al. 2014) with the same width.

The greedy is lazy: UCBs ``μ̃ + α̃ σ̃_j`` (RLS scale, ``σ̃² = σ²/λ``) only decrease, so a candidate's stored
UCB is an upper bound, and a pick needs fresh UCBs only for the candidates whose stored bound could still win. They
are kept in a pool of the best stored bounds (the best bound outside it is known); a refresh reads the features
and the kernel values against the picks of a few candidates (``O(M·(r + d)·j + M·j²)`` for ``M`` candidates).
Memory: ``O(A)`` for ``A`` candidates plus ``O(q·(r + q))`` and one chunk of candidates read on demand.

Example:
    >>> import torch
    >>> Z = torch.eye(3, dtype=torch.float64)                      # three orthogonal candidates in the span
    >>> reader = FeatureReader(Z, lambda i, j: (i[:, None] == j[None, :]).to(torch.float64))
    >>> batch = select_fixed_batch(reader, torch.tensor([0.0, 0.1, 0.2]).double(), torch.ones(3).double(),
    ...                            torch.eye(3, dtype=torch.float64), lam=1.0, alpha=1.0, q=3)
    >>> batch.indices.tolist(), batch.stop_reason
    ([2, 1, 0], 'q')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from torchbkb.errors import InputDataError
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.utils.host_copy import read_scalars, to_device

__all__ = ["FixedBatch", "FeatureReader", "select_fixed_batch", "check_q"]

#: Candidates refreshed at once when the best stored bound is stale.
REFRESH_BLOCK = 64
#: Size of the pool of candidates with the best stored bounds (at least ``4q``).
POOL = 4096


class FixedBatch(NamedTuple):
    """Result of :func:`select_fixed_batch`.

    Attributes:
        indices: `(B,)` long, distinct candidates in pick order (``B = q`` unless every candidate was picked).
        rls_in_batch: `(B,)` the RLS-scale variance of each pick when it was picked (after the earlier picks).
        ucb_evaluations: candidates whose UCB was recomputed after the batch start.
        stop_reason: ``"q"`` (the batch is full) or ``"exhausted"`` (no candidate left).
    """

    indices: Tensor
    rls_in_batch: Tensor
    ucb_evaluations: int
    stop_reason: str


class FeatureReader:
    """Candidates as :func:`select_fixed_batch` reads them: ``features(idx)`` `(M, r)` and ``cross(idx, picks)``
    `(M, j)` kernel values ``k(x_idx, x_picks)``, on demand.

    Args:
        features: `(A, r)` features, or a callable ``idx -> (M, r)``.
        cross: callable ``(idx, picks) -> (M, j)``.
    """

    def __init__(self, features: Tensor | Callable[[Tensor], Tensor], cross: Callable[[Tensor, Tensor], Tensor]):
        self._features, self.cross = features, cross

    def features(self, idx: Tensor) -> Tensor:
        """`(M, r)` features of the candidates ``idx``."""
        f = self._features
        return f[idx] if isinstance(f, Tensor) else f(idx)


def check_q(q, num_candidates: int) -> int:
    """``q`` as an ``int``: an integer ``1 <= q <= num_candidates`` (distinct picks), else
    :class:`~torchbkb.errors.InputDataError`."""
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise InputDataError(f"q: expected an integer >= 1, got {q!r}")
    if q > num_candidates:
        raise InputDataError(f"q: expected at most {num_candidates} distinct candidates (the number given), got {q}")
    return int(q)


def select_fixed_batch(reader: FeatureReader, mean: Tensor, rls: Tensor, V_inv: Tensor, *, lam: float, alpha: float,
                       q: int, excluded: Tensor | None = None, unique: bool = True,
                       chunk_size: int = DEFAULT_CHUNK) -> FixedBatch:
    """Select ``q`` distinct candidates greedily by ``μ̃_fb + α̃ σ̃_j`` with exact fantasies (module docstring).

    Args:
        reader: the candidates' features (in the posterior's embedding) and kernel values (:class:`FeatureReader`).
        mean: `(A,)` the frozen mean ``μ̃_fb``.
        rls: `(A,)` RLS-scale variances ``σ̃²_fb`` at the batch start.
        V_inv: `(r, r)` ``V⁻¹`` of the posterior.
        lam: ``λ``; alpha: the multiplier ``α̃ >= 0`` of ``σ̃``.
        q: the batch size (``1 <= q``; fewer when fewer candidates are left).
        excluded: optional `(A,)` bool, candidates never picked.
        unique: distinct picks (BoTorch's ``optimize_acqf_discrete(unique=True)``); ``False`` lets a candidate be
            picked again, at its variance after its own fantasies.
        chunk_size: the most candidates read at once (memory ``O(chunk_size·(r + q))``).

    Returns:
        A :class:`FixedBatch`.
    """
    A, dev = mean.shape[0], mean.device
    dt = V_inv.dtype
    lam, alpha = float(lam), float(alpha)
    mean_w, var0 = mean.to(dt), rls.to(dt).clamp_min(0.0) * lam  # GP-scale variance at the batch start
    ucb = mean_w + alpha * (var0 / lam).sqrt()
    if excluded is not None:
        ucb = ucb.masked_fill(excluded, -torch.inf)
    version = torch.zeros(A, dtype=torch.long, device=dev)  # how many picks a stored UCB accounts for
    proj = torch.eye(V_inv.shape[-1], dtype=dt, device=dev) - lam * V_inv  # c₀ = k - z (I - λV⁻¹) zᵀ
    B = torch.empty((V_inv.shape[-1], q), dtype=dt, device=dev)  # columns (I - λV⁻¹) z(p_i)
    L = torch.zeros((q, q), dtype=dt, device=dev)  # Cholesky factor of C_PP + λI
    in_batch: list[float] = []
    evaluations = 0
    size = max(POOL, 4 * q)
    pool, tau = _pool(ucb, size)
    reason = "q"
    picked = torch.empty(0, dtype=torch.long, device=dev)  # the picks, in order, on the device (no host copy)
    while picked.numel() < q:
        j = picked.numel()
        block = REFRESH_BLOCK  # doubled after every round that did not settle the pick
        while True:
            sub = ucb[pool]
            k, best, i, fresh = _pool_argmax(sub, pool, version)  # one host read
            if best == -torch.inf and tau == -torch.inf:
                break
            if best < tau:  # the pool may not hold the winner any more: a larger pool of the best bounds
                size = min(2 * size, A)
                pool, tau = _pool(ucb, size)
                continue
            if fresh == j:  # fresh and at least every other (upper) bound: the argmax
                break
            top = pool[torch.topk(sub, min(block, sub.numel())).indices]
            block *= 2
            stale = top[(version[top] < j) & (ucb[top] > -torch.inf)]
            for c in range(0, stale.numel(), chunk_size):
                part = stale[c : c + chunk_size]
                var = _variance(reader, part, picked, var0, B[:, :j], L[:j, :j], dt)
                ucb[part] = mean_w[part] + alpha * (var.clamp_min(0.0) / lam).sqrt()
            version[stale] = j
            evaluations += int(stale.numel())
        if best == -torch.inf:
            reason = "exhausted"
            break
        idx = pool[k : k + 1]  # (1,): the pick, i
        z = reader.features(idx).to(dt)  # (1, r)
        c = reader.cross(idx, picked).to(dt)[0] - (z @ B[:, :j])[0] if j else z.new_zeros(0)  # c₀(p, P)
        l = torch.linalg.solve_triangular(L[:j, :j], c.unsqueeze(-1), upper=False).squeeze(-1) if j else c
        prior, explained = read_scalars(var0[i], (l * l).sum())  # one host read
        var_i = prior - explained  # σ²_j(p): the variance it is picked at (float64, as float() of each)
        in_batch.append(max(var_i, 0.0) / lam)
        L[j, :j], L[j, j] = l, (max(var_i, 0.0) + lam) ** 0.5  # the row of p in the factor of C_PP + λI
        B[:, j] = (z @ proj)[0]
        picked = torch.cat([picked, idx])
        if unique:
            ucb[i] = -torch.inf
        else:
            version[i] = -1  # stale: its bound is refreshed before it can win again
    return FixedBatch(
        picked,
        to_device(torch.tensor(in_batch, dtype=rls.dtype), dev),
        evaluations,
        reason,
    )


def _pool_argmax(sub: Tensor, pool: Tensor, version: Tensor) -> tuple[int, float, int, int]:
    """``(k, best, i, version of i)`` for the pool's stored bounds ``sub``: the first argmax ``k``, its bound, its
    candidate ``i = pool[k]`` and how many picks its bound accounts for, read in one host transfer (float64 holds the
    bound of either dtype and the integers exactly)."""
    k = torch.argmax(sub).reshape(1)  # (1,): gathers by a tensor index read nothing (a 0-d index would be read)
    i = pool.index_select(0, k)
    best, pos, cand, fresh = read_scalars(sub.index_select(0, k), k, i, version.index_select(0, i))
    return int(pos), best, int(cand), int(fresh)


def _pool(ucb: Tensor, size: int) -> tuple[Tensor, float]:
    """The candidates of the ``size`` best stored bounds and the best bound outside them (``-inf`` if none)."""
    A = ucb.shape[0]
    if A <= size:
        return torch.arange(A, device=ucb.device), -torch.inf
    top = torch.topk(ucb, size + 1)
    return top.indices[:size], float(top.values[size])


def _variance(reader, idx: Tensor, picked: Tensor, var0: Tensor, B: Tensor, L: Tensor, dt) -> Tensor:
    """`(M,)` ``σ²_j`` of the candidates ``idx`` given the picks (GP scale)."""
    if picked.numel() == 0 or idx.numel() == 0:
        return var0[idx]
    z = reader.features(idx).to(dt)  # (M, r)
    c = reader.cross(idx, picked).to(dt) - z @ B  # (M, j) c₀(x, P)
    w = torch.linalg.solve_triangular(L, c.transpose(0, 1), upper=False)  # (j, M)
    return var0[idx] - (w * w).sum(0)
