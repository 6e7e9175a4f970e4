"""Accurate DTC scores when the one-product kernel-row formula cancels: a tiny noise, an ill-conditioned dictionary.

The fast scoring of raw points, ``σ̃² = k/λ - k_Sᵀ M k_S`` with ``M = Wᵀ (I/λ - V⁻¹) W`` (one `(n × m)·(m
× m)` product), subtracts two numbers of size ``k/λ`` to get one of size ``σ̃²``: with ``λ = 1e-10`` the result of
a well-sampled point loses every digit (a 50-digit reference shows errors of 10²-10⁵ relative). The feature form

    σ̃²(x) = (k(x, x) - ‖z‖²)⁺ / λ + ‖L⁻¹ z‖²,   μ̃(x) = zᵀ L⁻ᵀ L⁻¹ Zᵀ y,
    V = L Lᵀ (Cholesky, float64)

adds non-negative terms and matches the exact GP to ``1e-11``-``1e-4`` on the same problems (as accurate as
:class:`~torchbkb.ExactPosterior`), at the price of a second product. :func:`stable_factor` measures the two
forms against each other at the dictionary points -- where the variances are smallest -- and returns the
Cholesky factor when the fast one is off by more than :data:`FAST_RTOL`.

:func:`reference_rls` recomputes the variances at the dictionary points from float64 kernel values, so that a
bandit running on float32 kernel rows can tell when their rounding, amplified by ``cond(K_S)``, makes its
variances unreliable (:func:`warn_if_unreliable`).

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> S = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> k = GaussianKernel(0.3)
    >>> rls = reference_rls(k, S, S, torch.ones(30, dtype=torch.float64), 1e-10)   # S = the data: exact GP
    >>> bool((rls > 0).all())
    True
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch

from torchbkb.errors import NumericsWarning
from torchbkb.gp.linalg import inv_sqrt_factor, safe_cholesky
from torchbkb.utils.warning_site import outside_stacklevel

__all__ = [
    "FAST_RTOL", "UNRELIABLE_RTOL", "AccuracyMonitor", "feature_rls", "reference_rls", "rls_from_kernel_values",
    "stable_factor", "warn_if_unreliable", "whiten_rows"]

#: largest relative disagreement at the dictionary points for which the fast form is kept: float64, other dtypes.
FAST_RTOL = (1e-7, 1e-3)
#: relative error of a bandit's variances at its dictionary points above which it warns: float64, other dtypes.
UNRELIABLE_RTOL = (1e-3, 5e-2)


def feature_rls(Z: torch.Tensor, kdiag: torch.Tensor, L: torch.Tensor, lam: float) -> torch.Tensor:
    """RLS variance from features in the accurate form above (the mean is ``Z @ w`` with ``w = V⁻¹ Zᵀ C y``).

    Args:
        Z: `(*b, q, r)` features ``z(x)`` in ``L``'s dtype.
        kdiag: `(*b, q)` ``k(x, x)``.
        L: `(*b, r, r)` lower Cholesky factor of ``V = Zᵀ C Z + λ I``.
        lam: ``λ``.

    Returns:
        `(*b, q)` in ``L``'s dtype.
    """
    U = whiten_rows(L, Z)  # (*b, q, r) rows L⁻¹ z
    return (kdiag.to(Z.dtype) - (Z * Z).sum(-1)).clamp_min(0.0) / lam + (U * U).sum(-1)


def whiten_rows(L: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """Rows ``L⁻¹ z`` of `(*b, q, r)` ``Z`` for the lower-triangular `(*b', r, r)` ``L``; an unbatched ``L`` solves
    all rows in one triangular solve (broadcasting it would run one small solve per batch element).

    Example:
        >>> L = torch.tensor([[2.0, 0.0], [1.0, 1.0]]); Z = torch.tensor([[[2.0, 3.0]], [[4.0, 2.0]]])
        >>> whiten_rows(L, Z).tolist()
        [[[1.0, 2.0]], [[2.0, 0.0]]]
    """
    if L.dim() == 2:
        flat = Z.reshape(-1, Z.shape[-1])  # (N, r)
        return torch.linalg.solve_triangular(L, flat.transpose(0, 1), upper=False).transpose(0, 1).reshape(Z.shape)
    return torch.linalg.solve_triangular(L, Z.transpose(-1, -2), upper=False).transpose(-1, -2)


def stable_factor(K_SS: torch.Tensor, kdiag_S: torch.Tensor, W: torch.Tensor, M: torch.Tensor, ZtZ: torch.Tensor,
                  lam: float, dtype: torch.dtype) -> torch.Tensor | None:
    """The Cholesky factor of ``V`` when the fast form's variances at the dictionary points disagree with the
    feature form's by more than :data:`FAST_RTOL` for ``dtype``, else ``None``.

    Args:
        K_SS: `(m, m)` kernel matrix of the dictionary (the fast form's kernel rows at ``S``).
        kdiag_S: `(m,)` its diagonal.
        W: `(r, m)` whitening of ``K_S``; M: `(*b, m, m)` the fast form's operator in ``dtype``.
        ZtZ: `(*b, r, r)` ``Zᵀ C Z`` (compute dtype); lam: ``λ``; dtype: the dtype the fast form runs in.
    """
    K = K_SS.to(M.dtype)
    fast = kdiag_S.to(M.dtype) / lam - ((K @ M) * K).sum(-1)  # (*b, m) as score_kernel_rows computes it
    L = safe_cholesky(ZtZ + lam * torch.eye(ZtZ.shape[-1], dtype=ZtZ.dtype, device=ZtZ.device), name="V")
    Z = K_SS.to(W.dtype) @ W.T  # (m, r)
    accurate = feature_rls(Z.expand(*ZtZ.shape[:-2], *Z.shape), kdiag_S, L, lam)
    scale = accurate.abs().clamp_min(torch.finfo(accurate.dtype).tiny)
    off = float(((fast.to(accurate.dtype) - accurate).abs() / scale).max())
    return L if not off <= FAST_RTOL[dtype != torch.float64] else None


def reference_rls(kernel: Callable, S: torch.Tensor, X: torch.Tensor, counts: torch.Tensor, lam: float) -> torch.Tensor:
    """`(m,)` float64 RLS variances at the dictionary points ``S`` `(m, d)` of the DTC posterior on the
    points ``X`` `(p, d)` with weights ``counts`` `(p,)`, from float64 kernel values, in the feature form."""
    S64, X64 = S.double(), X.double()
    with torch.no_grad():
        return rls_from_kernel_values(kernel(S64, S64), kernel(X64, S64), counts, lam)


def rls_from_kernel_values(K_SS: torch.Tensor, K_XS: torch.Tensor, counts: torch.Tensor, lam: float,
                           W: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`reference_rls` from the float64 kernel values ``K_SS`` `(m, m)` and ``K_XS`` `(p, m)`, with the
    whitening ``W`` `(r, m)` of ``K_SS`` when it is known (else one `m × m` factorization)."""
    with torch.no_grad():
        W = inv_sqrt_factor(K_SS, name="K_S") if W is None else W  # (r, m)
        Zs = K_SS @ W.T  # (m, r)
        Zx = K_XS @ W.T  # (p, r)
        V = (Zx.T * counts.double()) @ Zx + lam * torch.eye(W.shape[0], dtype=torch.float64, device=K_SS.device)
        L = safe_cholesky(V, name="V")
        return feature_rls(Zs, K_SS.diagonal(), L, lam)


def warn_if_unreliable(rls: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype, lam: float, what: str,
                       stacklevel: int | None = 3) -> bool:
    """A :class:`~torchbkb.errors.NumericsWarning` (and ``True``) when ``rls`` is off ``reference`` by more than
    :data:`UNRELIABLE_RTOL` for ``dtype`` (relative, at the worst point); ``stacklevel=None`` names the first line
    outside torchbkb."""
    ref = reference.to(torch.float64)
    off = float(((rls.to(torch.float64) - ref).abs() / ref.abs().clamp_min(torch.finfo(torch.float64).tiny)).max())
    tol = UNRELIABLE_RTOL[dtype != torch.float64]
    if off <= tol:
        return False
    warnings.warn(
        f"{what}: the posterior variances at the dictionary points are off by up to {off:.1e} (relative) with {dtype} "
        f"kernel values, noise {lam:.3g} and this ill-conditioned dictionary of {ref.numel()} points (expected at most "
        f"{tol:g}); " + ("use float64 arms, " if dtype != torch.float64 else "") + "a larger noise or a smaller q_bar",
        NumericsWarning,
        stacklevel=outside_stacklevel() if stacklevel is None else stacklevel,
    )
    return True


class AccuracyMonitor:
    """One :class:`~torchbkb.errors.NumericsWarning` per owner (a bandit, a posterior) when its variances at the
    dictionary points are off the float64 :func:`reference_rls`, checked each time its data (dictionary or
    observations) has grown by a quarter since the last check, with a float64 copy of the kernel made once.

    Args:
        what: the owner's name in the warning.
    """

    def __init__(self, what: str):
        self.what = what
        self.warned = False
        self.checked = 0  # the size at the last check
        self._kernel64: Callable | None = None

    def due(self, size: int) -> bool:
        """Whether to check now, at data size ``size`` (records it as checked when so)."""
        if self.warned or size < 1.25 * self.checked + 1:
            return False
        self.checked = size
        return True

    def check(self, kernel: Callable, rls: torch.Tensor, S: torch.Tensor, X: torch.Tensor, counts: torch.Tensor,
              lam: float, dtype: torch.dtype, stacklevel: int | None, values: tuple | None = None) -> bool:
        """Compare ``rls`` `(m,)` at ``S`` with the float64 reference on the data ``X`` `(p, d)` weighted by
        ``counts``; warn (:func:`warn_if_unreliable`) and return ``True`` when it is off. ``values``: the float64
        ``(K_SS, K_XS, W)`` of :func:`rls_from_kernel_values` when the owner holds them (its kernel values are
        float64 already), used instead of evaluating the kernel again."""
        if values is not None:
            reference = rls_from_kernel_values(values[0], values[1], counts, lam, values[2])
        else:
            if self._kernel64 is None:
                self._kernel64 = copy.deepcopy(kernel).double()
            reference = reference_rls(self._kernel64, S, X, counts, lam)
        self.warned = warn_if_unreliable(rls, reference, dtype, lam, self.what,
                                         None if stacklevel is None else stacklevel + 1)
        return self.warned
