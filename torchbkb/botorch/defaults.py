"""BKBModel's fixed default hyperparameters: BoTorch's classic Matérn-5/2 kernel for inputs in the unit cube and
standardized outcomes.

Example:
    >>> k = default_kernel(4)
    >>> round(k.base_kernel.lengthscale[0, 0].item(), 3), k.outputscale.item()
    (0.4, 1.0)
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import MaternKernel, ScaleKernel

__all__ = ["default_kernel", "DEFAULT_LENGTHSCALE", "DEFAULT_OUTPUTSCALE", "DEFAULT_NOISE", "EXACT_FRACTION", "EXACT_BELOW", "MIN_YVAR"]

#: Matérn-5/2 lengthscale per input dimension is ``DEFAULT_LENGTHSCALE · √d`` (inputs in ``[0, 1]^d``):
#: the typical distance between two uniform points of the unit cube grows like ``√(d/6)``.
DEFAULT_LENGTHSCALE = 0.2
#: Prior variance ``k(x, x)`` of the default kernel (outcomes standardized to unit variance).
DEFAULT_OUTPUTSCALE = 1.0
#: Noise variance ``λ`` of the standardized outcomes (also BKB's regularization).
DEFAULT_NOISE = 1e-3
#: The model computes the exact GP when the dictionary holds at least this fraction of the training points:
#: past it the DTC algebra (``O(n·m² + m³)`` and an eigendecomposition of ``K_S``) costs more than the exact
#: solve it approximates (measured crossover on 2 CPU cores, docs/botorch.md).
EXACT_FRACTION = 0.5
#: Up to this many training points (unbatched) the exact GP is computed outright: its solve costs less than
#: the dictionary replay's Python overhead (the dictionary is then drawn only if read, from the exact RLS
#: variances). Kept small: scoring many candidates costs ``O(n²)`` each exactly against ``O(m²)`` with DTC.
EXACT_BELOW = 128
#: Floor of known noise variances (transformed outcomes), as BoTorch's noise-free ``train_Yvar`` of 1e-6.
MIN_YVAR = 1e-6


def default_kernel(d: int, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> ScaleKernel:
    """BoTorch's classic default kernel ``ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d))`` with fixed
    hyperparameters: lengthscale ``DEFAULT_LENGTHSCALE · √d`` in every dimension, outputscale
    ``DEFAULT_OUTPUTSCALE``.

    Example:
        >>> k = default_kernel(4)
        >>> round(k.base_kernel.lengthscale[0, 0].item(), 3), k.outputscale.item()
        (0.4, 1.0)
    """
    k = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=int(d)))
    k.base_kernel.lengthscale = torch.full((1, int(d)), DEFAULT_LENGTHSCALE * math.sqrt(d))
    k.outputscale = torch.tensor(DEFAULT_OUTPUTSCALE)
    return k.to(dtype=dtype, device=device)
