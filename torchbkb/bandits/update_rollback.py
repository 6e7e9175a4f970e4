"""A sketched bandit's update that fails leaves the bandit as it was before the update.

An update that raises a :class:`~torchbkb.errors.NumericsError` -- a kernel row with NaN/inf, found as the rows are
computed, cached or streamed, or a factorization that fails -- first puts back what it wrote: the dictionary's kernel
rows, the DTC state (:class:`~torchbkb.gp.kernel_row_posterior.KernelRowPosterior`), the pruning schedule, the
accuracy check's count and the counters. The arms whose kernel rows the error names are then dropped from the pulled
set, as a check of their rows on arrival drops them, so that a run goes on: the next update fits every pull but
theirs, this batch's included (``tell`` recorded its rewards before the update ran). The dictionary's draws are spent,
as every update that raises spends them (a pulled arm's row is checked after the draw too): every device and every
cache mode goes on with the same draws. Such arms are kept in ``nonfinite_arms`` (and in checkpoints): telling one
again runs the update without it, then raises the same error.

Example:
    >>> import torch
    >>> from torchbkb import BKB
    >>> from torchbkb.errors import NumericsError, nonfinite_rows_error
    >>> from torchbkb.gp.kernels import as_kernel
    >>> arms = torch.linspace(0, 1, 30, dtype=torch.float64).reshape(-1, 1)
    >>> def k(X1, X2):  # NaN between the arms past 0.9 and those below 0.1
    ...     a, b = X1[:, :1], X2[:, 0]
    ...     K = torch.exp(-(a - b) ** 2 / 0.1)
    ...     return K.masked_fill(((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9)), float("nan"))
    >>> kernel = as_kernel(k, diag=lambda X: torch.ones(len(X), dtype=X.dtype))
    >>> bandit = BKB(arms, kernel, noise=0.1, beta=1.0, seed=0, row_cache_bytes=0)  # rows checked as they enter S
    >>> named = []
    >>> for _ in range(40):
    ...     i = bandit.ask()
    ...     try:
    ...         bandit.tell(i, arms[i, 0])
    ...     except NumericsError as err:
    ...         named += err.arms
    ...         bandit.excluded[list(err.arms)] = True  # never these arms again
    >>> sorted(named), bandit.t, all(0.1 <= float(arms[a, 0]) <= 0.9 for a in bandit.dictionary.tolist())
    ([0, 1, 2, 27, 28, 29], 40, True)
"""

from __future__ import annotations

import functools

from torchbkb.bandits.pulled_arms import PulledArms
from torchbkb.errors import NumericsError, nonfinite_rows_error

__all__ = ["UpdateRollback", "rolled_back"]


def rolled_back(update):
    """A bandit's update method that, raising a :class:`~torchbkb.errors.NumericsError`, first restores the state
    it started from (:class:`UpdateRollback`)."""
    @functools.wraps(update)
    def run(self, *args, **kwargs):
        saved = self._update_state()
        try:
            out = update(self, *args, **kwargs)
        except NumericsError as err:
            self._roll_back(saved, err.arms)
            raise
        self._refuse_nonfinite()  # arms told again whose rows were found with NaN/inf: left out, and said so
        return out
    return run


class UpdateRollback(PulledArms):
    """Mixed into :class:`~torchbkb.bandits.sketched.SketchedKernelBandit` (with its pulled arms): what
    :func:`rolled_back` saves and restores."""

    def _update_state(self) -> tuple:
        """What an update writes, as it is now (references: nothing is copied)."""
        return (self.rows.snapshot(), self.row_posterior.snapshot(), self.pruning.state(), self._accuracy.checked,
                self.embeddings_computed, self.arms_scored_total, self._fused_pick)

    def _roll_back(self, saved: tuple, arms: tuple[int, ...]) -> None:
        """Restore :meth:`_update_state`'s ``saved`` and drop ``arms`` (whose rows hold NaN/inf) from the pulled set."""
        rows, post, pruning, self._accuracy.checked, *counters, self._fused_pick = saved
        self.rows.restore(rows)
        self.row_posterior.restore(post)
        self.pruning.load(pruning)
        self.embeddings_computed, self.arms_scored_total = counters
        self.engine.remember(self.dictionary)  # the next fixed-capacity update compares with the kept one
        self._posterior = None
        self._drop_pulled(arms)

    def _raise_nonfinite_scores(self, dictionary: list[int]) -> None:
        """The :class:`~torchbkb.errors.NumericsError` of NaN/inf scores from the rows of the arms ``dictionary``,
        naming those whose rows hold NaN/inf (their rows computed again)."""
        bad = self.rows.nonfinite_rows(dictionary)
        if bad:
            raise nonfinite_rows_error(bad)
        err = NumericsError("kernel: expected finite values k(a, ·), got NaN/inf scores from the dictionary rows")
        err.nonfinite = True
        raise err

