"""BBKB's in-batch state on the host: the lazy loop's products through NumPy views of CPU tensors.

A pick of :func:`~torchbkb.bandits.batch_selection.select_batch` reads one feature row, forms ``u = V_t⁻¹ z`` and
``s = zᵀ u``, updates ``V_t⁻¹`` by a rank-one term and refreshes the few arms whose stale UCB could still win: a
dozen products on `(r,)`, `(r, r)` and `(M, r)` arrays with ``r`` of tens and ``M`` of about ten. Their arithmetic
is a few microseconds; a torch operation costs more than that to dispatch, a NumPy one about a microsecond. So on
the CPU, for features in float32 or float64 that a tensor holds or that derive from cached kernel rows
(:func:`host_rows`), the loop runs on this state, whose methods are those of
:class:`~torchbkb.bandits.tensor_in_batch.TensorInBatch` (see there for the formulas) computed on NumPy views of the
same memory, in the same dtypes. Products may round differently from torch's (another BLAS), so the picks are
those of the torch state up to ties within round-off.

Example:
    >>> import numpy as np, torch
    >>> Z = torch.eye(3, dtype=torch.float64); V = torch.eye(3, dtype=torch.float64)
    >>> st = HostInBatch(host_rows(Z), torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), V, 1.0)
    >>> u, s = st.direction(0); st.hallucinate(u, 1.0 / (1.0 + s))
    >>> rls, ucb = np.ones(3), np.ones(3)
    >>> st.refresh_into(np.array([0, 1]), rls, ucb), rls.tolist()
    ((1.0, 1), [0.5, 1.0, 1.0])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from torchbkb.bandits.kernel_rows import FeatureRows
from torchbkb.bandits.tensor_in_batch import run_rivals
from torchbkb.utils.host_copy import HOST_DTYPES, host_array

__all__ = ["HostInBatch", "host_rows"]

RowReader = Callable[[int | np.ndarray], np.ndarray]


def host_rows(Z) -> RowReader | None:
    """A reader of the rows of ``Z`` -- an `(A, r)` tensor or a :class:`~torchbkb.bandits.kernel_rows.FeatureRows` --
    as NumPy arrays (``rows(i)`` `(r,)` for an int, ``rows(idx)`` `(M, r)` for host indices), or ``None`` unless its
    values live on the CPU in a :data:`~torchbkb.utils.host_copy.HOST_DTYPES` dtype."""
    if isinstance(Z, FeatureRows):
        return Z.host_rows()
    if not isinstance(Z, torch.Tensor) or Z.device.type != "cpu" or Z.dtype not in HOST_DTYPES or Z.dim() != 2:
        return None
    Zh = host_array(Z)
    if not Zh.flags.c_contiguous:  # np.take would copy a strided array whole
        return Zh.__getitem__
    return lambda idx: Zh[idx] if isinstance(idx, int) else Zh.take(idx, axis=0)  # a row as a view, rows gathered


class HostInBatch:
    """The in-batch state of :func:`~torchbkb.bandits.batch_selection.select_batch` on NumPy arrays.

    Args:
        rows: the reader :func:`host_rows` gives for the candidates' features `(A, r)`.
        mean: `(A,)` ``μ̃_fb`` and rls0: `(A,)` ``σ̃²_fb``, CPU tensors in the features' dtype.
        V_0: `(r, r)` ``V_fb⁻¹``, a CPU tensor (not modified); the rank-one updates run in its dtype.
        alpha: the UCB's multiplier of ``σ̃``.
        chunk: read at most this many rows at once (``None``: all a step needs).

    Attributes:
        mean_h, rls0_h: `(A,)` host arrays of ``mean`` and ``rls0`` (views).
    """

    def __init__(self, rows: RowReader, mean: torch.Tensor, rls0: torch.Tensor, V_0: torch.Tensor, alpha: float,
                 chunk: int | None = None):
        self.rows, self.alpha, self.chunk = rows, float(alpha), chunk
        self.mean_h, self.rls0_h = host_array(mean), host_array(rls0)
        dt = self.mean_h.dtype
        self.V_0 = host_array(V_0)  # a view: never written
        self.V_t = self.V_0.copy()
        self.D: np.ndarray | None = None  # V_0⁻¹ - V_t⁻¹ in V's dtype, once there are more than r runs
        r = self.V_t.shape[0]
        self.U, self.coef = np.empty((r, r), dtype=dt), np.empty(r, dtype=dt)  # u_j as columns, c_j
        self.b = 0  # hallucinated runs so far (one rank-one term each)

    def direction(self, i: int) -> tuple[np.ndarray, float]:
        """``(u, s)``: ``u = V_t⁻¹ z(x_i)`` `(r,)` in ``V``'s dtype and ``s = z(x_i)ᵀ u``."""
        z = self.rows(i)
        z = z if z.dtype == self.V_t.dtype else z.astype(self.V_t.dtype)
        u = self.V_t.dot(z)
        return u, float(z.dot(u))

    def hallucinate(self, u: np.ndarray, g: float) -> None:
        """``V_t⁻¹ -= g u uᵀ`` in place; the direction kept while ``b < r``, past that the difference
        ``D = V_0⁻¹ - V_t⁻¹`` the refreshes read."""
        # (-g u_i) u_j, as torch's addr_ with alpha = -g: a product of inner dimension 1 is exact and cheaper
        # than a broadcast multiply
        step = np.dot((-g * u)[:, None], u[None, :])
        self.V_t += step
        if self.b < self.U.shape[0]:
            self.U[:, self.b], self.coef[self.b] = u, g
        else:  # formed anew, not accumulated: on unit features it rounds as zᵀV_0⁻¹z - zᵀV_t⁻¹z (exact ties)
            self.D = np.subtract(self.V_0, self.V_t, out=self.D)
        self.b += 1

    def V_inv(self) -> torch.Tensor:
        """`(r, r)` ``V_t⁻¹`` as a CPU tensor: ``V_fb⁻¹`` with every hallucinated pick in."""
        return torch.from_numpy(self.V_t)

    def drops(self, Zi: np.ndarray) -> np.ndarray:
        """`(M,)` the decrease ``σ̃²_fb - σ̃²_t`` of the arms with features ``Zi`` `(M, r)`."""
        b = self.b
        if b <= Zi.shape[1]:
            proj = Zi.dot(self.U[:, :b])  # (M, b)
            return (proj * proj).dot(self.coef[:b])
        D = self.D if self.D.dtype == Zi.dtype else self.D.astype(Zi.dtype)
        return np.add.reduce(Zi.dot(D) * Zi, axis=1)  # zᵀ(V_0⁻¹ - V_t⁻¹)z: one product an arm

    def chunks(self, idx: np.ndarray) -> list[np.ndarray]:
        """``idx`` in pieces of at most ``chunk`` indices."""
        if self.chunk is None or idx.size <= self.chunk:
            return [idx]
        return [idx[k : k + int(self.chunk)] for k in range(0, idx.size, int(self.chunk))]

    def refresh_into(self, idx: np.ndarray, rls_out: np.ndarray, ucb_out: np.ndarray) -> tuple[float, int]:
        """The current variance and UCB of the arms ``idx`` (host indices `(M,)`), written into ``rls_out`` and
        ``ucb_out`` `(A,)`; returns the largest refreshed UCB and its first position in ``idx`` (``(-inf, -1)`` for
        none)."""
        if idx.size == 0:
            return -math.inf, -1
        parts = self.chunks(idx)
        drop = self.drops(self.rows(idx)) if len(parts) == 1 else np.concatenate([self.drops(self.rows(p))
                                                                                  for p in parts])
        rls = np.subtract(self.rls0_h.take(idx), drop, out=drop)
        np.maximum(rls, 0.0, out=rls)
        ucb = np.sqrt(rls)
        ucb *= self.alpha
        ucb += self.mean_h.take(idx)  # μ̃ + α σ̃, rounded as written
        rls_out[idx], ucb_out[idx] = rls, ucb
        values = ucb.tolist()  # exact; a NumPy reduction costs more on a few values
        top = max(values)
        return top, values.index(top)

    def run_length(self, i: int, u: np.ndarray, s: float, J: int, ucb: np.ndarray, rls_i: float,
                   lazy: bool) -> tuple[int, int]:
        """How many of the next ``J`` picks are ``i`` again, and how many arms were checked
        (:meth:`~torchbkb.bandits.tensor_in_batch.TensorInBatch.run_length`)."""
        dt, alpha, mean = self.mean_h.dtype, self.alpha, self.mean_h
        js = np.arange(1, J + 1, dtype=self.V_t.dtype)
        g = (js / (1.0 + js * s)).astype(dt)  # (J,)
        ucb_i = mean[i] + alpha * np.sqrt(np.maximum(rls_i - g * (s * s), 0.0))  # (J,), non-increasing
        idx = run_rivals(ucb, float(ucb_i[-1]), i, lazy)
        if idx.size == 0:
            return J, 0
        A, (M, r) = mean.size, (idx.size, self.U.shape[0])
        if M * J > A * max(r, 1):  # keep the step within O(A·r): look fewer picks ahead (idx stays a superset)
            J = max(1, A * max(r, 1) // M)
            g, ucb_i = g[:J], ucb_i[:J]
        u_dt = u.astype(dt)
        lost = np.zeros(J, dtype=bool)
        for part in self.chunks(idx):  # memory O(chunk·(r + J))
            Zi = self.rows(part)  # (c, r)
            rls_c = np.maximum(self.rls0_h.take(part) - self.drops(Zi), 0.0)  # (c,) σ̃²_t now
            p2 = np.square(Zi.dot(u_dt))  # (c,) (z_aᵀ u)²
            ucb_c = mean.take(part)[:, None] + alpha * np.sqrt(np.maximum(rls_c[:, None] - p2[:, None] * g, 0.0))
            lost |= ((ucb_c > ucb_i) | ((ucb_c == ucb_i) & (part < i)[:, None])).any(0)  # (J,)
        return (int(lost.argmax()) if lost.any() else J), M
