"""Validation of the data a :class:`~torchbkb.botorch.BKBModel` is built or conditioned on.

Each check raises :class:`~torchbkb.errors.InputDataError` with "expected X, got Y" before anything is stored.

Example:
    >>> import torch
    >>> X = torch.rand(5, 2, dtype=torch.float64)
    >>> check_train_data(X, torch.zeros(5, 1, dtype=torch.float64))
    >>> check_train_Yvar(torch.full((5, 1), -1.0, dtype=torch.float64), X, "train_Yvar")
    Traceback (most recent call last):
    ...
    torchbkb.errors.InputDataError: train_Yvar: expected non-negative noise variances, got min -1.000e+00
"""

from __future__ import annotations

import torch
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, ZeroMean
from torch import Tensor

from torchbkb.errors import InputDataError, check_finite

__all__ = ["check_train_data", "check_train_Yvar", "check_query", "as_query", "check_observation_noise",
           "check_model_inputs", "check_observations", "check_candidates"]


def check_train_data(train_X, train_Y) -> None:
    """``train_X`` `(*batch, n >= 1, d)` floating and ``train_Y`` `(*batch, n, 1)` alike, both finite."""
    if not isinstance(train_X, Tensor) or train_X.dim() < 2 or not train_X.is_floating_point():
        got = f"{tuple(train_X.shape)} {train_X.dtype}" if isinstance(train_X, Tensor) else type(train_X).__name__
        raise InputDataError(f"train_X: expected a floating tensor of shape (*batch, n, d), got {got}")
    if not isinstance(train_Y, Tensor):
        raise InputDataError(f"train_Y: expected a torch.Tensor of shape (*batch, n, 1), got {type(train_Y).__name__}")
    if train_Y.dim() != train_X.dim() or train_Y.shape[:-1] != train_X.shape[:-1]:
        raise InputDataError(
            f"train_Y: expected shape {(*train_X.shape[:-1], 1)} (explicit output dimension, matching train_X), "
            f"got {tuple(train_Y.shape)}"
        )
    if train_Y.shape[-1] != 1:
        raise InputDataError(
            f"train_Y: expected one output column, shape {(*train_X.shape[:-1], 1)}, got {tuple(train_Y.shape)} "
            "(BKBModel is single-output; use a ModelListGP of BKBModels for several outcomes)"
        )
    if train_Y.dtype != train_X.dtype or train_Y.device != train_X.device:
        raise InputDataError(
            f"train_Y: expected dtype {train_X.dtype} on {train_X.device} (like train_X), got {train_Y.dtype} on "
            f"{train_Y.device}"
        )
    if train_X.shape[-2] < 1 or train_X.shape[-1] < 1:
        raise InputDataError(f"train_X: expected at least one training point of d >= 1 inputs, got shape "
                             f"{tuple(train_X.shape)}")
    check_finite(train_X, "train_X")
    check_finite(train_Y, "train_Y")


def check_train_Yvar(Yvar, X: Tensor, name: str) -> None:
    """Observation noise variances: a tensor of shape ``(*X.shape[:-1], 1)`` (batch dimensions may broadcast
    for conditioning), finite and non-negative, with ``X``'s dtype and device."""
    if not isinstance(Yvar, Tensor):
        raise InputDataError(f"{name}: expected a tensor of shape {(*X.shape[:-1], 1)}, got {type(Yvar).__name__}")
    if Yvar.dim() < 2 or Yvar.shape[-2:] != (X.shape[-2], 1):
        raise InputDataError(f"{name}: expected shape {(*X.shape[:-1], 1)} like the outcomes, got {tuple(Yvar.shape)}")
    try:
        torch.broadcast_shapes(Yvar.shape[:-2], X.shape[:-2])
    except RuntimeError:
        raise InputDataError(f"{name}: expected shape {(*X.shape[:-1], 1)} like the outcomes, got "
                             f"{tuple(Yvar.shape)}") from None
    if Yvar.dtype != X.dtype or Yvar.device != X.device:
        raise InputDataError(f"{name}: expected dtype {X.dtype} on {X.device}, got {Yvar.dtype} on {Yvar.device}")
    check_finite(Yvar, name)
    if bool((Yvar < 0).any()):
        raise InputDataError(f"{name}: expected non-negative noise variances, got min {float(Yvar.min()):.3e}")


def check_query(X, input_dim: int, ref: Tensor, name: str, batch_shape: torch.Size | None = None, *,
                finite: bool = True) -> None:
    """A query `(*batch, q, input_dim)` with ``ref``'s dtype and device, finite (unless ``finite=False``: a caller
    that reads it with its own checks), and a batch shape that broadcasts with ``batch_shape`` (if given)."""
    if not isinstance(X, Tensor):
        raise InputDataError(f"{name}: expected a torch.Tensor, got {type(X).__name__}")
    if X.dim() < 2 or X.shape[-1] != input_dim:
        raise InputDataError(f"{name}: expected shape (*batch, q, {input_dim}), got {tuple(X.shape)}")
    if X.dtype != ref.dtype or X.device != ref.device:
        raise InputDataError(
            f"{name}: expected dtype {ref.dtype} on {ref.device} (the model's; use model.to(X)), got "
            f"dtype {X.dtype} on {X.device}"
        )
    if finite:
        check_finite(X.detach(), name)
    if batch_shape is not None:
        try:
            torch.broadcast_shapes(X.shape[:-2], batch_shape)
        except RuntimeError:
            raise InputDataError(
                f"{name}: expected a batch shape broadcastable with the model's batch_shape {tuple(batch_shape)}, "
                f"got {name} of shape {tuple(X.shape)}"
            ) from None


