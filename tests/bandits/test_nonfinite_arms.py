"""Arms whose kernel rows hold NaN/inf, in every kernel bandit: named by the error, left out of the posterior for
good (``nonfinite_arms``, kept in checkpoints), never a NaN in the state; the other arms of their batch stay."""

from __future__ import annotations

import copy

import pytest
import torch

from torchbkb import BBKB, BKB, GPBUCB, GPUCB
from torchbkb.errors import NumericsError
from torchbkb.gp.kernels import as_kernel

ARMS = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) + ARMS[:, 1]
BANDITS = [(GPUCB, {}), (GPBUCB, {}), (BKB, {}), (BBKB, {}), (BKB, {"row_cache_bytes": 0}),
           (BBKB, {"kernel_cache_bytes": 0})]


def _kernel(X1, X2):  # symmetric: NaN between the arms past 0.9 and those below 0.1 (first coordinate)
    a, b = X1[..., :, None, 0], X2[..., None, :, 0]
    K = torch.exp(-torch.cdist(X1, X2) ** 2 / 0.08)
    return K.masked_fill(((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9)), float("nan"))


KERNEL = as_kernel(_kernel, diag=lambda X: torch.ones(X.shape[:-1], dtype=X.dtype))


def _bad(a: int) -> bool:
    return not bool(torch.isfinite(_kernel(ARMS[a : a + 1], ARMS)).all())


def _make(cls, device="cpu", **kw):
    return cls(ARMS.to(device), KERNEL, noise=0.01, beta=0.3, seed=0, **kw)


def _step(bandit) -> tuple[list[int], tuple[int, ...]]:
    """One ask and tell; an error's arms excluded (the user's way on). Returns the picks and the arms named. (BBKB
    with a GPU's defaults runs a batch's update at the next ``ask``, which then raises.)"""
    try:
        i = bandit.ask()
    except NumericsError as err:
        bandit.excluded[list(err.arms)] = True
        return [], err.arms
    try:
        bandit.tell(i, F.to(i.device)[i])
    except NumericsError as err:
        bandit.excluded[list(err.arms)] = True
        return i.tolist(), err.arms
    return i.tolist(), ()


def _scores(bandit) -> tuple[torch.Tensor, torch.Tensor]:
    return bandit.posterior.watched() if isinstance(bandit, GPUCB) else bandit.scores()


@pytest.mark.parametrize(("cls", "kw"), BANDITS)
def test_named_arms_leave_the_posterior_and_no_nan_enters_it(cls, kw, device):
    """Every error names arms whose rows hold NaN/inf, they are kept in ``nonfinite_arms``, the scores stay finite
    at every step (the exact GP's watched points used to take NaN from a new row), and the run goes on."""
    bandit, named = _make(cls, device, **kw), []
    for _ in range(35):
        named += _step(bandit)[1]
        try:
            mean, var = _scores(bandit)
        except NumericsError as err:  # a read-out runs the update BBKB defers on a GPU: it raises then
            named += err.arms
            bandit.excluded[list(err.arms)] = True
            mean, var = _scores(bandit)
        assert bool(torch.isfinite(mean).all() and torch.isfinite(var).all())
    assert len(named) >= 5 and all(map(_bad, named)) and set(named) == bandit.nonfinite_arms
    assert bandit.t >= 35


@pytest.mark.parametrize(("cls", "kw"), BANDITS)
def test_a_checkpoint_after_an_error_resumes_the_same_run(cls, kw, device):
    """Saved right after each error and loaded into a fresh bandit: the load succeeds (a kernel NaN at the same
    probes is the same kernel) and the next steps are the uninterrupted run's. Loading used to fail, or refit the
    left-out arms."""
    bandit, resumed = _make(cls, device, **kw), 0
    for _ in range(25):
        if not _step(bandit)[1]:
            continue
        twin = _make(cls, device, **kw)
        twin.load_state_dict(bandit.state_dict())
        assert twin.nonfinite_arms == bandit.nonfinite_arms
        ahead = copy.deepcopy(bandit)
        assert [_step(ahead) for _ in range(4)] == [_step(twin) for _ in range(4)]
        resumed += 1
    assert resumed >= 3


