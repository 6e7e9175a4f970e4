"""The DTC algebra as functions: what :class:`~torchbkb.DTCPosterior` and the sketched bandits compute.

As ``torch.nn.functional`` is to ``torch.nn``: the modules keep state (the embedding, the data, the caches) and
call these stateless operations on tensors. With features ``z(x) = W k_S(x)`` (``Wᵀ W = K_S⁺``), observations
weighted by counts ``c`` and ``V = Zᵀ C Z + λ I``::

    μ̃(x)  = z(x)ᵀ V⁻¹ Zᵀ C y                       = k_S(x)ᵀ a,          a = Wᵀ V⁻¹ Zᵀ C y
    σ̃²(x) = (k(x,x) - ‖z(x)‖²)/λ + z(x)ᵀ V⁻¹ z(x)  = k(x,x)/λ - k_S(x)ᵀ M k_S(x),
    M = Wᵀ (I/λ - V⁻¹) W

The right-hand forms score points from their kernel rows alone (a bandit caches ``k(S, arms)``), one
`(m × m)·(m × c)` product per chunk; only `r × r` matrices are ever factorized.

Example:
    >>> import torch
    >>> from torchbkb.gp.functional import fit_kernel_row_operator, score_kernel_columns, score_features
    >>> K_S = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> W = torch.linalg.inv(torch.linalg.cholesky(K_S)); Zt = W @ K_S
    >>> n, y = torch.ones(2, dtype=torch.float64), torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> Ma, V_inv = fit_kernel_row_operator(W, Zt, n, y, 0.1)
    >>> weights = V_inv @ (Zt @ y)
    >>> rows = score_kernel_columns(K_S, torch.ones(2, dtype=torch.float64), Ma, 0.1, 64)
    >>> feats = score_features(Zt.T, torch.ones(2, dtype=torch.float64), V_inv, weights, 0.1)
    >>> all(torch.allclose(a, b) for a, b in zip(rows, feats))
    True
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torchbkb.gp.linalg import compute_dtype, spd_inverse
from torchbkb.gp.rank_one import RankOneDowndate, downdate, sherman_morrison
from torchbkb.utils.host_copy import to_dtype

__all__ = [
    "RankOneDowndate", "add_diagonal", "downdate", "chunked", "feature_sums", "fit_features",
    "fit_kernel_row_operator", "fit_kernel_row_operator_ex", "fit_kernel_rows_ex", "fit_kernel_rows", "KernelRowFit",
    "DTCState", "kernel_row_operator", "observation_sums", "ridge_solve", "rls_kernel_columns", "score_features",
    "score_kernel_columns", "score_kernel_rows", "scoring_operator", "sherman_morrison",
]


def add_diagonal(A: torch.Tensor, value: float) -> torch.Tensor:
    """``A + value·I`` for `(*b, n, n)` ``A`` (a new tensor)."""
    out = A.clone()
    out.diagonal(dim1=-2, dim2=-1).add_(value)
    return out


def score_features(Z: torch.Tensor, kdiag: torch.Tensor, V_inv: torch.Tensor, weights: torch.Tensor,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``zᵀ w`` and RLS variance ``(k - ‖z‖²)/λ + zᵀ V⁻¹ z`` of embedded points, each term
    clamped at 0.

    Args:
        Z: `(*b, c, r)` features.
        kdiag: `(*b, c)` ``k(x, x)``.
        V_inv: `(*b, r, r)`; weights: `(*b, r)` -- cast to ``Z``'s dtype.
        lam: ``λ``.

    Returns:
        ``(mean, rls)``, each `(*b, c)` in ``Z``'s dtype.
    """
    V_inv = V_inv.to(Z.dtype)
    mean = (Z @ weights.to(Z.dtype).unsqueeze(-1)).squeeze(-1)  # (*b, c)
    sq = (Z * Z).sum(-1)  # ‖z‖², (*b, c)
    quad = ((Z @ V_inv) * Z).sum(-1)  # zᵀ V⁻¹ z: the one (c×r)(r×r) product
    return mean, (kdiag - sq).clamp_min(0.0) / lam + quad.clamp_min(0.0)


