"""The checks a saved bandit state passes before :meth:`Bandit.load_state_dict` applies any of it.

A checkpoint may be truncated, hand-edited or written by another version: every field the base class
reads is checked for presence, type, shape and value here, so that loading fails before the bandit is
touched (the algorithm's own part is guarded by a rollback in ``load_state_dict``).

Example:
    >>> import torch
    >>> from torchbkb.bandits.baselines import Random
    >>> state = Random(torch.rand(5, 1), seed=0).state_dict()
    >>> check_saved_state(state, 5)
    >>> del state["counts"]
    >>> try:
    ...     check_saved_state(state, 5)
    ... except Exception as e:
    ...     print(type(e).__name__, e)
    CheckpointError state: expected a field 'counts', got none
"""

from __future__ import annotations

from typing import Any

import torch

from torchbkb.errors import CheckpointError

__all__ = ["check_saved_state", "check_algorithm_state"]

_FIELDS = ("generator", "counts", "reward_sums", "t", "batch_id", "history", "pending", "told", "algorithm")
#: algorithm fields that are lists of arm indices
_ARM_LISTS = ("nonfinite_arms",)


def check_saved_state(state: dict[str, Any], num_arms: int) -> None:
    """Raise :class:`~torchbkb.errors.CheckpointError` unless ``state`` is a well-formed base-class state
    over ``num_arms`` arms (counts consistent with the history, indices in range, finite rewards)."""
    for name in _FIELDS:
        if name not in state:
            raise CheckpointError(f"state: expected a field {name!r}, got none")
    gen = state["generator"]
    if not isinstance(gen, torch.Tensor) or gen.dtype != torch.uint8 or gen.dim() != 1:
        raise CheckpointError(f"state: expected a generator state (a uint8 tensor), got {_describe(gen)}")
    counts, sums = state["counts"], state["reward_sums"]
    if not isinstance(counts, torch.Tensor) or counts.dtype != torch.long or counts.shape != (num_arms,):
        raise CheckpointError(f"state: expected counts of dtype int64 and shape ({num_arms},), got {_describe(counts)}")
    if not isinstance(sums, torch.Tensor) or sums.dtype != torch.float64 or sums.shape != (num_arms,):
        raise CheckpointError(f"state: expected reward_sums of dtype float64 and shape ({num_arms},), got "
                              f"{_describe(sums)}")
    if bool((counts < 0).any()) or not bool(torch.isfinite(sums).all()):
        raise CheckpointError("state: expected non-negative counts and finite reward sums, got negative counts or "
                              "NaN/inf sums")
    t, batch_id = state["t"], state["batch_id"]
    if not _is_int(t) or not _is_int(batch_id) or t < 0 or batch_id < 0:
        raise CheckpointError(f"state: expected integers t >= 0 and batch_id >= 0, got t={t!r}, batch_id={batch_id!r}")
    if int(counts.sum()) != t:
        raise CheckpointError(f"state: expected counts summing to t={t}, got {int(counts.sum())}")
    hist = state["history"]
    if not isinstance(hist, dict) or any(not isinstance(hist.get(k), list) for k in ("index", "reward", "batch")):
        raise CheckpointError("state: expected a history with lists 'index', 'reward', 'batch', got something else")
    if not len(hist["index"]) == len(hist["reward"]) == len(hist["batch"]) == t:
        raise CheckpointError(f"state: expected {t} history entries, got "
                              f"{len(hist['index'])}/{len(hist['reward'])}/{len(hist['batch'])}")
    _check_arms(hist["index"], num_arms, "history index")
    pending = state["pending"]
    if not isinstance(pending, list):
        raise CheckpointError(f"state: expected a list of pending arms, got {_describe(pending)}")
    _check_arms(pending, num_arms, "pending")
    told = state["told"]
    if (not isinstance(told, (list, tuple)) or len(told) != 2 or not all(isinstance(x, list) for x in told)
        or len(told[0]) != len(told[1])):
        raise CheckpointError("state: expected 'told' as two lists of equal length (indices, rewards), got something "
                              "else")
    _check_arms(told[0], num_arms, "told")
    excluded = state.get("excluded")
    if (excluded is not None
        and (not isinstance(excluded, torch.Tensor) or excluded.dtype != torch.bool or excluded.shape != (num_arms,))):
        raise CheckpointError(f"state: expected excluded of dtype bool and shape ({num_arms},), got "
                              f"{_describe(excluded)}")
    reasons = state.get("exclusions")
    if reasons is not None and not isinstance(reasons, dict):
        raise CheckpointError(f"state: expected exclusions as a dict arm -> reason, got {_describe(reasons)}")
    if not isinstance(state["algorithm"], dict):
        raise CheckpointError(f"state: expected the algorithm's state as a dict, got {_describe(state['algorithm'])}")


