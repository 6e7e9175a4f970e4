"""Moving values between host and device with as few host waits as the values allow.

A plain ``tensor.to("cuda")`` from pageable host memory returns only once the copy is done: a host synchronization
that ``torch.cuda.set_sync_debug_mode`` reports. Copied from pinned memory with ``non_blocking=True`` it is queued
on the stream instead; PyTorch's caching host allocator keeps the pinned block until the copy has run, so the source
may be dropped at once.

The other way, every value the host reads from a GPU is a wait: :func:`read_flags` reads several yes/no checks made
on the device in one, :func:`read_scalars` several values in one; :func:`host_array` gives a tensor's values as a
NumPy array (a view of a CPU tensor).

Example:
    >>> import torch
    >>> to_device(torch.tensor([1.0, 2.0]), torch.device("cpu")).tolist()
    [1.0, 2.0]
    >>> read_flags({"finite": torch.tensor(True), "same": torch.tensor(False)})
    {'finite': True, 'same': False}
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["HOST_DTYPES", "cached_float", "check_at_once", "host_array", "read_flags", "read_scalars", "to_device",
           "to_dtype"]

#: the floating dtypes NumPy computes as torch does (the same IEEE types): host arithmetic on their views.
HOST_DTYPES = (torch.float32, torch.float64)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``: ``t`` itself when it is there already, queued from pinned memory when it moves from the
    CPU to a CUDA device (no host wait), else ``t.to(device)``."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if t.device == device:  # what t.to(device) returns, without its dispatch (a bandit step makes several)
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)``: ``t`` itself when it has the dtype already, without ``.to``'s dispatch (about a microsecond,
    several times a bandit step)."""
    return t if t.dtype == dtype else t.to(dtype)


def read_flags(flags: dict[str, torch.Tensor]) -> dict[str, bool]:
    """The 0-d boolean tensors ``flags`` (on one device) as Python bools, read in one host transfer (the bits of one
    integer) -- none when ``flags`` is empty."""
    if not flags:
        return {}
    code, *rest = flags.values()
    for i, t in enumerate(rest, 1):
        code = code + t * (1 << i)  # two small kernels a flag: cheaper than a read each
    value = int(code)  # the one read
    return {name: bool(value >> i & 1) for i, name in enumerate(flags)}


def check_at_once(flags: dict[str, torch.Tensor], checks: Callable[[], None]) -> None:
    """Validation in one wait: ``flags`` are 0-d booleans (any number), each true when a condition holds, read in one
    transfer as their conjunction; ``checks`` -- the same conditions checked one by one, raising on the first that
    fails -- runs only when a flag is false, or when the flags live on several devices. The errors are those of
    ``checks``.

    Example:
        >>> x = torch.tensor([1.0, float("nan")])
        >>> def checks():
        ...     raise ValueError("x: expected finite values")
        >>> check_at_once({"finite": torch.isfinite(x).all()}, checks)
        Traceback (most recent call last):
        ...
        ValueError: x: expected finite values
    """
    if flags and len({t.device for t in flags.values()}) == 1 and bool(torch.stack(list(flags.values())).all()):
        return
    checks()


def read_scalars(*values: torch.Tensor) -> list[float]:
    """One-element tensors ``values`` (on one device) as Python floats, exactly (float64 holds float32, float64 and
    integers below 2⁵³), in one host transfer: one wait on a GPU, where a read each would be as many.

    Example:
        >>> read_scalars(torch.tensor([3]), torch.tensor(0.5, dtype=torch.float32))
        [3.0, 0.5]
    """
    return torch.cat([v.reshape(1).to(torch.float64) for v in values]).tolist()


def host_array(t: torch.Tensor) -> np.ndarray:
    """``t`` as a NumPy array on the host: a view of a CPU tensor (no copy), a copy of a device one; a bfloat16
    tensor (NumPy has no bfloat16) as its values, exactly, in float32."""
    t = t.detach() if t.requires_grad else t
    if t.dtype == torch.bfloat16:
        t = t.float()
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def cached_float(owner: object, t: torch.Tensor, key: str) -> float:
    """``float(t)`` for a 0-d tensor, read from its device once per value: kept in ``owner.__dict__[key]`` with the
    tensor and its version, so a new tensor or an in-place write reads it again."""
    cached = owner.__dict__.get(key)
    if cached is None or cached[0] is not t or cached[1] != t._version:
        cached = (t, t._version, float(t))
        owner.__dict__[key] = cached
    return cached[2]
