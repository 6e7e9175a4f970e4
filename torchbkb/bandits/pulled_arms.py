"""The arms a sketched bandit has pulled, and the kernel rows they bring: kept on the device and the host.

Every update reads the pulled arms `(p,)` ascending (their counts and sums weigh the refit), and the host keeps them
too (a set and a long tensor), so that an update finds a new pull without reading the device. A newly pulled arm's
kernel row ``k(a, arms)`` is checked for NaN/inf before anything is built on it: on the CPU NumPy scans it as it
arrives (no read); on a device its finiteness is read together with the update's own read (the dictionary drawn, or
the fixed-capacity update's flags). A non-finite row drops the row and its arm before the error is raised, after the
dictionary is drawn either way (the draws are spent alike, on every device and wherever rows are checked).
"""

from __future__ import annotations

import torch

from torchbkb.errors import NumericsError, nonfinite_rows_error
from torchbkb.utils.host_copy import to_device, to_dtype

__all__ = ["PulledArms"]


class PulledArms:
    """The pulled arms of a :class:`~torchbkb.bandits.sketched.SketchedKernelBandit` (mixed into it): ``_pulled``
    `(p,)` on the arms' device, ``_pulled_host`` on the CPU and ``_pulled_set``; ``None``, ``None`` and an empty set
    until found from the counts."""

    def _pulled_arms(self, told: list[int]) -> torch.Tensor:
        """`(p,)` long, the arms pulled so far, ascending; updated on the host after a first pull (in ``told``)."""
        if self._pulled is None:
            pulled = (self.counts > 0).cpu().nonzero().squeeze(1).tolist()  # one read
            self._pulled_set = set(pulled) - self.nonfinite_arms
            self._pulled_set_changed()
        elif any(a not in self._pulled_set for a in told):
            self._pulled_set.update(a for a in told if a not in self.nonfinite_arms)
            self._pulled_set_changed()
        return self._pulled

    def _pulled_set_changed(self) -> None:
        """The host and device copies of ``_pulled_set``, ascending."""
        self._pulled_host = torch.tensor(sorted(self._pulled_set), dtype=torch.long)
        self._pulled = to_device(self._pulled_host, self.arms.device)

    def _add_pulled(self, told: list[int]) -> tuple[list[int], torch.Tensor | bool] | None:
        """Cache the kernel rows of the arms in ``told`` pulled the first time (not those of :attr:`nonfinite_arms`):
        ``(new arms, finite)`` for :meth:`_read_with_rows` (``None`` when no row was added)."""
        known = self.nonfinite_arms
        return self.rows.add_pulled([a for a in told if a not in known] if known else told, check=False)

    def _read_with_rows(self, values: torch.Tensor, added: tuple[list[int], torch.Tensor | bool] | None
                        ) -> torch.Tensor:
        """``values`` `(k,)` (the dictionary's mask, an update's flags) as a CPU tensor, read together with the
        finiteness of the rows ``added`` (:meth:`_add_pulled`): one read. Non-finite rows raise
        (:meth:`_reject_rows`)."""
        if added is None or isinstance(added[1], bool):
            if added is not None and not added[1]:  # scanned on the host already
                self._reject_rows(added[0])
            return values.cpu()
        both = torch.cat([values, to_dtype(added[1], values.dtype).reshape(1)]).cpu()
        if not both.numpy()[-1]:
            self._reject_rows(added[0])
        return both[:-1]

    def _reject_rows(self, arms: list[int]) -> None:
        """Raise the :class:`~torchbkb.errors.NumericsError` of the newly pulled ``arms`` whose kernel rows are not
        finite, after dropping those rows and arms from the pulled set (the arms' counts stay; the others of
        ``arms`` stay pulled, with their rows)."""
        try:
            self.rows.reject_pulled(arms)
        except NumericsError as err:
            self._drop_pulled(err.arms)
            raise

    def _refuse_nonfinite(self) -> None:
        """Raise the :class:`~torchbkb.errors.NumericsError` of the arms just told that were found with NaN/inf
        kernel rows before (:attr:`nonfinite_arms`): the update ran without them, their rewards counted, not fitted."""
        known, told = self.nonfinite_arms, self.last_told_ids
        if known and any(a in known for a in told):
            raise nonfinite_rows_error(sorted({a for a in told if a in known}))

    def _drop_pulled(self, arms) -> None:
        """Take ``arms`` out of the pulled set for good (their kernel rows hold NaN/inf: ``nonfinite_arms``)."""
        self.nonfinite_arms.update(arms)
        if self._pulled is not None and any(a in self._pulled_set for a in arms):
            self._pulled_set.difference_update(arms)
            self._pulled_set_changed()
            self._fixed_pulled = None  # the fixed-capacity engine's padded copy of the old set
