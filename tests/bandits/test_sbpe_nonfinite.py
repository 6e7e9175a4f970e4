"""S-BPE with a kernel that is NaN/inf between some arms: the ``ask`` or ``tell`` that meets such values names the arms
(``NumericsError.arms``), they are left out of every later batch, fit and elimination (``nonfinite_arms``, kept in
checkpoints), and no NaN enters the bounds; the run goes on."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchbkb
from torchbkb import SBPE
from torchbkb.bandits.design import UncertaintyExplorer
from torchbkb.errors import NumericsError
from torchbkb.gp.kernels import as_kernel

ARMS = torch.rand(150, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = torch.sin(5 * ARMS[:, 0]) + ARMS[:, 1]
BUDGET = 60
SWITCH = {"nan": True}  # the kernel's NaN pairs on or off (a kernel whose hyperparameters moved)


def _kernel(X1, X2):  # symmetric: NaN between the arms past 0.9 and those below 0.1 (first coordinate)
    a, b = X1[..., :, None, 0], X2[..., None, :, 0]
    K = torch.exp(-torch.cdist(X1, X2) ** 2 / 0.08)
    if not SWITCH["nan"]:
        return K
    return K.masked_fill(((a > 0.9) & (b < 0.1)) | ((a < 0.1) & (b > 0.9)), float("nan"))


KERNEL = as_kernel(_kernel, diag=lambda X: torch.ones(X.shape[:-1], dtype=X.dtype))


@pytest.fixture(autouse=True)
def nan_pairs_on():
    SWITCH["nan"] = True
    yield
    SWITCH["nan"] = True


def _bad(a: int) -> bool:
    return not bool(torch.isfinite(_kernel(ARMS[a : a + 1], ARMS)).all())


def _make(device="cpu", **kw):
    return SBPE(ARMS.to(device), KERNEL, noise=0.01, budget=BUDGET, beta=1.0, seed=0, **kw)


def _play(bandit):
    """Asks and tells to the end of the budget, each error's arms excluded (the user's way on); the arms named."""
    named = []
    while bandit.remaining > 0:
        try:
            i = bandit.ask()
        except NumericsError as err:
            named.append(("ask", err.arms))
            bandit.exclude(list(err.arms))
            continue
        assert not set(i.tolist()) & bandit.nonfinite_arms
        try:
            bandit.tell(i, F.to(i.device)[i])
        except NumericsError as err:
            named.append(("tell", err.arms))
            bandit.exclude(list(err.arms))
    return named


def _check_bounds(bandit):
    left = sorted(bandit.nonfinite_arms)
    assert bool(torch.isnan(bandit.upper[left]).all() and torch.isnan(bandit.lower[left]).all())
    scored = bandit.active.clone()
    scored[left] = False
    assert bool(torch.isfinite(bandit.upper[scored]).all() and torch.isfinite(bandit.lower[scored]).all())
    assert not bool(torch.isnan(bandit.best_lower).any())


def test_named_arms_are_left_out_and_the_run_ends_with_finite_bounds(device):
    bandit = _make(device)
    named = _play(bandit)
    assert named and named[0][0] == "ask"
    every = {a for _, arms in named for a in arms}
    assert every == bandit.nonfinite_arms and all(_bad(a) for a in every)
    assert bandit.t == BUDGET and len(bandit.betas) == bandit.num_batches
    _check_bounds(bandit)
    assert int(bandit.recommend()) not in bandit.nonfinite_arms


def test_a_failed_ask_changes_nothing_but_the_draws():
    bandit = _make()
    before = (bandit.asked, bandit.batch_id, bandit.pending_ids, bandit.active.clone())
    with pytest.raises(NumericsError, match="rows of arms") as info:
        bandit.ask()
    assert info.value.arms and set(info.value.arms) == bandit.nonfinite_arms
    assert (bandit.asked, bandit.batch_id, bandit.pending_ids) == before[:3] and torch.equal(bandit.active, before[3])
    i = bandit.ask()  # left out from now on: the next ask does not meet them
    assert i.numel() == bandit.schedule[0] and not set(i.tolist()) & bandit.nonfinite_arms


def test_a_tell_eliminates_on_the_other_arms_then_raises():
    """The NaN pairs appear after the ask: the batch's fit or the elimination's scores meet them."""
    SWITCH["nan"] = False
    bandit = _make()
    i = bandit.ask()
    SWITCH["nan"] = True
    with pytest.raises(NumericsError, match="rows of arms") as info:
        bandit.tell(i, F[i])
    named = set(info.value.arms)
    assert named and named == bandit.nonfinite_arms and all(_bad(a) for a in named)
    assert len(bandit.betas) == 1 and bandit.posterior is not None  # the elimination ran without them
    _check_bounds(bandit)
    assert not set(bandit.ask().tolist()) & named


def test_a_checkpoint_keeps_the_left_out_arms_and_resumes_the_same_run():
    bandit = _make()
    with pytest.raises(NumericsError):
        bandit.ask()
    state = bandit.state_dict()
    assert state["algorithm"]["nonfinite_arms"] == sorted(bandit.nonfinite_arms)
    fresh = _make()
    fresh.load_state_dict(state)
    assert fresh.nonfinite_arms == bandit.nonfinite_arms
    assert _play(fresh) == _play(bandit)
    assert fresh.history == bandit.history and torch.equal(fresh.active, bandit.active)


def test_a_checkpoint_from_before_left_out_arms_loads_with_none():
    SWITCH["nan"] = False
    bandit = _make()
    i = bandit.ask()
    bandit.tell(i, F[i])
    state = bandit.state_dict()
    del state["algorithm"]["nonfinite_arms"]
    fresh = _make()
    fresh.load_state_dict(state)
    assert fresh.nonfinite_arms == set() and fresh.t == bandit.t


def test_torchbkb_run_skips_the_named_arms_and_finishes():
    bandit = _make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        hist = torchbkb.run(bandit, F, budget=BUDGET, on_failure="skip", progress=False)
    assert len(hist) == BUDGET
    assert {a for _, a, _ in hist.failures} == bandit.nonfinite_arms != set()
    _check_bounds(bandit)


def test_the_explorer_names_the_candidates_and_keeps_its_picks():
    ex = UncertaintyExplorer(ARMS, KERNEL, 0.01, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NumericsError) as info:
        ex.run(5)
    assert info.value.arms and all(_bad(a) for a in info.value.arms)
    assert ex.picks.numel() == 0 and ex.refreshes == 0
    keep = torch.tensor([a for a in range(150) if a not in info.value.arms])
    ok = UncertaintyExplorer(ARMS[keep], KERNEL, 0.01, generator=torch.Generator().manual_seed(0))
    assert ok.run(5).numel() == 5
