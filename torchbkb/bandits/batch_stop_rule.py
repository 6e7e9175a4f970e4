"""When a BBKB / GP-BUCB batch ends: the stop rule on the picks' batch-start variances, and the batch limits.

A batch ends with the first pick for which ``1 + Σ_{s in batch} σ̃²_fb(x_s) > C̃`` (``"sum"``, BBKB,
001 Algorithm 1) or ``Π (1 + σ̃²_fb(x_s)) > C̃`` (``"product"``, GP-BUCB), or at ``max_batch_size``.
Repeated picks of one arm move the rule in closed form (:func:`level_after`), so a run of picks is counted
without looping over it (:func:`picks_to_stop`). :func:`sum_rule_end` is the device loop's ``"sum"`` rule, pick by
pick in the device's arithmetic, for picks read back from the device.

Example:
    >>> picks_to_stop(1.0, 0.4, 2.0, "sum")           # 1 + 0.4 + 0.4 <= 2, the third pick passes 2
    3
    >>> check_batch_limits(2.0, None)
    (2.0, None)
    >>> sum_rule_end([0.4, 0.4, 0.4, 0.4], 1.0, 2.0)     # the third pick passes 2
    (2, 2.2)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torchbkb.errors import InputDataError

__all__ = ["UNBOUNDED_PICKS", "check_batch_limits", "level_after", "picks_to_stop", "stop_rule_stalls",
           "sum_rule_end", "HOST_RULE_DTYPES"]

# a stop rule that needs more picks of one arm than this cannot end a batch that anyone evaluates (σ̃²_fb of
# the arm ≈ 0 next to C̃): without max_batch_size the batch ends with that pick, as for σ̃²_fb = 0
UNBOUNDED_PICKS = 2**24


def stop_rule_stalls(level: float, s0: float, batch_bound: float, stop_rule: str = "sum") -> bool:
    """Whether picks of an arm with ``σ̃²_fb = s0`` cannot end the batch within :data:`UNBOUNDED_PICKS` picks.

    Args:
        level: the rule's current value, ``1 + Σ σ̃²_fb`` (``"sum"``) or ``Π (1 + σ̃²_fb)`` (``"product"``).
        s0: the arm's batch-start variance (RLS scale).
        batch_bound: ``C̃``.
        stop_rule: ``"sum"`` or ``"product"``.

    Returns:
        ``True`` for ``s0 <= 0`` or ``s0 ≈ 0`` next to ``C̃ - level``.

    Example:
        >>> from torchbkb.bandits.batch_stop_rule import stop_rule_stalls
        >>> stop_rule_stalls(1.0, 0.5, 2.0), stop_rule_stalls(1.0, 1e-30, 2.0)
        (False, True)
        >>> stop_rule_stalls(1.0, 0.0, 2.0, "product")
        True
    """
    return s0 <= 0.0 or picks_to_stop(level, s0, batch_bound, stop_rule) is None


#: the dtypes whose arithmetic :func:`sum_rule_end` repeats on the host
HOST_RULE_DTYPES = {torch.float64: float, torch.float32: np.float32}


def sum_rule_end(rls_start, level: float, batch_bound: float, dtype: torch.dtype = torch.float64,
                 stall: bool = True) -> tuple[int | None, float]:
    """The ``"sum"`` rule over consecutive picks, as the device loop's done flag
    (:func:`~torchbkb.bandits.device_batch.pick_step`) computes it in ``dtype`` (a key of
    :data:`HOST_RULE_DTYPES`): a pick with ``σ̃²_fb = s`` ends the batch when the level passes ``C̃`` with it or,
    with ``stall`` (no cap), the rule stalls before it (``C̃ - level >= UNBOUNDED_PICKS · max(s, 0)``, or ``s`` does
    not move the level in ``dtype``: every ``s <= 0`` stalls); without ``stall`` (a cap ends the batch later) when
    ``s <= 0``.

    Args:
        rls_start: the picks' batch-start variances, in order (floats holding values of ``dtype``).
        level: the level before them (``1`` at a batch's start).
        batch_bound: ``C̃``.

    Returns:
        ``(j, level)``: the position of the batch's last pick among them (``None``: the batch goes on) and the
        level after it (after them all).
    """
    f = HOST_RULE_DTYPES[dtype]
    C, lvl, zero, unbounded = f(batch_bound), f(level), f(0.0), f(UNBOUNDED_PICKS)
    for j, s in enumerate(rls_start):
        s0 = f(s)
        raised = lvl + s0
        stalls = ((C - lvl) >= unbounded * max(s0, zero) or raised <= lvl) if stall else s0 <= zero
        lvl = raised
        if lvl > C or stalls:
            return j, float(lvl)
    return None, float(lvl)


def check_batch_limits(batch_bound: float, max_batch_size: int | None = None) -> tuple[float, int | None]:
    """Validate BBKB/GP-BUCB's batch limits: a finite ``C̃ >= 1`` and ``None`` or an integer ``>= 1``.

    Returns:
        ``(C̃, max_batch_size)`` as ``(float, int | None)``.
    """
    try:
        C = float(batch_bound)
    except (TypeError, ValueError):
        raise InputDataError(f"batch_bound: expected a float C̃ >= 1, got {batch_bound!r}") from None
    if not 1.0 <= C < math.inf:
        raise InputDataError(f"batch_bound: expected a finite C̃ >= 1, got {batch_bound!r}")
    if (max_batch_size is not None
        and (isinstance(max_batch_size, bool) or int(max_batch_size) != max_batch_size or int(max_batch_size) < 1)):
        raise InputDataError(f"max_batch_size: expected an integer >= 1 or None, got {max_batch_size!r}")
    return C, None if max_batch_size is None else int(max_batch_size)


def level_after(level: float, s0: float, n: int, stop_rule: str) -> float:
    """The stop rule's level after ``n`` more picks of an arm with ``σ̃²_fb = s0``: ``level + n·s0`` (sum)
    or ``level·(1 + s0)ⁿ`` (product)."""
    return level + n * s0 if stop_rule == "sum" else level * (1.0 + s0) ** n


def picks_to_stop(level: float, s0: float, bound: float, stop_rule: str) -> int | None:
    """Number ``n >= 1`` of further picks of an arm with ``σ̃²_fb = s0 > 0`` after which the stop rule ends
    the batch: the first ``n`` with ``level_after(level, s0, n) > C̃``; ``None`` when that is more than
    :data:`UNBOUNDED_PICKS` (σ̃²_fb ≈ 0 next to ``C̃``) or when a pick does not move the level in float64 (the
    rule stalls: at a level of exactly ``C̃`` no count of picks would pass it)."""
    if stop_rule == "sum":
        return _sum_picks_to_stop(level, s0, bound)
    if level * (1.0 + s0) <= level:
        return None
    guess = math.log(bound / level) / math.log1p(s0) if bound > level else 0.0
    if not guess < UNBOUNDED_PICKS:
        return None
    n = max(1, int(guess) + 1)  # then corrected for rounding
    while n > 1 and level_after(level, s0, n - 1, stop_rule) > bound:
        n -= 1
    while level_after(level, s0, n, stop_rule) <= bound:
        n += 1
    return n


def _sum_picks_to_stop(level: float, s0: float, bound: float) -> int | None:
    """:func:`picks_to_stop` for the ``"sum"`` rule, written out (BBKB's host loop calls it at every pick)."""
    if level + s0 <= level:
        return None
    guess = (bound - level) / s0
    if not guess < UNBOUNDED_PICKS:
        return None
    n = max(1, int(guess) + 1)
    while n > 1 and level + (n - 1) * s0 > bound:
        n -= 1
    while level + n * s0 <= bound:
        n += 1
    return n
