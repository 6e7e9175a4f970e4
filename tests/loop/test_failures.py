"""torchbkb.run under failures: the infrastructure's (unreachable objective, dead pool workers, a Dask restart)
never exclude an arm; the objective's are retried point by point, recorded, excluded and re-admitted (what the
objective returns is validated in test_objective_outputs.py)."""

import collections
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import torchbkb
from helpers import claim
from loop.failure_cases import ARMS, F, Batches
from torchbkb import BBKB, InfrastructureError
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

pytestmark = pytest.mark.usefixtures("one_thread")


def _bandit(seed=3):
    return BBKB(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, batch_bound=3.0, seed=seed)


def _reference(budget):
    return torchbkb.run(_bandit(), F, budget, progress=False)


class Counter:
    """Counts calls through files (pool workers share no memory): ``claim(name)`` numbers this call."""

    def __init__(self, root):
        self.root = str(root)

    def claim(self, name):
        return claim(self.root, name)

    def count(self, name):
        return len(list(Path(self.root).glob(f"{name}.*")))


class Unreachable(Counter):
    """``values[i]``, but calls raise ``ConnectionError`` while the service is down: from call ``up`` on (``None``:
    never), for ``down_for`` seconds after the first failure (``None``: for good); ``kill_at``: the call with that
    number kills its (pool worker) process, once."""

    def __init__(self, values, root, up=None, down_for=None, kill_at=None, driver_pid=None):
        super().__init__(root)
        self.table = values.tolist()  # plain floats: torch shares tensors with pool workers through file descriptors
        self.up, self.down_for, self.kill_at = up, down_for, kill_at
        self.driver_pid = os.getpid() if driver_pid is None else driver_pid
        self.since = None

    def __call__(self, idx):
        n = self.claim("call")
        if self.kill_at is not None and n == self.kill_at and os.getpid() != self.driver_pid:
            os._exit(1)
        if self.up is not None and n >= self.up:
            self.since = time.monotonic() if self.since is None else self.since
            if self.down_for is None or time.monotonic() - self.since < self.down_for:
                raise ConnectionError("service unreachable")
        return torch.tensor([self.table[i] for i in torch.as_tensor(idx).reshape(-1).tolist()], dtype=torch.float64)


def test_an_objective_unreachable_for_a_while_is_retried_and_blames_no_arm(tmp_path):
    ref = _reference(60)
    objective = Unreachable(F, tmp_path, up=5, down_for=0.5)  # many more failures than any arm's max_retries=2
    with ThreadPoolExecutor(4) as pool:
        hist = torchbkb.run(_bandit(), objective, 60, executor=pool, progress=False, checkpoint=tmp_path / "c.ckpt",
                            retry_delay=0.01, deadline=60)
    assert hist.index == ref.index and hist.reward == ref.reward and hist.failures == []
    assert len(hist.errors) > 3 and all(kind == "infrastructure" for _, _, kind, _ in hist.errors)
    assert max(hist.attempts) > 3  # retried beyond max_retries: infrastructure failures do not count
    saved = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert not bool(saved["bandit"]["excluded"].any())


class UrlDown:
    """``values[i]``; the first ``down`` calls raise ``urllib.error.URLError`` (an ``OSError``, not a
    ``ConnectionError``)."""

    def __init__(self, values, down):
        self.values, self.down, self.calls = values, down, 0

    def __call__(self, idx):
        import urllib.error

        self.calls += 1
        if self.calls <= self.down:
            raise urllib.error.URLError("no route to host")
        return self.values[torch.as_tensor(idx, dtype=torch.long)]


def test_operating_system_errors_of_the_objective_are_infrastructure_failures():
    ref = _reference(30)
    hist = torchbkb.run(_bandit(), UrlDown(F, 6), 30, progress=False, max_retries=0, retry_delay=0.001)
    assert (hist.index == ref.index and hist.failures == [] and [k for _, _, k, _ in hist.errors] == ["infrastructure"]
            * 6)


def test_past_the_deadline_the_run_checkpoints_raises_and_resumes_without_exclusions(tmp_path):
    ref = _reference(80)
    ckpt = tmp_path / "run.ckpt"
    down = Unreachable(F, tmp_path, up=30)  # down for good after 30 calls
    with ThreadPoolExecutor(2) as pool, pytest.raises(InfrastructureError, match="resume") as err:
        torchbkb.run(_bandit(), down, 80, executor=pool, progress=False, checkpoint=ckpt, retry_delay=0.01,
                     deadline=0.2)
    assert err.value.arms  # the outstanding arms are named
    saved = torch.load(ckpt, weights_only=True)
    done = len(saved["history"]["index"])
    assert not bool(saved["bandit"]["excluded"].any()) and done >= 30 - 2
    # the batches told whole are the reference's; of the batch cut off, the arms whose calls got through (which
    # ones is up to the pool's threads, so compared as a multiset)
    got, want = _by_batch(saved["history"]["index"], saved["history"]["batch"]), _by_batch(ref.index, ref.batch)
    last = max(got)
    assert (all(got[b] == want[b] for b in got if b != last)
            and not (collections.Counter(got[last]) - collections.Counter(want[last])))
    for _ in range(2):  # every resume while it is still down fails the same way, and excludes nothing
        with ThreadPoolExecutor(2) as pool, pytest.raises(InfrastructureError):
            torchbkb.run(_bandit(), down, 80, executor=pool, progress=False, checkpoint=ckpt, retry_delay=0.01,
                         deadline=0.1)
    resumed = torchbkb.run(_bandit(), F, 80, progress=False, checkpoint=ckpt)
    assert _by_batch(resumed.index, resumed.batch) == _by_batch(ref.index, ref.batch) and resumed.failures == []
    assert sorted(zip(resumed.index, resumed.reward)) == sorted(zip(ref.index, ref.reward))


