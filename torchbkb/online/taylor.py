"""Taylor features of the Gaussian kernel (004, Sec. 3.1, Eq. 6) and Theorem 4's choice of the degree.

For a multi-index ``k ∈ ℕ₀^d`` the basis function is

    g_k(x) = Π_i ψ_{k_i}(x_i),      ψ_j(u) = u^j / (σ^j √(j!)) · exp(-u² / 2σ²),

and the ``g_k`` with ``|k| = k_1 + ... + k_d <= M`` -- there are ``C(d + M, M)`` of them -- are
orthonormal in the RKHS of ``k(x, x') = exp(-‖x - x'‖² / 2σ²)`` (004 Lemma 11), with

    Σ_{|k| <= M} g_k(x) g_k(x') = exp(-(‖x‖² + ‖x'‖²) / 2σ²) Σ_{j <= M} (xᵀx' / σ²)^j / j!,

the degree-``M`` Taylor truncation of ``exp(xᵀx'/σ²)``; the error is at most
``(|xᵀx'| / σ²)^{M+1} / (M+1)! <= (R/σ)^{2M+2} / (M+1)!`` for ``‖x‖, ‖x'‖ <= R`` (004 Lemma 13).
Because the basis is orthonormal (``Q = I`` in 004 Eq. 37), ``φ(x) = (g_k(x))_k`` is directly the
embedding PKAWV needs.

Features are built degree by degree: every monomial of degree ``j`` is one monomial of degree ``j - 1``
times one coordinate (index tables precomputed at construction), so a call costs ``M`` vectorized
gathers and no Python loop over features.

Example:
    >>> import torch
    >>> from torchbkb.online import TaylorEmbedding, taylor_degree
    >>> emb = TaylorEmbedding(d=3, degree=8, lengthscale=1.0)
    >>> emb.num_features                     # C(3 + 8, 8)
    165
    >>> X = torch.rand(50, 3, dtype=torch.float64) / 2      # ‖x‖ <= 1
    >>> K = torch.exp(-0.5 * torch.cdist(X, X) ** 2)
    >>> F = emb(X)
    >>> bool((F @ F.T - K).abs().max() < 1e-6)
    True
    >>> taylor_degree(n=10_000, lam=1.0, radius=1.0)   # Theorem 4: ceil(max(8R²/σ², 2 log(n / min(λ,1))))
    19
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from torchbkb.errors import InputDataError, check_matrix, check_nonnegative, check_positive

__all__ = ["TaylorEmbedding", "taylor_degree", "taylor_num_features", "taylor_kernel_error_bound"]

#: Largest basis a TaylorEmbedding agrees to build (``C(d + M, M)`` features).
MAX_FEATURES = 2**24


def taylor_num_features(d: int, degree: int) -> int:
    """``C(d + M, M)``, the number of multi-indices ``k ∈ ℕ₀^d`` with ``|k| <= M``."""
    return math.comb(_check_int(d, "d", 1) + _check_int(degree, "degree", 0), int(degree))


def taylor_degree(n: int, lam: float, radius: float, lengthscale: float = 1.0) -> int:
    """Theorem 4 of 004: ``M = ceil(8R²/σ² ∨ 2 log(n / (λ ∧ 1)))``.

    With this ``M`` PKAWV's regret is within a factor 3/2 of Kernel-AWV's bound. It grows like
    ``log n`` and the basis like ``M^d``, which is why the paper's experiments use ``M ∈ {2, 3, 4}``.

    Args:
        n: horizon (number of rounds), ``>= 1``.
        lam: regularization ``λ > 0``.
        radius: ``R >= 0`` with ``‖x_t‖ <= R``.
        lengthscale: ``σ > 0``.

    Returns:
        The degree ``M >= 0``.
    """
    n = _check_int(n, "n", 1)
    lam = check_positive(lam, "lam")
    sigma = check_positive(lengthscale, "lengthscale")
    R = check_nonnegative(radius, "radius")
    value = max(8.0 * R * R / sigma**2, 2.0 * math.log(n / min(lam, 1.0)))
    return max(int(math.ceil(value - 1e-12)), 0)


def taylor_kernel_error_bound(radius: float, degree: int, lengthscale: float = 1.0) -> float:
    """004 Lemma 13: ``sup_{‖x‖,‖x'‖ <= R} |k(x, x') - φ(x)ᵀφ(x')| <= (R/σ)^{2M+2} / (M+1)!``."""
    M = _check_int(degree, "degree", 0)
    r = float(radius) / check_positive(lengthscale, "lengthscale")
    return math.exp((2 * M + 2) * math.log(r) - math.lgamma(M + 2)) if r > 0 else 0.0


class TaylorEmbedding(nn.Module):
    """Feature map ``φ(x) = (g_k(x))_{|k| <= M}`` of 004 Eq. 6 for the Gaussian kernel.

    Args:
        d: input dimension.
        degree: ``M >= 0``, the largest total degree ``|k|``.
        lengthscale: ``σ > 0`` of ``exp(-‖x - x'‖² / 2σ²)`` (a buffer).

    Attributes:
        multi_indices: `(D, d)` long buffer, row ``j`` is the multi-index ``k`` of feature ``j``
            (features are ordered by degree, then lexicographically by the index sequence).
        num_features: ``D = C(d + M, M)``.

    Example:
        >>> import torch
        >>> emb = TaylorEmbedding(d=2, degree=2)
        >>> emb.multi_indices.tolist()
        [[0, 0], [1, 0], [0, 1], [2, 0], [1, 1], [0, 2]]
        >>> x = torch.tensor([[0.5, -1.0]])
        >>> g = emb(x)                                   # (1, 6)
        >>> bool(torch.allclose(g[0, 3], torch.exp(-x.pow(2).sum() / 2) * 0.25 / 2 ** 0.5))
        True
    """

    def __init__(self, d: int, degree: int, lengthscale: float = 1.0):
        super().__init__()
        self.dim = _check_int(d, "d", 1)
        self.degree = _check_int(degree, "degree", 0)
        D = taylor_num_features(self.dim, self.degree)
        if D > MAX_FEATURES:
            raise InputDataError(
                f"degree: expected at most {MAX_FEATURES} features C(d + M, M), got {D} for d={d}, M={degree}; "
                "lower the degree (the paper's experiments use M = 2, 3, 4)"
            )
        self.register_buffer("lengthscale",
                             torch.tensor(check_positive(lengthscale, "lengthscale"), dtype=torch.float64))
        parent, coord, inv_sqrt, indices, offsets = _monomial_tables(self.dim, self.degree)
        self.offsets = offsets  # feature j of degree k is column offsets[k] + j
        self.register_buffer("multi_indices", indices)
        self.register_buffer("_parent", parent)  # (D - 1,) index of the parent inside the previous degree block
        self.register_buffer("_coord", coord)  # (D - 1,) coordinate multiplied in
        self.register_buffer("_inv_sqrt", inv_sqrt)  # (D - 1,) 1 / sqrt(new exponent of that coordinate)

    @property
    def num_features(self) -> int:
        """``D = C(d + M, M)``."""
        return int(self.multi_indices.shape[0])

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Embed points.

        Args:
            X: `(*b, n, d)` inputs.

        Returns:
            `(*b, n, D)` features in ``X``'s dtype, on ``X``'s device; differentiable w.r.t. ``X``.
        """
        check_matrix(X, "X", d=self.dim)
        dev = X.device
        Xs = X / self.lengthscale.to(X.dtype)  # (*b, n, d) in units of σ
        prev = torch.exp(-0.5 * (Xs * Xs).sum(-1, keepdim=True))  # (*b, n, 1): degree 0, Π_i exp(-x_i²/2σ²)
        blocks = [prev]
        parent, coord = self._parent.to(dev), self._coord.to(dev)
        inv_sqrt = self._inv_sqrt.to(device=dev, dtype=X.dtype)
        for k in range(1, self.degree + 1):  # loop over degrees (M of them), never over features
            lo, hi = self.offsets[k] - 1, self.offsets[k + 1] - 1  # slice of the (D - 1,) tables
            # degree-k block (*b, n, C(d+k-1, k)) = parent monomial · x_i / σ / sqrt(new k_i)
            prev = prev[..., parent[lo:hi]] * Xs[..., coord[lo:hi]] * inv_sqrt[lo:hi]
            blocks.append(prev)
        return torch.cat(blocks, dim=-1)  # (*b, n, D)

    def extra_repr(self) -> str:
        return (f"d={self.dim}, degree={self.degree}, num_features={self.num_features}, "
                f"lengthscale={float(self.lengthscale):g}")


def _monomial_tables(d: int, M: int):
    """Index tables of the degree-by-degree construction (built once, at construction time)."""
    parent, coord, inv_sqrt = [], [], []
    indices = [[0] * d]
    last = [0]  # last coordinate with a positive exponent (non-decreasing index sequences: no duplicates)
    offsets = [0, 1]
    prev_block = [0]  # global feature ids of the previous degree
    for _ in range(1, M + 1):
        block = []
        for local, gid in enumerate(prev_block):
            for i in range(last[gid], d):
                k = list(indices[gid])
                k[i] += 1
                parent.append(local)
                coord.append(i)
                inv_sqrt.append(1.0 / math.sqrt(k[i]))
                indices.append(k)
                last.append(i)
                block.append(len(indices) - 1)
        prev_block = block
        offsets.append(len(indices))
    return (
        torch.tensor(parent, dtype=torch.long),
        torch.tensor(coord, dtype=torch.long),
        torch.tensor(inv_sqrt, dtype=torch.float64),
        torch.tensor(indices, dtype=torch.long).reshape(-1, d),
        offsets,
    )


def _check_int(value: object, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise InputDataError(f"{name}: expected an integer >= {lo}, got {value!r}")
    return int(value)
