"""Peers run side by side with torchbkb: the BoTorch exact-GP UCB loop a BoTorch user would write.

:class:`BoTorchUCB` is a :class:`torchbkb.bandits.base.Bandit`, so :func:`torchbkb.run` drives and times
it like any torchbkb algorithm. Each step does what a BoTorch user with fixed hyperparameters does::

    model = SingleTaskGP(train_X, train_Y, covar_module=ScaleKernel(RBFKernel()), outcome_transform=None)
    # lengthscale ℓ, outputscale 1, likelihood noise λ, constant mean 0 -- set, never fitted
    acqf = UpperConfidenceBound(model, beta=β̃² / λ)      # = μ + β̃ σ̃ with σ̃ on the RLS scale
    x, _ = optimize_acqf_discrete(acqf, q=1, choices=arms)

``mode="rebuild"`` (default) builds that model from all the data at every step (``O(t³)`` Cholesky plus
``O(A·t²)`` scoring, BoTorch's default settings, no custom caching); ``mode="condition"`` instead
extends the previous model with ``model.condition_on_observations`` (BoTorch's incremental path,
which reuses the cached Cholesky factor of the previous model).

BoTorch is imported with this module, so its import time is not charged to the peer's runs.
"""

from __future__ import annotations

import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf_discrete
from gpytorch.kernels import RBFKernel, ScaleKernel

from torchbkb.bandits.base import Bandit
from torchbkb.bandits.confidence import to_botorch_beta
from torchbkb.errors import InputDataError, check_positive

__all__ = ["BoTorchUCB"]


class BoTorchUCB(Bandit):
    """BoTorch ``SingleTaskGP`` + ``UpperConfidenceBound`` + ``optimize_acqf_discrete`` over all arms.

    Args:
        arms: `(A, d)`.
        lengthscale: RBF lengthscale ``ℓ`` (fixed).
        noise: ``λ``, the likelihood noise variance (fixed).
        beta: the constant width on torchbkb's RLS scale; BoTorch gets ``beta = β̃² / λ``.
        seed: generator seed (the first arm is uniform, as in the torchbkb bandits).
        mode: ``"rebuild"`` or ``"condition"`` (see the module docstring).
        max_batch_size: arms scored per call inside ``optimize_acqf_discrete``.
    """

    def __init__(
        self,
        arms: torch.Tensor,
        *,
        lengthscale: float,
        noise: float,
        beta: float,
        seed: int | None = None,
        mode: str = "rebuild",
        outputscale: float = 1.0,
        max_batch_size: int = 2048,
    ):
        super().__init__(arms, seed=seed)
        if mode not in ("rebuild", "condition"):
            raise InputDataError(f"mode: expected 'rebuild' or 'condition', got {mode!r}")
        self.lengthscale = check_positive(lengthscale, "lengthscale")
        self.lam = check_positive(noise, "noise")
        self.outputscale = check_positive(outputscale, "outputscale")
        self.beta_rls = float(beta)
        self.botorch_beta = to_botorch_beta(self.beta_rls, self.lam)
        self.mode = mode
        self.max_batch_size = int(max_batch_size)
        self._X: list[int] = []
        self._y: list[float] = []
        self._model = None

    def _build_model(self, X: torch.Tensor, Y: torch.Tensor):
        model = SingleTaskGP(X, Y, covar_module=ScaleKernel(RBFKernel()), outcome_transform=None)
        model.covar_module.base_kernel.lengthscale = self.lengthscale
        model.covar_module.outputscale = self.outputscale
        model.likelihood.noise = self.lam
        model.mean_module.constant.data.fill_(0.0)
        return model.eval()

    def _select(self) -> torch.Tensor:
        if self.t == 0:
            return torch.randint(0, self.num_arms, (1,), generator=self.generator).to(self.arms.device)
        acqf = UpperConfidenceBound(self._model, beta=self.botorch_beta)
        with torch.no_grad():
            cand, _ = optimize_acqf_discrete(acqf, q=1, choices=self.arms, max_batch_size=self.max_batch_size)
        hit = (self.arms == cand).all(-1).nonzero()  # (k, 1): rows equal to the candidate
        return hit[0].reshape(1)

    def _update(self) -> None:
        idx, y = self.last_told
        Xn = self.arms[idx]  # (k, d)
        Yn = y.to(self.arms.dtype).unsqueeze(-1)  # (k, 1)
        self._X.extend(idx.tolist())
        self._y.extend(y.tolist())
        with torch.no_grad():
            if self.mode == "condition" and self._model is not None:
                self._model = self._model.condition_on_observations(Xn, Yn)
            else:
                X = self.arms[torch.as_tensor(self._X, device=self.arms.device)]
                Y = torch.as_tensor(self._y, dtype=self.arms.dtype, device=self.arms.device).unsqueeze(-1)
                self._model = self._build_model(X, Y)
                if self.mode == "condition":  # populate the prediction caches that conditioning extends
                    self._model.posterior(self.arms[:1])
