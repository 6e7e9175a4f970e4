"""BKB's dictionary over a given training set: 000 Algorithm 1's variance sampling, replayed in geometric rounds.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(300, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> S = sample_dictionary(GaussianKernel(0.2), X, noise=0.01, generator=torch.Generator().manual_seed(0))
    >>> S.shape[0] < 300
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from torchbkb.errors import InputDataError, check_finite, check_positive
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.sampling.rls_dictionary import DEFAULT_INCLUSION, RLSDictionary, check_inclusion
from torchbkb.gp.stable_scoring import feature_rls
from torchbkb.gp.linalg import compute_dtype, safe_cholesky

__all__ = ["sample_dictionary", "draw_dictionary", "KEEP_FEATURE_BYTES"]

#: A round whose points are all conditioned on and scored (the last) keeps up to this many bytes of the features it
#: embedded for ``V`` to score them with, instead of embedding them again: the same values, one pass fewer.
KEEP_FEATURE_BYTES = 2**28


def sample_dictionary(
    kernel: Callable,
    X: Tensor,
    noise: float,
    q_bar: float = 2.0,
    generator: torch.Generator | None = None,
    counts: Tensor | None = None,
    complete_above: float | None = None,
    max_size: int | None = None,
    inclusion: str = DEFAULT_INCLUSION,
    drawn: list | None = None,
) -> Tensor | None:
    """BKB's posterior-variance (ridge-leverage-score) dictionary over a set of training points.

    000 Algorithm 1 resamples after every pull: each point enters with probability ``min(1, q̄·σ̃²(x))``
    computed under the previous posterior (RLS scale). Replaying that over ``n`` given points would cost
    ``n`` refits, so the history is replayed in geometric rounds: with ``S = {x_1}``, for prefixes of length
    ``1, 2, 4, ..., n``, the posterior fitted on the current prefix with the current dictionary scores the
    next (twice as long) prefix and the dictionary is resampled from it; a last round scores all ``n``
    points under the posterior fitted on all of them. Once a prefix fills one chunk of the embedding, the last
    round follows at once, on the dictionary of that chunk: past a chunk each doubling round would embed its
    prefix twice (about 5.5 passes over the data in all, against 2). The posterior of a dictionary drawn from
    a prefix overestimates the other points' ``σ̃²``, so they enter more often: the dictionary stays accurate
    and grows a little. Each round costs ``O(n_j m²)``, ``O(n m²)`` in all.
    If no point is drawn, the one of largest ``σ̃²`` is kept.

    Args:
        kernel: a GPyTorch kernel or callable ``(X1, X2) -> Tensor``.
        X: `(*batch, n, d)` training points, ``n >= 1`` (a batch gets the union of its batches' dictionaries).
        noise: ``λ > 0``.
        q_bar: oversampling ``q̄``.
        generator: ``torch.Generator`` for reproducibility.
        counts: optional `(*batch, n)` positive weights of the points (``λ / noise_i`` for per-point noise).
        complete_above: if given (unbatched ``X``), return ``None`` when the dictionary is heading for at least
            this fraction of the points: at the first round conditioned on an eighth of them (or the round
            that fills the first chunk, if that comes first), the mean inclusion
            probability of the points conditioned on, extrapolated by its ratio to the previous round's over the
            doublings still to come, reaches it. The caller then draws the dictionary from the exact posterior
            (:func:`draw_dictionary`), which the last rounds would approximate at a higher cost.
        max_size: if given (unbatched ``X``), thin the dictionary to a uniform subset of ``max_size`` points
            whenever a round draws more: the replay then costs ``O(n·max_size²)`` whatever the kernel's
            effective dimension (what a fit's inducing points need, not a BKB posterior's).
        inclusion: how a point given ``n`` times (equal rows of ``X``, repeated evaluations) enters: ``"per_pull"``,
            one draw per row (``1 - (1 - p)^n``), or ``"count_scaled"``, one draw per distinct point with
            ``min(1, q̄·n·σ̃²)`` (:mod:`torchbkb.sampling.rls_dictionary`). ``counts`` are precision weights, not
            pulls.
        drawn: a list to which the last round's draw size before ``max_size`` thinning is appended (how large the
            dictionary would be; unbatched ``X``).

    Returns:
        `(m, d)` dictionary (rows of ``X``), or ``None`` (see ``complete_above``).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.rand(500, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> S = sample_dictionary(GaussianKernel(0.2), X, noise=0.01, generator=torch.Generator().manual_seed(0))
        >>> 1 <= S.shape[0] < 100                      # a smooth 1-d kernel: small effective dimension
        True
    """
    lam = check_positive(noise, "noise")
    if not isinstance(X, Tensor) or X.dim() < 2 or X.shape[-2] < 1:
        raise InputDataError(f"X: expected shape (*batch, n >= 1, d), got "
                             f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    dic = RLSDictionary(q_bar, generator=generator if generator is not None else _fresh_generator(X.device),
                        inclusion=check_inclusion(inclusion))
    flat = X.detach().reshape(-1, *X.shape[-2:])  # (B, n, d): one history per batch
    check_finite(flat, "X")  # once: the rounds embed and factorize rows of it unchecked
    if counts is None:
        w = flat.new_ones(flat.shape[:-1])
    else:
        if not isinstance(counts, Tensor) or counts.shape != X.shape[:-1]:
            raise InputDataError(f"counts: expected shape {tuple(X.shape[:-1])}, got "
                                 f"{tuple(counts.shape) if isinstance(counts, Tensor) else type(counts).__name__}")
        w = counts.detach().to(flat).reshape(flat.shape[:-1])
    if max_size is not None and (int(max_size) < 1 or flat.shape[0] != 1):
        raise InputDataError(f"max_size: expected an integer >= 1 with unbatched X, got {max_size!r} with X of shape "
                             f"{tuple(X.shape)}")
    if (complete_above is not None or max_size is not None) and flat.shape[0] == 1:
        return _sample_one(kernel, flat[0], w[0], lam, dic, None if complete_above is None else float(complete_above),
                           max_size, drawn)
    parts = [_sample_one(kernel, flat[i], w[i], lam, dic) for i in range(flat.shape[0])]
    return torch.cat(parts, dim=0)


def draw_dictionary(X: Tensor, rls: Tensor, q_bar: float = 2.0, generator: torch.Generator | None = None,
                    inclusion: str = DEFAULT_INCLUSION) -> Tensor:
    """Each point of `(n, d)` ``X`` enters with probability ``min(1, q̄·σ̃²)`` for its given RLS variance
    ``rls`` `(n,)` (if none does, the one of largest ``σ̃²``); equal rows follow ``inclusion``
    (:func:`sample_dictionary`).

    Example:
        >>> import torch
        >>> X = torch.arange(4.0).unsqueeze(-1)
        >>> draw_dictionary(X, torch.tensor([1.0, 0.0, 0.9, 0.0]), q_bar=2.0).squeeze(-1).tolist()
        [0.0, 2.0]
    """
    dic = RLSDictionary(check_positive(q_bar, "q_bar"),
                        generator=generator if generator is not None else _fresh_generator(X.device),
                        inclusion=check_inclusion(inclusion))
    return X[_resample(dic, rls.detach(), _row_groups(X, dic))]


def _row_groups(X: Tensor, dic: RLSDictionary) -> Tensor | None:
    """`(n,)` long: the id of each row's distinct point, for ``"count_scaled"`` when some row repeats (``None``
    otherwise: one draw per row, which is the same rule when every count is 1)."""
    if dic.inclusion != "count_scaled":
        return None
    groups = torch.unique(X.detach(), dim=0, return_inverse=True)[1]
    return groups if int(groups.max()) + 1 < X.shape[0] else None


def _resample(dic: RLSDictionary, rls: Tensor, groups: Tensor | None = None, validate: bool = True) -> Tensor:
    """`(n,)` bool: each point kept with its inclusion probability; if none is, the one of largest ``σ̃²``.

    With ``groups`` (the rows' distinct-point ids) a point given ``c`` times is drawn once, at its first row,
    with its count ``c`` (``"count_scaled"``). ``validate=False`` skips the variances' checks (their host reads)."""
    rls = rls.clamp_min(0.0)
    if groups is None:
        keep = dic.resample(rls, validate=validate)
    else:
        n = rls.shape[0]
        counts = torch.bincount(groups, minlength=int(groups.max()) + 1)
        first = torch.full_like(counts, n).scatter_reduce(0, groups, torch.arange(n, device=groups.device), "amin")
        present = (counts > 0).nonzero().squeeze(1)
        rows = first[present]
        keep = torch.zeros(n, dtype=torch.bool, device=rls.device)
        keep[rows[dic.resample(rls[rows], counts[present].to(rls.dtype), validate=validate)]] = True
    first = torch.arange(keep.numel(), device=keep.device) == rls.argmax()  # (n,) the largest σ̃² (lowest index)
    keep |= first & ~keep.any()  # kept when no point is; no host read
    return keep


def _sample_one(kernel, X: Tensor, w: Tensor, lam: float, dic: RLSDictionary, complete_above: float | None = None,
                max_size: int | None = None, drawn: list | None = None) -> Tensor | None:
    n = X.shape[0]
    groups = _row_groups(X, dic)
    emb = NystromEmbedding(kernel, X[:1])  # S_1 = {x_1}
    end, previous = 1, 1.0
    with torch.no_grad():
        while True:
            final = end == n
            new_end = n if final else min(n, 2 * end)
            last_next = new_end >= emb.chunk_size  # past a chunk: the last round follows, on this round's dictionary
            rls = _round_rls(emb, X, w, lam, end, new_end)
            # the variances come from checked data: checked once, in the last round (a NaN there raises)
            keep = _resample(dic, rls, None if groups is None else groups[:new_end], validate=final)
            idx = keep.nonzero().squeeze(-1)
            if final and drawn is not None:
                drawn.append(int(idx.numel()))
            if max_size is not None and idx.numel() > max_size:
                pick = torch.randperm(idx.numel(), generator=dic.generator,
                                      device=dic.generator.device)[: int(max_size)]
                idx = idx[pick.to(idx.device)].sort().values
            if final:
                return X[idx]
            if complete_above is not None:
                p_kept = dic.inclusion_probability(rls[:end].clamp_min(0.0), validate=False)  # points conditioned on
                kept = float(p_kept.mean())
                if 8 * end >= n or last_next:  # predict the last round's fraction: its trend over the doublings to come
                    if kept * (kept / max(previous, 1e-12)) ** math.log2(n / end) >= complete_above:
                        return None
                    complete_above = None  # sparse: replay to the end
                previous = kept
            emb.set_inducing_points(X[idx], validate=False)
            end = n if last_next else new_end


def _round_rls(emb: NystromEmbedding, X: Tensor, w: Tensor, lam: float, end: int, new_end: int) -> Tensor:
    """`(new_end,)` ``σ̃²`` of ``X[:new_end]`` under the posterior conditioned on ``X[:end]`` (``σ̃²`` ignores
    ``y``): ``V = Σ w z zᵀ + λI`` factorized once (no inverse), points scored as
    ``(k - ‖z‖²)/λ + ‖L⁻¹z‖²``; embedded once per round, or in chunks past the embedding's ``chunk_size``:
    twice, but for the chunks a last round keeps (:data:`KEEP_FEATURE_BYTES`), never all `(n, r)` features."""
    c = emb.chunk_size
    Z = emb(X[:new_end], validate=False) if new_end <= c else None  # (new_end, r); X was checked by the caller
    rows = (lambda i, j: Z[i:j]) if Z is not None else (lambda i, j: emb(X[i:j], validate=False))
    dtype = compute_dtype(X.dtype, emb.rank)
    V = torch.eye(emb.rank, dtype=dtype, device=X.device) * lam
    kept, room = {}, KEEP_FEATURE_BYTES if Z is None and end == new_end else 0  # the same chunks in both passes
    for i in range(0, end, c):
        Zi = rows(i, min(i + c, end)).to(dtype)
        V = V + (Zi.transpose(-1, -2) * w[i : min(i + c, end)].to(dtype)) @ Zi
        if Zi.numel() * Zi.element_size() <= room:
            kept[i], room = Zi, room - Zi.numel() * Zi.element_size()
    L = safe_cholesky(V, name="V")
    parts = [feature_rls(kept.pop(i) if i in kept else rows(i, min(i + c, new_end)).to(dtype),
                         emb.kernel_diag(X[i : min(i + c, new_end)]), L, lam)
             for i in range(0, new_end, c)]
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).to(X.dtype)


def _fresh_generator(device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.seed()
    return g
