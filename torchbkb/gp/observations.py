"""Validation of weighted observations ``(X, y, counts)`` before a posterior conditions on them.

Example:
    >>> import torch
    >>> from torchbkb import NystromEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> emb = NystromEmbedding(GaussianKernel(0.5), torch.rand(3, 2, dtype=torch.float64))
    >>> X = torch.rand(4, 2, dtype=torch.float64)
    >>> check_weighted_data(emb, X, torch.zeros(4, dtype=torch.float64), None)[2].tolist()
    [1.0, 1.0, 1.0, 1.0]
    >>> check_weighted_data(emb, X, torch.zeros(3, dtype=torch.float64), None)
    Traceback (most recent call last):
    ...
    torchbkb.errors.InputDataError: y: expected shape (4,) (matching X), got (3,)
"""

from __future__ import annotations

import torch

from torchbkb.errors import InputDataError, check_finite
from torchbkb.gp.functional import DTCState
from torchbkb.utils.host_copy import check_at_once

__all__ = ["check_dtc_state", "check_features", "check_targets", "check_values", "check_weighted_data"]


def check_weighted_data(emb, X, y, counts, xname: str = "X", yname: str = "y", *, allow_none_y: bool = False,
                        batch: tuple = ()):
    """Check ``X`` `(*b, n, d)` against the embedding ``emb``, ``y`` `(*b, n)` (finite, same dtype/device; ``None``
    only with ``allow_none_y``) and ``counts`` `(*b, n)` (positive, finite; default ones); with a training batch
    shape ``batch``, new points ``x`` must broadcast against it. Returns detached ``(X, y, counts)``, ``counts``
    in ``X``'s dtype; raises :class:`~torchbkb.errors.InputDataError` ("expected X, got Y") otherwise. Shapes,
    dtypes and devices are checked first, then the values in one host read (:func:`check_values`).
    """
    emb.check_input(X, xname, finite=False)
    given = counts is not None
    y, counts = check_targets(X, y, counts, yname, xname=xname, allow_none_y=allow_none_y, finite=False)
    if tuple(batch) and X.shape[:-2] != batch and xname == "x":
        try:
            torch.broadcast_shapes(X.shape[:-2], batch)
        except RuntimeError:
            raise InputDataError(
                f"{xname}: expected batch shape broadcastable with {tuple(batch)}, got {tuple(X.shape[:-2])}"
            ) from None
    check_values(X, y, counts if given else None, xname, yname)
    return X.detach(), y, counts


def check_values(X: torch.Tensor, y: torch.Tensor | None, counts: torch.Tensor | None, xname: str = "X",
                 yname: str = "y") -> None:
    """``X``, ``y`` and ``counts`` (``y`` and ``counts`` may be ``None``: not checked) finite and ``counts`` positive,
    read in one host transfer when they share a device (a GPU waits once, not once a check); raises the
    :class:`~torchbkb.errors.InputDataError` of the first check that fails, in that order.

    Example:
        >>> check_values(torch.zeros(2, 1), torch.zeros(2), torch.tensor([1.0, 0.0]))
        Traceback (most recent call last):
        ...
        torchbkb.errors.InputDataError: counts: expected positive weights, got min 0.0
    """
    values = [t.detach() for t in (X, y, counts) if t is not None]
    flags = {f"finite {i}": torch.isfinite(t).all() for i, t in enumerate(values)}
    if counts is not None:
        flags["positive"] = (values[-1] > 0).all()

    def one_at_a_time() -> None:  # the message of the first check that fails
        check_finite(X.detach(), xname)
        if y is not None:
            check_finite(y.detach(), yname)
        if counts is not None:
            check_finite(counts.detach(), "counts")
            if bool((counts.detach() <= 0).any()):
                raise InputDataError(f"counts: expected positive weights, got min {float(counts.detach().min())}")

    check_at_once(flags, one_at_a_time)


