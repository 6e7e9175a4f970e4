"""``torchbkb.run``: drive a bandit against an objective, with executors, retries, checkpoints, progress.

The objective is either

* a tensor of rewards per arm (dataset arm sets: the reward of arm ``i`` is ``values[i]``), or
* a callable ``objective(indices: LongTensor (k,)) -> Tensor (k,)`` (:mod:`torchbkb.objectives`); an
  :class:`~torchbkb.objectives.ArmObjective` wraps noise-free values with Gaussian reward noise and tells
  the loop the values (for regret). A callable is called once per arm unless it says ``vectorized = True``.

Regret needs the noise-free values ``f`` at the arms: taken from a tensor objective, from an
objective's ``values`` attribute, or from ``values=``. Then ``regret_t = max f - f(x_t)``, and the
normalized regret is ``R_t / R_unif(t)`` with ``R_unif(t) = t·(max f - mean f)`` the expected regret of
uniform sampling.

Failures (:mod:`torchbkb.experiment.evaluation`): an arm whose objective raises or returns NaN/inf is retried up to
``max_retries`` times (only the failed points are run again), then either stops the run with an
:class:`~torchbkb.errors.ObjectiveError` (``on_failure="raise"``) or is left out and excluded from later
selections with its error recorded (``"skip"``; ``readmit=`` or ``bandit.readmit()`` lets it back). A result
that is not one real number per arm is an :class:`~torchbkb.errors.ObjectiveOutputError` at once.
An arm whose kernel values are NaN/inf (the bandit's :class:`~torchbkb.errors.NumericsError` names it; its reward is
counted, not fitted) is handled as a failed objective: the run stops (``"raise"``) or the arm is excluded and the
error recorded (``"skip"``). Failures of the infrastructure (executor, workers, timeouts, connections, cancellations)
never exclude an arm: they are retried with backoff until ``deadline``, a pool the run owns (``executor="process"``)
is recreated, and otherwise the run checkpoints and raises :class:`~torchbkb.errors.InfrastructureError`;
running it again with the same checkpoint resumes. Every raise of the run's own errors is preceded by a
checkpoint that keeps the rewards already received in the batch.

With ``checkpoint=path`` the bandit, the history and the objective's state are saved atomically
(:mod:`torchbkb.experiment.checkpoint`) every ``checkpoint_every`` batches; the path is checked before the first
evaluation, and a run started with an existing checkpoint resumes from it after checking that it was
written for the same arms, kernel, noise and settings.

To use an existing Dask cluster, connect a client to its scheduler and pass it:
``torchbkb.run(bandit, objective, T, executor=distributed.Client("tcp://scheduler:8786"))``. The
objective is pickled to the workers, so it must be importable there; the bandit stays in the driver.

Example:
    >>> import torch, torchbkb
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> arms = torch.rand(100, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> f = -((arms - 0.5) ** 2).sum(-1)
    >>> bandit = torchbkb.BKB(arms, GaussianKernel(0.3), noise=0.01, beta=0.1, seed=0)
    >>> hist = torchbkb.run(bandit, f, budget=30, progress=False)
    >>> len(hist), hist.cumulative_regret[-1] < 30 * float(f.max() - f.mean())
    (30, True)
"""

from __future__ import annotations

import operator
import os
import time
import warnings
from typing import Any
from collections.abc import Callable

import torch

from torchbkb.bandits.base import Bandit
from torchbkb.experiment.checkpoint import check_checkpoint_path, read_checkpoint, save_checkpoint
from torchbkb.errors import (CheckpointError, InfrastructureError, InputDataError, NumericsError, ObjectiveError,
                             check_int)
from torchbkb.experiment.evaluation import BatchEvaluator
from torchbkb.experiment.history import History
from torchbkb.objectives import ArmObjective, as_objective, check_values