@pytest.mark.parametrize(("cls", "kw"), BANDITS)
def test_telling_a_left_out_arm_again_fits_the_others_then_raises(cls, kw):
    bandit = _make(cls, **kw)
    while not bandit.nonfinite_arms:
        _step(bandit)
    bad = min(bandit.nonfinite_arms)
    bandit.excluded[bad] = False  # the user lets it be asked again: telling it raises each time
    bandit.exclusions.pop(bad, None)
    for _ in range(40):
        i = bandit.ask()
        if bad in i.tolist():
            t = bandit.t
            with pytest.raises(NumericsError, match=rf"rows of arms \[{bad}\]") as err:
                bandit.tell(i, F[i])
            assert err.value.arms == (bad,) and bandit.t == t + i.numel()
            assert bandit.told_since_update == 0  # the update ran, without it
            return
        bandit.tell(i, F[i])
    pytest.skip("the left-out arm was not asked again")


def test_the_other_new_arms_of_a_batch_stay_pulled():
    """Two arms pulled for the first time in one batch, one with a NaN row: only that one is left out; the other's
    row stays cached and its reward is fitted at the next update."""
    bandit = _make(BBKB, batch_size=2)  # a fixed batch of distinct arms
    while bandit.t < 10:
        _step(bandit)
    pulled = set(bandit.history["index"])
    good = next(a for a in range(150) if a not in pulled and not _bad(a))
    bad = next(a for a in range(150) if a not in pulled and _bad(a))
    bandit.excluded[:] = True
    bandit.excluded[[good, bad]] = False
    i = bandit.ask()
    assert sorted(i.tolist()) == sorted([good, bad])
    with pytest.raises(NumericsError) as err:
        bandit.tell(i, F[i])
    assert err.value.arms == (bad,) and bad in bandit.nonfinite_arms and good not in bandit.nonfinite_arms
    bandit.excluded[:] = False
    bandit.excluded[list(bandit.nonfinite_arms)] = True
    _step(bandit)
    assert bandit.posterior.num_train == len(set(bandit.history["index"]) - bandit.nonfinite_arms)


def test_gp_bucb_ends_a_batch_at_an_arm_it_cannot_hallucinate():
    """A pick whose kernel values hold NaN/inf cannot be hallucinated: the batch ends with it (no NaN in the
    posterior, no error from ``ask``), and its tell raises naming it."""
    bandit = GPBUCB(ARMS, KERNEL, noise=0.01, beta=3.0, seed=0, batch_bound=50.0)
    for _ in range(30):
        i = bandit.ask()
        bad = [a for a in i.tolist() if _bad(a) and a not in bandit.nonfinite_arms]
        assert all(not _bad(a) or a in bandit.nonfinite_arms for a in i.tolist()[:-1])
        try:
            bandit.tell(i, F[i])
        except NumericsError as err:
            assert list(err.arms) == bad == i.tolist()[-1:]
            bandit.excluded[list(err.arms)] = True
        mean, var = bandit.posterior.watched()
        assert bool(torch.isfinite(mean).all() and torch.isfinite(var).all())
    assert bandit.nonfinite_arms


@pytest.mark.parametrize("cls", [GPUCB, BKB])
@pytest.mark.parametrize("bad", [[150], [-1], ["x"], [1.5], {"a": 1}])
def test_a_corrupt_list_of_left_out_arms_is_refused(cls, bad):
    from torchbkb.errors import CheckpointError

    bandit = _make(cls)
    while not bandit.nonfinite_arms:
        _step(bandit)
    state = bandit.state_dict()
    state["algorithm"]["nonfinite_arms"] = bad
    fresh = _make(cls)
    with pytest.raises(CheckpointError, match="nonfinite_arms"):
        fresh.load_state_dict(state)
    assert fresh.nonfinite_arms == set() and fresh.t == 0


@pytest.mark.parametrize("cls", [GPUCB, BKB])
def test_a_checkpoint_from_before_left_out_arms_loads_or_is_refused(cls):
    """Written before ``nonfinite_arms`` existed: none left out. A run whose history holds an arm with NaN kernel
    values cannot be rebuilt so (the exact GP's watched points used to take the NaN in): refused, nothing changed."""
    from torchbkb.errors import CheckpointError

    clean = _make(cls)
    while clean.t < 8 and not clean.nonfinite_arms:
        _step(clean)
    assert not clean.nonfinite_arms
    state = clean.state_dict()
    del state["algorithm"]["nonfinite_arms"]
    fresh = _make(cls)
    fresh.load_state_dict(state)
    assert fresh.nonfinite_arms == set() and fresh.t == clean.t
    while not clean.nonfinite_arms:
        _step(clean)
    state = clean.state_dict()
    del state["algorithm"]["nonfinite_arms"]
    fresh = _make(cls)
    with pytest.raises(CheckpointError, match="NaN/inf"):
        fresh.load_state_dict(state)
    assert fresh.t == 0
