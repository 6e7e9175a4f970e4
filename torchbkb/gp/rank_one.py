"""Rank-one updates of ``V⁻¹``: one Sherman-Morrison step per added row, and what each step does to every cached
quadratic form (:class:`RankOneDowndate`) -- how a posterior adds a few points in ``O(r²)`` each instead of a
refactorization.

Example:
    >>> import torch
    >>> V_inv = torch.eye(2, dtype=torch.float64)
    >>> z, c = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    >>> d = downdate(V_inv, z, c)                       # V ← V + z zᵀ halves zᵀ V⁻¹ z
    >>> float(z @ V_inv @ z - d.coef * (z @ d.direction) ** 2)
    0.5
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["RankOneDowndate", "downdate", "sherman_morrison"]


class RankOneDowndate(NamedTuple):
    """What a rank-one update ``V ← V + c·z zᵀ`` does to every quadratic form ``aᵀ V⁻¹ a``.

    ``aᵀ V_new⁻¹ a = aᵀ V_old⁻¹ a - coef · (aᵀ direction)²``, so cached RLS variances of embedded arms
    ``Z_A`` are downdated in ``O(A·r)`` by ``rls -= coef * (Z_A @ direction) ** 2``.

    Attributes:
        direction: `(*b, r)` ``u = V_old⁻¹ z`` (compute dtype).
        coef: `(*b,)` ``c / (1 + c · zᵀ u)``.
    """

    direction: torch.Tensor
    coef: torch.Tensor


def downdate(V_inv: torch.Tensor, z: torch.Tensor, c: torch.Tensor) -> RankOneDowndate:
    """The :class:`RankOneDowndate` of adding ``c·z zᵀ`` to ``V`` (``V_inv`` `(*b, r, r)`, ``z`` `(*b, r)`, ``c``
    `(*b,)`)."""
    u = (V_inv @ z.unsqueeze(-1)).squeeze(-1)  # (*b, r)
    return RankOneDowndate(u, c / (1.0 + c * (z * u).sum(-1)))


def sherman_morrison(V_inv: torch.Tensor, Z: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, RankOneDowndate]:
    """``(V + Σ_j c_j z_j z_jᵀ)⁻¹`` by one Sherman-Morrison step per row, `O(k r²)`, and the last step's
    downdate.

    Args:
        V_inv: `(*b, r, r)`.
        Z: `(*b, k, r)` rows ``z_j`` (``k >= 1``), in ``V_inv``'s dtype.
        c: `(*b, k)` positive weights.

    Returns:
        ``(V_inv_new, last)``: the updated inverse and the :class:`RankOneDowndate` of the last row.

    Example:
        >>> import torch
        >>> V = torch.eye(2, dtype=torch.float64) * 2; Z = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
        >>> new, _ = sherman_morrison(V.inverse(), Z, torch.ones(1, dtype=torch.float64))
        >>> bool(torch.allclose(new, (V + Z.T @ Z).inverse()))
        True
    """
    result = None
    for j in range(Z.shape[-2]):
        z = Z[..., j, :]
        result = downdate(V_inv, z, c[..., j])
        u, coef = result
        V_inv = V_inv - coef[..., None, None] * (u.unsqueeze(-1) * u.unsqueeze(-2))
    return V_inv, result
