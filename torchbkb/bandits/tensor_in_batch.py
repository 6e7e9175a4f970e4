"""BBKB's in-batch state with its arithmetic in torch on the candidates' device (any dtype, rows read on demand).

:func:`~torchbkb.bandits.batch_selection.select_batch` runs its lazy loop on one of two states with the same
methods: this one, for features on an accelerator, in a dtype NumPy lacks or computed on demand from streamed
kernel rows; :class:`~torchbkb.bandits.host_in_batch.HostInBatch` for features a CPU tensor holds (or derives from
cached kernel rows), which it reads through NumPy views. The loop's bookkeeping (argmax, which arms to refresh,
scalar reads) runs on host arrays with either; here the products run in torch and the elementwise rest of a refresh
on the host (the same IEEE operations in the same dtype).

The state holds ``σ̃²_fb``, the frozen mean, ``V_fb⁻¹`` and its hallucinated copy ``V_t⁻¹``, and the rank-one
terms hallucinated so far: while there are at most ``r`` of them, a refresh computes
``σ̃²_t(a) = σ̃²_fb(a) - Σ_j c_j (z(a)ᵀ u_j)²`` (cost ``r·b`` an arm), past that
``σ̃²_fb(a) - zᵀ V_0⁻¹ z + zᵀ V_t⁻¹ z`` (cost ``r²``).

Example:
    >>> import numpy as np, torch
    >>> Z = torch.eye(3, dtype=torch.float64); V = torch.eye(3, dtype=torch.float64)
    >>> st = TensorInBatch(Z, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), V, 1.0)
    >>> u, s = st.direction(0); st.hallucinate(u, 1.0 / (1.0 + s))
    >>> rls, ucb = np.ones(3), np.ones(3)
    >>> st.refresh_into(np.array([0, 1]), rls, ucb), rls.tolist()
    ((1.0, 1), [0.5, 1.0, 1.0])
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchbkb.utils.host_copy import host_array

__all__ = ["TensorInBatch", "run_rivals"]


class TensorInBatch:
    """The in-batch state of :func:`~torchbkb.bandits.batch_selection.select_batch` in torch (module docstring).

    Args:
        Z: `(A, r)` the candidates' features, or a reader of their rows (``Z[idx]`` for a long tensor or a slice).
        mean: `(A,)` ``μ̃_fb`` in ``Z``'s dtype; rls0: `(A,)` ``σ̃²_fb`` in ``Z``'s dtype.
        V_0: `(r, r)` ``V_fb⁻¹`` (not modified); the rank-one updates run in its dtype.
        alpha: the UCB's multiplier of ``σ̃``.
        chunk: read at most this many rows of ``Z`` at once (``None``: all a step needs).

    Attributes:
        mean_h, rls0_h: `(A,)` host arrays of ``mean`` and ``rls0``.
    """

    def __init__(self, Z, mean: torch.Tensor, rls0: torch.Tensor, V_0: torch.Tensor, alpha: float,
                 chunk: int | None = None):
        r, dt = Z.shape[1], Z.dtype
        self.Z, self.mean, self.rls0, self.V_0, self.alpha, self.chunk = Z, mean, rls0, V_0, alpha, chunk
        self.V_t = V_0.clone()
        self.U_buf = torch.empty((r, r), dtype=dt, device=Z.device)
        self.coef_buf = torch.empty((r,), dtype=dt, device=Z.device)
        self.b = 0  # hallucinated runs so far (one rank-one term each)
        self.mean_h, self.rls0_h = host_array(mean), host_array(rls0)
        self.V_0_rows = V_0 if V_0.dtype == dt else V_0.to(dt)

    def direction(self, i: int) -> tuple[torch.Tensor, float]:
        """``(u, s)``: ``u = V_t⁻¹ z(x_i)`` `(r,)` in ``V``'s dtype and ``s = z(x_i)ᵀ u``."""
        z = self.Z[i : i + 1][0]  # (r,)
        z = z if z.dtype == self.V_t.dtype else z.to(self.V_t.dtype)
        u = self.V_t @ z
        return u, float(z @ u)

    def hallucinate(self, u: torch.Tensor, g: float) -> None:
        """``V_t⁻¹ -= g u uᵀ`` in place (``V_t`` is this state's copy), the direction kept while ``b < r``."""
        self.V_t.addr_(u, u, alpha=-g)
        if self.b < self.U_buf.shape[0]:  # past r runs the direct form is cheaper and the directions are not needed
            self.U_buf[:, self.b], self.coef_buf[self.b] = u, g
        self.b += 1

    def V_inv(self) -> torch.Tensor:
        """`(r, r)` ``V_t⁻¹``: ``V_fb⁻¹`` with every hallucinated pick in."""
        return self.V_t

    def refresh(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Current RLS variance and UCB of the arms ``idx`` (a long tensor), rows read ``chunk`` at a time."""
        if self.chunk is None or idx.numel() <= self.chunk:
            return self.refresh_rows(self.Z[idx], idx)
        parts = [self.refresh_rows(self.Z[p], p) for p in idx.split(int(self.chunk))]
        return torch.cat([r for r, _ in parts]), torch.cat([u for _, u in parts])

    def refresh_into(self, idx: np.ndarray, rls_out: np.ndarray, ucb_out: np.ndarray) -> tuple[float, int]:
        """:meth:`refresh` of the arms ``idx`` (host indices `(M,)`), written into the host arrays ``rls_out`` and
        ``ucb_out`` `(A,)`; returns the largest refreshed UCB and its first position in ``idx`` (``(-inf, -1)`` for
        none)."""
        if idx.size == 0:
            return -math.inf, -1
        t_idx = self.indices(idx)
        if self.Z.dtype == torch.bfloat16:  # a dtype NumPy lacks: the elementwise part in torch too
            rls_m, ucb_m = self.refresh(t_idx)
            ucb = host_array(ucb_m)
            rls_out[idx], ucb_out[idx] = host_array(rls_m), ucb
            j = int(ucb.argmax())
            return float(ucb[j]), j
        if self.chunk is None or idx.size <= self.chunk:
            drop = self.drops(self.Z[t_idx])
        else:
            drop = torch.cat([self.drops(self.Z[p]) for p in t_idx.split(int(self.chunk))])
        rls = self.rls0_h[idx] - host_array(drop)
        np.maximum(rls, 0.0, out=rls)
        ucb = self.mean_h[idx] + self.alpha * np.sqrt(rls)
        rls_out[idx], ucb_out[idx] = rls, ucb
        j = int(ucb.argmax())
        return float(ucb[j]), j

    def drops(self, Zi: torch.Tensor) -> torch.Tensor:
        """`(M,)` the decrease ``σ̃²_fb - σ̃²_t`` of the arms with features ``Zi`` `(M, r)`."""
        if self.b <= Zi.shape[1]:
            proj = Zi @ self.U_buf[:, : self.b]  # (M, b); the buffers are in Z's dtype
            return (proj * proj) @ self.coef_buf[: self.b]
        V_t = self.V_t if self.V_t.dtype == Zi.dtype else self.V_t.to(Zi.dtype)
        return ((Zi @ self.V_0_rows) * Zi).sum(-1) - ((Zi @ V_t) * Zi).sum(-1)

    def indices(self, idx: np.ndarray) -> torch.Tensor:
        """Host indices `(M,)` as a long tensor on ``Z``'s device (a view on the CPU)."""
        t = torch.from_numpy(idx)
        return t if self.Z.device.type == "cpu" else t.to(self.Z.device)

    def refresh_rows(self, Zi: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`refresh` with the features ``Zi = Z[idx]`` `(M, r)` given."""
        rls_i = (self.rls0[idx] - self.drops(Zi)).clamp_min(0.0)
        return rls_i, self.mean[idx] + self.alpha * rls_i.sqrt()

    def run_length(self, i: int, u: torch.Tensor, s: float, J: int, ucb: np.ndarray, rls_i: float,
                   lazy: bool) -> tuple[int, int]:
        """How many of the next ``J`` picks are ``i`` again.

        Hallucinating ``i`` ``j`` times is one rank-one term: with ``u = V_t⁻¹ z_i`` and ``s = z_iᵀ u`` every
        variance becomes ``σ̃²_t(a) - g_j (z_aᵀ u)²``, ``g_j = j / (1 + j s)`` (Sherman-Morrison with
        ``j z_i z_iᵀ``), so the UCBs after ``1, ..., J`` hallucinations come in one `(M, J)` array. Only arms whose
        stale UCB reaches ``i``'s UCB after ``J`` hallucinations can beat it before (UCBs only decrease); ``lazy=False``
        checks every arm. Computed in ``Z``'s dtype, like the UCBs.

        Args:
            u: `(r,)` ``V_t⁻¹ z_i`` in the work dtype; ``s``: ``z_iᵀ u``.
            ucb: `(A,)` the stale UCBs (a host array); ``rls_i``: ``σ̃²_t(x_i)`` now.

        Returns:
            ``(wins, evaluated)``: the number of consecutive ``j = 1, 2, ...`` (at most ``J``) at which ``i`` is
            still the argmax (lowest index on ties), and how many arms were checked.
        """
        Z, mean, alpha = self.Z, self.mean, self.alpha
        dt = Z.dtype
        js = torch.arange(1, J + 1, dtype=u.dtype, device=u.device)
        g = (js / (1.0 + js * s)).to(dt)  # (J,)
        ucb_i = mean[i] + alpha * (rls_i - g * (s * s)).clamp_min(0.0).sqrt()  # (J,), non-increasing
        idx_h = run_rivals(ucb, float(ucb_i[-1]), i, lazy)
        if idx_h.size == 0:
            return J, 0
        idx = self.indices(idx_h)
        M, r = int(idx_h.size), Z.shape[1]
        # keep the step within O(A·r): look fewer picks ahead (idx stays a superset)
        if M * J > Z.shape[0] * max(r, 1):
            J = max(1, Z.shape[0] * max(r, 1) // M)
            g, ucb_i = g[:J], ucb_i[:J]
        lost = torch.zeros(J, dtype=torch.bool, device=u.device)
        step = M if self.chunk is None else max(1, int(self.chunk))
        for start in range(0, M, step):  # chunks of the arms checked: memory O(chunk·(r + J))
            part = idx[start : start + step]
            Zi = Z[part]  # (c, r)
            rls_c, _ = self.refresh_rows(Zi, part)  # (c,) σ̃²_t now
            p2 = (Zi @ u.to(dt)).square_()  # (c,) (z_aᵀ u)²
            ucb_c = mean[part, None] + alpha * (rls_c[:, None] - p2[:, None] * g).clamp_min_(0.0).sqrt_()  # (c, J)
            beats = (ucb_c > ucb_i) | ((ucb_c == ucb_i) & (part < i)[:, None])
            lost |= beats.any(0)  # (J,)
        wins = int(torch.argmax(lost.to(torch.uint8))) if bool(lost.any()) else J
        return wins, M


def run_rivals(ucb: np.ndarray, level: float, i: int, lazy: bool) -> np.ndarray:
    """`(M,)` the arms other than ``i`` that may beat it within a run: every other arm (``lazy=False``), or those
    whose stale UCB in ``ucb`` `(A,)` reaches ``level`` (``i``'s UCB after the run, rounded to ``ucb``'s dtype)."""
    if not lazy:
        return np.concatenate([np.arange(i), np.arange(i + 1, ucb.size)])
    idx = (ucb >= ucb.dtype.type(level)).nonzero()[0]
    return idx[idx != i]
