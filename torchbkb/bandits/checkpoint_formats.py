"""Checkpoints written by older versions: the one place that fills in the fields they lack.

A bandit's :meth:`~torchbkb.bandits.base.Bandit.load_state_dict` passes every saved state through
:func:`upgraded` before checking and applying it, so the loaders read each field directly and a field added to a
bandit's state gets its default for older checkpoints here, next to the others.

Example:
    >>> import torch
    >>> from torchbkb import BBKB
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> b = BBKB(torch.rand(20, 1, dtype=torch.float64), GaussianKernel(0.5), noise=0.1, beta=1.0)
    >>> old = b.state_dict()
    >>> del old["algorithm"]["practical_sum"], old["excluded"]
    >>> new = upgraded(old, b.state_dict())
    >>> new["algorithm"]["practical_sum"], bool(new["excluded"].any()), "practical_sum" in old["algorithm"]
    (0.0, False, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["upgraded", "ALGORITHM_DEFAULTS"]

#: Per algorithm field: its value in a checkpoint written before the field existed (from the saved algorithm state).
ALGORITHM_DEFAULTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "practical_sum": lambda saved: 0.0,  # BBKB, GP-BUCB: before the practical width
    "batch_fb": lambda saved: list(saved.get("batch_rls", [])),  # GP-BUCB: before the practical width
    "compactions": lambda saved: 0,  # GP-UCB, GP-BUCB: before repeated pulls were merged
    "compacted_at": lambda saved: 0,
    "prune": lambda saved: (False, 0, 0),  # the sketched bandits: before pruning, every arm was scored
    "scored": lambda saved: None,
    "arms_scored_total": lambda saved: 0,
    "order": lambda saved: None,  # the sketched bandits: before row blocks (rows recomputed in one block)
    "blocks": lambda saved: None,
    "nonfinite_arms": lambda saved: [],  # the kernel bandits: before arms with NaN/inf kernel rows were left out
}


def upgraded(state: Any, reference: dict[str, Any]) -> Any:
    """``state`` with the fields an older version did not write filled in (a new dict; ``state`` is not changed).

    Args:
        state: a saved :meth:`~torchbkb.bandits.base.Bandit.state_dict` (anything else is returned as is, for the
            checks that follow to reject).
        reference: the loading bandit's own current state: only the algorithm fields it has are filled in.

    Returns:
        The state with ``excluded`` (no arm excluded), ``exclusions`` and the missing algorithm fields of
        :data:`ALGORITHM_DEFAULTS` added.
    """
    if not isinstance(state, dict):
        return state
    out = dict(state)
    A = state.get("num_arms")
    if "excluded" not in out and type(A) is int and A >= 0:  # before exclusion existed
        out["excluded"] = torch.zeros(A, dtype=torch.bool)
    out.setdefault("exclusions", {})
    saved = out.get("algorithm")
    if isinstance(saved, dict):
        saved = dict(saved)
        for key, default in ALGORITHM_DEFAULTS.items():
            if key in reference.get("algorithm", {}) and key not in saved:
                saved[key] = default(saved)
        out["algorithm"] = saved
    return out