def feature_sums(rows, start: int, end: int, c: torch.Tensor, y: torch.Tensor | None, weights: torch.Tensor | None,
                 step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``Σ c z zᵀ`` `(*b, r, r)` and ``Σ c y z`` `(*b, r)` over rows ``start:end``, ``step`` rows at a time.

    ``rows(i, j)`` returns the features `(*b, j - i, r)` of rows ``i:j``; with ``y=None`` the rewards are the
    means ``zᵀ weights`` (hallucinated rows). Never holds more than one chunk of features.
    """
    ZtZ = Zty = None
    for i in range(start, max(end, start + 1), step):
        j = min(i + step, end)
        Z, ci = rows(i, j), c[..., i:j]
        yi = y[..., i:j] if y is not None else (Z @ weights.unsqueeze(-1)).squeeze(-1)
        A, b = (Z.transpose(-1, -2) * ci.unsqueeze(-2)) @ Z, ((ci * yi).unsqueeze(-2) @ Z).squeeze(-2)
        ZtZ, Zty = (A, b) if ZtZ is None else (ZtZ + A, Zty + b)
    return ZtZ, Zty


def fit_features(rows, n: int, counts: torch.Tensor, y: torch.Tensor, lam: float, *, rank: int, dtype: torch.dtype,
                 batch: torch.Size, device, step: int, n_observed: int | None = None) -> dict[str, torch.Tensor]:
    """``ZtZ = Zᵀ C Z``, ``Zty = Zᵀ C y``, ``V_inv = (ZtZ + λI)⁻¹`` and ``weights`` of ``n`` weighted rows, from
    scratch.

    ``rows(i, j)`` gives the features `(*b, j - i, r)` (see :func:`feature_sums`). Rows past ``n_observed`` are
    hallucinated: they enter ``V`` with the mean of the observed rows' posterior as their reward (the weights stay
    those of the observed rows). With ``n = 0`` this is the prior, ``V = λ I``, with no factorization.
    """
    if n == 0:
        V_inv = torch.eye(rank, dtype=dtype, device=device).expand(*batch, rank, rank) / lam
        zeros = torch.zeros((*batch, rank), dtype=dtype, device=device)
        return {"ZtZ": torch.zeros((*batch, rank, rank), dtype=dtype, device=device), "Zty": zeros,
                "V_inv": V_inv.clone(), "weights": zeros.clone()}
    c = counts.to(dtype)
    n_obs = n if n_observed is None else n_observed
    ZtZ_obs, Zty = feature_sums(rows, 0, n_obs, c, y.to(dtype), None, step)
    V_inv_obs, weights = ridge_solve(ZtZ_obs, Zty, lam)
    if n == n_obs:
        return {"ZtZ": ZtZ_obs, "Zty": Zty, "V_inv": V_inv_obs, "weights": weights}
    ZtZ_p, Zty_p = feature_sums(rows, n_obs, n, c, None, weights, step)  # hallucinated: the mean
    ZtZ = ZtZ_obs + ZtZ_p
    return {"ZtZ": ZtZ, "Zty": Zty + Zty_p, "V_inv": spd_inverse(add_diagonal(ZtZ, lam), name="V"), "weights": weights}


def chunked(score, n: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, rls)`` of ``n`` points from ``score(i, j)`` (the points ``i:j``), ``chunk`` points at a time, joined
    along the last dimension (one call when ``n <= chunk``)."""
    if n <= chunk:
        return score(0, n)
    return _join([score(i, min(i + chunk, n)) for i in range(0, n, chunk)])


