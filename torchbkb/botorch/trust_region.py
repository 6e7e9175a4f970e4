"""A TuRBO trust region (Eriksson, Pearce, Gardner, Turner, Poloczek: "Scalable Global Optimization via Local
Bayesian Optimization", NeurIPS 2019): its state machine and its candidates, in the unit cube.

The region is a hyperrectangle centred at the best point found, of side ``L·w_i`` with
``w_i = ℓ_i / (Π_j ℓ_j)^(1/d)`` for the model's lengthscales ``ℓ`` (volume ``L^d``), clipped to ``[0, 1]^d``.
After ``τ_succ = 3`` consecutive batches that improve the best value (by more than ``10⁻³·|best|``, the reference
code's rule) ``L`` doubles up to ``L_max = 1.6``; after ``τ_fail = ⌈max(4/q, d/q)⌉`` consecutive batches that do
not, it halves; below ``L_min = 2⁻⁷`` the region restarts (``L_init = 0.8``). Candidates are TuRBO's: Sobol points
in the region, of which each coordinate replaces the centre's with probability ``min(1, 20/d)`` (at least one per
candidate).

Example:
    >>> import torch
    >>> region = TrustRegion(dim=4, batch_size=10)
    >>> region.failure_tolerance, region.length
    (1, 0.8)
    >>> for y in (1.0, 2.0, 3.0, 4.0):              # three improvements in a row: the region grows
    ...     region.update(torch.tensor([y]))
    >>> region.length, region.best_value
    (1.6, 4.0)
    >>> cand = region.candidates(torch.full((4,), 0.5), torch.ones(4), 100, seed=0)
    >>> cand.shape, bool(((cand - 0.5).abs() <= 0.8 + 1e-12).all())
    (torch.Size([100, 4]), True)
"""

from __future__ import annotations

import math

import torch
from botorch.fit import DEFAULT_WARNING_HANDLER
from gpytorch.constraints import Interval
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor
from torch.quasirandom import SobolEngine

from torchbkb.errors import InputDataError, check_finite, check_int

__all__ = ["TrustRegion", "num_candidates", "turbo_modules", "model_lengthscale", "accept_stalled_line_search"]


def num_candidates(dim: int) -> int:
    """TuRBO's number of candidates per proposal: ``min(5000, max(2000, 200·d))``."""
    return min(5000, max(2000, 200 * int(dim)))


def turbo_modules(dim: int) -> dict:
    """TuRBO's model choices: ``ScaleKernel(Matérn-5/2, ARD)`` with lengthscales in ``[0.005, 4]`` on the unit cube
    and a noise in ``[1e-8, 1e-3]`` (standardized outcomes): ``BKBModel(X, Y, **turbo_modules(d))``."""
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=int(dim), lengthscale_constraint=Interval(0.005, 4.0)))
    return {"covar_module": kernel, "likelihood": GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))}


def accept_stalled_line_search(w) -> bool:
    """``fit_gpytorch_mll``'s ``warning_handler``, but for an L-BFGS-B line search that could not improve
    (``ABNORMAL``: in float32, an evidence at its rounding floor), which ends the fit where it stopped instead of
    failing it (without priors to draw from, BoTorch's retries repeat the same failed start)."""
    return DEFAULT_WARNING_HANDLER(w) or "ABNORMAL" in str(w.message)


def model_lengthscale(model, like: Tensor) -> Tensor:
    """`(d,)` or `(1,)` the lengthscales of a model's (scaled) stationary kernel, in ``like``'s dtype and device;
    ones for a kernel without them (the region's metric)."""
    kernel = getattr(model.covar_module, "base_kernel", model.covar_module)
    ls = getattr(kernel, "lengthscale", None)
    return torch.ones(1, dtype=like.dtype) if ls is None else ls.detach().reshape(-1).to(like)


