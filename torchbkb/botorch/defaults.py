"""BKBModel's defaults: the hyperparameter modules of BoTorch's ``SingleTaskGP`` (:func:`hyperparameter_modules`),
and the classic fixed Matérn-5/2 kernel for users who want fixed hyperparameters (:func:`default_kernel`).

Example:
    >>> import torch
    >>> covar, likelihood, mean = hyperparameter_modules(4, None, None, None, torch.zeros(1))
    >>> type(covar).__name__, type(likelihood).__name__, type(mean).__name__
    ('RBFKernel', 'GaussianLikelihood', 'ConstantMean')
"""

from __future__ import annotations

import math

import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior, get_gaussian_likelihood_with_lognormal_prior
)
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood
from gpytorch.means import ConstantMean
from torch import Tensor, nn

from torchbkb.errors import InputDataError

__all__ = ["hyperparameter_modules", "hyperparameter_values", "same_values", "default_kernel", "DEFAULT_LENGTHSCALE",
           "DEFAULT_OUTPUTSCALE", "DEFAULT_NOISE", "EXACT_FRACTION", "EXACT_BELOW", "EXACT_BELOW_ACCELERATOR",
           "EXACT_BELOW_SLOW_FLOAT64", "FULL_RATE_FLOAT64", "exact_below", "exact_outright", "EXACT_FIT",
           "MIN_YVAR"]

#: Matérn-5/2 lengthscale per input dimension is ``DEFAULT_LENGTHSCALE · √d`` (inputs in ``[0, 1]^d``):
#: the typical distance between two uniform points of the unit cube grows like ``√(d/6)``.
DEFAULT_LENGTHSCALE = 0.2
#: Prior variance ``k(x, x)`` of the default kernel (outcomes standardized to unit variance).
DEFAULT_OUTPUTSCALE = 1.0
#: The fixed noise variance ``λ`` of the standardized outcomes that goes with :func:`default_kernel`.
DEFAULT_NOISE = 1e-3
#: The model computes the exact GP when the dictionary holds at least this fraction of the training points:
#: past it the DTC algebra (``O(n·m² + m³)`` and an eigendecomposition of ``K_S``) costs more than the exact
#: solve it approximates (the crossover measured on 2 CPU cores).
EXACT_FRACTION = 0.5
#: Up to this many training points (unbatched) the exact GP is computed outright: its solve costs less than
#: the dictionary replay's Python overhead (the dictionary is then drawn only if read, from the exact RLS
#: variances). Kept small: scoring many candidates costs ``O(n²)`` each exactly against ``O(m²)`` with DTC.
EXACT_BELOW = 128
#: The same on a GPU whose float64 runs at full rate (:data:`FULL_RATE_FLOAT64`). There an iteration's time is its
#: kernel launches and host reads, not its arithmetic: the exact GP's solve and scoring launch fewer kernels than the
#: dictionary replay and the DTC scoring, and their ``O(n³)`` and ``O(n²)``-per-candidate arithmetic (in float64
#: whatever the inputs' dtype, :func:`~torchbkb.gp.linalg.compute_dtype`) stays small up to a few thousand points.
EXACT_BELOW_ACCELERATOR = 4096
#: The same on any other accelerator: float64 at 1/32-1/64 of the float32 rate makes that arithmetic the cost.
EXACT_BELOW_SLOW_FLOAT64 = 512
#: CUDA compute capabilities whose float64 runs at half the float32 rate or better (P100, V100, A100/A30,
#: H100/H200, B200; AMD's MI200 and MI300 read as 9.0 under ROCm).
FULL_RATE_FLOAT64 = frozenset({(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)})
#: Up to this many training points a fit maximizes the exact evidence (one round: it does not depend on a
#: dictionary), which costs about what the bound does there and is what an exact posterior needs.
EXACT_FIT = 1000
#: Floor of known noise variances (transformed outcomes), as BoTorch's noise-free ``train_Yvar`` of 1e-6.
MIN_YVAR = 1e-6