__all__ = ["run", "History", "ArmObjective", "ObjectiveError"]


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
    workers: int | None = None,
    retry_delay: float = 0.1,
    deadline: float = 900.0,
    timeout: float | None = None,
    transient: tuple[type[BaseException], ...] = (),
    readmit: bool | list[int] | torch.Tensor | None = None,
) -> History:
    """Run ``bandit`` for ``budget`` evaluations of ``objective``.

    Args:
        bandit: any :class:`~torchbkb.bandits.base.Bandit`.
        objective: rewards per arm `(A,)`, or a callable ``indices (k,) -> rewards (k,)``.
        budget: total number of evaluations ``T``. A bandit with a budget of its own (S-BPE) ends the run sooner once
            it has asked that budget, points that failed or were cut at a budget included (``meta["stopped"]``).
        executor: ``None`` (evaluate in the driver), a ``concurrent.futures.Executor`` or a
            ``dask.distributed.Client`` (yours: a broken one ends the run with an ``InfrastructureError``), or a
            pool the run owns, creates, recreates when it breaks and shuts down: ``"thread"``, ``"process"``
            or a zero-argument factory. Each batch's points are submitted one per task (objectives with
            ``evaluate_in_driver = True``, like :class:`ArmObjective`, are still called in the driver).
        progress: show a tqdm bar with regret and batch size.
        checkpoint: path of a checkpoint file; resumed from if it exists, written every ``checkpoint_every`` batches.
        checkpoint_every: batches between checkpoints.
        values: `(A,)` noise-free values for regret (default: the tensor objective or ``objective.values``).
        max_retries: retries of a point whose objective fails (default 0 in the driver, 2 with an executor).
        on_failure: ``"raise"`` (an :class:`ObjectiveError` naming the arms; default without executor) or
            ``"skip"`` (report in ``History.failures``, discard and exclude; default with an executor).
        time_limit: stop (after the current batch) once this many seconds of wall time have passed
            (for capping slow peers in benchmarks); the history says so in ``meta["stopped"]``.
        workers: ``max_workers`` of an owned ``"thread"``/``"process"`` pool.
        retry_delay: first wait after infrastructure failures, seconds (doubled each round, at most 2: a service that
            comes back is noticed within 2 s).
        deadline: seconds of continued infrastructure failures before the run checkpoints and raises.
        timeout: seconds to wait for a batch's results on an executor (late points are infrastructure failures).
        transient: more exception types to treat as infrastructure failures.
        readmit: on resume, let excluded arms be selected again: ``True`` (all) or their indices.

    Returns:
        The :class:`History`.

    Raises:
        ObjectiveError: an arm's objective kept failing and ``on_failure="raise"`` (after a checkpoint).
        ObjectiveOutputError: the objective returned something else than one real reward per arm.
        InfrastructureError: evaluations could not be run before ``deadline`` (after a checkpoint).
        NumericsError: the kernel's values at some arms are NaN/inf and ``on_failure="raise"``, or a factorization
            failed (after a checkpoint that holds the rewards told).
        CheckpointError: the checkpoint path cannot be written, or the file cannot be resumed here.
    """
    if not isinstance(bandit, Bandit):
        raise InputDataError(f"bandit: expected a torchbkb Bandit, got {type(bandit).__name__}")
    budget = _integer(budget, "budget", 0)
    checkpoint_every = _integer(checkpoint_every, "checkpoint_every", 1)
    evaluate = as_objective(objective, bandit.num_arms)
    f = check_values(objective, values, bandit.num_arms)
    max_retries = (0 if executor is None else 2) if max_retries is None else _integer(max_retries, "max_retries", 0)
    on_failure = on_failure or ("raise" if executor is None else "skip")
    if on_failure not in ("raise", "skip"):
        raise InputDataError(f"on_failure: expected 'raise' or 'skip', got {on_failure!r}")
    if checkpoint is not None:
        check_checkpoint_path(checkpoint)

    hist = History()
    best = float("nan")
    if f is not None:
        f64 = f.detach().to("cpu", torch.float64).contiguous().numpy()  # read on the host, a batch's values at once
        best = float(f64.max())
        hist.uniform_regret_rate = best - float(torch.from_numpy(f64).mean())  # torch's sum, as before
    batches_done = 0
    if checkpoint is not None and os.path.exists(checkpoint):
        hist, batches_done = _resume(checkpoint, bandit, objective)
    if readmit is not None and readmit is not False:
        back = bandit.readmit(None if readmit is True else readmit)
        hist.meta.setdefault("readmitted", []).extend(back)
    t_offset = hist.time[-1] if hist.time else 0.0
    a_offset = hist.algo_time[-1] if hist.algo_time else 0.0
    evaluator = BatchEvaluator(
        evaluate, executor, workers=workers, max_retries=max_retries, retry_delay=retry_delay,
        deadline=deadline, timeout=timeout, transient=transient,
    )  # fmt: skip

    owed: list[int] = []  # history rows whose dictionary size is read after the next ask (a deferred update)

    def fill_sizes() -> None:
        if owed:
            size = bandit.dictionary_size
            for k in owed:
                hist.dictionary_size[k] = -1 if size is None else int(size)
            owed.clear()

    def save() -> None:
        fill_sizes()
        if checkpoint is not None:
            state = getattr(objective, "state_dict", None) if not isinstance(objective, torch.Tensor) else None
            save_checkpoint(checkpoint,
                            {"bandit": bandit.state_dict(), "history": hist.to_dict(),
                             "objective": state() if state else None, "batches": batches_done})

    def left_out(err: NumericsError, batch: int) -> None:
        """Arms whose kernel values are NaN/inf (``err.arms``, named by the bandit): the run stops after a checkpoint
        (``"raise"``) or they are recorded and excluded (``"skip"``)."""
        if not err.arms or on_failure == "raise":
            save()
            raise err
        for a in err.arms:
            warnings.warn(f"torchbkb.run: arm {a} is left out: {err}", RuntimeWarning, stacklevel=3)
            hist.failures.append((batch, a, str(err)))
        bandit.exclude(list(err.arms), reason=str(err))

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
            if getattr(bandit, "remaining", 1) <= 0 and not bandit.pending_ids:  # a fixed-budget bandit (S-BPE)
                hist.meta["stopped"] = (f"{type(bandit).__name__} asked its own budget of {bandit.budget} at "
                                        f"t={len(hist)} (points it asked that failed or fell past a budget count)")
                break
            a0 = time.perf_counter()
            try:
                idx = bandit.ask()
            except NumericsError as err:  # the update the ask ran (BBKB's on a GPU) met NaN/inf kernel values
                left_out(err, bandit.batch_id - 1)
                continue
            algo += time.perf_counter() - a0
            fill_sizes()  # the ask ran the deferred update: its size is known without a read of its own
            room = budget - len(hist)
            whole = room >= idx.numel()  # the usual case: the batch fits the budget
            ids = bandit.pending_ids  # the asked arms on the host: no read of the tensor (a sync on a GPU)
            todo, extra = (ids, None) if whole else (ids[:room], idx[room:])
            batch = bandit.batch_id - 1
            out = evaluator.evaluate(todo)
            hist.errors.extend((batch, todo[j], kind, msg) for j, kind, msg in out.errors)
            ok = sorted(out.rewards)
            a0 = time.perf_counter()
            told = todo if len(ok) == len(todo) else [todo[j] for j in ok]
            kernel_error = None
            if ok:  # every point told: the tensor ask returned, whose arms the bandit knows without reading them
                try:
                    bandit.tell(idx if whole and told is todo else torch.tensor(told, dtype=torch.long),
                                torch.tensor([out.rewards[j] for j in ok], dtype=torch.float64))
                except NumericsError as err:  # the rewards are told; arms with NaN/inf kernel values are left out
                    kernel_error = err
            algo += time.perf_counter() - a0
            now, a_now = t_offset + time.perf_counter() - start, a_offset + algo
            deferred = getattr(bandit, "update_deferred", False)
            dsize = None if deferred else bandit.dictionary_size  # a deferred update's size: after the next ask
            regrets = [best - v for v in f64.take(told).tolist()] if f is not None else [float("nan")] * len(ok)
            for j, i, r in zip(ok, told, regrets):
                hist.index.append(i)
                hist.reward.append(out.rewards[j])
                hist.regret.append(r)
                cum_regret += r
                hist.time.append(now)
                hist.algo_time.append(a_now)
                hist.batch.append(batch)
                if deferred:
                    owed.append(len(hist.dictionary_size))
                hist.dictionary_size.append(-1 if dsize is None else int(dsize))
                hist.attempts.append(out.attempts[j])
            if out.outstanding:  # the infrastructure gave up: keep what arrived, blame no arm
                save()
                arms = [todo[j] for j in out.outstanding]
                resume = "pass checkpoint= to be able to resume"
                if checkpoint is not None:
                    resume = "the checkpoint holds every reward received, run again to resume"
                raise InfrastructureError(
                    f"run: evaluations of arms {arms} (batch {batch}) could not be run for {deadline:g}s or on a "
                    f"broken executor ({out.infrastructure}); {resume}",
                    arms,
                )
            failed = sorted(out.failed)
            if failed and on_failure == "raise":
                save()
                j = failed[0]
                raise ObjectiveError(f"objective failed at arm index {todo[j]} (batch {batch}) after {out.attempts[j]} "
                                     f"attempt(s): {out.failed[j]}"
                                     + (f"; also arms {[todo[k] for k in failed[1:]]}" if len(failed) > 1 else ""))
            if kernel_error is not None:
                left_out(kernel_error, batch)
            a0 = time.perf_counter()
            if extra is not None and extra.numel() and len(bandit.pending):  # past the budget: not evaluated
                bandit.discard(extra)
            for j in failed:  # the objective failed every retry: left out and excluded, with its error
                warnings.warn(f"torchbkb.run: arm {todo[j]} failed {out.attempts[j]} time(s) and is left out: "
                              f"{out.failed[j]}", RuntimeWarning, stacklevel=2)
                hist.failures.append((batch, todo[j], out.failed[j]))
                if len(bandit.pending):
                    bandit.discard(torch.tensor([todo[j]]), exclude=True, reason=out.failed[j])
            algo += time.perf_counter() - a0
            batches_done += 1
            if bar is not None:
                bar.update(len(ok))
                post = {"batch": len(todo)}
                if f is not None and hist.regret:  # O(1): no pass over the history
                    rate = hist.uniform_regret_rate
                    post["R/Runif"] = f"{cum_regret / (len(hist) * rate) if rate > 0 else float('nan'):.3g}"
                if dsize is not None:
                    post["m"] = dsize
                bar.set_postfix(post, refresh=False)
            if checkpoint is not None and batches_done % checkpoint_every == 0:
                save()
    finally:
        evaluator.close()
        if bar is not None:
            bar.close()
    save()
    return hist


