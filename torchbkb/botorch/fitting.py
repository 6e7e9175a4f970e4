"""How ``fit_gpytorch_mll`` fits a :class:`~torchbkb.botorch.BKBModel`: the evidence bound maximized with the
dictionary fixed, then the dictionary re-drawn by BKB's variance sampling at the new hyperparameters, in rounds.

The bound depends on the dictionary, and the dictionary (drawn with probabilities ``q̄·σ̃²``) on the
hyperparameters, so neither can be fixed first. Round ``r`` runs L-BFGS-B (BoTorch's ``fit_gpytorch_mll_scipy``)
on the bound over dictionary ``S_r``, then draws ``S_{r+1}`` at the fitted hyperparameters (``S_1`` is drawn
after a warm start: the exact GP fitted on :data:`WARM_START` of the points). It stops when the
new dictionary changes the bound by less than :data:`STABLE_TOL` per training point (the next round would start
where this one ended), or after :data:`MAX_ROUNDS` rounds: a model whose hyperparameters start at
``SingleTaskGP``'s prior modes takes two or three (docs/botorch_scale.md).

Example:
    >>> import torch
    >>> from botorch.fit import fit_gpytorch_mll
    >>> from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
    >>> X = torch.rand(80, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> model = BKBModel(X, torch.cos(5 * X[:, :1]), seed=0)
    >>> _ = fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    >>> 1 <= model.fit_rounds <= MAX_ROUNDS
    True
"""

from __future__ import annotations

import warnings

import torch
from botorch.exceptions.warnings import OptimizationWarning
from botorch.optim.fit import fit_gpytorch_mll_scipy

from torchbkb.botorch.marginal_likelihood import DTCMarginalLogLikelihood
from torchbkb.errors import InputDataError

__all__ = ["fit_rounds", "MAX_ROUNDS", "STABLE_TOL", "WARM_START"]

#: At most this many rounds of (fit, re-draw the dictionary).
MAX_ROUNDS = 3
#: Stop when re-drawing the dictionary moves the bound by less than this, per training point.
STABLE_TOL = 1e-3
#: Past this many training points the rounds start from a fit of the exact GP on this many of them, drawn at
#: random: at ``SingleTaskGP``'s prior modes (noise ≈ 0.007) the first dictionary would hold most of the data.
WARM_START = 500


def fit_rounds(model, mll, closure=None, optimizer=None, closure_kwargs=None, optimizer_kwargs=None, max_rounds: int = MAX_ROUNDS, **kwargs):
    """Fit ``model``'s hyperparameters by maximizing ``mll`` (a :class:`~torchbkb.botorch.DTCMarginalLogLikelihood`
    of ``model``) in rounds; ``model.fit_rounds`` records how many ran.

    Args:
        model: the :class:`~torchbkb.botorch.BKBModel`.
        mll: ``DTCMarginalLogLikelihood(model.likelihood, model)``.
        closure, closure_kwargs: as in ``fit_gpytorch_mll`` (default: the negated bound and its gradients).
        optimizer: a BoTorch fit routine ``(mll, closure=..., closure_kwargs=..., **optimizer_kwargs)``; default
            ``fit_gpytorch_mll_scipy`` (L-BFGS-B).
        optimizer_kwargs: passed to ``optimizer``.
        max_rounds: the largest number of rounds.

    Returns:
        ``mll`` in eval mode, the model's posterior rebuilt at the fitted hyperparameters.
    """
    if not isinstance(mll, DTCMarginalLogLikelihood) or mll.model is not model:
        raise InputDataError(
            f"mll: expected DTCMarginalLogLikelihood(model.likelihood, model) for this BKBModel, got {type(mll).__name__}"
        )
    if int(max_rounds) < 1:
        raise InputDataError(f"max_rounds: expected an integer >= 1, got {max_rounds!r}")
    optimizer = fit_gpytorch_mll_scipy if optimizer is None else optimizer
    rounds = 0
    if not any(p.requires_grad for p in mll.parameters()):
        model.fit_rounds = 0  # nothing to learn (fixed noise and a kernel without parameters)
        return mll.eval()
    n = model.train_inputs[0].shape[-2]
    if n > WARM_START and closure is None:
        gen = torch.Generator().manual_seed(0 if model.seed is None else model.seed)
        idx = torch.randperm(n, generator=gen)[:WARM_START].to(model.train_inputs[0].device)
        mll.train()
        optimizer(mll, closure_kwargs={**(closure_kwargs or {}), "indices": idx}, **(optimizer_kwargs or {}))
    for rounds in range(1, int(max_rounds) + 1):
        mll.train()
        result = optimizer(mll, closure=closure, closure_kwargs=closure_kwargs, **(optimizer_kwargs or {}))
        status = getattr(result, "status", None)
        if status is not None and getattr(status, "name", "") == "FAILURE":
            warnings.warn(f"BKBModel fit, round {rounds}: the optimizer failed ({getattr(result, 'message', '')})", OptimizationWarning, stacklevel=3)
        with torch.no_grad():
            fitted = float(mll())  # on the dictionary the fit used (train mode: no rebuild)
            mll.eval()
            redrawn = float(mll())  # eval mode: the posterior is rebuilt and the dictionary re-drawn
        if abs(redrawn - fitted) < STABLE_TOL:
            break
    model.fit_rounds = rounds
    return mll.eval()
