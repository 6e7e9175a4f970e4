"""Synthetic objectives: samples of a zero-mean GP at a finite arm set.

Two ways to draw ``f ~ GP(0, k)`` at arms ``X`` `(A, d)`:

* ``method="exact"`` -- ``f = L ε`` with ``L L ᵀ = K_XX + jitter·I`` (Cholesky in float64) and
  ``ε ~ N(0, I_A)``: the exact joint law, ``O(A³)`` time and ``O(A²)`` memory (fine up to a few thousand
  arms);
* ``method="rff"`` -- random Fourier features (Rahimi & Recht 2007): ``f(x) = φ(x)ᵀ w`` with
  ``φ(x) = √(2/D) cos(Ωx + b)``, ``w ~ N(0, I_D)``, ``b ~ U[0, 2π)^D`` and the rows ``ω`` of ``Ω`` drawn
  from the kernel's spectral density, so that ``E[φ(x)ᵀφ(x')] = k(x, x')``. ``O(A·D·d)`` time, chunked
  over arms, so ``A = 10⁶`` or more is fine. The process is Gaussian only as ``D → ∞``; with the default
  ``D = 4096`` the covariance error is ``O(1/√D)`` entrywise.

Spectral densities (``k(x, x') = E_ω cos(ωᵀ(x − x'))``, lengthscale ``ℓ``):

* RBF ``exp(−‖r‖²/(2ℓ²))``: ``ω ~ N(0, ℓ⁻² I_d)``;
* Matérn-ν (GPyTorch's parametrization, ``ν ∈ {1/2, 3/2, 5/2}``): the multivariate Student-t with
  ``2ν`` degrees of freedom and scale ``ℓ⁻¹``, i.e. ``ω = z / ℓ · √(2ν / u)`` with ``z ~ N(0, I_d)`` and
  ``u ~ χ²_{2ν}``. (Its density is ``∝ (2ν/ℓ² + ‖ω‖²)^{−(ν + d/2)}``, the Fourier transform of the
  Matérn kernel with ``√(2ν)‖r‖/ℓ`` in the Bessel function.)

``"auto"`` uses ``"exact"`` up to :data:`EXACT_MAX_ARMS` arms and ``"rff"`` beyond.

Example:
    >>> import torch
    >>> from torchbkb.datasets import gp_sample, random_arms
    >>> X = random_arms(500, 2, seed=0)
    >>> f = gp_sample(X, kernel="matern52", lengthscale=0.2, seed=1)
    >>> f.shape, f.dtype
    (torch.Size([500]), torch.float64)
    >>> bool(torch.equal(f, gp_sample(X, kernel="matern52", lengthscale=0.2, seed=1)))   # same seed, same f
    True
    >>> gp_sample(random_arms(10_000, 3, seed=0), lengthscale=0.3, seed=0, method="rff").shape
    torch.Size([10000])
"""

from __future__ import annotations

import math

import torch

from torchbkb.errors import InputDataError, check_matrix, check_positive
from torchbkb.gp.linalg import safe_cholesky

__all__ = ["gp_sample", "kernel_matrix", "rff_features", "KERNELS", "EXACT_MAX_ARMS"]

#: Kernel names and their Matérn smoothness ``ν`` (``inf`` for the RBF kernel).
KERNELS = {"rbf": math.inf, "matern12": 0.5, "matern32": 1.5, "matern52": 2.5}

#: ``method="auto"`` samples exactly up to this many arms.
EXACT_MAX_ARMS = 4000

_CHUNK = 65536


def gp_sample(
    arms: torch.Tensor,
    kernel: str = "rbf",
    lengthscale: float = 0.2,
    seed: int = 0,
    method: str = "auto",
    *,
    outputscale: float = 1.0,
    num_features: int = 4096,
) -> torch.Tensor:
    """One sample ``f ~ GP(0, outputscale · k)`` at the arms.

    Args:
        arms: `(A, d)` arm set (finite, floating).
        kernel: ``"rbf"``, ``"matern12"``, ``"matern32"`` or ``"matern52"``.
        lengthscale: ``ℓ > 0``.
        seed: seed of a private CPU ``torch.Generator`` (the sample does not depend on the device).
        method: ``"auto"``, ``"exact"`` or ``"rff"`` (see the module docstring).
        outputscale: prior variance ``k(x, x)``.
        num_features: ``D``, the number of random features for ``method="rff"``.

    Returns:
        `(A,)` values in the arms' dtype and device.
    """
    check_matrix(arms, "arms", min_rows=1)
    if arms.dim() != 2:
        raise InputDataError(f"arms: expected shape (A, d), got {tuple(arms.shape)}")
    _check_kernel(kernel)
    lengthscale = check_positive(lengthscale, "lengthscale")
    outputscale = check_positive(outputscale, "outputscale")
    if method not in ("auto", "exact", "rff"):
        raise InputDataError(f"method: expected 'auto', 'exact' or 'rff', got {method!r}")
    if int(num_features) < 1:
        raise InputDataError(f"num_features: expected an integer >= 1, got {num_features!r}")
    A, d = arms.shape
    if method == "auto":
        method = "exact" if A <= EXACT_MAX_ARMS else "rff"
    gen = torch.Generator().manual_seed(int(seed))
    X = arms.detach().to(torch.float64)
    if method == "exact":
        K = kernel_matrix(kernel, X, X, lengthscale) * outputscale  # (A, A)
        L = safe_cholesky(K + 1e-10 * outputscale * torch.eye(A, dtype=K.dtype, device=K.device), name="K_XX")
        eps = torch.randn(A, generator=gen, dtype=torch.float64).to(X.device)
        f = L @ eps  # (A,)
    else:
        omega, phase = _spectral_draw(kernel, d, lengthscale, int(num_features), gen)
        w = torch.randn(int(num_features), generator=gen, dtype=torch.float64)
        omega, phase, w = omega.to(X.device), phase.to(X.device), w.to(X.device)
        f = torch.empty(A, dtype=torch.float64, device=X.device)
        for i in range(0, A, _CHUNK):  # O(chunk · D) memory
            f[i : i + _CHUNK] = _features(X[i : i + _CHUNK], omega, phase) @ w
        f = f * math.sqrt(outputscale)
    return f.to(arms.dtype)


