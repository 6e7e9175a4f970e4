"""torchbkb.run with parallel executors: a real Dask LocalCluster (worker processes), a thread pool,
a flaky objective (transient failures, a dying worker, an arm that always fails) and a driver crash
resumed from the checkpoint."""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import torchbkb
from helpers import claim
from torchbkb import BBKB, ObjectiveError
from torchbkb.gp.kernels import GaussianKernel


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny operations: one intra-op thread (tests/conftest.py)



class FlakyObjective:
    """Rewards ``values[i]``, with failures driven by attempt files in a shared directory (worker
    processes share no memory): arms in ``fail_first`` raise on their first attempt, arms in
    ``always_fail`` always raise, and the ``die_at``-th evaluation overall kills its worker process
    (once, and never the driver)."""

    def __init__(self, values, root, fail_first=(), always_fail=(), die_at=None, driver_pid=None):
        self.values = values
        self.root = str(root)
        self.fail_first = set(fail_first)
        self.always_fail = set(always_fail)
        self.die_at = die_at
        self.driver_pid = os.getpid() if driver_pid is None else driver_pid

    def _claim(self, name: str) -> int:
        return claim(self.root, name)

    def attempts(self, arm: int) -> int:
        return len(list(Path(self.root).glob(f"arm{arm}.*")))

    def __call__(self, idx):
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        for i in idx.tolist():
            k = self._claim(f"arm{i}")
            n = self._claim("eval")
            if self.die_at is not None and n == self.die_at and os.getpid() != self.driver_pid:
                os._exit(1)  # the worker process dies in the middle of the task
            if i in self.always_fail:
                raise RuntimeError(f"arm {i} is broken")
            if i in self.fail_first and k == 0:
                raise RuntimeError(f"transient failure at arm {i}")
        return self.values[idx]


