"""BBKB's in-batch selection (001 Algorithm 1, lines 4-8): adaptive batch, hallucinated variances, lazy UCB.

Inside a batch the dictionary and the mean ``μ̃_fb`` are frozen; each pick ``x`` is hallucinated into
``V`` by a rank-one update, so every RLS variance can only decrease::

    σ̃²_t(a) = σ̃²_fb(a) - Σ_{j<=t} c_j (z(a)ᵀ u_j)²,
    u_j = V_{j-1}⁻¹ z(x_j),   c_j = 1 / (1 + z(x_j)ᵀ u_j)

and so can every UCB ``μ̃_fb + α̃ σ̃_t``. After a pick we therefore only recompute the arms whose *stale*
UCB is at least the chosen arm's *new* UCB (lazy UCB): every other arm's true UCB is below it and
cannot be the next argmax. The batch ends with the first pick for which
``1 + Σ_{s in batch} σ̃²_fb(x_s) > C̃`` (that pick is the last one of the batch), or at ``max_batch_size``
(without a cap, a pick whose ``σ̃²_fb`` is too small for the rule to end the batch within 2²⁴ picks is the last).

Runs of one arm: late in a run a batch is mostly the same arm picked again and again. Hallucinating
``x_i`` ``j`` times is the single rank-one term ``j z_i z_iᵀ``, so with ``u = V_t⁻¹ z_i``, ``s = z_iᵀ u``
every variance after ``j`` more picks of ``x_i`` is ``σ̃²_t(a) - g_j (z(a)ᵀ u)²``, ``g_j = j / (1 + j s)``.
The UCBs after ``1, ..., J`` more picks of the current argmax are therefore computed at once, for the arms
whose stale UCB reaches ``x_i``'s UCB after ``J`` picks (no other arm can catch up before), and the run
lasts until another arm wins (lowest index on ties) or the stop rule ends the batch. A whole run costs
about one pick (one argmax over ``A``, one ``V`` update); the picks are exactly those of selecting one
at a time (the tests compare with a literal one-at-a-time implementation). The look-ahead ``J`` starts
at 8, grows 4× after the arm won a whole window, falls back to 8 when it loses, and is cut so that the
``M`` arms checked times ``J`` stay within ``A·r``: a step stays within the lazy update's ``O(A·r)``.

Example:
    >>> import torch
    >>> from torchbkb.bandits.batch_selection import select_batch
    >>> Z = torch.eye(3, dtype=torch.float64)                  # three orthogonal arms, r = 3
    >>> V_inv = torch.eye(3, dtype=torch.float64)              # V = I (λ = 1, nothing pulled)
    >>> mean = torch.tensor([0.0, 0.1, 0.2], dtype=torch.float64)
    >>> rls = torch.ones(3, dtype=torch.float64)
    >>> sel = select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=2.5)
    >>> sel.indices.tolist(), sel.rls_start.tolist()             # 1 + 1 <= 2.5 goes on, 1 + 2 > 2.5 ends
    ([2, 1], [1.0, 1.0])
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from torchbkb.bandits.batch_stop_rule import (
    UNBOUNDED_PICKS, check_batch_limits, level_after, picks_to_stop, stop_rule_stalls
)
from torchbkb.errors import InputDataError, check_finite

__all__ = ["UNBOUNDED_PICKS", "BatchSelection", "check_batch_limits", "picks_to_stop", "select_batch",
           "stop_rule_stalls"]

_WINDOW, _MAX_WINDOW = 8, 1024  # repeated picks looked ahead at once (grows while an arm keeps winning)


class BatchSelection(NamedTuple):
    """Result of :func:`select_batch`.

    Attributes:
        indices: `(B,)` long, the arms of the batch in pick order (repeats allowed).
        rls_start: `(B,)` ``σ̃²_fb`` of the picks at the batch start (RLS scale).
        rls_in_batch: `(B,)` ``σ̃²_{t-1}`` of each pick at the moment it was picked (after the previous
            hallucinations) -- what GP-BUCB-style rules and diagnostics need.
        ucb_evaluations: number of arm UCBs recomputed after the batch start (lazy: usually ``<< A·B``).
        V_inv: `(r, r)` ``V⁻¹`` with all picks but the last hallucinated in.
    """

    indices: torch.Tensor
    rls_start: torch.Tensor
    rls_in_batch: torch.Tensor
    ucb_evaluations: int
    V_inv: torch.Tensor


def select_batch(
    Z: torch.Tensor,
    mean: torch.Tensor,
    rls: torch.Tensor,
    V_inv: torch.Tensor,
    alpha: float,
    batch_bound: float,
    max_batch_size: int | None = None,
    lazy: bool = True,
    stop_rule: str = "sum",
    *,
    validate: bool = True,
    chunk_size: int | None = None,
) -> BatchSelection:
    """Select one BBKB batch over embedded candidates.

    Args:
        Z: `(A, r)` embedded candidates ``z(a)`` (any float dtype; scoring runs in it), or anything that
            reads like it -- ``shape``, ``dtype``, ``device``, ``Z[idx]`` for a long tensor ``idx`` -- such
            as :class:`~torchbkb.bandits.kernel_rows.FeatureRows`, which computes the few rows a batch reads
            on demand (with ``validate=False``).
        mean: `(A,)` frozen mean ``μ̃_fb``.
        rls: `(A,)` RLS-scale variances ``σ̃²_fb`` at the batch start.
        V_inv: `(r, r)` ``V_fb⁻¹`` at the batch start (not modified).
        alpha: the multiplier ``α̃`` of ``σ̃`` in the UCB (``C̃·β̃`` for the theory; a user float as is).
        batch_bound: ``C̃ >= 1``.
        max_batch_size: optional cap on the batch length. Without it, a pick whose ``σ̃²_fb`` is 0, or so
            small that the stop rule would need more than :data:`UNBOUNDED_PICKS` (2²⁴) further picks of it,
            is the batch's last (with a cap the batch runs to the cap then; ``σ̃²_fb = 0`` always ends it).
        lazy: recompute only the arms that could win (``False``: recompute all, for testing).
        stop_rule: ``"sum"`` -- BBKB, stop once ``1 + Σ σ̃²_fb(x_s) > C̃``; ``"product"`` -- GP-BUCB,
            stop once ``Π (1 + σ̃²_fb(x_s)) > C̃``.
        validate: check shapes, finiteness and ranges (``False`` skips the ``O(A·r)`` scans; for callers
            such as :class:`~torchbkb.BBKB` whose inputs come from their own posterior).
        chunk_size: read at most this many rows of ``Z`` at once (memory ``O(A + chunk_size·(r + J))`` with a
            ``Z`` that computes rows on demand); ``None`` reads all the rows a step needs at once.

    Returns:
        A :class:`BatchSelection`.
    """
    if validate:
        _check(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size, stop_rule)
    dt, work, dev = Z.dtype, V_inv.dtype, Z.device
    alpha = float(alpha)
    state = _InBatch(Z, mean.to(dt), rls.to(dt), V_inv, alpha, chunk_size)
    rls0, V_t = state.rls0, state.V_t
    # the loop's bookkeeping (argmax, which arms to refresh, scalar reads) runs on host arrays: one small NumPy call
    # costs a fraction of a tensor operation's dispatch; the arithmetic stays in torch on Z's device
    ucb = host_array(state.mean + alpha * rls0.clamp_min(0.0).sqrt())  # stale upper bounds, exact now
    mean_h, rls0_h = state.mean_h, state.rls0_h
    cur_rls = rls0_h.copy()
    as_dt = rounding_to(dt)  # a threshold rounded to the scores' dtype, as a tensor comparison rounds it
    picks: list[int] = []
    in_batch: list[float] = []
    level = 1.0  # 1 + Σ σ̃²_fb   or   Π (1 + σ̃²_fb)
    evaluations = 0
    window = _WINDOW
    while True:
        i = int(ucb.argmax())  # lowest index among ties; exact (every arm that could beat it was refreshed)
        s0 = float(rls0_h[i])
        if s0 <= 0.0:
            # σ̃²_fb of the pick is 0 (to rounding): the stop rule would not move and every later pick would
            # be this arm again -- end the batch with it
            n_allowed = 1
        else:
            n_allowed = picks_to_stop(level, s0, batch_bound, stop_rule)
            if n_allowed is None:  # more than UNBOUNDED_PICKS: only a cap can end the batch later than now
                n_allowed = 1 if max_batch_size is None else max_batch_size - len(picks)
        if max_batch_size is not None:
            n_allowed = min(n_allowed, max_batch_size - len(picks))
        z = Z[i : i + 1][0]  # (r,)
        z = z if z.dtype == work else z.to(work)
        u = V_t @ z
        s = float(z @ u)
        rls_i = float(cur_rls[i])
        run = 1
        if n_allowed > 1 and picks and picks[-1] == i:  # i again: how many more times, hallucinated 1, 2, ... times?
            # (only once an arm repeats: when picks alternate between arms, looking ahead costs more than it saves)
            J = min(n_allowed - 1, window)
            wins, seen = state.run_length(i, u, s, J, ucb, rls_i, lazy)
            evaluations += seen
            run += wins
            window = min(4 * window, _MAX_WINDOW) if wins == J else _WINDOW
        # σ̃²_t of each pick of the run
        in_batch.extend(max(rls_i - j / (1.0 + j * s) * (s * s), 0.0) for j in range(run))
        picks.extend([i] * run)
        level = level_after(level, s0, run, stop_rule)
        done = run == n_allowed  # the stop rule (or the cap) ends the batch with the run's last pick
        k = run - 1 if done else run  # picks hallucinated: all but the batch's last one
        if k > 0:  # hallucinate x_i k times: Sherman-Morrison with k z zᵀ, O(r²)
            g = k / (1.0 + k * s)
            state.hallucinate(u, g)
        if done:
            break
        # lazy UCB: refresh every arm whose stale UCB reaches x_i's new UCB (closed form: σ̃²_t(x_i) - g s²;
        # x_i itself is among them, its stale UCB being its old one) -- the argmax is then exact, unless
        # rounding left every refreshed UCB below that level: then the arms between are refreshed too
        # <= the stale one
        ucb_i_new = min(float(mean_h[i]) + alpha * math.sqrt(max(rls_i - g * (s * s), 0.0)), float(ucb[i]))
        idx = np.flatnonzero(ucb >= as_dt(ucb_i_new)) if lazy else np.arange(ucb.size)  # (M,)
        top = state.refresh_into(idx, cur_rls, ucb)
        evaluations += idx.size
        if lazy and top < ucb_i_new:
            more = np.flatnonzero((ucb >= as_dt(top)) & (ucb < as_dt(ucb_i_new)))
            state.refresh_into(more, cur_rls, ucb)
            evaluations += more.size
    picked = torch.tensor(picks, dtype=torch.long, device=dev)
    return BatchSelection(
        indices=picked,
        rls_start=rls0[picked].to(rls.dtype),
        rls_in_batch=torch.tensor(in_batch, dtype=rls.dtype, device=dev),
        ucb_evaluations=evaluations,
        V_inv=V_t,
    )


def host_array(t: torch.Tensor) -> np.ndarray:
    """``t`` as a NumPy array on the host: a view of a CPU tensor (no copy), a copy of a device one."""
    t = t.detach() if t.requires_grad else t
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: its values, exactly, in float32
        t = t.float()
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


def rounding_to(dtype: torch.dtype):
    """``x -> x`` rounded to ``dtype`` (a Python float in, a host scalar out), as a tensor comparison with a Python
    scalar rounds it."""
    if dtype == torch.bfloat16:
        return lambda x: float(torch.tensor(x, dtype=dtype))
    return np.dtype(str(dtype).removeprefix("torch.")).type


class _InBatch:
    """The in-batch state of :func:`select_batch`: the candidates ``Z``, the frozen mean, ``σ̃²_fb``, ``V_fb⁻¹``
    and its hallucinated copy ``V_t``, and the rank-one terms hallucinated so far (directions ``u_j`` as the first ``b``
    columns of an `(r, r)` buffer in ``Z``'s dtype, their coefficients ``c_j``)."""

    def __init__(self, Z, mean: torch.Tensor, rls0: torch.Tensor, V_0: torch.Tensor, alpha: float, chunk: int | None):
        r, dt = Z.shape[1], Z.dtype
        self.Z, self.mean, self.rls0, self.V_0, self.alpha, self.chunk = Z, mean, rls0, V_0, alpha, chunk
        self.V_t = V_0.clone()
        self.U_buf = torch.empty((r, r), dtype=dt, device=Z.device)
        self.coef_buf = torch.empty((r,), dtype=dt, device=Z.device)
        self.b = 0  # hallucinated runs so far (one rank-one term each)
        self.mean_h, self.rls0_h = host_array(mean), host_array(rls0)
        self.V_0_rows = V_0 if V_0.dtype == dt else V_0.to(dt)
        self.on_host = Z.device.type == "cpu" and dt != torch.bfloat16  # the buffers' NumPy views are theirs
        if self.on_host:
            self.U_h, self.coef_h = self.U_buf.numpy(), self.coef_buf.numpy()

    def hallucinate(self, u: torch.Tensor, g: float) -> None:
        """``V_t⁻¹ -= g u uᵀ`` in place (``V_t`` is this state's copy), the direction kept while ``b < r``."""
        self.V_t.addr_(u, u, alpha=-g)
        if self.b < self.U_buf.shape[0]:  # past r runs the direct form is cheaper and the directions are not needed
            if self.on_host:  # written through NumPy views of the buffers: no tensor dispatch
                self.U_h[:, self.b], self.coef_h[self.b] = host_array(u), g
            else:
                self.U_buf[:, self.b], self.coef_buf[self.b] = u, g
        self.b += 1

    def refresh(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Current RLS variance and UCB of the arms ``idx`` (a long tensor): ``σ̃²_fb - Σ_j c_j (zᵀu_j)²`` while
        at most ``r`` runs were hallucinated (cost ``|idx|·r·b``), else ``σ̃²_fb - zᵀV_0⁻¹z + zᵀV_t⁻¹z``
        (cost ``|idx|·r²``); rows are read ``chunk`` at a time when given."""
        if self.chunk is None or idx.numel() <= self.chunk:
            return self.refresh_rows(self.Z[idx], idx)
        parts = [self.refresh_rows(self.Z[p], p) for p in idx.split(int(self.chunk))]
        return torch.cat([r for r, _ in parts]), torch.cat([u for _, u in parts])

    def refresh_into(self, idx: np.ndarray, rls_out: np.ndarray, ucb_out: np.ndarray) -> float:
        """:meth:`refresh` of the arms ``idx`` (host indices `(M,)`), written into the host arrays ``rls_out`` and
        ``ucb_out`` `(A,)`; returns the largest refreshed UCB (``-inf`` for none). The drops are computed in torch,
        the elementwise rest on the host (the same IEEE operations in the same dtype)."""
        if idx.size == 0:
            return -math.inf
        t_idx = self.indices(idx)
        if self.Z.dtype == torch.bfloat16:  # a dtype NumPy lacks: the elementwise part in torch too
            rls_m, ucb_m = self.refresh(t_idx)
            ucb = host_array(ucb_m)
            rls_out[idx], ucb_out[idx] = host_array(rls_m), ucb
            return float(ucb.max())
        if self.chunk is None or idx.size <= self.chunk:
            drop = self.drops(self.Z[t_idx])
        else:
            drop = torch.cat([self.drops(self.Z[p]) for p in t_idx.split(int(self.chunk))])
        rls = self.rls0_h[idx] - host_array(drop)
        np.maximum(rls, 0.0, out=rls)
        ucb = self.mean_h[idx] + self.alpha * np.sqrt(rls)
        rls_out[idx], ucb_out[idx] = rls, ucb
        return float(ucb.max())

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
        return t if self.on_host else t.to(self.Z.device)

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
            u: `(r,)` ``V_t⁻¹ z_i`` (``V_t`` holds the inverse) in the work dtype; ``s``: ``z_iᵀ u``.
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
        if lazy:
            idx_h = np.flatnonzero(ucb >= ucb.dtype.type(float(ucb_i[-1])))
            idx_h = idx_h[idx_h != i]
        else:
            idx_h = np.concatenate([np.arange(i), np.arange(i + 1, ucb.size)])
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


def _check(Z, mean, rls, V_inv, alpha, batch_bound, max_batch_size, stop_rule):
    if not isinstance(Z, torch.Tensor) or Z.dim() != 2:
        raise InputDataError(f"Z: expected shape (A, r), got "
                             f"{tuple(Z.shape) if isinstance(Z, torch.Tensor) else type(Z).__name__}")
    A, r = Z.shape
    if A == 0:
        raise InputDataError("Z: expected at least one candidate, got A = 0")
    for name, t in (("mean", mean), ("rls", rls)):
        if not isinstance(t, torch.Tensor) or t.shape != (A,):
            raise InputDataError(f"{name}: expected shape ({A},), got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        check_finite(t, name)
    if not isinstance(V_inv, torch.Tensor) or V_inv.shape != (r, r):
        raise InputDataError(f"V_inv: expected shape ({r}, {r}), got "
                             f"{tuple(V_inv.shape) if isinstance(V_inv, torch.Tensor) else type(V_inv).__name__}")
    check_finite(Z, "Z")
    if bool((rls < 0).any()):
        raise InputDataError(f"rls: expected non-negative variances, got min {float(rls.min()):.3e}")
    if not float(alpha) >= 0:
        raise InputDataError(f"alpha: expected alpha >= 0, got {alpha!r}")
    if not float(batch_bound) >= 1.0:
        raise InputDataError(f"batch_bound: expected C̃ >= 1, got {batch_bound!r}")
    check_batch_limits(batch_bound, max_batch_size)
    if stop_rule not in ("sum", "product"):
        raise InputDataError(f"stop_rule: expected 'sum' or 'product', got {stop_rule!r}")
    return A, r
