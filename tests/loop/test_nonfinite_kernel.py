"""``torchbkb.run`` with a kernel that is NaN at some arms: such an arm is handled as a failed objective -- skipped
and excluded with its error (``on_failure="skip"``), or the run stops after a checkpoint that holds every reward told
(``"raise"``), and resuming from it goes on. And ``Bandit.exclude``, which the run uses."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchbkb
from torchbkb import BBKB, BKB, GPUCB
from torchbkb.bandits.baselines import Random
from torchbkb.errors import InputDataError, NumericsError
from torchbkb.gp.kernels import GaussianKernel, as_kernel

ARMS = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) + ARMS[:, 1]


def _kernel(X1, X2):  # symmetric: NaN between the arms past 0.9 and those below 0.1 (first coordinate)
    a, b = X1[..., :, None, 0], X2[..., None, :, 0]
    K = torch.exp(-torch.cdist(X1, X2) ** 2 / 0.08)
    return K.masked_fill(((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9)), float("nan"))


KERNEL = as_kernel(_kernel, diag=lambda X: torch.ones(X.shape[:-1], dtype=X.dtype))
BANDITS = [(BKB, {}), (BBKB, {}), (GPUCB, {}), (BKB, {"row_cache_bytes": 0})]


def _bad(a: int) -> bool:
    return not bool(torch.isfinite(_kernel(ARMS[a : a + 1], ARMS)).all())


@pytest.mark.parametrize(("cls", "kw"), BANDITS)
def test_skip_leaves_out_and_excludes_the_arms_with_nan_kernel_values(cls, kw):
    bandit = cls(ARMS, KERNEL, noise=0.01, beta=0.3, seed=0, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = torchbkb.run(bandit, F, 80, progress=False, on_failure="skip")
    assert len(hist) == 80 == bandit.t  # every reward told is in the history, the left-out arms' too
    left = [a for _, a, _ in hist.failures]
    assert left and all(map(_bad, left)) and set(left) == bandit.nonfinite_arms
    assert all("NaN/inf" in bandit.exclusions[a] for a in left)
    assert all(hist.index.count(a) == 1 for a in left)  # excluded after its one pull
    assert sum("left out" in str(w.message) for w in caught) == len(left)


@pytest.mark.filterwarnings("ignore:torchbkb.run. arm:RuntimeWarning")
@pytest.mark.parametrize(("cls", "kw"), BANDITS)
def test_raise_checkpoints_every_reward_told_and_a_resumed_run_goes_on(cls, kw, tmp_path):
    path = tmp_path / "run.pt"
    bandit = cls(ARMS, KERNEL, noise=0.01, beta=0.3, seed=0, **kw)
    with pytest.raises(NumericsError, match="NaN/inf") as err:
        torchbkb.run(bandit, F, 80, progress=False, checkpoint=path)  # on_failure="raise" in the driver
    assert err.value.arms and all(map(_bad, err.value.arms))
    resumed = cls(ARMS, KERNEL, noise=0.01, beta=0.3, seed=0, **kw)
    hist = torchbkb.run(resumed, F, 80, progress=False, checkpoint=path, on_failure="skip")
    assert len(hist) == 80 and hist.index[: bandit.t] == bandit.history["index"]  # nothing told was lost
    assert set(err.value.arms) <= resumed.nonfinite_arms


def test_exclude_keeps_the_reason_changes_nothing_on_bad_input_and_leaves_pending_arms_pending():
    bandit = Random(ARMS, seed=0)
    assert bandit.exclude(torch.tensor([7, 3, 7]), reason="broken") == [3, 7]
    assert bandit.exclusions == {3: "broken", 7: "broken"} and int(bandit.excluded.sum()) == 2
    before = (bandit.excluded.clone(), dict(bandit.exclusions))
    for bad in ([150], [-1], torch.tensor([1.0]), [[1, 2]]):
        with pytest.raises(InputDataError):
            bandit.exclude(bad)
        assert torch.equal(bandit.excluded, before[0]) and bandit.exclusions == before[1]
    i = bandit.ask()
    bandit.exclude(i)
    assert bandit.pending_ids == i.tolist()  # still to be told (or discarded)
    bandit.tell(i, F[i])
    for _ in range(40):
        j = bandit.ask()
        assert int(j) not in (3, 7, int(i))
        bandit.tell(j, F[j])


def test_exclude_after_a_pruned_update_rescores_the_skipped_arms():
    """Excluding the arm whose mean set the pruning level: the variances the update skipped are computed, so the next
    pick is the one an update without pruning makes."""
    runs = []
    for prune in (True, False):
        bandit = BKB(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, seed=0, prune=prune)
        for _ in range(30):
            i = bandit.ask()
            bandit.tell(i, F[i])
        bandit.exclude([int(bandit.arm_means.argmax())])
        runs.append([int(bandit.ask())])
    assert runs[0] == runs[1]