def _problem(A=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    f = torch.sin(5 * arms[:, 0]) * torch.cos(3 * arms[:, 1]) + arms[:, 1]
    return arms, f


def _bandit(arms, seed=3):
    return BBKB(arms, GaussianKernel(0.2), noise=0.01, beta=0.3, batch_bound=3.0, seed=seed)


def _reference(budget):
    arms, f = _problem()
    return torchbkb.run(_bandit(arms), f, budget, progress=False)


def test_dask_flaky_objective_and_dying_worker_give_the_serial_run(dask_client, tmp_path):
    arms, f = _problem()
    budget = 80
    ref = _reference(budget)
    # every third arm fails once, and the 6th evaluation kills its worker
    objective = FlakyObjective(f, tmp_path, fail_first=range(0, len(f), 3), die_at=5)
    hist = torchbkb.run(_bandit(arms), objective, budget, executor=dask_client, progress=False, max_retries=2)
    assert len(hist) == budget and hist.failures == []
    assert hist.index == ref.index and hist.reward == ref.reward and hist.batch == ref.batch  # each point once
    retried = [i for i in set(hist.index) if i % 3 == 0]
    assert retried and all(objective.attempts(i) >= 2 for i in retried)  # the failures really happened
    assert (tmp_path / "eval.5").exists()  # the worker did die (its task was rerun elsewhere)
    runs = {}
    for i, a in zip(hist.index, hist.attempts):
        runs[i] = runs.get(i, 0) + a
    assert runs == {i: objective.attempts(i) for i in runs}  # History reports every run, Dask's own reruns too
    assert sum(kind == "infrastructure" for _, _, kind, _ in hist.errors) == sum(runs.values()) - len(hist) - sum(
        kind == "objective" for _, _, kind, _ in hist.errors
    )


def test_dask_arm_that_always_fails_is_reported_and_left_out(dask_client, tmp_path):
    arms, f = _problem()
    broken = int(_reference(40).index[0])  # the uniform first arm: its batch is only that arm
    bandit = _bandit(arms)
    objective = FlakyObjective(f, tmp_path, always_fail=[broken])
    with pytest.warns(RuntimeWarning, match=f"arm {broken} failed 3 time"):
        hist = torchbkb.run(bandit, objective, 40, executor=dask_client, progress=False, max_retries=2)
    assert len(hist) == 40 and broken not in hist.index
    assert hist.failures and all(arm == broken and "is broken" in msg for _, arm, msg in hist.failures)
    assert objective.attempts(broken) == 3 * len(hist.failures)
    assert bandit.t == 40 and int(bandit.counts.sum()) == 40 and int(bandit.counts[broken]) == 0
    assert len(bandit.pending) == 0 and bandit.history["index"] == hist.index


def test_thread_pool_with_transient_failures_gives_the_serial_run(tmp_path):
    arms, f = _problem()
    ref = _reference(60)
    objective = FlakyObjective(f, tmp_path, fail_first=range(1, len(f), 2))
    with ThreadPoolExecutor(max_workers=4) as pool:
        hist = torchbkb.run(_bandit(arms), objective, 60, executor=pool, progress=False, max_retries=1)
    assert hist.index == ref.index and hist.reward == ref.reward and hist.failures == []
    assert any(objective.attempts(i) == 2 for i in hist.index if i % 2 == 1)


class CrashAfter:
    """Rewards from ``values``; raises (a driver-side crash) once ``calls`` evaluations were made."""

    def __init__(self, values, calls):
        self.values, self.calls, self.n = values, calls, 0

    def __call__(self, idx):
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        self.n += 1
        if self.n > self.calls:
            raise KeyboardInterrupt("driver killed")
        return self.values[idx]


def test_driver_crash_resumes_from_the_checkpoint_losing_at_most_the_batch_in_flight(tmp_path):
    arms, f = _problem()
    budget = 150
    ref = _reference(budget)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        torchbkb.run(_bandit(arms), CrashAfter(f, calls=6), budget, progress=False, checkpoint=ckpt)
    saved = torch.load(ckpt, weights_only=False)
    done = len(saved["history"]["index"])
    assert saved["batches"] == 6 and done == sum(ref.batch_sizes[:6])  # everything before the crashed batch
    resumed = torchbkb.run(_bandit(arms, seed=77), f, budget, progress=False, checkpoint=ckpt)  # a fresh driver
    assert resumed.index == ref.index and resumed.reward == ref.reward and resumed.batch == ref.batch


def test_objective_error_with_on_failure_raise_then_resume(tmp_path):
    arms, f = _problem()
    ref = _reference(100)
    ckpt = tmp_path / "run.pt"
    broken_batch = 4
    earlier = set(i for i, b in zip(ref.index, ref.batch) if b < broken_batch)
    arm = next(i for i, b in zip(ref.index, ref.batch) if b == broken_batch and i not in earlier)  # new in batch 4
    objective = FlakyObjective(f, tmp_path / "att", always_fail=[arm])
    (tmp_path / "att").mkdir()
    with pytest.raises(ObjectiveError, match=f"arm index {arm}"):
        torchbkb.run(_bandit(arms), objective, 100, progress=False, checkpoint=ckpt, on_failure="raise")
    saved = torch.load(ckpt, weights_only=False)
    assert saved["history"]["index"] == ref.index[: len(saved["history"]["index"])]
    assert saved["batches"] == broken_batch  # at most the batch in flight is lost
    resumed = torchbkb.run(_bandit(arms), f, 100, progress=False, checkpoint=ckpt)
    assert resumed.index == ref.index


def test_noisy_arm_objective_draws_independent_reproducible_noise_with_an_executor(dask_client):
    arms, f = _problem()
    serial = torchbkb.run(_bandit(arms), torchbkb.ArmObjective(f, noise_std=0.1, seed=4), 30, progress=False)
    remote = torchbkb.run(_bandit(arms), torchbkb.ArmObjective(f, noise_std=0.1, seed=4), 30, executor=dask_client,
                          progress=False)
    assert remote.reward == serial.reward and remote.index == serial.index
    noise = torch.tensor(remote.reward, dtype=torch.float64) - f[remote.index]
    assert len(set(noise.tolist())) == len(noise)  # one draw per evaluation (copies in workers would repeat one)
