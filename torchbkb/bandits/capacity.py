"""Fixed-capacity buffers: capacities that are powers of two, and the kept entries compacted into slots.

A buffer whose size follows the data (the pulled arms, the dictionary, the arms that pass a pruning bound) is held
at a capacity that only changes when outgrown (doubling), so a function of fixed shapes -- compiled, or replayed
from a CUDA graph -- serves many sizes; which entries are valid is a mask, never a data-dependent shape.

Example:
    >>> import torch
    >>> keep = torch.tensor([True, False, True, True, False])
    >>> slots, valid, m = compact_slots(keep, 4)
    >>> slots.tolist(), valid.tolist(), int(m), capacity_for(17)
    ([0, 2, 3, 0], [True, True, True, False], 3, 32)
"""

from __future__ import annotations

import torch

__all__ = ["FIXED_ROWS_MAX", "MIN_CAPACITY", "capacity_for", "compact_slots"]

#: the smallest capacity of the pulled arms and of the dictionary's slots.
MIN_CAPACITY = 16
#: the most padded kernel-row entries (``m_cap × A``) the fixed-capacity update takes on: past it a pass over its rows
#: costs more than the launches and host reads it saves (measured on a GPU: ``docs/gpu.md``), and the eager update runs.
FIXED_ROWS_MAX = 2**23


def capacity_for(n: int) -> int:
    """The capacity that holds ``n`` entries: a power of two, at least :data:`MIN_CAPACITY`."""
    return max(MIN_CAPACITY, 1 << max(int(n) - 1, 0).bit_length())


def compact_slots(keep: torch.Tensor, m_cap: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions of the kept entries of ``keep`` `(P,)`, ascending, in ``m_cap`` slots.

    Returns:
        ``(positions, valid, m)``: `(m_cap,)` long (0 in the unused slots), `(m_cap,)` bool, and the 0-d count ``m``
        of kept entries (when ``m > m_cap`` only the first ``m_cap`` are placed).
    """
    k = keep.long()
    pos = torch.cumsum(k, 0) - 1
    m = k.sum()
    src = torch.arange(keep.shape[0], device=keep.device)
    target = torch.where(keep & (pos < m_cap), pos, m_cap + src)  # the rest to slots of their own past the end
    positions = torch.zeros(m_cap + keep.shape[0], dtype=torch.long, device=keep.device).scatter(0, target, src)
    positions = positions[:m_cap]  # (unique targets: a deterministic scatter on every device)
    valid = torch.arange(m_cap, device=keep.device) < m
    return torch.where(valid, positions, 0), valid, m
