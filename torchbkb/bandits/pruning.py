"""Skipping the variances of arms that cannot be selected: the UCB bound and when to try it.

A DTC variance never exceeds the prior's (``V ⪰ λ I``, so ``σ̃²(a) <= k(a,a)/λ``), so with a width ``w`` known
before scoring, ``μ̃(a) + w √(k(a,a)/λ)`` bounds the UCB of arm ``a``. An arm whose bound is below
``max_b μ̃(b)`` -- a lower bound of the largest UCB, and of every UCB a batch can reach, since in-batch UCBs
never fall below the mean -- is never the argmax, and its `m × m` quadratic form can be skipped
(:func:`ucb_survivors`). It pays when the bonus at the prior is small next to the spread of the means; when most
arms pass, the attempt (one more pass over the kernel rows for the means alone) is wasted, so
:class:`PruningSchedule` backs off: after an attempt in which more than :data:`PRUNE_MAX_FRACTION` of the arms
passed, the next 1, 2, 4, ... (at most :data:`PRUNE_MAX_BACKOFF`) updates score every arm without trying.

Example:
    >>> import torch
    >>> mean = torch.tensor([0.0, 1.0, 0.2]); bonus = torch.tensor([0.5, 0.5, 0.9])
    >>> ucb_survivors(mean, bonus, torch.zeros(3, dtype=torch.bool), torch.tensor([0])).tolist()
    [0, 1, 2]
    >>> ucb_survivors(mean, 0.5 * bonus, torch.zeros(3, dtype=torch.bool), torch.tensor([], dtype=torch.long)).tolist()
    [1]
    >>> schedule = PruningSchedule()
    >>> schedule.should_attempt(True), schedule.record_attempt(passed=3, total=4), schedule.should_attempt(True)
    (True, False, False)
"""

from __future__ import annotations

import numpy as np
import torch

from torchbkb.utils.host_copy import HOST_DTYPES, host_array

__all__ = ["PRUNE_MAX_BACKOFF", "PRUNE_MAX_FRACTION", "PruningSchedule", "survivor_mask", "ucb_survivors"]

#: arms skipped by the UCB bound are scored anyway when the arms left to score exceed this fraction of ``A``.
PRUNE_MAX_FRACTION = 0.5
#: after a pruning attempt that left most arms to score, up to this many updates score every arm in one pass first.
PRUNE_MAX_BACKOFF = 16


def ucb_survivors(mean: torch.Tensor, bonus: torch.Tensor, excluded: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`(k,)` ascending arms whose UCB bound ``mean + bonus`` reaches the largest mean of the arms not ``excluded``,
    plus the arms ``keep`` (always scored). ``mean``, ``bonus``, ``excluded``: `(A,)`; ``keep``: `(P,)` long. The
    arms of :func:`survivor_mask`, with ``keep`` written into the bound's mask (three passes over the arms fewer); on
    the CPU the same operations through NumPy views (a long pass costs torch several times NumPy's: the same arms)."""
    on_cpu = all(t.device.type == "cpu" for t in (mean, bonus, excluded, keep))  # host_array detaches a graph
    if on_cpu and mean.dtype in HOST_DTYPES and bonus.dtype in HOST_DTYPES:
        m, ex = host_array(mean), host_array(excluded)
        passes = np.greater_equal(m + host_array(bonus), m.max(initial=-np.inf, where=~ex) if ex.any() else m.max())
        passes[host_array(keep)] = True
        return torch.from_numpy(np.flatnonzero(passes))
    return _bound_passes(mean, bonus, excluded).index_fill_(0, keep, True).nonzero().squeeze(1)


def survivor_mask(mean: torch.Tensor, bonus: torch.Tensor, excluded: torch.Tensor, keep: torch.Tensor,
                  keep_valid: torch.Tensor) -> torch.Tensor:
    """:func:`ucb_survivors` as a mask `(A,)` bool, with fixed shapes and no host read (the fixed-capacity update
    takes it as is): ``keep`` `(P,)` may be padded, the arms with ``keep_valid`` `(P,)` always kept."""
    kept = torch.zeros(mean.shape, dtype=torch.long, device=mean.device).index_add_(0, keep, keep_valid.long())
    return _bound_passes(mean, bonus, excluded) | (kept > 0)


def _bound_passes(mean: torch.Tensor, bonus: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
    """`(A,)` bool, the arms whose UCB bound ``mean + bonus`` (computed as the selections compute a UCB) reaches the
    largest mean of the arms not ``excluded``, a lower bound of the largest UCB."""
    return mean + bonus >= mean.masked_fill(excluded, -torch.inf).max()


class PruningSchedule:
    """Whether the next update tries the UCB bound, with exponential back-off after wasted attempts.

    Attributes:
        wait: updates left to score in one pass before the next attempt.
        backoff: the current back-off length (0 after an attempt that paid).
        last_attempt: whether the last update tried (a checkpoint repeats its path).
        forced: while not ``None``, overrides the schedule (set while a checkpoint is replayed).
    """

    def __init__(self):
        self.wait = self.backoff = 0
        self.last_attempt = False
        self.forced: bool | None = None

    def should_attempt(self, width_known: bool) -> bool:
        """Whether this update tries the bound (never without a known width); records the decision."""
        attempt = width_known and (self.wait == 0 if self.forced is None else self.forced)
        if not attempt:
            self.wait = max(self.wait - 1, 0)
        self.last_attempt = attempt
        return attempt

    def record_attempt(self, passed: int, total: int) -> bool:
        """After an attempt in which ``passed`` of ``total`` arms passed: ``True`` if they are few enough to score
        alone (the back-off is reset), ``False`` if every arm should be scored (the back-off doubles)."""
        worth = passed <= PRUNE_MAX_FRACTION * total
        self.backoff = 0 if worth else min(max(2 * self.backoff, 1), PRUNE_MAX_BACKOFF)
        self.wait = self.backoff
        return worth

    def state(self) -> list:
        """``[last_attempt, wait, backoff]`` for a checkpoint."""
        return [self.last_attempt, self.wait, self.backoff]

    def load(self, state) -> None:
        """Restore :meth:`state`'s output."""
        last_attempt, wait, backoff = state
        self.last_attempt, self.wait, self.backoff = bool(last_attempt), int(wait), int(backoff)
