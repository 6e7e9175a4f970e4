"""Loading a state dict all at once or not at all.

``nn.Module.load_state_dict`` copies every matching entry before it reports a missing key or a shape mismatch, so a
rejected state dict leaves a module half loaded. :func:`load_state_dict_atomically` checks everything first (keys,
types, shapes, finite values) and, should the copy itself still fail, puts the old values back: the module is then
exactly as it was, and the error says what was expected.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(2, 1)
    >>> before = layer.weight.detach().clone()
    >>> bad = {"weight": torch.zeros(1, 2), "bias": torch.zeros(3)}
    >>> try:
    ...     load_state_dict_atomically(layer, nn.Module.load_state_dict, bad)
    ... except ValueError as err:
    ...     print(err)
    state_dict['bias']: expected shape (1,), got (3,)
    >>> bool(torch.equal(layer.weight, before))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from torchbkb.errors import InputDataError
from torchbkb.utils.host_copy import check_at_once

__all__ = ["check_state_dict", "load_state_dict_atomically"]


def check_state_dict(module: nn.Module, state_dict, strict: bool = True) -> None:
    """Raise :class:`~torchbkb.errors.InputDataError` unless ``module.load_state_dict(state_dict, strict)`` can copy
    every entry: a mapping of tensors, each of the module's shape, floating where the module's entry is floating,
    without NaN (nor ±inf for a parameter); with ``strict``, the same keys as ``module.state_dict()``."""
    if not isinstance(state_dict, Mapping):
        raise InputDataError(f"state_dict: expected a mapping of names to tensors, got {type(state_dict).__name__}")
    own = module.state_dict(keep_vars=True)
    params = {name for name, _ in module.named_parameters()}
    if strict:
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise InputDataError(
                f"state_dict: expected the keys of this {type(module).__name__}, got {len(missing)} missing "
                f"{missing[:5]} and {len(unexpected)} unexpected {unexpected[:5]}"
            )
    floating = {}
    for key, value in state_dict.items():
        if key not in own or not isinstance(own[key], torch.Tensor):
            continue
        target = own[key]
        if not isinstance(value, torch.Tensor):
            raise InputDataError(f"state_dict[{key!r}]: expected a tensor, got {type(value).__name__}")
        if value.shape != target.shape:
            raise InputDataError(f"state_dict[{key!r}]: expected shape {tuple(target.shape)}, got {tuple(value.shape)}")
        if target.is_floating_point():
            if not value.is_floating_point():
                raise InputDataError(f"state_dict[{key!r}]: expected a floating tensor, got {value.dtype}")
            floating[key] = value.detach()

    def usable(key: str, v: torch.Tensor) -> torch.Tensor:  # parameters finite; buffers may hold ±inf, never NaN
        return torch.isfinite(v).all() if key in params else ~torch.isnan(v).any()

    def one_at_a_time() -> None:
        for key, v in floating.items():
            if not bool(usable(key, v)):
                raise InputDataError(f"state_dict[{key!r}]: expected finite values, got NaN/inf")

    check_at_once({key: usable(key, v) for key, v in floating.items()}, one_at_a_time)  # one read for every value


def load_state_dict_atomically(module: nn.Module, loader: Callable, state_dict, strict: bool = True, **kwargs):
    """``loader(module, state_dict, strict=strict, **kwargs)`` (a ``load_state_dict`` implementation) after
    :func:`check_state_dict`; if the copy still raises, the previous values are restored and an
    :class:`~torchbkb.errors.InputDataError` says why. Returns what ``loader`` returns."""
    check_state_dict(module, state_dict, strict)
    own = module.state_dict(keep_vars=True)
    backup = {k: v.detach().clone() for k, v in own.items() if isinstance(v, torch.Tensor)}
    try:
        return loader(module, state_dict, strict=strict, **kwargs)
    except Exception as err:
        nn.Module.load_state_dict(module, backup, strict=False)
        name = type(module).__name__
        raise InputDataError(f"state_dict: expected a state dict this {name} can load, got: {err}") from err
