"""Synthetic arm sets in the unit cube and the :class:`Problem` record (arms + noise-free values + noise).

Example:
    >>> from torchbkb.datasets import grid_arms, random_arms
    >>> grid_arms(3, 2).shape, random_arms(5, 4, seed=0).shape
    (torch.Size([9, 2]), torch.Size([5, 4]))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torchbkb.errors import InputDataError, check_int
from torchbkb.objectives import ArmObjective

__all__ = ["Problem", "grid_arms", "random_arms"]


class Problem(NamedTuple):
    """A finite-arm optimization problem: maximize ``values`` over ``arms`` from noisy rewards.

    Unpacks as ``arms, values, noise_std = problem`` (the name is the fourth field).

    Attributes:
        arms: `(A, d)` arm set.
        values: `(A,)` noise-free objective values (for regret).
        noise_std: standard deviation of the Gaussian reward noise.
        name: a short label.

    Example:
        >>> import torch
        >>> p = Problem(torch.zeros(2, 1), torch.tensor([0.0, 1.0]), 0.0, "toy")
        >>> p.objective(seed=0)(torch.tensor([1]))
        tensor([1.])
    """

    arms: torch.Tensor
    values: torch.Tensor
    noise_std: float
    name: str = ""

    def objective(self, seed: int = 0):
        """A :class:`torchbkb.ArmObjective` drawing ``values[i] + N(0, noise_std²)`` rewards."""
        return ArmObjective(self.values, noise_std=self.noise_std, seed=seed)


def random_arms(
    A: int,
    d: int,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``A`` arms uniform in ``[0, 1]^d`` (drawn on the CPU from ``seed``, then moved).

    Args:
        A: number of arms ``>= 1``.
        d: dimension ``>= 1``.
        seed: generator seed.
        dtype: floating dtype.
        device: target device.

    Returns:
        `(A, d)`.
    """
    A, d = check_int(A, "A"), check_int(d, "d")
    _check_dtype(dtype)
    gen = torch.Generator().manual_seed(int(seed))
    return torch.rand(A, d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


def grid_arms(
    n_per_dim: int,
    d: int,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The regular grid ``{0, 1/(n-1), ..., 1}^d`` (``n = n_per_dim``; a single point 0.5 when ``n = 1``).

    Args:
        n_per_dim: points per axis ``>= 1``.
        d: dimension ``>= 1``.
        dtype: floating dtype.
        device: target device.

    Returns:
        `(n_per_dim ** d, d)`, the last coordinate varying fastest.

    Example:
        >>> grid_arms(2, 2).tolist()
        [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
    """
    n, d = check_int(n_per_dim, "n_per_dim"), check_int(d, "d")
    _check_dtype(dtype)
    axis = torch.linspace(0.0, 1.0, n, dtype=torch.float64) if n > 1 else torch.full((1,), 0.5, dtype=torch.float64)
    mesh = torch.meshgrid(*([axis] * d), indexing="ij")  # d tensors of shape (n, ..., n)
    return torch.stack([m.reshape(-1) for m in mesh], dim=-1).to(dtype=dtype, device=device)  # (n^d, d)


def _check_dtype(dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputDataError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
