"""What a sketched bandit saves beside the base state, and how it rebuilds its posterior from it.

The dictionary, the slot order of its kernel rows and the blocks they were computed in, the RLS variances the next
resampling draws with, the pruning schedule and the fixed-capacity engine's slots: a resumed bandit rebuilds the
posterior bit for bit and makes the uninterrupted run's choices (``tests/bandits/test_fixed_capacity.py``,
``tests/loop/test_checkpoint.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from torchbkb.bandits.fixed_capacity import MIN_CAPACITY
from torchbkb.errors import check_int

__all__ = ["SketchedCheckpoint"]


class SketchedCheckpoint:
    """The algorithm state of a :class:`~torchbkb.bandits.sketched.SketchedKernelBandit` (mixed into it)."""

    def _algorithm_state(self) -> dict[str, Any]:
        return {
            "dictionary": self.dictionary.cpu().clone(),
            "order": list(self.rows.order),
            "blocks": self.rows.blocks(),
            "beta": self.beta,
            "rls": self.row_posterior.rls.cpu().clone(),
            "scored": None if self.scored_arms is None else self.scored_arms.cpu().clone(),
            "embeddings_computed": self.embeddings_computed,
            "arms_scored_total": self.arms_scored_total,
            "prune": self.pruning.state(),
            "slots": self.engine.m_cap,
            "nonfinite_arms": sorted(self.nonfinite_arms),
        }

    def _load_algorithm_state(self, state: dict[str, Any]) -> None:
        self.rows.reset()
        self._pulled, self.nonfinite_arms = None, {int(a) for a in state["nonfinite_arms"]}
        pulled = [a for a in dict.fromkeys(self.history["index"]) if a not in self.nonfinite_arms]
        self.rows.add_pulled(pulled)  # each row alone, as first computed
        self._clear_posterior()
        self.dictionary = self._long([])
        saved = state["prune"]
        if self.t > 0:  # order/blocks None: an older checkpoint (rows recomputed in one block)
            self.pruning.forced = bool(saved[0])  # the refit takes the scoring path the saved one took
            try:
                # the engine's slots as saved: the same products, the same bits
                self.engine.m_cap = check_int(state.get("slots", self.engine.m_cap), "slots", minimum=MIN_CAPACITY)
                if self._fixed_applies():  # the refit the uninterrupted run made
                    pulled = self._pulled_arms([])
                    self._update_fixed(pulled, self.counts[pulled].to(torch.float64),
                                       state["dictionary"].to(self.arms.device))
                else:
                    self._rebuild(state["dictionary"].to(self.arms.device), order=state["order"],
                                  blocks=state["blocks"])
            finally:
                self.pruning.forced = None
        self.pruning.load(saved)
        scored = state["scored"]
        # the refit above found the same arms; their kernel columns read again, to be sure
        self.row_posterior.restore_scores(state["rls"].to(self.arms.device),
                                          None if scored is None else scored.to(self.arms.device), self.rows.rows())
        self.beta = float(state["beta"])
        self.embeddings_computed = int(state["embeddings_computed"])
        self.arms_scored_total = int(state["arms_scored_total"])