def check_algorithm_state(saved: dict[str, Any], reference: dict[str, Any], num_arms: int, *,
                          nan_fields: tuple[str, ...] = ()) -> None:
    """Raise :class:`~torchbkb.errors.CheckpointError` unless every field of the algorithm's saved state that the
    ``reference`` (the same bandit's own current state) has is of the same kind: a tensor of the same dtype --
    floating and boolean per-arm tensors of length ``num_arms``, integer (index) tensors within ``[0, num_arms)``,
    floating tensors without NaN but in ``nan_fields`` (NaN marking values not computed) -- a list,
    a number or a string. A field the reference holds as ``None`` (or that can be ``None``) may be either;
    a field missing from ``saved`` is left to the algorithm (older checkpoints lack some)."""
    for key, ref in reference.items():
        if key not in saved:
            continue
        got = saved[key]
        if got is None or ref is None:
            if got is not None and not isinstance(got, (torch.Tensor, list, tuple, int, float, str)):
                raise CheckpointError(f"state: expected algorithm field {key!r} as None or data, got {_describe(got)}")
            continue
        if isinstance(ref, torch.Tensor):
            if not isinstance(got, torch.Tensor) or got.dtype != ref.dtype or got.dim() != ref.dim():
                raise CheckpointError(f"state: expected algorithm field {key!r} as a {ref.dtype} tensor of {ref.dim()} "
                                      f"dims, got {_describe(got)}")
            if ref.dim() and not ref.dtype == torch.long and ref.shape[0] == num_arms and got.shape[0] != num_arms:
                raise CheckpointError(f"state: expected algorithm field {key!r} of length {num_arms} (one entry per "
                                      f"arm), got {_describe(got)}")
            if got.is_floating_point() and key not in nan_fields and bool(got.isnan().any()):
                raise CheckpointError(f"state: expected algorithm field {key!r} without NaN, got "
                                      f"{int(got.isnan().sum())} NaN entries")
            if got.dtype == torch.long and got.numel() and (int(got.min()) < 0 or int(got.max()) >= num_arms):
                raise CheckpointError(f"state: expected arm indices in [0, {num_arms}) in algorithm field {key!r}, got "
                                      f"values in [{int(got.min())}, {int(got.max())}]")
        elif (isinstance(ref, bool) != isinstance(got, bool)
              or (isinstance(ref, (int, float)) and not isinstance(got, (int, float)))):
            raise CheckpointError(f"state: expected algorithm field {key!r} as a {type(ref).__name__}, got "
                                  f"{_describe(got)}")
        elif (isinstance(ref, (list, tuple, dict, str))
              and not isinstance(got, type(ref) if not isinstance(ref, (list, tuple)) else (list, tuple))):
            raise CheckpointError(f"state: expected algorithm field {key!r} as a {type(ref).__name__}, got "
                                  f"{_describe(got)}")
        if key in _ARM_LISTS:
            _check_arms(list(got), num_arms, f"algorithm field {key!r}:")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_arms(values: list, num_arms: int, name: str) -> None:
    bad = [v for v in values if not _is_int(v) or not 0 <= v < num_arms]
    if bad:
        raise CheckpointError(f"state: expected {name} arm indices in [0, {num_arms}), got {bad[:5]}")


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
