"""Private helper: a row buffer that grows by doubling (amortized O(1) appends, no per-round copies)."""

from __future__ import annotations

import torch


class GrowableRows:
    """Rows ``(n, *shape)`` stored in a capacity-doubling tensor.

    Args:
        shape: trailing shape of one row (``()`` for scalars).
        dtype: storage dtype.
        device: storage device.
        capacity: initial number of rows.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, capacity: int = 1024):
        self._data = torch.empty((max(int(capacity), 1), *shape), dtype=dtype, device=device)
        self.n = 0

    @property
    def data(self) -> torch.Tensor:
        """`(n, *shape)` view of the stored rows."""
        return self._data[: self.n]

    def append(self, rows: torch.Tensor) -> None:
        """Append `(k, *shape)` rows (cast to the storage dtype)."""
        k = rows.shape[0]
        need = self.n + k
        if need > self._data.shape[0]:
            cap = self._data.shape[0]
            while cap < need:
                cap *= 2
            new = torch.empty((cap, *self._data.shape[1:]), dtype=self._data.dtype, device=self._data.device)
            new[: self.n] = self._data[: self.n]
            self._data = new
        self._data[self.n : need] = rows
        self.n = need