def check_model_inputs(train_X, train_Y, train_Yvar, noise, kernel, covar_module, likelihood=None, mean_module=None):
    """The constructor's data (:func:`check_train_data`, ``train_Yvar`` like ``train_Y``), one noise source (``noise``,
    ``train_Yvar`` or a ``GaussianLikelihood``), one kernel (``covar_module`` is BoTorch's name for ``kernel``) and a
    constant mean; returns the kernel given (or None)."""
    check_train_data(train_X, train_Y)
    if train_Yvar is not None:
        check_train_Yvar(train_Yvar, train_X, "train_Yvar")
        if train_Yvar.shape != train_Y.shape:
            raise InputDataError(f"train_Yvar: expected shape {tuple(train_Y.shape)} like train_Y, got "
                                 f"{tuple(train_Yvar.shape)}")
        if noise is not None:
            raise InputDataError(f"noise: expected None when train_Yvar gives the noise, got {noise!r}")
    if likelihood is not None:
        if not isinstance(likelihood, GaussianLikelihood):
            raise InputDataError(f"likelihood: expected a gpytorch GaussianLikelihood (homoskedastic noise), got "
                                 f"{type(likelihood).__name__}")
        if noise is not None or train_Yvar is not None:
            raise InputDataError("likelihood: expected the noise from one source, got a likelihood with noise= or "
                                 "train_Yvar=")
    if mean_module is not None and not isinstance(mean_module, (ConstantMean, ZeroMean)):
        raise InputDataError(f"mean_module: expected a ConstantMean or ZeroMean (a constant prior mean), got "
                             f"{type(mean_module).__name__}")
    if kernel is not None and covar_module is not None:
        raise InputDataError("kernel, covar_module: expected one of the two (they name the same argument), got both")
    return kernel if kernel is not None else covar_module


def as_query(X, input_dim: int):
    """``X`` with a 1-d `(q,)` query of a one-input model read as `(q, 1)` (as ``SingleTaskGP`` reads it); any other
    value is returned as it is (for :func:`check_query`)."""
    if isinstance(X, Tensor) and X.dim() == 1 and input_dim == 1:
        return X.unsqueeze(-1)  # (q,) -> (q, 1)
    return X


def check_observation_noise(observation_noise, X: Tensor) -> None:
    """``posterior``'s ``observation_noise``: a bool, or a tensor of finite non-negative variances `(*b, q[, 1])`
    with ``X``'s dtype and device and ``q`` matching `(*b, q, d)` ``X``."""
    if isinstance(observation_noise, bool):
        return
    if not isinstance(observation_noise, Tensor):
        raise InputDataError(
            f"observation_noise: expected a bool or a tensor of noise variances, got "
            f"{type(observation_noise).__name__} {observation_noise!r}"
        )
    noise = observation_noise.detach()
    q = X.shape[-2]
    ok_shape = noise.dim() >= 1 and (noise.shape[-1] == q or (noise.dim() >= 2 and noise.shape[-2:] == (q, 1)))
    if not ok_shape:
        raise InputDataError(f"observation_noise: expected shape (*batch, {q}, 1) like the query, got "
                             f"{tuple(noise.shape)}")
    if not noise.is_floating_point() or noise.device != X.device:
        raise InputDataError(f"observation_noise: expected a floating tensor on {X.device}, got {noise.dtype} on "
                             f"{noise.device}")
    check_finite(noise, "observation_noise")
    if bool((noise < 0).any()):
        raise InputDataError(f"observation_noise: expected non-negative variances, got min {float(noise.min()):.3e}")


def check_observations(X: Tensor, Y, noise, batch_shape: torch.Size) -> torch.Size:
    """New observations at ``X``: ``Y`` `(*batch', n', 1)` finite, ``noise`` like it (positive) or None; returns
    the batch shape of the conditioned model (``X``'s, ``Y``'s, ``noise``'s and ``batch_shape`` broadcast)."""
    if not isinstance(Y, Tensor) or Y.dim() < 2 or Y.shape[-1] != 1 or Y.shape[-2] != X.shape[-2]:
        got = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
        raise InputDataError(f"Y: expected shape (*batch, {X.shape[-2]}, 1), got {got}")
    check_finite(Y.detach(), "Y")
    if noise is not None:
        check_train_Yvar(noise, X, "noise")
        if bool((noise <= 0).any()):
            raise InputDataError(f"noise: expected positive variances, got min {float(noise.min()):.3e}")
    try:
        return torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2], batch_shape,
                                      *(() if noise is None else (noise.shape[:-2],)))
    except RuntimeError:
        raise InputDataError(
            f"X, Y: expected batch shapes broadcastable with the model's {tuple(batch_shape)}, got "
            f"X {tuple(X.shape)} and Y {tuple(Y.shape)}"
        ) from None


def check_candidates(model, choices) -> None:
    """A model without batch dimensions and `(A >= 1, d)` candidates like its inputs (discrete selections)."""
    if model.batch_shape != torch.Size():
        raise InputDataError(f"model: expected a model without batch dimensions, got batch_shape "
                             f"{tuple(model.batch_shape)}")
    if not isinstance(choices, Tensor) or choices.dim() != 2 or choices.shape[0] < 1:
        got = tuple(choices.shape) if isinstance(choices, Tensor) else type(choices).__name__
        raise InputDataError(f"choices: expected shape (A >= 1, {model.input_dim}), got {got}")
    model.check_query(choices, "choices")