def exact_below(device: torch.device | str) -> int:
    """The most training points (unbatched) for which a model on ``device`` computes the exact GP outright:
    :data:`EXACT_BELOW` on the CPU, :data:`EXACT_BELOW_ACCELERATOR` on a CUDA device of
    :data:`FULL_RATE_FLOAT64`, :data:`EXACT_BELOW_SLOW_FLOAT64` on any other accelerator.

    Example:
        >>> exact_below("cpu")
        128
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InputDataError(f"device: expected a torch.device or a device string, got {device!r}") from err
    if device.type == "cpu":
        return EXACT_BELOW
    if device.type == "cuda" and torch.cuda.is_available():
        if tuple(torch.cuda.get_device_capability(device)) in FULL_RATE_FLOAT64:
            return EXACT_BELOW_ACCELERATOR
    return EXACT_BELOW_SLOW_FLOAT64


def exact_outright(X: Tensor, exact_fraction: float | None) -> bool:
    """Whether a model on the training inputs ``X`` `(*b, n, d)` computes the exact GP outright, with no dictionary
    replay: unbatched, at most :func:`exact_below` points on ``X``'s device, and ``exact_fraction`` not ``None``.

    Example:
        >>> exact_outright(torch.zeros(100, 2), 0.5), exact_outright(torch.zeros(100, 2), None)
        (True, False)
    """
    return exact_fraction is not None and X.dim() == 2 and X.shape[-2] <= exact_below(X.device)


def default_kernel(d: int, *, dtype: torch.dtype = torch.float64,
                   device: torch.device | str | None = None) -> ScaleKernel:
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


def hyperparameter_modules(d: int, noise_tf: Tensor | None, noise: float | None, kernel: nn.Module | None, like: Tensor,
                           batch_shape: torch.Size | None = None, likelihood=None, mean_module=None) -> tuple:
    """``(covar_module, likelihood, mean_module)`` as ``SingleTaskGP`` builds them (BoTorch's current defaults).

    Args:
        d: input dimension (of the transformed inputs).
        noise_tf: `(*batch, n)` known noise variances (transformed outcomes): a ``FixedNoiseGaussianLikelihood``.
        noise: a fixed noise variance: a ``GaussianLikelihood`` with that noise, not learned.
        kernel: the kernel given, else the RBF kernel with BoTorch's dimension-scaled lognormal lengthscale prior.
        like: the modules take its dtype and device.
        batch_shape: the training data's batch shape: the default modules get one set of hyperparameters per
            batch, as ``SingleTaskGP``'s (a batched model, e.g. BoTorch's ``batch_cross_validation``).
        likelihood, mean_module: the user's (checked by the model), used as given.

    Without ``noise_tf``, ``noise`` and ``likelihood`` the noise is learned: BoTorch's lognormal-prior
    ``GaussianLikelihood``.
    """
    batch_shape = torch.Size(batch_shape or ())
    if kernel is None:
        kernel = get_covar_module_with_dim_scaled_prior(ard_num_dims=int(d), batch_shape=batch_shape)
    if isinstance(kernel, nn.Module):
        kernel = kernel.to(like)
    if likelihood is None:
        if noise_tf is not None:
            likelihood = FixedNoiseGaussianLikelihood(noise=noise_tf, batch_shape=batch_shape)
        elif noise is not None:
            likelihood = GaussianLikelihood(noise_constraint=GreaterThan(0.0), batch_shape=batch_shape).to(like)
            likelihood.noise = torch.tensor(float(noise), dtype=like.dtype, device=like.device)
            likelihood.requires_grad_(False)  # a noise the user gives is kept
        else:
            likelihood = get_gaussian_likelihood_with_lognormal_prior(batch_shape=batch_shape)
    if mean_module is None:
        mean_module = ConstantMean(batch_shape=batch_shape)
    return kernel, likelihood.to(like), mean_module.to(like)


def hyperparameter_values(*modules) -> Tensor | None:
    """`(p,)` the values of every parameter and floating buffer of the given modules (``None`` if there are none):
    a snapshot that tells when a posterior built from them is stale."""
    values = [
        t.detach().reshape(-1)
        for m in modules
        if isinstance(m, nn.Module)
        for t in (*m.parameters(), *(b for b in m.buffers() if b.is_floating_point()))
    ]
    return torch.cat(values) if values else None  # cat copies: the snapshot never aliases a parameter


def same_values(a: Tensor | None, b: Tensor | None) -> bool | Tensor:
    """Whether two :func:`hyperparameter_values` snapshots are equal: a bool when their presence or shapes decide
    it, else a 0-d boolean tensor on their device, which the caller reads with its other checks (one host read)."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and (a == b).all()