def _by_batch(index: list[int], batch: list[int]) -> dict[int, list[int]]:
    """``{batch: sorted arms told in it}``: the order within a batch is the order the evaluations arrived in."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for i, b in zip(index, batch):
        out[b].append(i)
    return {b: sorted(v) for b, v in out.items()}


def test_a_pool_the_run_owns_is_recreated_when_a_worker_dies(tmp_path):
    ref = _reference(50)
    objective = Unreachable(F, tmp_path, kill_at=6)
    hist = torchbkb.run(_bandit(), objective, 50, executor="process", workers=2, progress=False, max_retries=0,
                        retry_delay=0.01)
    assert hist.index == ref.index and hist.reward == ref.reward and hist.failures == []
    assert any("BrokenProcessPool" in msg for _, _, kind, msg in hist.errors if kind == "infrastructure")


def test_a_broken_pool_of_the_caller_ends_the_run_with_a_typed_error_and_nothing_excluded(tmp_path):
    ref = _reference(50)
    ckpt = tmp_path / "run.ckpt"
    objective = Unreachable(F, tmp_path, kill_at=6)
    with ProcessPoolExecutor(2) as pool, pytest.raises(InfrastructureError, match="broken"):
        torchbkb.run(_bandit(), objective, 50, executor=pool, progress=False, checkpoint=ckpt, max_retries=12,
                     retry_delay=0.01)
    saved = torch.load(ckpt, weights_only=True)
    assert not bool(saved["bandit"]["excluded"].any())
    with ProcessPoolExecutor(2) as pool:
        resumed = torchbkb.run(_bandit(), objective, 50, executor=pool, progress=False, checkpoint=ckpt)
    assert resumed.index == ref.index and resumed.reward == ref.reward and resumed.failures == []


class Slow(Counter):
    """``values[i]`` after ``delay`` seconds; the first call signals ``started``."""

    def __init__(self, values, root, delay):
        super().__init__(root)
        self.values, self.delay = values, delay

    def __call__(self, idx):
        if self.claim("call") >= 12:
            Path(self.root, "started").touch()
            time.sleep(self.delay)
        return self.values[torch.as_tensor(idx, dtype=torch.long)]


def test_a_dask_restart_in_the_middle_of_a_batch_excludes_no_arm(dask_client, tmp_path):
    ref = _reference(40)
    objective = Slow(F, tmp_path, delay=0.3)

    def restart_once():
        while not (tmp_path / "started").exists():
            time.sleep(0.01)
        dask_client.restart()

    watcher = threading.Thread(target=restart_once, daemon=True)
    watcher.start()
    hist = torchbkb.run(_bandit(), objective, 40, executor=dask_client, progress=False, max_retries=0, retry_delay=0.1,
                        deadline=120)
    watcher.join(timeout=60)
    assert hist.index == ref.index and hist.reward == ref.reward
    assert hist.failures == [] and any(kind == "infrastructure" for _, _, kind, _ in hist.errors)


class OnceBroken(Counter):
    """``values[i]``; arm ``bad`` raises on its first evaluation only. Counts point evaluations."""

    def __init__(self, values, root, bad, vectorized=False):
        super().__init__(root)
        self.values, self.bad, self.vectorized = values, bad, vectorized

    def __call__(self, idx):
        idx = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        for _ in idx.tolist():
            self.claim("point")
        if self.bad in idx.tolist() and self.claim("bad") == 0:
            if self.vectorized:
                out = self.values[idx].clone()
                out[idx == self.bad] = float("nan")  # a vectorized objective reports the failed point as NaN
                return out
            raise RuntimeError(f"transient failure at arm {self.bad}")
        return self.values[idx]


@pytest.mark.parametrize("vectorized", [False, True])
def test_retries_rerun_only_the_failed_point(tmp_path, vectorized):
    bandit = Batches(ARMS, 50, seed=1)
    first = bandit.ask()
    bad = int(first[7])
    objective = OnceBroken(F, tmp_path, bad, vectorized=vectorized)
    hist = torchbkb.run(bandit, objective, 150, progress=False, max_retries=1)
    assert len(hist) == 150 and hist.failures == []
    assert objective.count("point") == 151  # 150 rewards, one re-run point
    assert hist.attempts.count(2) == 1 and hist.attempts[hist.index.index(bad)] == 2
    assert [(b, a, k) for b, a, k, _ in hist.errors] == [(0, bad, "objective")]


class AlwaysBroken:
    def __init__(self, values, bad):
        self.values, self.bad = values, set(bad)

    def __call__(self, idx):
        i = int(torch.as_tensor(idx).reshape(-1)[0])
        if i in self.bad:
            raise ValueError(f"sample {i} is contaminated")
        return self.values[[i]]


def test_excluded_arms_keep_their_error_and_can_be_readmitted_on_resume(tmp_path):
    bandit = Batches(ARMS, 5, seed=2)
    bad = bandit.ask()[:2].tolist()
    ckpt = tmp_path / "run.ckpt"
    with pytest.warns(RuntimeWarning, match="left out"):
        hist = torchbkb.run(bandit, AlwaysBroken(F, bad), 20, progress=False, on_failure="skip", max_retries=1,
                            checkpoint=ckpt)
    assert (sorted(bandit.exclusions) == sorted(set(bad))
            and all(r == f"ValueError: sample {a} is contaminated" for a, r in bandit.exclusions.items()))
    assert {a for _, a, _ in hist.failures} == set(bad) and hist.attempts == [1] * len(hist)
    fresh = Batches(ARMS, 5, seed=2)
    # the exclusions come back with the checkpoint
    resumed = torchbkb.run(fresh, F, 40, progress=False, checkpoint=ckpt)
    assert sorted(fresh.exclusions) == sorted(set(bad)) and not set(resumed.index[len(hist):]) & set(bad)
    again = Batches(ARMS, 5, seed=2)
    hist2 = torchbkb.run(again, F, 60, progress=False, checkpoint=ckpt, readmit=True)
    assert not bool(again.excluded.any()) and again.exclusions == {}
    assert sorted(hist2.meta["readmitted"]) == sorted(set(bad))
    with pytest.raises(InputDataError, match="excluded"):
        again.readmit([0])


def test_a_bandit_readmits_chosen_arms():
    bandit = Batches(ARMS, 3, seed=0)
    idx = bandit.ask()
    bandit.discard(idx, exclude=True, reason="broken sensor")
    assert bandit.exclusions == {int(a): "broken sensor" for a in idx}
    assert bandit.readmit(idx[:1]) == [int(idx[0])]
    assert not bool(bandit.excluded[idx[0]]) and int(idx[0]) not in bandit.exclusions


def test_infrastructure_retries_back_off_exponentially_up_to_a_cap_and_a_deadline(monkeypatch):
    import torchbkb.experiment.evaluation as evaluation

    waits, clock = [], [0.0]
    monkeypatch.setattr(evaluation.time, "sleep", lambda s: (waits.append(s), clock.__setitem__(0, clock[0] + s)))
    monkeypatch.setattr(evaluation.time, "monotonic", lambda: clock[0])
    calls = []

    def down_ten_times(idx):
        calls.append(idx)
        if len(calls) <= 10:
            raise ConnectionError("down")
        return F[idx]

    out = evaluation.BatchEvaluator(down_ten_times, retry_delay=0.1, deadline=100).evaluate([4])
    assert out.rewards == {0: float(F[4])} and out.attempts == [11] and out.failed == {}
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6] + [evaluation.MAX_DELAY] * 5)
    waits.clear()
    calls.clear()
    clock[0] = 0.0
    out = evaluation.BatchEvaluator(down_ten_times, retry_delay=0.1, deadline=1.0).evaluate([4])
    assert out.outstanding == [0] and out.rewards == {} and sum(waits) == pytest.approx(1.0)  # gave up at the deadline


def test_an_executor_that_was_shut_down_ends_the_run_with_a_typed_error_and_no_exclusion(tmp_path):
    pool = ThreadPoolExecutor(2)
    pool.shutdown()
    bandit = _bandit()
    with pytest.raises(InfrastructureError, match="shutdown"):
        torchbkb.run(bandit, F, 20, executor=pool, progress=False, checkpoint=tmp_path / "c.ckpt")
    assert not bool(bandit.excluded.any()) and len(bandit.pending) == 1 and bandit.t == 0


class SlowFirst:
    """``values[i]``; the first call sleeps ``delay`` seconds."""

    def __init__(self, values, delay):
        self.values, self.delay, self.calls = values, delay, 0

    def __call__(self, idx):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.delay)
        return self.values[torch.as_tensor(idx, dtype=torch.long)]


def test_a_point_that_times_out_is_an_infrastructure_failure_and_is_retried():
    ref = _reference(15)
    with ThreadPoolExecutor(2) as pool:
        hist = torchbkb.run(_bandit(), SlowFirst(F, 1.0), 15, executor=pool, progress=False, max_retries=0, timeout=0.2,
                            retry_delay=0.01)
    assert hist.index == ref.index and hist.failures == []
    assert [k for _, _, k, msg in hist.errors] == ["infrastructure"] and hist.attempts[0] == 2