def rff_features(arms: torch.Tensor, kernel: str = "rbf", lengthscale: float = 0.2, num_features: int = 4096,
                 seed: int = 0) -> torch.Tensor:
    """Random Fourier features ``φ(X)`` with ``E[φ(X) φ(X)ᵀ] = k(X, X)`` (unit outputscale).

    Args:
        arms: `(A, d)`.
        kernel: see :data:`KERNELS`.
        lengthscale: ``ℓ > 0``.
        num_features: ``D``.
        seed: generator seed (the same seed gives the features :func:`gp_sample` uses).

    Returns:
        `(A, D)` features in float64 on the arms' device.

    Example:
        >>> import torch
        >>> X = torch.zeros(3, 2, dtype=torch.float64)
        >>> phi = rff_features(X, num_features=8)
        >>> phi.shape
        torch.Size([3, 8])
    """
    check_matrix(arms, "arms", min_rows=1)
    _check_kernel(kernel)
    gen = torch.Generator().manual_seed(int(seed))
    omega, phase = _spectral_draw(kernel, arms.shape[-1], check_positive(lengthscale, "lengthscale"), int(num_features),
                                  gen)
    X = arms.detach().to(torch.float64)
    return _features(X, omega.to(X.device), phase.to(X.device))


def kernel_matrix(kernel: str, X1: torch.Tensor, X2: torch.Tensor, lengthscale: float) -> torch.Tensor:
    """Dense kernel matrix with unit outputscale.

    Args:
        kernel: see :data:`KERNELS`.
        X1: `(n1, d)`.
        X2: `(n2, d)`.
        lengthscale: ``ℓ``.

    Returns:
        `(n1, n2)`.

    Example:
        >>> import torch
        >>> x = torch.zeros(1, 1, dtype=torch.float64)
        >>> float(kernel_matrix("matern12", x, x + 0.2, 0.2))   # exp(-r/ℓ) = exp(-1)
        0.36787...
    """
    nu = _check_kernel(kernel)
    r = torch.cdist(X1 / lengthscale, X2 / lengthscale)  # (n1, n2) scaled distances
    if math.isinf(nu):
        return torch.exp(-0.5 * r * r)
    s = math.sqrt(2.0 * nu) * r
    if nu == 0.5:
        return torch.exp(-s)
    if nu == 1.5:
        return (1.0 + s) * torch.exp(-s)
    return (1.0 + s + s * s / 3.0) * torch.exp(-s)  # ν = 5/2


# ---------------------------------------------------------------------------------------- helpers
def _check_kernel(kernel: str) -> float:
    if kernel not in KERNELS:
        raise InputDataError(f"kernel: expected one of {sorted(KERNELS)}, got {kernel!r}")
    return KERNELS[kernel]


def _spectral_draw(kernel: str, d: int, lengthscale: float, D: int, gen: torch.Generator) -> tuple[torch.Tensor,
                                                                                                   torch.Tensor]:
    """Frequencies `(D, d)` from the spectral density and phases `(D,)` uniform in ``[0, 2π)``."""
    nu = KERNELS[kernel]
    z = torch.randn(D, d, generator=gen, dtype=torch.float64)  # (D, d)
    if math.isinf(nu):
        omega = z / lengthscale
    else:  # multivariate Student-t, 2ν degrees of freedom: z / ℓ · sqrt(2ν / χ²_{2ν})
        dof = int(round(2 * nu))  # 1, 3 or 5: χ²_{2ν} is a sum of 2ν squared standard normals
        u = torch.randn(D, dof, generator=gen, dtype=torch.float64).pow(2).sum(-1)  # (D,)
        omega = z / lengthscale * torch.sqrt(2.0 * nu / u).unsqueeze(-1)
    phase = 2.0 * math.pi * torch.rand(D, generator=gen, dtype=torch.float64)
    return omega, phase


def _features(X: torch.Tensor, omega: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """``√(2/D) cos(X Ωᵀ + b)``: `(n, d)` -> `(n, D)`."""
    D = omega.shape[0]
    return math.sqrt(2.0 / D) * torch.cos(X @ omega.T + phase)
