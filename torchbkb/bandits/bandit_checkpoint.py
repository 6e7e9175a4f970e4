"""A bandit's checkpoint: :meth:`~BanditCheckpoint.state_dict` and a validated, all-or-nothing
:meth:`~BanditCheckpoint.load_state_dict`, shared by every :class:`~torchbkb.bandits.base.Bandit`.

A checkpoint holds the ask/tell record (counts, reward sums, history, pending and told arms, exclusions, the
generator) and the algorithm's own part (``_algorithm_state``/``_load_algorithm_state``, which subclasses
override). Loading checks the class, the arm count and the fingerprint (arms, kernel, settings), upgrades an older
format in one place (:func:`~torchbkb.bandits.checkpoint_formats.upgraded`), checks every field, and rolls back
when the algorithm's part fails: a failed load raises :class:`~torchbkb.errors.CheckpointError` and changes nothing.

Example:
    >>> import torch
    >>> from torchbkb.bandits.baselines import Random
    >>> arms = torch.rand(10, 2)
    >>> a, b = Random(arms, seed=0), Random(arms, seed=0)
    >>> a.tell(a.ask(), torch.tensor([0.5]))
    >>> b.load_state_dict(a.state_dict())
    >>> b.t, bool((b.counts == a.counts).all())
    (1, True)
    >>> Random(torch.rand(10, 2), seed=0).load_state_dict(a.state_dict())   # other arms: refused
    Traceback (most recent call last):
    ...
    torchbkb.errors.CheckpointError: ...
"""

from __future__ import annotations

import copy
from typing import Any

from torchbkb.bandits.checkpoint_formats import upgraded
from torchbkb.bandits.fingerprint import bandit_fingerprint, check_fingerprint
from torchbkb.bandits.saved_state import check_algorithm_state, check_saved_state
from torchbkb.errors import CheckpointError

__all__ = ["BanditCheckpoint"]


class BanditCheckpoint:
    """The checkpoint methods of :class:`~torchbkb.bandits.base.Bandit` (which owns every attribute they read)."""

    #: algorithm fields whose floating tensors mark values not computed with NaN (others are refused with NaN)
    nan_fields: tuple[str, ...] = ()

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint must match to be loaded here: arms, kernel, settings
        (:func:`~torchbkb.bandits.fingerprint.bandit_fingerprint`; computed once, the arms are fixed)."""
        if self._fingerprint is None:
            self._fingerprint = bandit_fingerprint(self)
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume with an identical continuation (plain Python + tensors)."""
        self._settle()  # a deferred update draws from the generator: run it before anything is saved
        self._sync_exclusions()  # a directly written mask, taken in as the next ask would
        return {
            "class": type(self).__name__,
            "num_arms": self.num_arms,
            "fingerprint": copy.deepcopy(self.fingerprint()),
            "generator": self.generator.get_state(),
            "counts": self.counts.cpu().clone(),
            "reward_sums": self.reward_sums.cpu().clone(),
            "t": self.t,
            "batch_id": self.batch_id,
            "history": copy.deepcopy(self.history),
            "pending": list(self._pending),
            "told": (list(self._told_idx), list(self._told_y)),
            "excluded": self.excluded.cpu().clone(),
            "exclusions": dict(self.exclusions),
            "algorithm": self._algorithm_state(),
        }

    def _settle(self) -> None:
        """Run work deferred to the next ``ask`` now (nothing here; BBKB on a GPU defers its batch-end update)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a bandit built with the same arguments. Every field and the
        :meth:`fingerprint` (arms, kernel, settings) are checked first, and a failure of the algorithm's own part
        rolls back: a failed load (:class:`~torchbkb.errors.CheckpointError`) changes nothing."""
        is_dict = isinstance(state, dict)
        cls, A = (state.get("class"), state.get("num_arms")) if is_dict else (type(state).__name__, None)
        if (not is_dict or not isinstance(cls, str) or cls != type(self).__name__ or type(A) is not int
                or A != self.num_arms):
            got = (cls if isinstance(cls, str) else type(cls).__name__, A if type(A) is int else type(A).__name__)
            raise CheckpointError(f"state: expected a {type(self).__name__} checkpoint over {self.num_arms} arms, got "
                                  f"{got[0]} over {got[1]} arms")
        if "fingerprint" in state:  # absent in checkpoints written before fingerprints
            check_fingerprint(state["fingerprint"], self.fingerprint())
        backup = self.state_dict()
        state = upgraded(state, backup)  # older checkpoints' missing fields, in one place
        check_saved_state(state, self.num_arms)
        check_algorithm_state(state["algorithm"], backup["algorithm"], self.num_arms, nan_fields=self.nan_fields)
        try:
            self._apply_state(state)
        except Exception as e:
            self._apply_state(backup)
            raise CheckpointError(f"state: expected a loadable {type(self).__name__} state, got one that failed with "
                                  f"{type(e).__name__}: {e}") from e

    def _apply_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.counts = state["counts"].to(self.arms.device).clone()
        self.reward_sums = state["reward_sums"].to(self.arms.device).clone()
        self.t = int(state["t"])
        self.batch_id = int(state["batch_id"])
        self.history = copy.deepcopy(state["history"])
        self._pending = list(state["pending"])
        self._told_idx, self._told_y = list(state["told"][0]), list(state["told"][1])
        self.excluded = state["excluded"].to(self.arms.device).clone()
        reasons = state["exclusions"]
        self.exclusions = {int(a): str(reasons.get(a, "excluded")) for a in self.excluded.nonzero().squeeze(1).tolist()}
        self._load_algorithm_state(state["algorithm"])

    def _algorithm_state(self) -> dict[str, Any]:
        return {}

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        pass