class TrustRegion:
    """One TuRBO trust region's state (maximization).

    Args:
        dim: ``d``.
        batch_size: ``q`` (sets ``τ_fail``).
        length_init, length_min, length_max: ``L_init = 0.8``, ``L_min = 2⁻⁷``, ``L_max = 1.6``.
        success_tolerance: ``τ_succ = 3``.
        failure_tolerance: ``τ_fail``; default ``⌈max(4/q, d/q)⌉``.

    Attributes:
        length: the current side ``L``; best_value: the best value seen since the last restart;
        success_counter, failure_counter: consecutive successes and failures; restarts: restarts so far;
        restart_triggered: ``L`` fell below ``L_min`` (call :meth:`restart`).
    """

    def __init__(self, dim: int, batch_size: int, *, length_init: float = 0.8, length_min: float = 0.5**7,
                 length_max: float = 1.6, success_tolerance: int = 3, failure_tolerance: int | None = None):
        for name, v in (("dim", dim), ("batch_size", batch_size), ("success_tolerance", success_tolerance)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputDataError(f"{name}: expected an integer >= 1, got {v!r}")
        if not 0 < length_min <= length_init <= length_max:
            raise InputDataError("lengths: expected 0 < length_min <= length_init <= length_max, "
                                 f"got {length_min}, {length_init}, {length_max}")
        if failure_tolerance is None:
            failure_tolerance = math.ceil(max(4.0 / batch_size, dim / batch_size))
        if isinstance(failure_tolerance, bool) or not isinstance(failure_tolerance, int) or failure_tolerance < 1:
            raise InputDataError(f"failure_tolerance: expected an integer >= 1, got {failure_tolerance!r}")
        self.dim, self.batch_size = dim, batch_size
        self.length_init, self.length_min, self.length_max = float(length_init), float(length_min), float(length_max)
        self.success_tolerance, self.failure_tolerance = success_tolerance, failure_tolerance
        self.restarts = 0
        self.restart()
        self.restarts = 0

    def restart(self) -> None:
        """Back to ``L_init`` with no best value and no counts (a new region)."""
        self.length = self.length_init
        self.success_counter = self.failure_counter = 0
        self.best_value = -math.inf
        self.restart_triggered = False
        self.restarts += 1

    def update(self, Y_next: Tensor) -> None:
        """Count the batch ``Y_next`` `(k,)` or `(k, 1)` (finite, maximization) as a success or a failure and resize."""
        if not isinstance(Y_next, Tensor) or Y_next.numel() < 1:
            raise InputDataError(f"Y_next: expected a non-empty tensor, got {Y_next!r}")
        check_finite(Y_next, "Y_next")
        best = float(Y_next.max())
        if self.best_value == -math.inf or best > self.best_value + 1e-3 * abs(self.best_value):
            self.success_counter, self.failure_counter = self.success_counter + 1, 0
        else:
            self.success_counter, self.failure_counter = 0, self.failure_counter + 1
        if self.success_counter == self.success_tolerance:
            self.length, self.success_counter = min(2.0 * self.length, self.length_max), 0
        elif self.failure_counter == self.failure_tolerance:
            self.length, self.failure_counter = self.length / 2.0, 0
        self.best_value = max(self.best_value, best)
        self.restart_triggered = self.length < self.length_min

    def bounds(self, center: Tensor, lengthscale: Tensor) -> tuple[Tensor, Tensor]:
        """``(lower, upper)`` `(d,)` of the region around `(d,)` ``center`` in ``[0, 1]^d``, its sides scaled by the
        `(d,)` (or `(1,)`) positive ``lengthscale`` to volume ``L^d``."""
        center, ls = self._check(center, lengthscale)
        w = ls / ls.mean()
        w = w / w.log().mean().exp()  # Π w_i = 1
        half = w * self.length / 2.0
        return (center - half).clamp(0.0, 1.0), (center + half).clamp(0.0, 1.0)

    def candidates(self, center: Tensor, lengthscale: Tensor, n: int, seed: int | None = None) -> Tensor:
        """`(n, d)` TuRBO candidates: Sobol points in the region, each coordinate perturbed from ``center`` with
        probability ``min(1, 20/d)`` and at least one per candidate (the others keep the centre's)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputDataError(f"n: expected an integer >= 1, got {n!r}")
        lb, ub = self.bounds(center, lengthscale)
        d = self.dim
        sobol = SobolEngine(d, scramble=True, seed=seed).draw(n).to(center)  # (n, d)
        pert = lb + (ub - lb) * sobol
        gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
        mask = torch.rand(n, d, generator=gen) <= min(20.0 / d, 1.0)
        lone = (~mask.any(-1)).nonzero().squeeze(-1)
        mask[lone, torch.randint(0, d, (lone.numel(),), generator=gen)] = True
        return torch.where(mask.to(center.device), pert, center.expand(n, d))

    def state_dict(self) -> dict:
        """The state as plain numbers (checkpoints)."""
        keys = ("length", "success_counter", "failure_counter", "best_value", "restart_triggered", "restarts")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; a wrong or incomplete one (a key missing or extra, a length that is not a
        finite float > 0, a best value that is not a finite float or ``-inf``, counters that are not integers >= 0)
        raises and changes nothing."""
        keys = ("length", "success_counter", "failure_counter", "best_value", "restart_triggered", "restarts")
        if not isinstance(state, dict) or set(state) != set(keys):
            got = sorted(state) if isinstance(state, dict) else repr(state)
            raise InputDataError(f"state: expected the keys {sorted(keys)}, got {got}")
        length, best = state["length"], state["best_value"]
        if not (isinstance(length, float) and math.isfinite(length) and length > 0):
            raise InputDataError(f"state: expected a finite length > 0, got {length!r}")
        if not (isinstance(best, float) and (math.isfinite(best) or best == -math.inf)):
            raise InputDataError(f"state: expected best_value as a finite float or -inf, got {best!r}")
        if not isinstance(state["restart_triggered"], bool):
            raise InputDataError(f"state: expected restart_triggered as a bool, got {state['restart_triggered']!r}")
        for k in ("success_counter", "failure_counter", "restarts"):
            check_int(state[k], f"state: {k}", 0)
        for k in keys:
            setattr(self, k, state[k])

    def _check(self, center: Tensor, lengthscale: Tensor) -> tuple[Tensor, Tensor]:
        if not isinstance(center, Tensor) or center.shape != (self.dim,):
            raise InputDataError(f"center: expected shape ({self.dim},), got {getattr(center, 'shape', center)}")
        check_finite(center, "center")
        if bool(((center < 0) | (center > 1)).any()):
            raise InputDataError(f"center: expected a point of the unit cube [0, 1]^{self.dim}, got {center.tolist()}")
        ls = torch.as_tensor(lengthscale, dtype=center.dtype, device=center.device).reshape(-1)
        if ls.numel() not in (1, self.dim) or not bool(torch.isfinite(ls).all()) or bool((ls <= 0).any()):
            raise InputDataError(f"lengthscale: expected 1 or {self.dim} positive values, got {ls.tolist()}")
        return center, ls.expand(self.dim)
