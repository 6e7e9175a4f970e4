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
from torchbkb.bandits.host_in_batch import HostInBatch, host_rows
from torchbkb.bandits.tensor_in_batch import TensorInBatch
from torchbkb.errors import InputDataError, check_finite
from torchbkb.utils.host_copy import host_array

__all__ = ["UNBOUNDED_PICKS", "BatchSelection", "check_batch_limits", "picks_to_stop", "select_batch",
           "stop_rule_stalls"]

_WINDOW, _MAX_WINDOW = 8, 1024  # repeated picks looked ahead at once (grows while an arm keeps winning)
_VECTOR_RUN = 16  # runs at least this long get their in-batch variances in one NumPy pass


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
    dt, dev = Z.dtype, Z.device
    alpha = float(alpha)
    mean0, rls0 = mean.to(dt), rls.to(dt)
    state = in_batch_state(Z, mean0, rls0, V_inv, alpha, chunk_size)
    # the loop's bookkeeping (argmax, which arms to refresh, scalar reads) runs on host arrays: one small NumPy call
    # costs a fraction of a tensor operation's dispatch. The stale upper bounds, exact now, are formed in torch as the
    # scores were (torch's vectorized float32 square root may round unlike NumPy's)
    ucb = host_array(mean0 + alpha * rls0.clamp_min(0.0).sqrt())
    mean_h, rls0_h = state.mean_h, state.rls0_h
    cur_rls = rls0_h.copy()
    as_dt = rounding_to(dt)  # a threshold rounded to the scores' dtype, as a tensor comparison rounds it
    picks: list[int] = []
    in_batch: list[float] = []
    level = 1.0  # 1 + Σ σ̃²_fb   or   Π (1 + σ̃²_fb)
    evaluations = 0
    window = _WINDOW
    refreshed: np.ndarray | None = None  # (A,) scratch mask of the rare branch below
    i = int(ucb.argmax())  # lowest index among ties
    while True:
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
        u, s = state.direction(i)
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
        if run == 1:
            in_batch.append(max(rls_i, 0.0))
            picks.append(i)
        else:
            in_batch.extend(_in_run_variances(rls_i, s, run))
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
        idx = (ucb >= as_dt(ucb_i_new)).nonzero()[0] if lazy else np.arange(ucb.size)  # (M,) ascending
        top, j = state.refresh_into(idx, cur_rls, ucb)
        evaluations += idx.size
        # the next argmax, exact: every arm not refreshed is strictly below the refreshed maximum, so it is the
        # first refreshed arm at that maximum (the lowest index among ties)
        i = int(idx[j])
        if lazy and top < ucb_i_new:  # rare: rounding put x_i's refreshed UCB below its closed form
            more = ((ucb >= as_dt(top)) & (ucb < as_dt(ucb_i_new))).nonzero()[0]
            if refreshed is None:
                refreshed = np.zeros(ucb.size, dtype=bool)
            refreshed[idx] = True  # not the arms just refreshed (those at top); a mask, not np.setdiff1d's sort
            more = more[~refreshed[more]]
            refreshed[idx] = False
            state.refresh_into(more, cur_rls, ucb)
            evaluations += more.size
            i = int(ucb.argmax())
    picked = torch.tensor(picks, dtype=torch.long, device=dev)
    return BatchSelection(
        indices=picked,
        rls_start=rls0[picked].to(rls.dtype),
        rls_in_batch=torch.tensor(in_batch, dtype=rls.dtype, device=dev),
        ucb_evaluations=evaluations,
        V_inv=state.V_inv(),
    )


def _in_run_variances(rls_i: float, s: float, run: int) -> list[float]:
    """``σ̃²_t`` of each pick of a run of ``run`` picks of one arm, as Python floats:
    ``max(σ̃² - j s² / (1 + j s), 0)`` for ``j < run`` (``j`` hallucinations of it before); a long run in one NumPy
    pass of the same operations (IEEE float64 either way: the same values)."""
    if run < _VECTOR_RUN:
        return [max(rls_i - j / (1.0 + j * s) * (s * s), 0.0) for j in range(run)]
    js = np.arange(run, dtype=np.float64)
    return np.maximum(rls_i - js / (1.0 + js * s) * (s * s), 0.0).tolist()


def rounding_to(dtype: torch.dtype):
    """``x -> x`` rounded to ``dtype`` (a Python float in, a host scalar out), as a tensor comparison with a Python
    scalar rounds it."""
    if dtype == torch.bfloat16:
        return lambda x: float(torch.tensor(x, dtype=dtype))
    return np.dtype(str(dtype).removeprefix("torch.")).type


def in_batch_state(Z, mean: torch.Tensor, rls0: torch.Tensor, V_inv: torch.Tensor, alpha: float,
                   chunk: int | None) -> HostInBatch | TensorInBatch:
    """The loop's state: on NumPy views when every input is on the CPU and ``Z``'s rows can be read there
    (:func:`~torchbkb.bandits.host_in_batch.host_rows`), else in torch on ``Z``'s device."""
    rows = host_rows(Z) if V_inv.device.type == "cpu" and mean.device.type == "cpu" else None
    if rows is not None:
        return HostInBatch(rows, mean, rls0, V_inv, alpha, chunk)
    return TensorInBatch(Z, mean, rls0, V_inv, alpha, chunk)


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