def ridge_solve(ZtZ: torch.Tensor, Zty: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``V⁻¹`` and the weights ``V⁻¹ Zᵀ C y`` for ``V = Zᵀ C Z + λ I``.

    Args:
        ZtZ: `(*b, r, r)` ``Zᵀ C Z``.
        Zty: `(*b, r)` ``Zᵀ C y``.
        lam: ``λ > 0``.

    Returns:
        ``(V_inv, weights)``, `(*b, r, r)` and `(*b, r)`, in the compute dtype of ``ZtZ``.
    """
    V_inv = spd_inverse(add_diagonal(ZtZ, lam), name="V")
    return V_inv, (V_inv @ to_dtype(Zty, V_inv.dtype).unsqueeze(-1)).squeeze(-1)


def scoring_operator(W: torch.Tensor, V_inv: torch.Tensor, weights: torch.Tensor, lam: float) -> tuple[torch.Tensor,
                                                                                                       torch.Tensor]:
    """``M = Wᵀ (I/λ - V⁻¹) W`` and ``a = Wᵀ w``: the DTC posterior as operators on kernel rows ``k_S(x)``.

    ``(k(x,x) - ‖z‖²)/λ + zᵀV⁻¹z = k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` and ``μ̃(x) = k_S(x)ᵀ a`` for
    ``z = W k_S(x)``. The one derivation every posterior uses (:func:`kernel_row_operator` writes the same products
    into one block). The difference ``I/λ - V⁻¹`` is taken in the `(r, r)` feature space, where both terms are
    ``O(1/λ)``, before ``W`` (whose entries grow like ``1/√(smallest eigenvalue of K_S)``) is applied: subtracting
    ``Wᵀ W/λ - Wᵀ V⁻¹ W`` after it loses the small variances of well-sampled points to rounding.

    Args:
        W: `(r, m)` whitening of ``K_S`` (``Wᵀ W = K_S⁺``).
        V_inv: `(*b, r, r)`.
        weights: `(*b', r)` (``b'`` may differ from ``b``: fantasies share ``V``).
        lam: ``λ``.

    Returns:
        ``(M, a)``: `(*b, m, m)` (symmetric up to rounding) and `(*b', m)`, in ``V_inv``'s dtype.
    """
    W = W.to(V_inv.dtype)
    return W.mT @ (_feature_difference(V_inv, lam) @ W), (weights.unsqueeze(-2) @ W).squeeze(-2)


def kernel_row_operator(W: torch.Tensor, V_inv: torch.Tensor, weights: torch.Tensor, lam: float) -> torch.Tensor:
    """`(m + 1, m)` ``[M; aᵀ]``: :func:`scoring_operator`'s products for ``W`` `(r, m)`, ``V_inv`` `(r, r)` and
    ``weights`` `(r,)` (no batch, no autograd), written into one block -- what :func:`score_kernel_columns` reads."""
    m = W.shape[1]
    Ma = W.new_empty((m + 1, m))
    torch.matmul(weights.unsqueeze(0), W, out=Ma[m:])  # aᵀ = (V⁻¹ Zᵀ N y)ᵀ W
    torch.matmul(W.T, _feature_difference(V_inv, lam) @ W, out=Ma[:m])
    return Ma


def _feature_difference(V_inv: torch.Tensor, lam: float) -> torch.Tensor:
    """``I/λ - V⁻¹`` `(*b, r, r)`, PSD."""
    inner = V_inv.neg()
    inner.diagonal(dim1=-2, dim2=-1).add_(1.0 / lam)
    return inner


class DTCState(NamedTuple):
    """The state of a fitted DTC posterior, ``V = ZtZ + λ I``, as a :class:`~torchbkb.gp.dtc_fit.DTCFit` hands it
    over (:meth:`~torchbkb.gp.dtc_fit.DTCFit.state`, :meth:`~torchbkb.DTCPosterior.set_state`).

    Attributes:
        M: `(*b, m, m)` and a: `(*b, m)`, the operator on kernel rows (:func:`scoring_operator`).
        V_inv: `(*b, r, r)` ``V⁻¹``.
        weights: `(*b, r)` ``w = V⁻¹ Zᵀ N y``.
        ZtZ: `(*b, r, r)` ``Zᵀ N Z``.
        Zty: `(*b, r)` ``Zᵀ N y``.
    """

    M: torch.Tensor
    a: torch.Tensor
    V_inv: torch.Tensor
    weights: torch.Tensor
    ZtZ: torch.Tensor
    Zty: torch.Tensor


class KernelRowFit(NamedTuple):
    """A DTC posterior fitted for scoring by kernel rows (:func:`fit_kernel_rows`): ``operator`` `(m + 1, m)`
    ``[M; aᵀ]`` (:func:`kernel_row_operator`), ``V_inv``, ``ZtZ`` `(r, r)`, ``weights``, ``Zty`` `(r,)`."""

    operator: torch.Tensor
    V_inv: torch.Tensor
    weights: torch.Tensor
    ZtZ: torch.Tensor
    Zty: torch.Tensor

    def state(self) -> DTCState:
        """The :class:`DTCState` (its ``M`` and ``a`` views of :attr:`operator`)."""
        return DTCState(self.operator[:-1], self.operator[-1], self.V_inv, self.weights, self.ZtZ, self.Zty)


def observation_sums(Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor) -> tuple:
    """``(ZᵀNZ, ZᵀNy)``, `(r, r)` and `(r,)` in ``Zt``'s dtype, of observations given as feature columns ``Zt``
    `(r, p)` with ``counts`` ``N`` and ``reward_sums`` ``N y`` `(p,)`."""
    return (Zt * to_dtype(counts, Zt.dtype)) @ Zt.T, Zt @ to_dtype(reward_sums, Zt.dtype)


def fit_kernel_rows(W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor,
                    lam: float) -> KernelRowFit:
    """:func:`fit_kernel_row_operator` with every part of the state, a :class:`KernelRowFit` in ``Zt``'s dtype
    (arguments as there)."""
    ZtZ, Zty = observation_sums(Zt, counts, reward_sums)
    V_inv, weights = ridge_solve(ZtZ, Zty, lam)
    return KernelRowFit(kernel_row_operator(W, V_inv, weights, lam), V_inv, weights, ZtZ, Zty)


def fit_kernel_row_operator(
    W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit the DTC posterior of weighted observations and return it as one operator on kernel rows.

    With ``V = Zᵀ N Z + λ I``: ``M = Wᵀ (I/λ - V⁻¹) W`` and ``a = Wᵀ V⁻¹ Zᵀ (N y)`` -- the same
    quantities as :func:`ridge_solve` followed by :func:`scoring_operator`, stacked as ``[M; aᵀ]`` for
    :func:`score_kernel_columns` (or ``M`` for :func:`rls_kernel_columns` and ``a`` in one product); this is a
    bandit's per-step refit.

    Args:
        W: `(r, m)` whitening of ``K_S`` (``Wᵀ W = K_S⁺``), compute dtype.
        Zt: `(r, p)` features ``z(x) = W k_S(x)`` of the observed points (one column each), same dtype.
        counts: `(p,)` positive weights ``N``.
        reward_sums: `(p,)` ``N y`` (sum of the rewards observed at each point).
        lam: ``λ > 0``.

    Returns:
        ``(Ma, V_inv)``: `(m + 1, m)` ``[M; aᵀ]`` (``M`` symmetric up to rounding) and the `(r, r)` ``V⁻¹``.

    Example:
        >>> import torch
        >>> K_S = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
        >>> W = torch.linalg.inv(torch.linalg.cholesky(K_S))
        >>> Zt = W @ K_S                       # the two dictionary points observed once each
        >>> y = torch.tensor([1.0, -1.0], dtype=torch.float64)
        >>> Ma, V_inv = fit_kernel_row_operator(W, Zt, torch.ones(2, dtype=torch.float64), y, 0.1)
        >>> M, a = scoring_operator(W, *ridge_solve(Zt @ Zt.T, Zt @ y, 0.1), 0.1)
        >>> bool(torch.allclose(Ma[:-1], M) and torch.allclose(Ma[-1], a))
        True
    """
    fit = fit_kernel_rows(W, Zt, counts, reward_sums, lam)
    return fit.operator, fit.V_inv


def fit_kernel_row_operator_ex(
    W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor, lam: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`fit_kernel_rows_ex`'s ``(Ma, V_inv, info)`` (it compiles with ``fullgraph=True``)."""
    fit, info = fit_kernel_rows_ex(W, Zt, counts, reward_sums, lam)
    return fit.operator, fit.V_inv, info


def fit_kernel_rows_ex(W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor,
                       lam: float) -> tuple[KernelRowFit, torch.Tensor]:
    """:func:`fit_kernel_rows` with no host read: ``V``'s Cholesky failure is returned, not handled --
    ``(fit, info)``, ``info`` a 0-d int tensor, non-zero when ``V`` was not factored and ``fit`` is not to be used.
    Bit for bit :func:`fit_kernel_rows` when it is zero."""
    ZtZ, Zty = observation_sums(Zt, counts, reward_sums)
    L, info = torch.linalg.cholesky_ex(add_diagonal(ZtZ, lam).to(compute_dtype(ZtZ.dtype, ZtZ.shape[-1])))
    V_inv = torch.cholesky_inverse(L)
    weights = (V_inv @ to_dtype(Zty, V_inv.dtype).unsqueeze(-1)).squeeze(-1)
    return KernelRowFit(kernel_row_operator(W, V_inv, weights, lam), V_inv, weights, ZtZ, Zty), info


def score_kernel_rows(
    K: torch.Tensor, kdiag: torch.Tensor, M: torch.Tensor, a: torch.Tensor, lam: float, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``k_Sᵀ a`` and RLS variance ``k/λ - k_Sᵀ M k_S`` (clamped at 0) of points given by their
    kernel rows, chunked over the points: one `(c × m)·(m × m)` product per chunk.

    Args:
        K: `(*b, n, m)` kernel rows ``k(x, s_j)``.
        kdiag: `(*b, n)` ``k(x, x)``.
        M, a: :func:`scoring_operator` output, cast to ``K``'s dtype by the caller.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        ``(mean, rls)``, each `(*b, n)`.
    """
    n, c = K.shape[-2], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[..., i : i + c, :]  # (*b, c, m)
        mean = (Kc @ a.unsqueeze(-1)).squeeze(-1)
        quad = ((Kc @ M) * Kc).sum(-1)
        parts.append((mean, (kdiag[..., i : i + c] / lam - quad).clamp_min_(0.0)))
    return _join(parts)


def score_kernel_columns(K: torch.Tensor, kdiag: torch.Tensor, Ma: torch.Tensor, lam: float,
                         chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`score_kernel_rows` for kernel rows stored as columns -- a cache `(m, n)` holding one
    contiguous row ``k(s_j, ·)`` per inducing point -- with the operator stacked as ``[M; aᵀ]``
    (:func:`fit_kernel_row_operator`): one `(m + 1, m)·(m, c)` product per chunk gives ``M k_S`` and
    the mean together (one pass over ``K``). Variances as in :func:`rls_kernel_columns`.

    Args:
        K: `(m, n)` ``k(s_j, x)``.
        kdiag: `(n,)` ``k(x, x)``.
        Ma: `(m + 1, m)` ``[M; aᵀ]`` in ``K``'s dtype.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        ``(mean, rls)``, each `(n,)`.

    Example:
        >>> import torch
        >>> K = torch.rand(3, 5, dtype=torch.float64)
        >>> M = torch.eye(3, dtype=torch.float64); a = torch.ones(3, dtype=torch.float64)
        >>> kd = torch.full((5,), 10.0, dtype=torch.float64)
        >>> rows = score_kernel_rows(K.T, kd, M, a, 0.5, 2)
        >>> cols = score_kernel_columns(K, kd, torch.cat([M, a[None]]), 0.5, 2)
        >>> all(torch.allclose(r, c) for r, c in zip(rows, cols))
        True
    """
    n, c = K.shape[-1], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[:, i : i + c]  # (m, c)
        P = Ma @ Kc  # (m + 1, c)
        parts.append((P[-1], _rls_from_products(P[:-1], Kc, kdiag[i : i + c], lam)))
    return _join(parts)


def rls_kernel_columns(K: torch.Tensor, kdiag: torch.Tensor, M: torch.Tensor, lam: float,
                       chunk_size: int) -> torch.Tensor:
    """RLS variances ``k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` of points given by their kernel rows stored as columns --
    a cache `(m, n)` holding one contiguous row ``k(s_j, ·)`` per inducing point, as the bandits keep it --
    one `(m, m)·(m, c)` product per chunk, clamped to ``[0, k(x,x)/λ]``: ``M`` is PSD, so a DTC variance never
    exceeds the prior's, and the clamp keeps rounding from breaking that bound (a bandit that skips arms by
    it relies on it). The mean is one more product, ``aᵀ K``, or see :func:`score_kernel_columns`.

    Args:
        K: `(m, n)` ``k(s_j, x)``.
        kdiag: `(n,)` ``k(x, x)``.
        M: `(m, m)` :func:`scoring_operator`'s ``M`` in ``K``'s dtype.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        `(n,)` RLS-scale variances.

    Example:
        >>> import torch
        >>> K = torch.rand(3, 5, dtype=torch.float64); M = torch.eye(3, dtype=torch.float64)
        >>> kd = torch.full((5,), 10.0, dtype=torch.float64)
        >>> rls = rls_kernel_columns(K, kd, M, 0.5, 2)
        >>> bool(torch.allclose(rls, score_kernel_rows(K.T, kd, M, torch.zeros(3, dtype=torch.float64), 0.5, 2)[1]))
        True
    """
    n, c = K.shape[-1], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[:, i : i + c]  # (m, c)
        parts.append(_rls_from_products(M @ Kc, Kc, kdiag[i : i + c], lam))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _rls_from_products(MK: torch.Tensor, K: torch.Tensor, kdiag: torch.Tensor, lam: float) -> torch.Tensor:
    """``k/λ - Σ_j (M K)_j K_j`` column-wise from ``MK = M K`` `(m, c)` (overwritten), clamped to ``[0, k/λ]``."""
    quad = MK.mul_(K).sum(0).clamp_min_(0.0)  # (c,)
    return (kdiag / lam - quad).clamp_min_(0.0)


def _join(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate chunked ``(mean, rls)`` pairs along the last dimension."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=-1)
