"""``History``: what a :func:`torchbkb.run` did, one entry per told evaluation, plus its failures.

Example:
    >>> h = History(index=[3, 1], reward=[0.5, 0.7], regret=[0.2, 0.0], time=[0.1, 0.2], algo_time=[0.0, 0.0],
    ...             batch=[0, 1], dictionary_size=[1, 2], attempts=[1, 2], uniform_regret_rate=0.5)
    >>> h.cumulative_regret, h.batch_sizes, h.summary()["T"]
    ([0.2, 0.2], [1, 1], 2)
    >>> History.from_dict(h.to_dict()).attempts
    [1, 2]
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from torchbkb.errors import InputDataError

__all__ = ["History"]

#: the per-evaluation lists, all of one length.
PER_EVALUATION = ("index", "reward", "regret", "time", "algo_time", "batch", "dictionary_size")


@dataclass
class History:
    """What happened in a run, one entry per evaluation (told reward).

    Attributes:
        index: arm indices.
        reward: observed rewards.
        regret: instantaneous regret ``max f - f(x_t)`` (``nan`` when ``f`` is unknown).
        time: wall-clock seconds since the start of the run (resumed runs continue the clock).
        algo_time: seconds spent in ``ask``/``tell`` (the algorithm's own cost) since the start.
        batch: batch id of each evaluation.
        dictionary_size: the bandit's dictionary size when the batch was told (``-1`` if none).
        attempts: how many times each evaluation was run before it gave its reward (1: first time).
        failures: ``(batch, arm, error message)`` for points left out after their objective kept failing.
        errors: ``(batch, arm, kind, error message)`` for every failed attempt, ``kind`` being ``"objective"``
            (the objective raised or returned a non-finite reward) or ``"infrastructure"`` (executor, worker,
            connection, timeout or cancellation; never blamed on the arm).
        uniform_regret_rate: ``max f - mean f`` (``nan`` when unknown).
        meta: free-form notes (``"stopped"`` when a time limit ended the run).
    """

    index: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    regret: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    algo_time: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    dictionary_size: list[int] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    failures: list[tuple[int, int, str]] = field(default_factory=list)
    errors: list[tuple[int, int, str, str]] = field(default_factory=list)
    uniform_regret_rate: float = float("nan")
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def cumulative_regret(self) -> list[float]:
        """``R_t = Σ_{s<=t} regret_s``."""
        out, acc = [], 0.0
        for r in self.regret:
            acc += r
            out.append(acc)
        return out

    @property
    def normalized_regret(self) -> list[float]:
        """``R_t / R_unif(t)``, ``R_unif(t) = t · (max f - mean f)``."""
        rate = self.uniform_regret_rate
        return [r / ((t + 1) * rate) if rate > 0 else float("nan") for t, r in enumerate(self.cumulative_regret)]

    @property
    def batch_sizes(self) -> list[int]:
        """Length of each batch, in order."""
        sizes: dict[int, int] = {}
        for b in self.batch:
            sizes[b] = sizes.get(b, 0) + 1
        return [sizes[b] for b in sorted(sizes)]

    def to_dict(self) -> dict[str, Any]:
        """The per-evaluation lists and the run's summaries as plain Python values (JSON-ready)."""
        return {
            **{k: getattr(self, k) for k in PER_EVALUATION},
            "cumulative_regret": self.cumulative_regret,
            "normalized_regret": self.normalized_regret,
            "batch_sizes": self.batch_sizes,
            "attempts": self.attempts,
            "failures": [list(f) for f in self.failures],
            "errors": [list(e) for e in self.errors],
            "uniform_regret_rate": self.uniform_regret_rate,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        """The history of :meth:`to_dict` (or of its JSON, ``null`` read as NaN), checked: every
        per-evaluation list present and of one length, failures and errors well formed."""
        if not isinstance(d, dict):
            raise InputDataError(f"history: expected a dict, got {type(d).__name__}")
        missing = [k for k in PER_EVALUATION if not isinstance(d.get(k), list)]
        if missing:
            raise InputDataError(f"history: expected lists {list(PER_EVALUATION)}, got none for {missing}")
        lists = {k: list(d[k]) for k in PER_EVALUATION}
        n = len(lists["index"])
        attempts = list(d.get("attempts") or [1] * n)  # absent before attempts were recorded
        if any(len(v) != n for v in lists.values()) or len(attempts) != n:
            raise InputDataError(f"history: expected per-evaluation lists of one length, got lengths "
                                 f"{[len(v) for v in lists.values()] + [len(attempts)]}")
        for key in ("regret", "reward", "time", "algo_time"):
            lists[key] = [float("nan") if v is None else float(v) for v in lists[key]]
        h = cls(**lists, attempts=[int(a) for a in attempts])
        try:
            h.failures = [(int(b), int(a), str(m)) for b, a, m in d.get("failures", [])]
            h.errors = [(int(b), int(a), str(k), str(m)) for b, a, k, m in d.get("errors", [])]
        except (TypeError, ValueError):
            raise InputDataError("history: expected failures as (batch, arm, message) and errors as (batch, arm, kind, "
                                 "message), got something else") from None
        rate = d.get("uniform_regret_rate")
        h.uniform_regret_rate = float("nan") if rate is None else float(rate)
        h.meta = dict(d.get("meta", {}))
        return h

    def save(self, path: str | os.PathLike) -> None:
        """Write the history as JSON (NaN written as ``null``)."""
        with open(path, "w") as f:
            json.dump(_nan_to_none(self.to_dict()), f)

    def summary(self) -> dict[str, float]:
        """Final numbers: evaluations, time, regret, normalized regret, batches, dictionary size, failures."""
        return {
            "T": len(self),
            "time": self.time[-1] if self.time else 0.0,
            "algo_time": self.algo_time[-1] if self.algo_time else 0.0,
            "regret": self.cumulative_regret[-1] if self.regret else float("nan"),
            "normalized_regret": self.normalized_regret[-1] if self.regret else float("nan"),
            "batches": len(self.batch_sizes),
            "dictionary_size": self.dictionary_size[-1] if self.dictionary_size else -1,
            "failed_attempts": len(self.errors),
            "left_out": len(self.failures),
        }


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x
