"""Named benchmark problems: the anchor problem and discretized BoTorch test functions.

Example:
    >>> from torchbkb.datasets import anchor_problem, botorch_problem
    >>> arms, values, noise_std, name = anchor_problem()
    >>> tuple(arms.shape), round(float(values.std(unbiased=False)), 6), noise_std
    ((1000, 2), 1.0, 0.1)
    >>> p = botorch_problem("branin", A=200, seed=0)
    >>> tuple(p.arms.shape), bool(p.values.max() <= -0.397887)       # negated: the maximum is -min f
    ((200, 2), True)
"""

from __future__ import annotations

import numpy as np
import torch

from torchbkb.datasets.arms import Problem, random_arms
from torchbkb.errors import InputDataError

__all__ = ["anchor_problem", "botorch_problem", "BOTORCH_PROBLEMS", "ANCHOR_SETTINGS"]

#: The run settings that go with :func:`anchor_problem` (λ is the GP noise variance).
ANCHOR_SETTINGS = {"T": 1000, "noise": 0.01, "q_bar": 2.0, "lengthscale": 0.2}

#: Names accepted by :func:`botorch_problem` -> (botorch class name, constructor kwargs).
BOTORCH_PROBLEMS = {
    "ackley": ("Ackley", {"dim": 2}),
    "branin": ("Branin", {}),
    "hartmann3": ("Hartmann", {"dim": 3}),
    "hartmann6": ("Hartmann", {"dim": 6}),
    "levy": ("Levy", {"dim": 2}),
    "rosenbrock": ("Rosenbrock", {"dim": 2}),
    "sixhumpcamel": ("SixHumpCamel", {}),
}


def anchor_problem(*, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> Problem:
    """The anchor problem, drawn exactly as follows (NumPy, float64)::

        rng  = numpy.random.default_rng(0)
        arms = rng.uniform(size=(1000, 2))                          # A = 1,000 arms in [0, 1]²
        K    = exp(-‖x - x'‖² / (2 · 0.2²))                          # RBF kernel, lengthscale 0.2
        L    = numpy.linalg.cholesky(K + 1e-8 · I)                   # jitter for the Cholesky only
        f    = L @ rng.standard_normal(1000)                        # the same rng, continued
        f    = (f - f.mean()) / f.std()                             # standardized (ddof = 0)

    Rewards are ``f(x) + N(0, 0.1²)`` (``noise_std = 0.1``); the settings that go with it are
    :data:`ANCHOR_SETTINGS` (``T = 1,000``, ``λ = 0.01``, ``q̄ = 2``).

    Args:
        dtype: floating dtype of the returned tensors.
        device: their device.

    Returns:
        :class:`~torchbkb.datasets.Problem` ``(arms (1000, 2), values (1000,), 0.1, "anchor")``.
    """
    rng = np.random.default_rng(0)
    arms = rng.uniform(size=(1000, 2))  # (A, 2)
    sq = ((arms[:, None, :] - arms[None, :, :]) ** 2).sum(-1)  # (A, A) squared distances
    K = np.exp(-sq / (2.0 * 0.2**2))
    L = np.linalg.cholesky(K + 1e-8 * np.eye(len(arms)))
    f = L @ rng.standard_normal(len(arms))
    f = (f - f.mean()) / f.std()
    return Problem(torch.as_tensor(arms, dtype=dtype, device=device), torch.as_tensor(f, dtype=dtype, device=device),
                   0.1, "anchor")


def botorch_problem(
    name: str,
    A: int = 1000,
    seed: int = 0,
    *,
    noise_std: float = 0.0,
    dim: int | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Problem:
    """A BoTorch test function discretized on ``A`` random candidates, for maximization.

    The candidates are uniform in the unit cube ``[0, 1]^d`` (the arms); the objective at arm ``u`` is
    ``-f(lb + u · (ub - lb))`` with ``f`` the BoTorch function (``negate=True``) on its native bounds.

    Args:
        name: one of :data:`BOTORCH_PROBLEMS` (case-insensitive).
        A: number of candidates.
        seed: seed of the candidates.
        noise_std: reward noise of the returned problem (the values are noise-free).
        dim: dimension for the functions that take one (Ackley, Levy, Rosenbrock; default 2).
        dtype: floating dtype.
        device: device.

    Returns:
        :class:`~torchbkb.datasets.Problem` with arms `(A, d)` and values `(A,)`.
    """
    key = str(name).lower() if isinstance(name, str) else None
    if key not in BOTORCH_PROBLEMS:
        raise InputDataError(f"name: expected one of {sorted(BOTORCH_PROBLEMS)}, got {name!r}")
    if not float(noise_std) >= 0:
        raise InputDataError(f"noise_std: expected noise_std >= 0, got {noise_std!r}")
    from botorch import test_functions

    cls_name, kwargs = BOTORCH_PROBLEMS[key]
    kwargs = dict(kwargs)
    if dim is not None:
        if "dim" not in kwargs or key.startswith("hartmann"):
            raise InputDataError(f"dim: expected None for {name!r} (fixed dimension), got {dim!r}")
        kwargs["dim"] = int(dim)
    fn = getattr(test_functions, cls_name)(negate=True, **kwargs)
    bounds = fn.bounds.to(torch.float64)  # (2, d)
    U = random_arms(A, fn.dim, seed)  # (A, d) in the unit cube
    with torch.no_grad():
        values = fn(bounds[0] + U * (bounds[1] - bounds[0]), noise=False)  # forward() applies negate
    return Problem(U.to(dtype=dtype, device=device), values.to(dtype=dtype, device=device), float(noise_std), key)
