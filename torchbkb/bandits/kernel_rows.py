"""Kernel rows ``k(S, arms)`` `(m, A)` as the sketched bandits read them: cached, or streamed chunk by chunk.

A sketched bandit scores every arm from the kernel rows of its dictionary. Caching them costs ``m·A`` values;
past the bandit's ``kernel_cache_bytes`` they are instead recomputed on demand by :class:`StreamedKernelRows`,
which reads like the `(m, A)` cache where the bandit reads it (column chunks, column subsets, rows of a few
arms through ``.T``, ``a @ K``) and never holds more than a chunk. :class:`FeatureRows` derives the arms'
Nyström features from either, a few rows at a time.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> k = GaussianKernel(0.5)
    >>> arms = torch.rand(1000, 2, dtype=torch.float64); S = arms[:5]
    >>> lazy = StreamedKernelRows(k, S, arms, chunk_size=128)
    >>> dense = k(S, arms)
    >>> bool(torch.allclose(lazy[:, 10:20], dense[:, 10:20]))
    True
    >>> bool(torch.allclose(torch.ones(5, dtype=torch.float64) @ lazy, dense.sum(0)))
    True
    >>> bool(torch.allclose(lazy.T[torch.tensor([3, 7])], dense.T[[3, 7]]))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch

from torchbkb.errors import NumericsError, nonfinite_rows_error
from torchbkb.utils.host_copy import HOST_DTYPES, host_array

__all__ = ["FeatureRows", "StreamedKernelRows", "finite_flag", "finite_rows", "nonfinite_kernel_rows", "on_host"]


class FeatureRows:
    """Nyström features ``z(a) = W k_S(a)`` of an arm set, computed row by row on demand from the kernel rows.

    Reads like the `(A, r)` embedding where :func:`~torchbkb.bandits.batch_selection.select_batch` reads it --
    ``shape``, ``dtype``, ``device`` and ``rows[idx]`` for a long tensor or a slice ``idx`` -- without forming it:
    a batch touches a few arms, and forming all ``A`` rows costs `A·m·r` at every dictionary change.

    Args:
        K_SA: `(m, A)` kernel rows ``k(s_j, arms)``.
        W: `(r, m)` whitening of ``K_S`` (``Wᵀ W = K_S⁺``); used in ``K_SA``'s dtype.
        index: optional `(k,)` long, a subset of the arms: row ``i`` is then arm ``index[i]`` (shape `(k, r)`).

    Example:
        >>> import torch
        >>> K_SA = torch.rand(3, 10, dtype=torch.float64); W = torch.rand(3, 3, dtype=torch.float64)
        >>> rows = FeatureRows(K_SA, W)
        >>> tuple(rows.shape), bool(torch.allclose(rows[torch.tensor([4, 7])], (W @ K_SA).T[[4, 7]]))
        ((10, 3), True)
        >>> sub = FeatureRows(K_SA, W, index=torch.tensor([2, 4, 7]))
        >>> tuple(sub.shape), bool(torch.equal(sub[torch.tensor([1, 2])], rows[torch.tensor([4, 7])]))
        ((3, 3), True)
    """

    def __init__(self, K_SA: torch.Tensor, W: torch.Tensor, index: torch.Tensor | None = None):
        self._K_T = K_SA.T  # (A, m) view: a row gather reads one arm's kernel values
        self._W_T = W.T.to(K_SA.dtype)  # (m, r)
        self._index = index
        self.shape = torch.Size((K_SA.shape[1] if index is None else index.numel(), W.shape[0]))
        self.dtype, self.device = K_SA.dtype, K_SA.device

    def __getitem__(self, idx: torch.Tensor | slice) -> torch.Tensor:
        arms = idx if self._index is None else self._index[idx]
        return self._K_T[arms] @ self._W_T  # (M, r)

    def host_rows(self) -> Callable[[int | np.ndarray], np.ndarray] | None:
        """The same rows computed on NumPy views of the cached kernel rows: ``rows(i)`` `(r,)` for an int,
        ``rows(idx)`` `(M, r)` for host indices; ``None`` unless the rows are a CPU tensor in float32 or float64."""
        K_T = self._K_T
        if not isinstance(K_T, torch.Tensor) or K_T.device.type != "cpu" or K_T.dtype not in HOST_DTYPES:
            return None
        K_h, W_h = K_T.detach().numpy().T, self._W_T.detach().numpy()  # (m, A) and (m, r) views
        index = None if self._index is None else self._index.numpy()
        # a gather by [:, idx] reads the few columns whatever the layout (np.take would copy a strided array whole)
        if index is None:
            return lambda idx: K_h[:, idx].T.dot(W_h)
        return lambda idx: K_h[:, index[idx]].T.dot(W_h)


class StreamedKernelRows:
    """The `(m, A)` kernel rows ``k(S, arms)`` computed on demand, ``chunk_size`` arms at a time.

    Every chunk computed is checked for NaN/inf before it is returned (:func:`finite_rows`); within
    :meth:`checked_once` the checks where torch scans (a GPU) are read together at its end instead of one read a chunk.

    Args:
        kernel: callable ``(X1, X2) -> Tensor`` (a :class:`~torchbkb.gp.kernels.KernelAdapter`).
        S: `(m, d)` the dictionary points (rows in the bandit's slot order).
        arms: `(A, d)` the arm set.
        columns: optional `(k,)` long, a subset of the arms (column ``j`` is arm ``columns[j]``).
        chunk_size: arms evaluated at once by whole-set reductions (``a @ K``).
        ids: the arm indices of ``S`` (the dictionary, in slot order), which a NaN/inf error names.
    """

    def __init__(self, kernel: Callable, S: torch.Tensor, arms: torch.Tensor, columns: torch.Tensor | None = None,
                 chunk_size: int = 4096, *, ids: list[int] | None = None, checks: _Checks | None = None):
        self._kernel, self._S, self._arms, self._columns, self._chunk = kernel, S, arms, columns, int(chunk_size)
        self._ids = ids
        self.shape = torch.Size((S.shape[0], arms.shape[0] if columns is None else columns.numel()))
        self.dtype, self.device = arms.dtype, arms.device
        self._checks = _Checks() if checks is None else checks  # shared with the rows derived from these

    def _arm_rows(self, key) -> torch.Tensor:
        return self._arms[key] if self._columns is None else self._arms[self._columns[key]]

    def _arm_ids(self, key) -> list[int]:
        """The arm indices of the columns ``key`` (read on the host: only to name bad rows)."""
        cols = torch.arange(self.shape[1], device=self.device)[key] if isinstance(key, slice) else key
        return torch.as_tensor(self._resolve(cols)).reshape(-1).tolist()

    def _resolve(self, key: torch.Tensor) -> torch.Tensor:
        if self._columns is None:
            return key
        return self._columns[key]

    def __getitem__(self, key):
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None)):
            raise TypeError(f"StreamedKernelRows: expected [:, columns], got {key!r}")
        cols = key[1]
        if isinstance(cols, slice):  # a chunk: computed now
            X = self._arm_rows(cols)
            return self._finite(self._kernel(self._S, X), lambda: self._kernel(self._S, X), self._ids)  # (m, c)
        return StreamedKernelRows(self._kernel, self._S, self._arms, self._resolve(cols), self._chunk,
                                  ids=self._ids, checks=self._checks)

    def index_select(self, dim: int, index: torch.Tensor) -> StreamedKernelRows:
        """The columns ``index`` (``dim`` must be 1), still lazy."""
        if dim != 1:
            raise TypeError(f"StreamedKernelRows: expected index_select over columns (dim 1), got dim {dim}")
        return self[:, index]

    @property
    def T(self) -> _RowsOfArms:
        """Reads like the `(A, m)` transpose: ``.T[idx]`` computes the rows of the arms ``idx``."""
        return _RowsOfArms(self)

    def __rmatmul__(self, a: torch.Tensor) -> torch.Tensor:
        """``a @ K`` `(..., A)`, chunk by chunk, their finiteness read once (:meth:`checked_once`)."""
        n, c = self.shape[1], self._chunk
        with self.checked_once():
            return torch.cat([a @ self[:, i : i + c] for i in range(0, max(n, 1), c)], dim=-1)

    @contextmanager
    def checked_once(self):
        """Within it, the finiteness of every chunk these rows and the rows derived from them compute where torch
        scans it is collected and read once, at its end: a non-finite chunk raises :func:`finite_rows`'s error
        there, before the caller's next statement (keep what the chunks computed unused until then). Nested: the
        outermost reads."""
        checks = self._checks
        if checks.pending is not None:
            yield
            return
        checks.pending = []
        try:
            yield
            pending = checks.pending
        finally:
            checks.pending = None
        if pending and not bool(torch.stack([flag for flag, _ in pending]).all()):  # the one read
            for flag, again in pending:
                if not bool(flag):
                    finite_rows(*again())

    def _finite(self, rows: torch.Tensor, again: Callable[[], torch.Tensor], names) -> torch.Tensor:
        """``rows`` `(e, ·)` of kernel values ``k(names, ·)`` (:func:`finite_rows`' ``arms``) checked now, or, within
        :meth:`checked_once` where torch scans them, their flag kept (``again()`` computes them anew to name the bad
        ones)."""
        if self._checks.pending is None or on_host(rows):
            return finite_rows(rows, names)
        self._checks.pending.append((finite_flag(rows), lambda: (again(), names)))
        return rows


class _Checks:
    """The finiteness flags of the chunks computed within a :meth:`StreamedKernelRows.checked_once` (``None``
    outside one)."""

    def __init__(self):
        self.pending: list | None = None


class _RowsOfArms:
    def __init__(self, rows: StreamedKernelRows):
        self._rows = rows

    def __getitem__(self, key) -> torch.Tensor:
        r = self._rows
        X = r._arm_rows(key)
        return r._finite(r._kernel(X, r._S), lambda: r._kernel(X, r._S), lambda: r._arm_ids(key))  # (k, m)


def on_host(rows: torch.Tensor) -> bool:
    """Whether :func:`finite_rows` scans ``rows`` on the host (a CPU tensor in a NumPy dtype): no device read."""
    return rows.device.type == "cpu" and rows.dtype in HOST_DTYPES


def finite_flag(rows: torch.Tensor) -> bool | torch.Tensor:
    """Whether ``rows`` are all finite: a Python bool where NumPy scans them in place (:func:`on_host`), else a 0-d
    bool tensor on their device, for the caller to read (with whatever else it reads)."""
    return bool(np.isfinite(host_array(rows)).all()) if on_host(rows) else torch.isfinite(rows).all()


def finite_rows(rows: torch.Tensor, arms: list[int] | Callable[[], list[int]] | None) -> torch.Tensor:
    """``rows`` `(e, A)` of kernel values ``k(arms, ·)``, or a :class:`~torchbkb.errors.NumericsError` before a NaN/inf
    value can enter the bandit's state. ``arms`` names the rows (a callable giving them is called only on failure;
    the error's ``arms`` are then the bad ones), ``None`` for unnamed rows (the error names their positions). On the
    CPU NumPy scans them in place: a few microseconds against three tensor operations and a read."""
    if not bool(finite_flag(rows)):
        bad = (~torch.isfinite(rows)).any(1).nonzero().squeeze(1).tolist()
        names = arms() if callable(arms) else arms
        if names is not None:
            raise nonfinite_rows_error([names[i] for i in bad])
        err = NumericsError(f"kernel: expected finite values k(a, ·), got NaN/inf in the rows of positions {bad}")
        err.nonfinite = True
        raise err
    return rows


def nonfinite_kernel_rows(kernel: Callable, X: torch.Tensor, Y: torch.Tensor | None = None, *,
                          chunk_size: int = 4096) -> list[int]:
    """The rows ``i`` of ``k(X, Y)`` (``Y = X`` by default) holding NaN/inf, in chunks of ``chunk_size`` rows: what
    a computation over ``X`` that raised calls to name the points at fault (an empty list: the kernel is not).

    Example:
        >>> import torch
        >>> k = lambda A, B: torch.where(A[:, :1] > 0.5, float("nan"), A @ B.T)
        >>> nonfinite_kernel_rows(k, torch.tensor([[0.1], [0.9], [0.2]]))
        [1]
    """
    Y = X if Y is None else Y
    bad: list[int] = []
    with torch.no_grad():
        for i in range(0, X.shape[0], chunk_size):
            rows = torch.as_tensor(kernel(X[i : i + chunk_size], Y))
            bad += (i + (~torch.isfinite(rows)).any(1).nonzero().squeeze(1)).tolist()
    return bad
