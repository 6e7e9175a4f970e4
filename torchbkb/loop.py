"""``torchbkb.run``: drive a bandit against an objective, with executors, retries, checkpoints, progress.

The objective is either

* a tensor of rewards per arm (dataset arm sets: the reward of arm ``i`` is ``values[i]``), or
* a callable ``objective(indices: LongTensor (k,)) -> Tensor (k,)``; an :class:`ArmObjective` wraps
  noise-free values with Gaussian reward noise and tells the loop the values (for regret).

Regret needs the noise-free values ``f`` at the arms: taken from a tensor objective, from an
objective's ``values`` attribute, or from ``values=``. Then ``regret_t = max f - f(x_t)``, and the
normalized regret is ``R_t / R_unif(t)`` with ``R_unif(t) = t·(max f - mean f)`` the expected regret of
uniform sampling.

Each batch's points are evaluated in parallel when an ``executor`` is given: any
``concurrent.futures.Executor`` or a ``dask.distributed.Client`` (points are submitted one by one,
with ``pure=False`` for Dask so a retried point is really re-run). An evaluation that raises (or whose
worker dies) is retried up to ``max_retries`` times; a point that keeps failing is reported in
``History.failures`` and left out of the ``tell`` (``bandit.discard``), which leaves the bandit state
consistent; the bandit also excludes such an arm from later selections (``discard(..., exclude=True)``),
otherwise a deterministic algorithm, having learned nothing, would ask for it again forever.

To use an existing Dask cluster, connect a client to its scheduler and pass it:
``torchbkb.run(bandit, objective, T, executor=distributed.Client("tcp://scheduler:8786"))``. The
objective is pickled to the workers, so it must be importable there (install your package on the
workers, or ``client.upload_file("my_objective.py")``); the bandit stays in the driver.

With ``checkpoint=path`` the bandit and the history are saved (atomically) every ``checkpoint_every``
batches, and a run started with an existing checkpoint resumes from it: killing the driver loses at
most the batch in flight.

Example:
    >>> import torch, torchbkb
    >>> from torchbkb.kernels import GaussianKernel
    >>> arms = torch.rand(100, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = -((arms - 0.5) ** 2).sum(-1)
    >>> bandit = torchbkb.BKB(arms, GaussianKernel(0.3), noise=0.01, beta=0.1, seed=0)
    >>> hist = torchbkb.run(bandit, f, budget=30, progress=False)
    >>> len(hist), hist.cumulative_regret[-1] < 30 * float(f.max() - f.mean())
    (30, True)
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from torchbkb.bandits.base import Bandit
from torchbkb.errors import InputDataError, TorchBKBError

__all__ = ["run", "History", "ArmObjective", "ObjectiveError"]


class ObjectiveError(TorchBKBError):
    """The objective raised (after retries) for some arms; the message names them."""


class ArmObjective:
    """Noisy rewards ``f(x_i) + N(0, noise_std²)`` from noise-free values at the arms.

    Args:
        values: `(A,)` noise-free ``f`` at the arms (used for regret).
        noise_std: standard deviation of the reward noise.
        seed: seed of its own generator (its state is checkpointed with the run).

    It is evaluated in the driver even when :func:`run` has an executor (``evaluate_in_driver``): copies
    pickled to worker processes would all start from the same generator state and draw the same noise.

    Example:
        >>> import torch
        >>> obj = ArmObjective(torch.tensor([0.0, 1.0]), noise_std=0.0)
        >>> obj(torch.tensor([1, 0]))
        tensor([1., 0.])
    """

    #: :func:`run` calls it in the driver (its noise generator must not be copied to workers).
    evaluate_in_driver = True

    def __init__(self, values: torch.Tensor, noise_std: float = 0.0, seed: int | None = 0):
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or not values.is_floating_point():
            raise InputDataError(f"values: expected a floating tensor of shape (A,), got {values!r:.60}")
        if not float(noise_std) >= 0:
            raise InputDataError(f"noise_std: expected noise_std >= 0, got {noise_std!r}")
        self.values = values
        self.noise_std = float(noise_std)
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else int(seed))

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        idx = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        noise = torch.randn(idx.shape, generator=self.generator, dtype=torch.float64) * self.noise_std
        return self.values[idx.to(self.values.device)] + noise.to(self.values)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


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
        failures: ``(batch, arm, error message)`` for points left out after failed retries.
        uniform_regret_rate: ``max f - mean f`` (``nan`` when unknown).
    """

    index: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    regret: list[float] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    algo_time: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    dictionary_size: list[int] = field(default_factory=list)
    failures: list[tuple[int, int, str]] = field(default_factory=list)
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
        return {
            "index": self.index,
            "reward": self.reward,
            "regret": self.regret,
            "cumulative_regret": self.cumulative_regret,
            "normalized_regret": self.normalized_regret,
            "time": self.time,
            "algo_time": self.algo_time,
            "batch": self.batch,
            "batch_sizes": self.batch_sizes,
            "dictionary_size": self.dictionary_size,
            "failures": [list(f) for f in self.failures],
            "uniform_regret_rate": self.uniform_regret_rate,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "History":
        keys = ("index", "reward", "regret", "time", "algo_time", "batch", "dictionary_size")
        h = cls(**{k: list(d[k]) for k in keys})
        h.failures = [tuple(f) for f in d.get("failures", [])]
        h.uniform_regret_rate = float(d.get("uniform_regret_rate", float("nan")))
        h.meta = dict(d.get("meta", {}))
        return h

    def save(self, path: str | os.PathLike) -> None:
        """Write the history as JSON (NaN written as ``null``)."""
        with open(path, "w") as f:
            json.dump(_nan_to_none(self.to_dict()), f)

    def summary(self) -> dict[str, float]:
        """Final numbers: evaluations, time, regret, normalized regret, batches, dictionary size."""
        return {
            "T": len(self),
            "time": self.time[-1] if self.time else 0.0,
            "algo_time": self.algo_time[-1] if self.algo_time else 0.0,
            "regret": self.cumulative_regret[-1] if self.regret else float("nan"),
            "normalized_regret": self.normalized_regret[-1] if self.regret else float("nan"),
            "batches": len(self.batch_sizes),
            "dictionary_size": self.dictionary_size[-1] if self.dictionary_size else -1,
        }


def run(
    bandit: Bandit,
    objective: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor,
    budget: int,
    executor: Any = None,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    *,
    values: torch.Tensor | None = None,
    max_retries: int | None = None,
    on_failure: str | None = None,
    time_limit: float | None = None,
) -> History:
    """Run ``bandit`` for ``budget`` evaluations of ``objective``.

    Args:
        bandit: any :class:`~torchbkb.bandits.base.Bandit`.
        objective: rewards per arm `(A,)`, or a callable ``indices (k,) -> rewards (k,)``.
        budget: total number of evaluations ``T``.
        executor: ``None`` (evaluate in the driver), a ``concurrent.futures.Executor`` or a
            ``dask.distributed.Client``; each batch's points are submitted one per task (objectives with
            ``evaluate_in_driver = True``, like :class:`ArmObjective`, are still called in the driver).
        progress: show a tqdm bar with regret and batch size.
        checkpoint: path of a checkpoint file; resumed from if it exists, written every ``checkpoint_every`` batches.
        checkpoint_every: batches between checkpoints.
        values: `(A,)` noise-free values for regret (default: the tensor objective or ``objective.values``).
        max_retries: retries per failing point (default 0 in the driver, 2 with an executor).
        on_failure: ``"raise"`` (an :class:`ObjectiveError` naming the arms; default without executor) or
            ``"skip"`` (report in ``History.failures`` and discard; default with an executor).
        time_limit: stop (after the current batch) once this many seconds of wall time have passed
            (for capping slow peers in benchmarks); the history says so in ``meta["stopped"]``.

    Returns:
        The :class:`History`.
    """
    if not isinstance(bandit, Bandit):
        raise InputDataError(f"bandit: expected a torchbkb Bandit, got {type(bandit).__name__}")
    if int(budget) < 0:
        raise InputDataError(f"budget: expected an integer >= 0, got {budget!r}")
    if int(checkpoint_every) < 1:
        raise InputDataError(f"checkpoint_every: expected an integer >= 1, got {checkpoint_every!r}")
    evaluate = _as_callable(objective, bandit.num_arms)
    f = _values(objective, values, bandit.num_arms)
    max_retries = (0 if executor is None else 2) if max_retries is None else int(max_retries)
    on_failure = on_failure or ("raise" if executor is None else "skip")
    if on_failure not in ("raise", "skip"):
        raise InputDataError(f"on_failure: expected 'raise' or 'skip', got {on_failure!r}")

    remote = None if getattr(objective, "evaluate_in_driver", False) else executor  # e.g. ArmObjective's noise

    hist = History()
    if f is not None:
        f64 = f.detach().to("cpu", torch.float64)
        best = float(f64.max())
        hist.uniform_regret_rate = best - float(f64.mean())
    t_offset = a_offset = 0.0
    batches_done = 0
    if checkpoint is not None and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=False)
        bandit.load_state_dict(state["bandit"])
        hist = History.from_dict(state["history"])
        if state.get("objective") is not None and hasattr(objective, "load_state_dict"):
            objective.load_state_dict(state["objective"])
        t_offset = hist.time[-1] if hist.time else 0.0
        a_offset = hist.algo_time[-1] if hist.algo_time else 0.0
        batches_done = int(state.get("batches", 0))

    cum_regret = sum(hist.regret) if f is not None else float("nan")  # running R_t, for the postfix
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(budget), initial=len(hist), desc=type(bandit).__name__, leave=False)
    start = time.perf_counter()
    algo = 0.0
    try:
        while len(hist) < budget:
            if time_limit is not None and t_offset + time.perf_counter() - start > time_limit:
                hist.meta["stopped"] = f"time limit {time_limit:.0f}s reached at t={len(hist)}"
                break
            a0 = time.perf_counter()
            idx = bandit.ask()
            algo += time.perf_counter() - a0
            room = budget - len(hist)
            todo, extra = idx[:room], idx[room:]
            batch = bandit.batch_id - 1
            ok_idx, ok_y, failed = _evaluate(evaluate, todo, remote, max_retries)
            for arm, msg in failed:
                if on_failure == "raise":
                    raise ObjectiveError(f"objective failed at arm index {arm} (batch {batch}) after {max_retries + 1} attempt(s): {msg}")
                warnings.warn(f"torchbkb.run: arm {arm} failed {max_retries + 1} time(s) and is left out: {msg}", RuntimeWarning, stacklevel=2)
                hist.failures.append((batch, arm, msg))
            a0 = time.perf_counter()
            if ok_idx:
                bandit.tell(torch.tensor(ok_idx, dtype=torch.long), ok_y)
            if extra.numel() and len(bandit.pending):  # past the budget: simply not evaluated
                bandit.discard(extra)
            if failed and len(bandit.pending):  # failed every retry: left out and never asked again
                bandit.discard(torch.tensor([a for a, _ in failed], dtype=torch.long), exclude=True)
            algo += time.perf_counter() - a0
            now, a_now = t_offset + time.perf_counter() - start, a_offset + algo
            dsize = bandit.dictionary_size
            for i, y in zip(ok_idx, ok_y.tolist()):
                hist.index.append(i)
                hist.reward.append(y)
                r = best - float(f64[i]) if f is not None else float("nan")
                hist.regret.append(r)
                cum_regret += r
                hist.time.append(now)
                hist.algo_time.append(a_now)
                hist.batch.append(batch)
                hist.dictionary_size.append(-1 if dsize is None else int(dsize))
            batches_done += 1
            if bar is not None:
                bar.update(len(ok_idx))
                post = {"batch": len(todo)}
                if f is not None and hist.regret:  # O(1): no pass over the history
                    rate = hist.uniform_regret_rate
                    post["R/Runif"] = f"{cum_regret / (len(hist) * rate) if rate > 0 else float('nan'):.3g}"
                if dsize is not None:
                    post["m"] = dsize
                bar.set_postfix(post, refresh=False)
            if checkpoint is not None and batches_done % int(checkpoint_every) == 0:
                _save_checkpoint(checkpoint, bandit, hist, objective, batches_done)
    finally:
        if bar is not None:
            bar.close()
    if checkpoint is not None:
        _save_checkpoint(checkpoint, bandit, hist, objective, batches_done)
    return hist


