"""What :meth:`BKBModel.from_model <torchbkb.botorch.BKBModel.from_model>` copies from a fitted BoTorch GP.

Example:
    >>> import torch
    >>> from botorch.models import SingleTaskGP
    >>> X = torch.rand(10, 2, dtype=torch.float64)
    >>> parts = gp_parts(SingleTaskGP(X, X.sum(-1, keepdim=True)), None)
    >>> parts["X_tf"].shape, type(parts["likelihood"]).__name__
    (torch.Size([10, 2]), 'GaussianLikelihood')
"""

from __future__ import annotations

import copy

import torch
from botorch.models.model import Model
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor, nn

from torchbkb.errors import InputDataError, check_finite

__all__ = ["gp_parts", "transform_inducing_points"]


def gp_parts(gp: Model, inducing_points: Tensor | None) -> dict:
    """Copies of the fitted kernel, likelihood and constant mean, the transformed training data and copies of the
    transforms of a single-output BoTorch ``ExactGP`` with a homoskedastic ``GaussianLikelihood`` (``gp`` is left
    unchanged).

    Returns:
        A dict with ``kernel``, ``likelihood``, ``mean_module``, ``X_tf`` `(n, d)`, ``y_tf`` `(n,)`,
        ``inducing_points`` (transformed, or None), ``input_dim``, ``input_transform``, ``outcome_transform``.
    """
    from gpytorch.means import ConstantMean, ZeroMean
    from gpytorch.models import ExactGP

    if not isinstance(gp, Model) or not isinstance(gp, ExactGP):
        raise InputDataError(f"gp: expected a BoTorch ExactGP model such as SingleTaskGP, got {type(gp).__name__}")
    if gp.num_outputs != 1:
        raise InputDataError(f"gp: expected a single-output model, got num_outputs={gp.num_outputs}")
    if gp.batch_shape != torch.Size():
        raise InputDataError(
            f"gp: expected a model without batch dimensions (one shared dictionary), got batch_shape "
            f"{tuple(gp.batch_shape)}"
        )
    lik = gp.likelihood
    if type(lik) is not GaussianLikelihood:
        raise InputDataError(
            f"gp.likelihood: expected a homoskedastic GaussianLikelihood, got {type(lik).__name__}"
        )
    mean_module = getattr(gp, "mean_module", None)
    if not isinstance(mean_module, (ConstantMean, ZeroMean)):
        raise InputDataError(
            f"gp.mean_module: expected ConstantMean or ZeroMean, got {type(mean_module).__name__}"
        )
    input_transform = getattr(gp, "input_transform", None)
    if gp._has_transformed_inputs:  # eval mode: train_inputs hold the transformed inputs
        X_orig = gp._original_train_inputs
        X_tf = gp.train_inputs[0]
    else:
        X_orig = gp.train_inputs[0]
        with torch.no_grad():
            X_tf = X_orig if input_transform is None else input_transform.preprocess_transform(X_orig)
    y_tf = gp.train_targets  # (n,) outcome-transformed
    it = None if input_transform is None else copy.deepcopy(input_transform).eval()
    ot = getattr(gp, "outcome_transform", None)
    ot = None if ot is None else copy.deepcopy(ot).eval()
    S_tf = None if inducing_points is None else transform_inducing_points(inducing_points, X_orig, it)

    return {
        "kernel": copy.deepcopy(gp.covar_module),
        "likelihood": copy.deepcopy(lik),
        "mean_module": copy.deepcopy(mean_module),
        "X_tf": X_tf.detach(),
        "y_tf": y_tf.detach(),
        "inducing_points": S_tf,
        "input_dim": X_orig.shape[-1],
        "input_transform": it,
        "outcome_transform": ot,
    }


def transform_inducing_points(inducing_points: Tensor, train_X: Tensor, input_transform: nn.Module | None) -> Tensor:
    """`(m, d)` inducing points checked and mapped through the input transform (in eval mode), detached."""
    if (not isinstance(inducing_points, Tensor) or inducing_points.dim() != 2
            or inducing_points.shape[-1] != train_X.shape[-1]):
        got = tuple(inducing_points.shape) if isinstance(inducing_points, Tensor) else type(inducing_points).__name__
        raise InputDataError(f"inducing_points: expected shape (m, {train_X.shape[-1]}), got {got}")
    if inducing_points.dtype != train_X.dtype or inducing_points.device != train_X.device:
        raise InputDataError(
            f"inducing_points: expected dtype {train_X.dtype} on {train_X.device}, got "
            f"{inducing_points.dtype} on {inducing_points.device}"
        )
    check_finite(inducing_points, "inducing_points")
    if input_transform is None:
        return inducing_points.detach()
    was_training = input_transform.training
    input_transform.eval()
    with torch.no_grad():
        S = input_transform(inducing_points)
    input_transform.train(was_training)
    return S.detach()
