"""Evaluating a batch of arms for :func:`torchbkb.run`: calls, executors, retries, and the line between
the objective's failures and the infrastructure's.

Two kinds of failure are told apart (:func:`is_infrastructure_failure`):

* **objective failures** -- the objective raised (any other exception) or returned NaN/inf for an arm.
  They count against that arm's ``max_retries``; an arm that exhausts them is reported to the loop, which
  raises or excludes it.
* **infrastructure failures** -- the executor is shut down or broken, a worker was lost, a future was
  cancelled, a timeout, a connection or other operating-system error (``OSError`` and its subclasses
  ``ConnectionError``, ``TimeoutError``, ``BrokenPipeError``, ``urllib``'s ``URLError``, ``requests``'
  ``ConnectionError``...; ``EOFError``, ``concurrent.futures.CancelledError``/``TimeoutError``,
  ``BrokenExecutor``, Dask's ``KilledWorker``/``CommClosedError``, :class:`~torchbkb.errors.InfrastructureError`,
  plus the types given as ``transient``). They never count
  against an arm: the points are retried with exponential backoff (``retry_delay``, doubled up to
  :data:`MAX_DELAY`) until ``deadline`` seconds have passed since the first of them, a pool the evaluator
  owns (``executor="thread"``/``"process"`` or a factory) is recreated when it breaks, and what is still
  outstanding then is handed back to the loop, which checkpoints and raises
  :class:`~torchbkb.errors.InfrastructureError`. A broken or shut-down executor that the caller owns
  cannot be repaired here: its points are handed back at once.

Only the points that failed are run again. A ``vectorized`` objective gets the whole batch (or the
points being retried) in one call; if that call raises for another reason than the infrastructure, the
points are called one by one in the same round to find the failing arm.

Example:
    >>> import torch
    >>> ev = BatchEvaluator(lambda idx: idx.double() * 2)
    >>> out = ev.evaluate([3, 5])
    >>> out.rewards, out.attempts
    ({0: 6.0, 1: 10.0}, [1, 1])
"""

from __future__ import annotations

import asyncio
import math
import time
from concurrent.futures import BrokenExecutor, CancelledError, Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeoutError
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.errors import InfrastructureError, InputDataError, ObjectiveOutputError, check_int
from torchbkb.objectives import check_rewards

__all__ = ["BatchEvaluator", "BatchOutcome", "INFRASTRUCTURE_ERRORS", "MAX_DELAY", "RERUN_MESSAGE", "call_objective",
           "is_infrastructure_failure", "scheduler_reruns"]

#: exception types that are the infrastructure's failures, never an arm's.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, TimeoutError, FuturesTimeoutError, asyncio.TimeoutError, CancelledError, BrokenExecutor,
    InfrastructureError,
)  # fmt: skip
#: the same, for Dask/Tornado types known by name (no import of distributed needed).
INFRASTRUCTURE_NAMES = frozenset({"KilledWorker", "CommClosedError", "StreamClosedError", "FutureCancelledError"})
#: the error recorded for an evaluation the executor ran again after losing its worker
RERUN_MESSAGE = "worker lost while evaluating: the executor ran the evaluation again"
#: the longest wait between two rounds of infrastructure retries, seconds (a service that is back is noticed within it).
MAX_DELAY = 2.0


