"""The collapsed (Titsias) evidence bound of a :class:`~torchbkb.botorch.BKBModel`'s DTC posterior as a GPyTorch
marginal log likelihood, so that BoTorch's ``fit_gpytorch_mll`` learns the model's hyperparameters at
``O(n·m²)`` (the bound itself: :func:`torchbkb.gp.evidence_bound.dtc_evidence_bound`).

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
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from torchbkb.errors import InputDataError, NumericsError
from torchbkb.gp.evidence_bound import dtc_evidence_bound, exact_evidence
from torchbkb.utils.host_copy import check_at_once

__all__ = ["DTCMarginalLogLikelihood", "training_noise", "BoundNanError", "BoundNotPSDError"]


class BoundNanError(NumericsError, NanError):
    """The bound met NaN/inf (a hyperparameter out of range): BoTorch's closure reads it as a NaN loss, so L-BFGS's
    line search backs off, as it does for ``SingleTaskGP``."""


class BoundNotPSDError(NumericsError, NotPSDError):
    """A matrix of the bound is not positive definite even with jitter: BoTorch's fit retries the attempt from a
    draw of the priors, as it does for ``SingleTaskGP``."""


def training_noise(model) -> Tensor:
    """`(*batch, n)` the noise variance of each of ``model``'s training points, read live from its likelihood (the
    learned noise, differentiable in the likelihood's parameters), or the known noise of ``train_Yvar``."""
    X = model.train_inputs[0]
    noise = model.likelihood.noise  # (*batch, 1) learned, or (*batch, n) known
    if noise.shape[-1] == 1:
        return noise.expand(*torch.broadcast_shapes(noise.shape[:-1], X.shape[:-2]), X.shape[-2])
    return model.train_noise


class DTCMarginalLogLikelihood(Module):
    """The evidence bound of a :class:`~torchbkb.botorch.BKBModel` per training point, plus its priors' log
    densities -- the scale of GPyTorch's ``ExactMarginalLogLikelihood``, which it equals (float64) when the
    model's dictionary holds every training point, and when the model computes the exact GP (``is_exact``).

    ``fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))`` fits the model's kernel, noise and
    constant mean (:meth:`BKBModel.custom_fit <torchbkb.botorch.BKBModel.custom_fit>`): L-BFGS on the bound with
    the dictionary fixed, then the dictionary re-drawn with the new hyperparameters, a few rounds. A batched
    model (one set of hyperparameters per batch) gets one exact evidence per batch, as ``ExactMarginalLogLikelihood``.

    Args:
        likelihood: ``model.likelihood``.
        model: a single-output :class:`~torchbkb.botorch.BKBModel`.

    Calling it (``mll()``, or ``mll(output, target)`` as GPyTorch's MLLs are called in a training loop: both
    arguments are ignored, the bound is always on the model's data) returns a `(*batch)` tensor, differentiable in
    every hyperparameter; the dictionary is the one of the model's last posterior (fixed during the call, not
    re-drawn at each step of a loop). Numerical failures raise :class:`BoundNanError` / :class:`BoundNotPSDError`,
    which BoTorch's fit handles as it handles ``SingleTaskGP``'s.

    Attributes:
        evaluations: how many times it has been called (a fit's cost in evaluations of the bound or evidence).
    """

    def __init__(self, likelihood, model) -> None:
        if not (isinstance(model, Model) and hasattr(type(model), "engine") and hasattr(type(model), "last_engine")):
            raise InputDataError(f"model: expected a BKBModel, got {type(model).__name__}")
        if likelihood is not model.likelihood:
            raise InputDataError("likelihood: expected model.likelihood (the bound uses the model's own noise)")
        super().__init__()
        self.likelihood = likelihood
        self.model = model
        self.evaluations = 0

    def forward(self, *args, indices: Tensor | None = None, inducing_points: Tensor | None = None, **kwargs) -> Tensor:
        """`(*batch)` the bound per training point plus the priors' log densities per training point; with
        ``indices`` `(k,)`, the exact evidence of those training points instead (the fit's warm start); with
        ``inducing_points`` `(k, d)` (transformed space), the bound over them instead of the model's dictionary
        (of the points ``indices`` when both are given: a fitting round on a subset)."""
        self.evaluations += 1
        model = self.model
        X, y = model.train_inputs[0], model.train_targets
        n, noise = X.shape[-2], training_noise(model)
        if indices is not None:
            X, y, noise, n = X[..., indices, :], y[..., indices], noise[..., indices], int(indices.shape[0])
        resid = y - model.mean_module(X)
        flags = {"mean": torch.isfinite(resid).all(), "noise": torch.isfinite(noise).all(),
                 "positive": (noise > 0).all()}
        check_at_once(flags, _bad_mean_or_noise)  # one read an evaluation
        try:
            if inducing_points is not None and X.dim() == 2:
                bound = dtc_evidence_bound(model.covar_module, X, resid, noise, inducing_points)
            elif X.dim() > 2 or indices is not None or (engine := model.last_engine()).is_exact:
                bound = exact_evidence(model.covar_module, X, resid, noise)  # batched, or the exact GP's evidence
            else:
                bound = dtc_evidence_bound(model.covar_module, X, resid, noise, engine.dictionary)
        except NumericsError as err:
            raise (BoundNanError if err.nonfinite else BoundNotPSDError)(str(err)) from err
        batch = X.shape[:-2]
        for _, module, prior, closure, _ in Module.named_priors(model):  # the model's priors, once each (as GPyTorch)
            log_prob = prior.log_prob(closure(module))
            if batch and log_prob.shape[: len(batch)] == batch:  # each batch's own hyperparameters' prior
                bound = bound + log_prob.reshape(*batch, -1).sum(-1)
            else:
                bound = bound + log_prob.sum()
        return bound / n

    def compute_custom_loss(self, **kwargs) -> Tensor:
        """BoTorch's loss closure hook (``get_loss_closure``): the negated bound."""
        return -self(**kwargs)


def _bad_mean_or_noise() -> None:
    """The error of an evaluation whose mean or noise failed the checks (the fit backs off from it)."""
    raise BoundNanError("DTCMarginalLogLikelihood: expected a finite mean and positive noise, got NaN/inf/<= 0")