def check_targets(X, y, counts, yname: str = "y", *, xname: str = "X", allow_none_y: bool = False,
                  finite: bool = True):
    """Check observations ``y`` `(*b, n)` and weights ``counts`` `(*b, n)` against checked inputs ``X`` `(*b, n, d)`:
    the same leading shape, ``X``'s device, ``y`` in ``X``'s dtype, all finite, counts positive (default ones;
    ``finite=False``: all but the values, which the caller checks). Returns detached ``(y, counts)``, ``counts`` in
    ``X``'s dtype; raises :class:`~torchbkb.errors.InputDataError`.
    """
    shape = X.shape[:-1]
    if y is None and not allow_none_y:
        raise InputDataError(f"{yname}: expected a tensor of shape {tuple(shape)}, got None")
    if y is not None:
        if not isinstance(y, torch.Tensor):
            raise InputDataError(f"{yname}: expected a torch.Tensor of shape {tuple(shape)}, got {type(y).__name__}")
        if y.shape != shape:
            raise InputDataError(f"{yname}: expected shape {tuple(shape)} (matching {xname}), got {tuple(y.shape)}")
        if y.dtype != X.dtype or y.device != X.device:
            raise InputDataError(f"{yname}: expected dtype {X.dtype} on {X.device}, got {y.dtype} on {y.device}")
        if finite:
            check_finite(y, yname)
    if counts is None:
        counts = torch.ones(shape, dtype=X.dtype, device=X.device)
    else:
        if not isinstance(counts, torch.Tensor) or counts.shape != shape:
            got = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
            raise InputDataError(f"counts: expected shape {tuple(shape)}, got {got}")
        if counts.device != X.device:
            raise InputDataError(f"counts: expected device {X.device}, got {counts.device}")
        counts = counts.to(X.dtype)
        if finite:
            check_finite(counts, "counts")
            if bool((counts <= 0).any()):
                raise InputDataError(f"counts: expected positive weights, got min {float(counts.min())}")
    return (None if y is None else y.detach()), counts.detach()


def check_features(Z, y, counts, rank: int) -> torch.Tensor:
    """Check embedded points before a rank-one update: ``Z`` `(*b, k, r)` (or `(r,)`) floating and finite with
    ``r == rank``; ``y`` ``None`` or finite with ``k`` trailing entries; ``counts`` ``None`` or positive and finite.
    Returns ``Z`` as `(*b, k, r)`; raises :class:`~torchbkb.errors.InputDataError` ("expected X, got Y"). The values
    are checked in one host read when the tensors share a device (a GPU waits once, not four times).

    Example:
        >>> check_features(torch.ones(2, 3), None, None, rank=4)
        Traceback (most recent call last):
        ...
        torchbkb.errors.InputDataError: Z: expected features of shape (*b, k, 4), got (2, 3)
    """
    if not isinstance(Z, torch.Tensor) or not Z.is_floating_point():
        raise InputDataError(f"Z: expected a floating tensor of shape (*b, k, {rank}), got {type(Z).__name__}")
    if Z.dim() == 1:
        Z = Z.unsqueeze(0)  # (1, r)
    if Z.shape[-1] != rank:
        raise InputDataError(f"Z: expected features of shape (*b, k, {rank}), got {tuple(Z.shape)}")
    for name, t in (("y", y), ("counts", counts)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[-1] != Z.shape[-2]):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputDataError(f"{name}: expected shape (*b, {Z.shape[-2]}) matching Z, got {got}")
    check_values(Z, y, counts, "Z", "y")
    return Z


def check_dtc_state(state, batch: torch.Size, rank: int, m: int, dtype: torch.dtype, device: torch.device) -> None:
    """Check a :class:`~torchbkb.gp.functional.DTCState` for a posterior of batch shape ``batch``, feature rank
    ``rank`` and ``m`` inducing points: every part of its shape, ``dtype`` and ``device``, and finite (one host read);
    raises :class:`~torchbkb.errors.InputDataError` ("expected X, got Y") otherwise."""
    if not isinstance(state, DTCState):
        raise InputDataError(f"state: expected a DTCState, got {type(state).__name__}")
    b = tuple(batch)
    shapes = {"M": (*b, m, m), "a": (*b, m), "V_inv": (*b, rank, rank), "weights": (*b, rank), "ZtZ": (*b, rank, rank),
              "Zty": (*b, rank)}
    for name, want in shapes.items():
        t = getattr(state, name)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != dtype or t.device != device:
            got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise InputDataError(f"state.{name}: expected shape {want}, {dtype} on {device}, got {got}")
    if not bool(torch.stack([torch.isfinite(t).all() for t in state]).all()):
        raise InputDataError("state: expected finite values, got NaN or inf")
