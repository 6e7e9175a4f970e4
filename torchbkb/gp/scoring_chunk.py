"""How many points one scoring product takes: cache-sized on the CPU, launch-sized on a GPU.

Scoring ``A`` arms against an `(m, m)` operator is a loop of `(m, m)·(m, c)` products over chunks of ``c`` arms. On
the CPU a chunk that stays in cache is fastest (:data:`~torchbkb.gp.nystrom.DEFAULT_CHUNK`); on a GPU every chunk is a
handful of kernel launches, so the chunk is as large as a bounded block allows (the measurements: ``docs/gpu.md``).
A chunk the user gives is used as given.
"""

from __future__ import annotations

import operator

import torch

from torchbkb.errors import InputDataError
from torchbkb.gp.nystrom import DEFAULT_CHUNK

__all__ = ["GPU_BLOCK_BYTES", "check_chunk_size", "scoring_chunk"]

#: Bytes of one `(m, c)` block of a scoring product on a GPU when the chunk is sized for the device.
GPU_BLOCK_BYTES = 256 * 2**20


def check_chunk_size(chunk_size: int | None) -> int | None:
    """``None`` (sized for the device) or a positive ``int``; anything else raises :class:`InputDataError`."""
    if chunk_size is None:
        return None
    try:
        value = operator.index(chunk_size)
    except TypeError:
        value = 0
    if isinstance(chunk_size, bool) or value < 1:
        raise InputDataError(f"chunk_size: expected None or an integer >= 1, got {chunk_size!r}")
    return value


def scoring_chunk(chunk_size: int | None, rows: int, device: torch.device, dtype: torch.dtype) -> int:
    """Points per scoring product.

    Args:
        chunk_size: the user's chunk (used as given), or ``None``.
        rows: ``m``, the rows of the `(m, c)` block a chunk makes.
        device, dtype: where the block lives.

    Returns:
        ``chunk_size`` when given; else :data:`~torchbkb.gp.nystrom.DEFAULT_CHUNK` on the CPU and, on a GPU, the most
        points whose `(m, c)` block fits in :data:`GPU_BLOCK_BYTES` (at least ``DEFAULT_CHUNK``).

    Example:
        >>> import torch
        >>> scoring_chunk(None, 50, torch.device("cpu"), torch.float64)
        16384
        >>> scoring_chunk(None, 64, torch.device("cuda"), torch.float64)
        524288
        >>> scoring_chunk(1000, 64, torch.device("cuda"), torch.float64)
        1000
    """
    if chunk_size is not None:
        return chunk_size
    if torch.device(device).type == "cpu":
        return DEFAULT_CHUNK
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    return max(DEFAULT_CHUNK, GPU_BLOCK_BYTES // (max(int(rows), 1) * itemsize))
