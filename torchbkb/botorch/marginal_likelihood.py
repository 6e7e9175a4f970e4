"""The collapsed (Titsias) evidence bound of a :class:`~torchbkb.botorch.BKBModel`'s DTC posterior as a GPyTorch
marginal log likelihood, so that BoTorch's ``fit_gpytorch_mll`` learns the model's hyperparameters at
``O(n·m²)`` (the bound itself: :func:`torchbkb.evidence_bound.dtc_evidence_bound`).

Example:
    >>> import torch
    >>> from botorch.fit import fit_gpytorch_mll
    >>> from torchbkb.botorch import BKBModel
    >>> X = torch.rand(60, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> model = BKBModel(X, torch.sin(6 * X[:, :1]), seed=0)
    >>> mll = fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    >>> bool(model.likelihood.noise < 0.01), mll.training
    (True, False)
"""

from __future__ import annotations

import torch
from botorch.models.model import Model
from gpytorch.module import Module
from torch import Tensor

from torchbkb.errors import InputDataError
from torchbkb.evidence_bound import dtc_evidence_bound, exact_evidence

__all__ = ["DTCMarginalLogLikelihood", "training_noise"]


def training_noise(model) -> Tensor:
    """`(n,)` the noise variance of each of ``model``'s training points, read live from its likelihood (the
    learned noise, or the known noise of ``train_Yvar``): differentiable in the likelihood's parameters."""
    n = model.train_inputs[0].shape[-2]
    noise = model.likelihood.noise.reshape(-1)
    return noise.expand(n) if noise.numel() == 1 else (noise if noise.numel() == n else model.train_noise)


class DTCMarginalLogLikelihood(Module):
    """The evidence bound of a :class:`~torchbkb.botorch.BKBModel` per training point, plus its priors' log
    densities -- the scale of GPyTorch's ``ExactMarginalLogLikelihood``, which it equals (float64) when the
    model's dictionary holds every training point, and when the model computes the exact GP (``is_exact``).

    ``fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))`` fits the model's kernel, noise and
    constant mean (:meth:`BKBModel.custom_fit <torchbkb.botorch.BKBModel.custom_fit>`): L-BFGS on the bound with
    the dictionary fixed, then the dictionary re-drawn with the new hyperparameters, a few rounds.

    Args:
        likelihood: ``model.likelihood``.
        model: a single-output, unbatched :class:`~torchbkb.botorch.BKBModel` (the bound is on its own data).

    Calling it (``mll()``, or ``mll(output, target)`` as GPyTorch's MLLs are called: both arguments are
    ignored, the bound is always on the model's data) returns a `()` tensor, differentiable in every
    hyperparameter; the model's dictionary is fixed during the call.
    """

    def __init__(self, likelihood, model) -> None:
        if not (isinstance(model, Model) and hasattr(type(model), "engine") and hasattr(type(model), "inducing_points")):  # never builds it
            raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
        if likelihood is not model.likelihood:
            raise InputDataError("likelihood: expected model.likelihood (the bound is computed with the model's own noise)")
        if model.batch_shape != torch.Size():
            raise InputDataError(f"model: expected an unbatched model (one dictionary), got batch_shape {tuple(model.batch_shape)}")
        super().__init__()
        self.likelihood = likelihood
        self.model = model

    def forward(self, *args, indices: Tensor | None = None, inducing_points: Tensor | None = None, **kwargs) -> Tensor:
        """`()` the bound per training point plus the priors' log densities per training point; with ``indices``
        `(k,)`, the exact evidence of those training points instead (the fit's warm start); with
        ``inducing_points`` `(k, d)` (transformed space), the bound over them instead of the model's dictionary
        (of the points ``indices`` when both are given: a fitting round on a subset)."""
        model = self.model
        X, y = model.train_inputs[0], model.train_targets
        n, noise = X.shape[-2], training_noise(model)
        if indices is not None:
            X, y, noise, n = X[indices], y[indices], noise[indices], int(indices.shape[0])
        resid = y - model.mean_module(X)
        if inducing_points is not None:
            bound = dtc_evidence_bound(model.covar_module, X, resid, noise, inducing_points)
        elif indices is not None or model.is_exact:  # the posterior is the exact GP: so is its evidence
            bound = exact_evidence(model.covar_module, X, resid, noise)
        else:
            bound = dtc_evidence_bound(model.covar_module, X, resid, noise, model.inducing_points)
        for _, module, prior, closure, _ in Module.named_priors(model):  # the model's priors, once each (as GPyTorch)
            bound = bound + prior.log_prob(closure(module)).sum()
        return bound / n

    def compute_custom_loss(self, **kwargs) -> Tensor:
        """BoTorch's loss closure hook (``get_loss_closure``): the negated bound."""
        return -self(**kwargs)
