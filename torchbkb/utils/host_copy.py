"""Host-to-device copies that do not make the host wait.

A plain ``tensor.to("cuda")`` from pageable host memory returns only once the copy is done: a host synchronization
that ``torch.cuda.set_sync_debug_mode`` reports. Copied from pinned memory with ``non_blocking=True`` it is queued
on the stream instead; PyTorch's caching host allocator keeps the pinned block until the copy has run, so the source
may be dropped at once.

Example:
    >>> import torch
    >>> to_device(torch.tensor([1.0, 2.0]), torch.device("cpu")).tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``: ``t`` itself when it is there already, queued from pinned memory when it moves from the
    CPU to a CUDA device (no host wait), else ``t.to(device)``."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if t.device == device:  # what t.to(device) returns, without its dispatch (a bandit step makes several)
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