# ---------------------------------------------------------------------------------------- helpers
def _as_callable(objective, A: int) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(objective, torch.Tensor):
        if objective.shape != (A,) or not objective.is_floating_point():
            raise InputDataError(f"objective: expected a floating tensor of rewards of shape ({A},), got {objective.dtype} {tuple(objective.shape)}")
        return _TensorObjective(objective.detach())
    if not callable(objective):
        raise InputDataError(f"objective: expected a callable indices -> rewards or a tensor of shape ({A},), got {type(objective).__name__}")
    return objective


class _TensorObjective:
    """Rewards looked up in a tensor (picklable, so process pools and Dask workers can run it)."""

    def __init__(self, values: torch.Tensor):
        self.values = values

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        return self.values[torch.as_tensor(idx, dtype=torch.long).to(self.values.device)]


def _values(objective, values, A: int) -> torch.Tensor | None:
    if values is None:
        values = objective if isinstance(objective, torch.Tensor) else getattr(objective, "values", None)
    if values is None:
        return None
    if not isinstance(values, torch.Tensor) or values.shape != (A,):
        raise InputDataError(f"values: expected a tensor of shape ({A},), got {getattr(values, 'shape', type(values).__name__)}")
    return values


def _call_one(evaluate, arm: int) -> torch.Tensor:
    out = torch.as_tensor(evaluate(torch.tensor([arm], dtype=torch.long)))
    return out.reshape(-1)[0]


