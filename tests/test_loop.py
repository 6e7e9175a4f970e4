import concurrent.futures as cf
import json
import math

import pytest
import torch

from torchbkb import BKB, ArmObjective, History, ObjectiveError, Random, run
from torchbkb.errors import InputDataError
from torchbkb.gp.kernels import GaussianKernel

ARMS = torch.rand(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(3 * ARMS[:, 0]) + ARMS[:, 1]


def test_history_regret_and_json(tmp_path):
    hist = run(Random(ARMS, seed=0), F, budget=25, progress=False)
    best, rate = float(F.max()), float(F.max() - F.mean())
    regret = [best - float(F[i]) for i in hist.index]
    assert hist.regret == pytest.approx(regret)
    assert hist.cumulative_regret[-1] == pytest.approx(sum(regret))
    assert hist.normalized_regret[-1] == pytest.approx(sum(regret) / (25 * rate))
    assert hist.reward == pytest.approx([float(F[i]) for i in hist.index])
    assert hist.batch_sizes == [1] * 25 and hist.dictionary_size == [-1] * 25
    assert all(b >= a for a, b in zip(hist.time, hist.time[1:]))
    hist.save(tmp_path / "h.json")
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["index"] == hist.index and len(data["normalized_regret"]) == 25
    assert History.from_dict(data).index == hist.index
    s = hist.summary()
    assert s["T"] == 25 and s["batches"] == 25


def test_callable_objective_with_values_and_unknown_regret():
    obj = ArmObjective(F, noise_std=0.1, seed=0)
    hist = run(Random(ARMS, seed=0), obj, budget=10, progress=False)
    assert not math.isnan(hist.regret[0])
    hist2 = run(Random(ARMS, seed=0), lambda idx: F[idx], budget=5, progress=False)
    assert all(math.isnan(r) for r in hist2.regret)


class Flaky:
    """Raises for arm 3 always, and once for every other arm on the first call."""

    def __init__(self):
        self.calls = {}

    def __call__(self, idx):
        out = []
        for i in idx.tolist():
            self.calls[i] = self.calls.get(i, 0) + 1
            if i == 3 or self.calls[i] == 1:
                raise RuntimeError(f"boom at {i}")
            out.append(float(F[i]))
        return torch.tensor(out, dtype=torch.float64)


def test_objective_that_raises_names_the_arm():
    bandit = Random(ARMS, seed=0)
    with pytest.raises(ObjectiveError, match=r"arm index \d+"):
        run(bandit, Flaky(), budget=5, progress=False)
    assert len(bandit.pending) == 1  # the state stays consistent: the arm is still pending


def test_retries_and_skip_with_an_executor():
    # force arm 3 into the first ask by making it the only arm of a Random bandit over 1 arm
    arms = ARMS[:5]
    with cf.ThreadPoolExecutor(2) as ex, pytest.warns(RuntimeWarning, match="arm 3 failed 2 time"):
        hist = run(Random(arms, seed=0), Flaky(), budget=8, executor=ex, progress=False, max_retries=1, values=F[:5])
    assert all(i != 3 for i in hist.index)
    assert len(hist) == 8 or len(hist.failures) > 0
    assert all(f[1] == 3 for f in hist.failures) and all("boom at 3" in f[2] for f in hist.failures)


def test_time_limit_and_bad_arguments():
    hist = run(BKB(ARMS, GaussianKernel(0.3), noise=0.1, beta=0.1, seed=0), F, budget=1000, progress=False,
               time_limit=0.0)
    assert len(hist) == 0 and "time limit" in hist.meta["stopped"]
    with pytest.raises(InputDataError, match="bandit"):
        run("x", F, budget=3)
    with pytest.raises(InputDataError, match="objective"):
        run(Random(ARMS), F[:3], budget=3)
    with pytest.raises(InputDataError, match="budget"):
        run(Random(ARMS), F, budget=-1)
    with pytest.raises(InputDataError, match="on_failure"):
        run(Random(ARMS), F, budget=1, on_failure="ignore")


def test_progress_bar_runs():
    hist = run(Random(ARMS, seed=0), F, budget=5, progress=True)
    assert len(hist) == 5


def test_progress_postfix_shows_the_running_normalized_regret(monkeypatch, tmp_path):
    """The bar's R/Runif is R_t / R_unif(t) at every step -- kept as a running sum, also across a resume."""
    import tqdm.auto

    shown = []

    class Bar:
        def __init__(self, *a, **k):
            pass

        def update(self, n):
            pass

        def set_postfix(self, post, refresh=True):
            shown.append(post["R/Runif"])

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    ckpt = tmp_path / "c.pt"
    run(Random(ARMS, seed=0), F, budget=7, progress=True, checkpoint=ckpt)
    hist = run(Random(ARMS, seed=0), F, budget=12, progress=True, checkpoint=ckpt)
    assert shown == [f"{r:.3g}" for r in hist.normalized_regret]
