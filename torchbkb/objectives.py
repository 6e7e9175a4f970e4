"""Objectives for :func:`torchbkb.run` and the check every objective result passes.

An objective is a callable ``objective(indices: LongTensor (k,)) -> rewards (k,)`` or a tensor of rewards
per arm. Two attributes tell the loop how to call it:

* ``vectorized = True``: one call may take a whole batch (else the loop calls it once per arm, so that a
  failure is the failure of one arm and a retry re-runs only that arm);
* ``evaluate_in_driver = True``: never send it to an executor's workers (:class:`ArmObjective`'s noise
  generator must not be copied).

:func:`check_rewards` accepts exactly one real reward per asked arm -- shape ``(k,)`` or ``(k, 1)`` (a
scalar for one arm), a real dtype -- and raises :class:`~torchbkb.errors.ObjectiveOutputError` naming the
arms for anything else; NaN/inf are returned as they are (the loop counts them as failed attempts of
those arms).

Example:
    >>> import torch
    >>> check_rewards(torch.tensor([[1.0], [2.0]]), [4, 7]).tolist()
    [1.0, 2.0]
    >>> try:
    ...     check_rewards(torch.ones(3), [4, 7])
    ... except Exception as e:
    ...     print(type(e).__name__)
    ObjectiveOutputError
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import torch

from torchbkb.errors import InputDataError, ObjectiveOutputError, check_finite
from torchbkb.utils.host_copy import to_device

__all__ = ["ArmObjective", "TensorObjective", "as_objective", "check_rewards", "check_values"]


class ArmObjective:
    """Noisy rewards ``f(x_i) + N(0, noise_std²)`` from noise-free values at the arms.

    Args:
        values: `(A,)` noise-free ``f`` at the arms (used for regret).
        noise_std: standard deviation of the reward noise.
        seed: seed of its own generator (its state is checkpointed with the run).

    It is evaluated in the driver even when :func:`torchbkb.run` has an executor (``evaluate_in_driver``):
    copies pickled to worker processes would all start from the same generator state and draw the same noise.

    Example:
        >>> import torch
        >>> obj = ArmObjective(torch.tensor([0.0, 1.0]), noise_std=0.0)
        >>> obj(torch.tensor([1, 0]))
        tensor([1., 0.])
    """

    #: :func:`torchbkb.run` calls it in the driver (its noise generator must not be copied to workers).
    evaluate_in_driver = True
    #: one call takes a whole batch.
    vectorized = True

    def __init__(self, values: torch.Tensor, noise_std: float = 0.0, seed: int | None = 0):
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or not values.is_floating_point():
            raise InputDataError(f"values: expected a floating tensor of shape (A,), got {values!r:.60}")
        check_finite(values, "values")
        if not float(noise_std) >= 0 or noise_std == float("inf"):
            raise InputDataError(f"noise_std: expected a finite noise_std >= 0, got {noise_std!r}")
        self.values = values
        self.noise_std = float(noise_std)
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else int(seed))

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        noise = torch.randn(idx.shape, generator=self.generator, dtype=torch.float64) * self.noise_std
        v = self.values
        idx = to_device(idx, v.device)  # from pinned memory: no host wait on a GPU
        noise = to_device(noise, v.device)
        return v[idx] + (noise if noise.dtype == v.dtype else noise.to(v.dtype))

    def state_dict(self) -> dict:
        """``{"generator": state}``: the noise generator's state, so that a resumed run draws the same noise."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s generator state; a malformed one raises ``InputDataError``, state unchanged."""
        gen = state.get("generator") if isinstance(state, dict) else None
        if not isinstance(gen, torch.Tensor) or gen.dtype != torch.uint8:
            raise InputDataError(f"state: expected {{'generator': uint8 tensor}}, got {type(state).__name__}")
        self.generator.set_state(gen)


class TensorObjective:
    """Rewards looked up in a tensor (picklable, so process pools and Dask workers can run it).

    Example:
        >>> import torch
        >>> TensorObjective(torch.tensor([0.5, 1.5]))(torch.tensor([1]))
        tensor([1.5000])
    """

    vectorized = True

    def __init__(self, values: torch.Tensor):
        self.values = values

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.values[to_device(torch.as_tensor(idx, dtype=torch.long), self.values.device)]


def as_objective(objective: Any, A: int) -> Callable[[torch.Tensor], Any]:
    """``objective`` as a callable over arm indices; a tensor `(A,)` of finite rewards becomes a
    :class:`TensorObjective`."""
    if isinstance(objective, torch.Tensor):
        return TensorObjective(check_values(None, objective, A, name="objective").detach())
    if not callable(objective):
        raise InputDataError(f"objective: expected a callable indices -> rewards or a tensor of shape ({A},), got "
                             f"{type(objective).__name__}")
    return objective


def check_values(objective: Any, values: Any, A: int, *, name: str = "values") -> torch.Tensor | None:
    """The noise-free values `(A,)` for regret (``values``, a tensor objective, or ``objective.values``), checked
    to be real and finite (``name`` in errors); ``None`` when there are none."""
    if values is None:
        values = objective if isinstance(objective, torch.Tensor) else getattr(objective, "values", None)
    if values is None:
        return None
    if not isinstance(values, torch.Tensor) or values.shape != (A,) or not values.is_floating_point():
        got = f"{values.dtype} {tuple(values.shape)}" if isinstance(values, torch.Tensor) else type(values).__name__
        raise InputDataError(f"{name}: expected a real floating tensor of shape ({A},), got {got}")
    check_finite(values, name)
    return values


def check_rewards(out: Any, arms: list[int]) -> torch.Tensor:
    """`(k,)` float64 rewards on the CPU from an objective's output for the ``k`` arms ``arms``.

    Raises:
        ObjectiveOutputError: not a number per arm: wrong shape, complex, boolean or not numeric.
    """
    k = len(arms)
    try:
        t = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
    except (TypeError, ValueError, RuntimeError):
        raise ObjectiveOutputError(f"objective: expected {k} real reward(s) for arms {arms}, got "
                                   f"{type(out).__name__}") from None
    if t.is_complex() or t.dtype == torch.bool or not (t.is_floating_point() or t.dtype in _INTEGERS):
        raise ObjectiveOutputError(f"objective: expected real rewards for arms {arms}, got dtype {t.dtype}")
    if t.shape not in ((k,), (k, 1)) and not (k == 1 and t.dim() == 0):
        raise ObjectiveOutputError(f"objective: expected rewards of shape ({k},) or ({k}, 1) for arms {arms}, got "
                                   f"shape {tuple(t.shape)}")
    if t.dim() == 1 and t.dtype == torch.float64 and t.device.type == "cpu":  # the usual output: no conversion
        return t.detach()
    return t.detach().reshape(-1).to("cpu", torch.float64)


_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