def is_infrastructure_failure(exc: BaseException, transient: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``exc`` is a failure of the machinery around the objective rather than of the arm."""
    if isinstance(exc, INFRASTRUCTURE_ERRORS + tuple(transient)):
        return True
    if any(cls.__name__ in INFRASTRUCTURE_NAMES for cls in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and _is_shutdown(exc)


def scheduler_reruns(dask_scheduler, keys: list) -> dict:
    """On a Dask scheduler: ``{key: times the task was lost with its worker and run again}`` (module level, so it
    pickles)."""
    tasks = dask_scheduler.tasks
    return {k: tasks[k].suspicious for k in keys if k in tasks}


def call_objective(objective: Callable, arm: int) -> Any:
    """``objective(tensor([arm]))``: what a worker runs for one point (module level, so it pickles)."""
    return objective(torch.tensor([arm], dtype=torch.long))


@dataclass
class BatchOutcome:
    """What became of a batch's points (positions ``j`` index the arms given to :meth:`BatchEvaluator.evaluate`).

    Attributes:
        rewards: ``{j: reward}`` of the points that succeeded.
        attempts: `(k,)` how many times each point was run.
        errors: ``(j, kind, message)`` for every failed attempt (``kind``: ``"objective"`` or ``"infrastructure"``).
        failed: ``{j: message}`` of the points whose objective failed every one of its ``max_retries + 1`` attempts.
        outstanding: the points the infrastructure could not evaluate before the deadline (or ever, with a
            broken executor the evaluator does not own).
        infrastructure: the last infrastructure error's message when ``outstanding`` is not empty.
    """

    rewards: dict[int, float] = field(default_factory=dict)
    attempts: list[int] = field(default_factory=list)
    errors: list[tuple[int, str, str]] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    outstanding: list[int] = field(default_factory=list)
    infrastructure: str | None = None


class BatchEvaluator:
    """Runs an objective over batches of arms in the driver or on an executor, with retries.

    Args:
        objective: ``indices (k,) -> rewards (k,)`` (see :mod:`torchbkb.objectives`).
        executor: ``None`` (the driver), a ``concurrent.futures.Executor`` or ``dask.distributed.Client`` (the
            caller's), or one the evaluator owns and recreates when it breaks: ``"thread"``, ``"process"``
            or a zero-argument factory returning an executor.
        workers: ``max_workers`` of an owned ``"thread"``/``"process"`` pool.
        max_retries: retries of a point whose objective fails.
        retry_delay: first wait after a round with infrastructure failures, seconds (then doubled).
        deadline: seconds of continued infrastructure failures after which the outstanding points are handed back.
        timeout: seconds to wait for a batch's results on an executor (late points are infrastructure failures).
        transient: more exception types to treat as infrastructure failures.
    """

    def __init__(
        self,
        objective: Callable,
        executor: Any = None,
        *,
        workers: int | None = None,
        max_retries: int = 0,
        retry_delay: float = 0.1,
        deadline: float = 900.0,
        timeout: float | None = None,
        transient: tuple[type[BaseException], ...] = (),
    ):
        check_int(max_retries, "max_retries", minimum=0)
        for name, v in (("retry_delay", retry_delay), ("deadline", deadline)):
            if not float(v) >= 0:
                raise InputDataError(f"{name}: expected seconds >= 0, got {v!r}")
        if timeout is not None and not float(timeout) > 0:
            raise InputDataError(f"timeout: expected seconds > 0 or None, got {timeout!r}")
        self.objective = objective
        self.max_retries, self.retry_delay, self.deadline = max_retries, float(retry_delay), float(deadline)
        self.timeout = None if timeout is None else float(timeout)
        self.transient = tuple(transient)
        self.factory = _pool_factory(executor, workers)
        self.owned = self.factory is not None
        self.executor = self.factory() if self.owned else executor
        self.in_driver = self.executor is None or bool(getattr(objective, "evaluate_in_driver", False))
        self.vectorized = bool(getattr(objective, "vectorized", False))

    def close(self) -> None:
        """Shut down a pool the evaluator owns (without waiting: after an interrupt, tasks still running are
        abandoned, queued ones cancelled)."""
        if self.owned and self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    def evaluate(self, arms: list[int]) -> BatchOutcome:
        """Evaluate ``arms`` (a batch, repeats allowed) until each succeeded, failed for good or is outstanding."""
        out = BatchOutcome(attempts=[0] * len(arms))
        failures = [0] * len(arms)
        todo = list(range(len(arms)))
        first_infra: float | None = None
        delay = self.retry_delay
        while todo:
            results, reruns = self._round(arms, todo)
            retry, infra, fatal, last = [], [], False, None
            for j, count in reruns.items():  # the executor re-ran a task whose worker was lost: attempts too
                out.attempts[j] += count
                out.errors.extend([(j, "infrastructure", RERUN_MESSAGE)] * count)
            for j in todo:
                out.attempts[j] += 1
                kind, value = results[j]
                if kind == "ok":
                    out.rewards[j] = value
                elif kind == "objective":
                    out.errors.append((j, kind, value))
                    failures[j] += 1
                    if failures[j] <= self.max_retries:
                        retry.append(j)
                    else:
                        out.failed[j] = value
                else:
                    out.errors.append((j, "infrastructure", value[0]))
                    infra.append(j)
                    last, fatal = value[0], fatal or value[1]
            if infra:
                now = time.monotonic()
                first_infra = now if first_infra is None else first_infra
                if fatal and self.owned:
                    self._recreate()
                    fatal = False
                waited = now - first_infra
                if fatal or waited >= self.deadline:
                    out.outstanding, out.infrastructure = sorted(infra + retry), last
                    return out
                time.sleep(min(delay, self.deadline - waited))
                delay = min(2 * delay, MAX_DELAY)
            else:
                first_infra, delay = None, self.retry_delay
            todo = sorted(retry + infra)
        return out

    # ------------------------------------------------------------------ internals
    def _round(self, arms: list[int], todo: list[int]) -> tuple[dict[int, tuple[str, Any]], dict[int, int]]:
        """One attempt at each point of ``todo``: ``{j: ("ok", reward) | ("objective", message) |
        ("infrastructure", (message, unrecoverable))}``, and ``{j: count}`` of the tasks the executor itself ran
        again after losing their worker (Dask reschedules them silently)."""
        if self.in_driver:
            if self.vectorized:
                done = self._driver_batch(arms, todo)
                if done is not None:
                    return done, {}
            return {j: self._settle(arms[j], lambda j=j: call_objective(self.objective, arms[j])) for j in todo}, {}
        futures, results = {}, {}
        for j in todo:
            try:
                futures[j] = self._submit(arms[j])
            except Exception as e:  # noqa: BLE001 - a pool that cannot take work
                if not is_infrastructure_failure(e, self.transient):
                    raise
                results[j] = self._infra(e)
        end = None if self.timeout is None else time.monotonic() + self.timeout
        for j, fut in futures.items():
            wait = None if end is None else max(end - time.monotonic(), 0.0)
            results[j] = self._settle(arms[j], lambda fut=fut, wait=wait: fut.result(timeout=wait), future=fut)
        return results, self._reruns(futures)

    def _reruns(self, futures: dict[int, Any]) -> dict[int, int]:
        """``{j: count}`` of the Dask tasks the scheduler re-ran after their worker died (its ``suspicious``
        count; other executors never re-run a task on their own)."""
        if not futures or not hasattr(self.executor, "run_on_scheduler"):
            return {}
        keys = {j: getattr(fut, "key", None) for j, fut in futures.items()}
        try:
            counts = self.executor.run_on_scheduler(scheduler_reruns, keys=[k for k in keys.values() if k is not None])
        except Exception:  # noqa: BLE001 - a scheduler that cannot answer: nothing to report
            return {}
        return {j: int(counts[k]) for j, k in keys.items() if counts.get(k)}

    def _driver_batch(self, arms: list[int], todo: list[int]) -> dict[int, tuple[str, Any]] | None:
        """One call over the points ``todo``; ``None`` when it raised for the objective's reasons (then
        the points are called one by one)."""
        picked = [arms[j] for j in todo]
        try:
            raw = self.objective(torch.tensor(picked, dtype=torch.long))
        except Exception as e:  # noqa: BLE001
            if is_infrastructure_failure(e, self.transient):
                return {j: self._infra(e) for j in todo}
            return None if len(todo) > 1 else {todo[0]: ("objective", _message(e))}
        y = check_rewards(raw, picked)
        return {j: _finite(float(v)) for j, v in zip(todo, y.tolist())}

    def _settle(self, arm: int, get: Callable[[], Any], future: Any = None) -> tuple[str, Any]:
        try:
            raw = get()
        except ObjectiveOutputError:
            raise
        except Exception as e:  # noqa: BLE001 - classified below
            if future is not None and isinstance(e, (TimeoutError, FuturesTimeoutError)):
                future.cancel()
            if is_infrastructure_failure(e, self.transient):
                return self._infra(e)
            return "objective", _message(e)
        return _finite(float(check_rewards(raw, [arm])[0]))

    def _infra(self, e: BaseException) -> tuple[str, tuple[str, bool]]:
        broken = isinstance(e, BrokenExecutor) or (isinstance(e, RuntimeError) and _is_shutdown(e))
        return "infrastructure", (_message(e), broken)

    def _submit(self, arm: int) -> Any:
        if type(self.executor).__module__.startswith("distributed"):
            return self.executor.submit(call_objective, self.objective, arm, pure=False)  # a retry really re-runs
        return self.executor.submit(call_objective, self.objective, arm)

    def _recreate(self) -> None:
        try:
            self.executor.shutdown(wait=False, cancel_futures=True)
        except Exception:  # noqa: BLE001 - a broken pool may fail to shut down cleanly
            pass
        self.executor = self.factory()


def _pool_factory(executor: Any, workers: int | None) -> Callable[[], Any] | None:
    if executor == "thread":
        return lambda: ThreadPoolExecutor(max_workers=workers)
    if executor == "process":
        return lambda: ProcessPoolExecutor(max_workers=workers)
    if isinstance(executor, str):
        raise InputDataError(f"executor: expected None, 'thread', 'process', an Executor, a Dask Client or a factory, "
                             f"got {executor!r}")
    if executor is None or isinstance(executor, Executor) or hasattr(executor, "submit"):
        return None
    if callable(executor):
        return executor
    raise InputDataError(f"executor: expected None, 'thread', 'process', an Executor, a Dask Client or a factory, got "
                         f"{type(executor).__name__}")


def _finite(v: float) -> tuple[str, Any]:
    return ("ok", v) if math.isfinite(v) else ("objective", f"non-finite reward {v}")


def _is_shutdown(e: BaseException) -> bool:
    return "shutdown" in str(e) and "schedule" in str(e)


def _message(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"
