"""Titsias' collapsed evidence bound of the DTC posterior, in chunks: what learning hyperparameters at
``O(n·m²)`` maximizes.

For training data ``(X, y)`` with per-point noise ``D = diag(d_i)`` and dictionary ``S`` (Titsias 2009, Eq. 9)::

    log p(y) >= log N(y | 0, Q + D) - ½ tr(D⁻¹(K - Q)),    Q = K_XS K_SS⁻¹ K_SX,

equal to the exact log marginal likelihood when ``S`` holds every training point. With ``K_SS = L Lᵀ`` and
``V = L⁻¹K_SX`` `(m, n)`, everything comes from sums over the points -- ``A = V D⁻¹ Vᵀ``, ``b = V D⁻¹ y``,
``Σ k(x,x)/d``, ``Σ y²/d``, ``Σ log d`` -- accumulated in chunks (recomputed in the backward pass), so no
`(n, n)` and no `(n, m)` tensor beyond a chunk is formed; the only factorizations are of `(m, m)` matrices.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(40, 2, dtype=torch.float64); y = torch.sin(4 * X[:, 0])
    >>> full = dtc_evidence_bound(GaussianKernel(0.5), X, y, torch.full_like(y, 0.1), X)
    >>> sparse = dtc_evidence_bound(GaussianKernel(0.5), X, y, torch.full_like(y, 0.1), X[:5])
    >>> bool(sparse <= full)                      # a lower bound on the exact evidence
    True
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from torchbkb.errors import InputDataError, check_finite
from torchbkb.gp.kernels import as_kernel
from torchbkb.gp.linalg import safe_cholesky
from torchbkb.utils.host_copy import check_at_once

__all__ = ["dtc_evidence_bound", "exact_evidence", "FIT_CHUNK"]

#: Training points per chunk of the bound's sums: peak memory ``O(FIT_CHUNK·m)`` whatever ``n``.
FIT_CHUNK = 8192


def dtc_evidence_bound(kernel, X: Tensor, y: Tensor, noise: Tensor, dictionary: Tensor,
                       chunk_size: int = FIT_CHUNK) -> Tensor:
    """Titsias' collapsed bound ``log N(y | 0, Q + D) - ½ tr(D⁻¹(K - Q))`` (a sum over the points, not a mean).

    Args:
        kernel: a GPyTorch kernel (or callable ``(X1, X2) -> Tensor``); gradients flow to its parameters.
        X: `(n, d)` inputs, ``n >= 1``.
        y: `(n,)` outcomes, already centered by the prior mean (gradients flow to it).
        noise: `(n,)` positive noise variances ``d_i`` (gradients flow to them).
        dictionary: `(m, d)` the inducing points ``S``.
        chunk_size: points per chunk.

    Returns:
        `()` the bound.

    Example:
        >>> import torch
        >>> from gpytorch.kernels import RBFKernel
        >>> X = torch.linspace(0, 1, 6, dtype=torch.float64)[:, None]; y = torch.sin(5 * X[:, 0])
        >>> K = RBFKernel().double()(X).to_dense() + 0.1 * torch.eye(6, dtype=torch.float64)
        >>> exact = torch.distributions.MultivariateNormal(torch.zeros(6, dtype=torch.float64), K).log_prob(y)
        >>> bound = dtc_evidence_bound(RBFKernel().double(), X, y, torch.full_like(y, 0.1), X)
        >>> bool(torch.isclose(bound, exact))
        True
    """
    _check(X, y, noise, dictionary)
    kernel = as_kernel(kernel)  # dense blocks and the diagonal, for GPyTorch kernels and callables alike
    n, m = X.shape[0], dictionary.shape[0]
    K_SS = kernel(dictionary, dictionary)
    L = safe_cholesky(K_SS, name="K_SS")  # (m, m): jitter only if needed
    # L⁻¹ once (m³), so that each chunk is a product, not a triangular solve, forward and backward. Summing
    # K_SX D⁻¹ K_XS first and applying L⁻¹ after would save more, but loses the bound when K_SS is
    # ill-conditioned.
    L_inv = torch.linalg.solve_triangular(L, torch.eye(m, dtype=L.dtype, device=L.device), upper=False)
    A = X.new_zeros(m, m)
    b = X.new_zeros(m)
    trace = X.new_zeros(())
    grad = torch.is_grad_enabled() and n > chunk_size  # one chunk: nothing to save by recomputing it
    for i in range(0, n, chunk_size):
        args = (X[i : i + chunk_size], y[i : i + chunk_size], noise[i : i + chunk_size], dictionary, L_inv)
        A_c, b_c, t_c = (checkpoint(_chunk_sums, kernel, *args, use_reentrant=False) if grad
                         else _chunk_sums(kernel, *args))
        A, b, trace = A + A_c, b + b_c, trace + t_c
    LB = safe_cholesky(A + torch.eye(m, dtype=A.dtype, device=A.device), name="I + V D⁻¹ Vᵀ")
    c = torch.linalg.solve_triangular(LB, b.unsqueeze(-1), upper=False).squeeze(-1)
    log_det = 2.0 * LB.diagonal().log().sum() + noise.log().sum()
    quad = (y * y / noise).sum() - (c * c).sum()
    return -0.5 * (n * math.log(2 * math.pi) + log_det + quad + trace - A.diagonal().sum())


def exact_evidence(kernel, X: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    """The exact GP's ``log N(y | 0, K + D)`` (one `(n, n)` Cholesky factorization per batch: for small ``n``).

    Args:
        kernel: a GPyTorch kernel or callable (batched hyperparameters broadcast against the batch).
        X: `(*b, n, d)` inputs; y: `(*b, n)` centered outcomes; noise: `(*b, n)` positive noise variances.

    Returns:
        `(*b)` the log evidence of each batch.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.linspace(0, 1, 6, dtype=torch.float64)[:, None]; y = X[:, 0]; d = torch.full_like(y, 0.1)
        >>> k = GaussianKernel(0.3)
        >>> bool(torch.isclose(exact_evidence(k, X, y, d), dtc_evidence_bound(k, X, y, d, X)))
        True
    """
    _check(X, y, noise, X, batched=True)
    K = as_kernel(kernel)(X, X)
    L = safe_cholesky(K + torch.diag_embed(noise), name="K + D")
    a = torch.linalg.solve_triangular(L, y.unsqueeze(-1), upper=False).squeeze(-1)
    log_det = 2.0 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return -0.5 * (X.shape[-2] * math.log(2 * math.pi) + log_det + (a * a).sum(-1))


def _chunk_sums(kernel, X: Tensor, y: Tensor, noise: Tensor, S: Tensor, L_inv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``V D⁻¹ Vᵀ`` `(m, m)`, ``V D⁻¹ y`` `(m,)` and ``Σ k(x,x)/d`` of one chunk, ``V = L⁻¹ K_SX``."""
    V = L_inv @ kernel(S, X)  # (m, c)
    Vw = V / noise
    k_diag = kernel.diag(X)
    return Vw @ V.transpose(-1, -2), Vw @ y, (k_diag / noise).sum()