def _evaluate(evaluate, idx: torch.Tensor, executor, max_retries: int):
    """Evaluate the arms ``idx`` (with retries).

    Returns:
        ``(arms, y, failures)``: the arms that succeeded (list of int, in order), their rewards `(k,)`
        float64 on the CPU, and ``(arm, message)`` for each arm that failed every attempt.
    """
    arms = [int(i) for i in idx.tolist()]
    results: dict[int, torch.Tensor] = {}
    errors: dict[int, str] = {}
    todo = list(range(len(arms)))
    if executor is None and todo:
        try:  # fast path: the whole batch in one call
            out = torch.as_tensor(evaluate(idx.cpu())).reshape(-1).to("cpu", torch.float64)
            if out.numel() == len(arms) and bool(torch.isfinite(out).all()):
                return arms, out, []
        except Exception:  # noqa: BLE001 - retried point by point below to name the failing arm
            pass
    for attempt in range(max_retries + 1):
        if not todo:
            break
        if executor is None:
            outcome = {}
            for j in todo:
                try:
                    outcome[j] = (True, _call_one(evaluate, arms[j]))
                except Exception as e:  # noqa: BLE001
                    outcome[j] = (False, f"{type(e).__name__}: {e}")
        else:
            outcome = _submit_all(executor, evaluate, {j: arms[j] for j in todo})
        nxt = []
        for j in todo:
            ok, val = outcome[j]
            if ok and bool(torch.isfinite(torch.as_tensor(val, dtype=torch.float64))):
                results[j] = torch.as_tensor(val, dtype=torch.float64)
            else:
                errors[j] = val if not ok else f"non-finite reward {float(val)}"
                nxt.append(j)
        todo = nxt
    ok_pos = [j for j in range(len(arms)) if j in results]
    y = torch.stack([results[j].reshape(()).cpu() for j in ok_pos]) if ok_pos else torch.zeros(0, dtype=torch.float64)
    return [arms[j] for j in ok_pos], y, [(arms[j], errors[j]) for j in todo]


def _submit_all(executor, evaluate, jobs: dict[int, int]) -> dict[int, tuple[bool, Any]]:
    is_dask = type(executor).__module__.startswith("distributed")
    futures = {}
    for j, arm in jobs.items():
        if is_dask:
            futures[j] = executor.submit(_call_one, evaluate, arm, pure=False)
        else:
            futures[j] = executor.submit(_call_one, evaluate, arm)
    out = {}
    for j, fut in futures.items():
        try:
            out[j] = (True, fut.result())
        except Exception as e:  # noqa: BLE001 - includes dead workers (KilledWorker, BrokenProcessPool)
            out[j] = (False, f"{type(e).__name__}: {e}")
    return out


def _save_checkpoint(path, bandit, hist, objective, batches) -> None:
    state = {
        "bandit": bandit.state_dict(),
        "history": hist.to_dict(),
        "objective": objective.state_dict() if hasattr(objective, "state_dict") and not isinstance(objective, torch.Tensor) else None,
        "batches": batches,
    }
    tmp = f"{os.fspath(path)}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a killed driver leaves the previous checkpoint intact


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    return x
