"""torchbkb.run validates what the objective returns and the values it is given: anything but one real reward per arm
is refused with a typed error naming the arms, a NaN reward is a failure of its arm, and nothing is told."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchbkb
from loop.failure_cases import ARMS, A, F, Batches
from torchbkb import ObjectiveError, ObjectiveOutputError
from torchbkb.errors import InputDataError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "make",
    [
        lambda idx: torch.zeros(len(idx), 2),  # (k, 2)
        lambda idx: torch.zeros(len(idx) + 1),  # k + 1 values
        lambda idx: torch.zeros(len(idx), dtype=torch.complex128) + 1j,  # complex
        lambda idx: "1.0",  # not a number
        lambda idx: None,
        lambda idx: torch.ones(len(idx), dtype=torch.bool),
    ],
)
@pytest.mark.parametrize("vectorized", [False, True])
def test_results_that_are_not_one_real_reward_per_arm_are_refused(make, vectorized):
    class Objective:
        def __call__(self, idx):
            return make(idx)

    Objective.vectorized = vectorized
    bandit = Batches(ARMS, 4, seed=0)
    asked = bandit.ask().tolist()
    with pytest.raises(ObjectiveOutputError, match=r"arms \[") as err:
        torchbkb.run(bandit, Objective(), 8, progress=False)
    assert str(asked[0]) in str(err.value)
    assert bandit.t == 0 and bandit.pending.tolist() == asked  # nothing told, nothing dropped


def test_nan_rewards_are_failures_of_their_arm():
    bandit = Batches(ARMS, 3, seed=0)
    bad = int(bandit.ask()[1])
    objective = lambda idx: F[idx] if int(idx[0]) != bad else torch.tensor([float("nan")])  # noqa: E731
    with pytest.raises(ObjectiveError, match=f"arm index {bad}.*non-finite"):
        torchbkb.run(bandit, objective, 6, progress=False, max_retries=2)
    assert bandit.t == 2 and bandit.pending.tolist() == [bad]  # the others were kept


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.int64, torch.complex64, torch.bool]))
def test_any_output_is_accepted_exactly_when_it_is_one_real_reward_per_arm(shape, dtype):
    k = 3
    out = torch.ones(shape, dtype=dtype)

    class Objective:
        vectorized = True

        def __call__(self, idx):
            return out

    bandit = Batches(ARMS, k, seed=0)
    ok = tuple(shape) in ((k,), (k, 1)) and dtype in (torch.float64, torch.float32, torch.int64)
    if ok:
        hist = torchbkb.run(bandit, Objective(), k, progress=False)
        assert hist.reward == [1.0] * k
    else:
        asked = bandit.ask().tolist()
        with pytest.raises(ObjectiveOutputError):
            torchbkb.run(bandit, Objective(), k, progress=False)
        assert bandit.pending.tolist() == asked and bandit.t == 0


def test_values_are_validated_up_front():
    calls = []

    def objective(idx):
        calls.append(idx)
        return F[idx]

    bad = F.clone()
    bad[3] = float("nan")
    for values, match in [(bad, "NaN"), (F[:10], "shape"), (F.to(torch.complex128), "real"), ([1.0] * A, "tensor")]:
        with pytest.raises(InputDataError, match=match):
            torchbkb.run(Batches(ARMS, 2), objective, 4, values=values, progress=False)
    with pytest.raises(InputDataError, match="NaN"):
        torchbkb.run(Batches(ARMS, 2), bad, 4, progress=False)
    assert calls == []