def _check(X, y, noise, S, batched: bool = False) -> None:
    if not isinstance(X, Tensor) or X.dim() < 2 or (X.dim() != 2 and not batched) or X.shape[-2] < 1:
        want = "(*b, n >= 1, d)" if batched else "(n >= 1, d)"
        raise InputDataError(f"X: expected shape {want}, got "
                             f"{tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__}")
    n, d = X.shape[-2:]
    for name, t in (("y", y), ("noise", noise)):
        if not isinstance(t, Tensor) or t.dim() < 1 or t.shape[-1] != n or (not batched and t.dim() != 1):
            raise InputDataError(f"{name}: expected shape {(*X.shape[:-2], n)}, got "
                                 f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if not isinstance(S, Tensor) or S.dim() < 2 or S.shape[-2] < 1 or S.shape[-1] != d:
        raise InputDataError(f"dictionary: expected shape (m >= 1, {d}), got "
                             f"{tuple(S.shape) if isinstance(S, Tensor) else type(S).__name__}")
    values = {"X": X.detach(), "y": y.detach(), "noise": noise.detach(), "dictionary": S.detach()}

    def one_at_a_time() -> None:  # the message of the first check that fails
        for name, t in values.items():
            check_finite(t, name)
        if bool((values["noise"] <= 0).any()):
            raise InputDataError(f"noise: expected positive variances, got min {float(values['noise'].min()):.3e}")

    flags = {name: torch.isfinite(t).all() for name, t in values.items()}
    check_at_once(flags | {"positive": (values["noise"] > 0).all()}, one_at_a_time)  # one read an evaluation