def _integer(value: Any, name: str, minimum: int) -> int:
    """``value`` as an ``int`` >= ``minimum`` (:func:`~torchbkb.errors.check_int`, NumPy integers converted first)."""
    try:
        return check_int(value if isinstance(value, bool) else operator.index(value), name, minimum)
    except TypeError:
        raise InputDataError(f"{name}: expected an integer >= {minimum}, got {value!r}") from None


def _resume(path, bandit: Bandit, objective: Any) -> tuple[History, int]:
    """Load the checkpoint at ``path`` into ``bandit`` and ``objective``: all of it or, on any error, none."""
    state = read_checkpoint(path)
    try:
        hist = History.from_dict(state["history"])
    except InputDataError as e:
        raise CheckpointError(f"checkpoint: expected a valid history, got {e}") from e
    if state["version"] < 2:
        warnings.warn(f"checkpoint {os.fspath(path)!r} predates format version 2: its arms, kernel and settings cannot "
                      f"be verified", RuntimeWarning, stacklevel=3)
    obj_state = state.get("objective")
    restorable = (obj_state is not None and hasattr(objective, "load_state_dict")
                  and not isinstance(objective, torch.Tensor))
    obj_backup = objective.state_dict() if restorable and hasattr(objective, "state_dict") else None
    bandit_backup = bandit.state_dict() if restorable else None  # to undo the bandit's load if the objective's fails
    bandit.load_state_dict(state["bandit"])  # validated, all or nothing
    if restorable:
        try:
            objective.load_state_dict(obj_state)
        except Exception as e:
            bandit.load_state_dict(bandit_backup)
            if obj_backup is not None:
                objective.load_state_dict(obj_backup)
            raise CheckpointError(f"checkpoint: expected an objective state that {type(objective).__name__} accepts, "
                                  f"got one that failed with {type(e).__name__}: {e}") from e
    return hist, int(state.get("batches", 0))
