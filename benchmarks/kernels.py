"""Kernels the benchmarks use beside torchbkb's Gaussian kernel."""

from __future__ import annotations

import math

import torch

from torchbkb.gp.kernels import GaussianKernel


class Matern52(torch.nn.Module):
    """``(1 + √5 r/ℓ + 5r²/(3ℓ²)) exp(-√5 r/ℓ)``; checked against ``gpytorch.kernels.MaternKernel(nu=2.5)``."""

    def __init__(self, lengthscale: float):
        super().__init__()
        self.lengthscale = float(lengthscale)

    def forward(self, X1, X2):
        d2 = (X1 * X1).sum(-1)[..., :, None] + (X2 * X2).sum(-1)[..., None, :] - 2.0 * X1 @ X2.transpose(-1, -2)
        s = math.sqrt(5.0) * d2.clamp_min(0.0).sqrt() / self.lengthscale
        return (1.0 + s + s * s / 3.0) * torch.exp(-s)

    def diag(self, X):
        return torch.ones(X.shape[:-1], dtype=X.dtype, device=X.device)


def check_matern_against_gpytorch() -> float:
    import gpytorch

    X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = gpytorch.kernels.MaternKernel(nu=2.5).double()
    ref.lengthscale = 0.2
    with torch.no_grad():
        return float((ref(X, X).to_dense() - Matern52(0.2)(X, X)).abs().max())


def make_kernel(name: str, ls: float):
    """``"rbf"`` (or ``"gaussian"``): :class:`~torchbkb.gp.kernels.GaussianKernel`; ``"matern52"``:
    :class:`Matern52`."""
    return GaussianKernel(ls) if name in ("rbf", "gaussian") else Matern52(ls)
