"""The arms a bandit may no longer select: its ``excluded`` mask and the reasons in ``exclusions``.

An arm is excluded by :meth:`ExcludedArms.exclude`, by ``discard(..., exclude=True)`` (what
:func:`torchbkb.run` does for points whose objective kept failing) or by a direct write of the ``excluded`` mask,
which ``ask`` takes in before its next selection; :meth:`ExcludedArms.readmit` lets arms back. The reasons live in
``exclusions`` and in checkpoints.

Example:
    >>> import torch
    >>> from torchbkb.bandits.baselines import Random
    >>> bandit = Random(torch.rand(10, 2), seed=0)
    >>> bandit.exclude([3, 1], reason="broken sensor")
    [1, 3]
    >>> bandit.readmit([3]), bandit.exclusions, int(bandit.excluded.sum())
    ([3], {1: 'broken sensor'}, 1)
"""

from __future__ import annotations

import torch

from torchbkb.errors import InputDataError, TorchBKBError

__all__ = ["ExcludedArms"]


class ExcludedArms:
    """The excluded arms of a :class:`~torchbkb.bandits.base.Bandit` (mixed into it, which owns ``excluded``,
    ``exclusions`` and the arms)."""

    def exclude(self, indices: torch.Tensor, reason: str | None = None) -> list[int]:
        """Exclude the arms ``indices`` `(k,)` from every later selection, with ``reason`` (default ``"excluded"``)
        kept in :attr:`exclusions` and checkpoints; returns them, ascending. :meth:`readmit` lets them back. Arms
        still pending stay pending (:meth:`discard` drops them)."""
        idx, ids = self._check_indices(indices, "indices")
        if self._write_exclusions(idx, ids, reason):
            self._exclusions_added()
        return sorted(set(ids))

    def readmit(self, indices: torch.Tensor | None = None) -> list[int]:
        """Let the excluded arms ``indices`` `(k,)` (``None``: all) be selected again, e.g. once the cause of their
        failures is fixed; returns them, ascending."""
        self._sync_exclusions()
        if indices is None:
            idx = self.excluded.nonzero().squeeze(1)
        else:
            idx, ids = self._check_indices(indices, "indices")
            bad = [a for a in ids if not bool(self.excluded[a])]
            if bad:
                raise InputDataError(f"indices: expected excluded arms (excluded: {sorted(self.exclusions)}), got arms "
                                     f"{bad} that are not")
        arms = sorted(set(idx.tolist()))
        self.excluded[idx] = False
        for a in arms:
            self.exclusions.pop(a, None)
        self._excluded_seen = (self.excluded, self.excluded._version)
        return arms

    # ------------------------------------------------------------------ internals
    def _write_exclusions(self, idx: torch.Tensor, ids: list[int], reason: str | None) -> bool:
        """Exclude the checked arms ``idx`` (``ids`` on the host) with ``reason``; whether any was not excluded."""
        self._sync_exclusions()
        added = any(a not in self.exclusions for a in ids)
        self.excluded[idx] = True
        for a in ids:
            self.exclusions[a] = "excluded" if reason is None else str(reason)
        self._excluded_seen = (self.excluded, self.excluded._version)
        return added

    def _allowed(self) -> torch.Tensor:
        """`(k,)` indices of the arms not excluded; an error when there is none."""
        allowed = (~self.excluded).nonzero().squeeze(1)
        if allowed.numel() == 0:
            raise TorchBKBError(f"{type(self).__name__}: every one of the {self.num_arms} arms was excluded (they all "
                                f"kept failing)")
        return allowed

    def _sync_exclusions(self) -> None:
        """:attr:`exclusions` brought in line with :attr:`excluded` when that was written directly or replaced since
        the last sync (one host read then, none otherwise); an error, changing nothing, for a tensor of another
        shape, dtype or device."""
        ex, (seen, version) = self.excluded, self._excluded_seen
        if ex is seen and ex._version == version:
            return
        A, dev = self.num_arms, self.arms.device
        if not isinstance(ex, torch.Tensor) or ex.dtype != torch.bool or ex.shape != (A,) or ex.device != dev:
            got = (f"{ex.dtype} of shape {tuple(ex.shape)} on {ex.device}" if isinstance(ex, torch.Tensor)
                   else type(ex).__name__)
            raise InputDataError(f"excluded: expected a bool tensor of shape ({A},) on {dev}, got {got}")
        arms = ex.nonzero().squeeze(1).tolist()
        added = any(a not in self.exclusions for a in arms)
        self.exclusions = {a: self.exclusions.get(a, "excluded") for a in arms}
        self._excluded_seen = (ex, ex._version)
        if added:
            self._exclusions_added()

    def _exclusions_added(self) -> None:
        """Hook: arms were excluded by a direct write of :attr:`excluded`, perhaps after the last update (nothing
        here)."""

    def _mask_excluded(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` `(A,)` with the excluded arms at ``-inf`` (so no argmax picks them), or ``scores`` itself when no
        arm is (callers only read it). No host read: :attr:`exclusions`, which ``ask`` syncs before a selection, says
        whether any arm is excluded, and an error says so if every arm is."""
        if not self.exclusions:
            return scores
        self._allowed()
        return scores.masked_fill(self.excluded, -torch.inf)
