"""Where the fixed-capacity update applies: past ``FIXED_ROWS_MAX`` padded row entries an update that prunes runs
eagerly, and BBKB with replayed picks keeps the fixed update, which then scores every arm -- the same picks."""

from __future__ import annotations

import pytest

from fixed_capacity_cases import problem, run_picks
from torchbkb import BBKB, BKB


def test_bbkb_with_replayed_picks_scores_every_arm_in_the_fixed_update():
    """Replayed picks take every arm, so BBKB's fixed-capacity update does not prune while they are on: the same
    picks as the eager update, which prunes."""
    from torchbkb.bandits.pick_graph import PickGraphs

    arms, f = problem(3, "cpu", A=3_000)
    kw = {"T": 120, "seed": 3, "prune": True, "beta": 0.05, "batch_bound": 3.0}
    eager, be = run_picks(BBKB, arms, f, fixed=False, **kw)

    def replayed(b):
        b.device_loop, b.pick_graphs = True, PickGraphs(devices=("cpu", "cuda"))

    fixed, bf = run_picks(BBKB, arms, f, fixed=True, setup=replayed, **kw)
    assert fixed == eager
    assert be.scored_arms is not None and bf.scored_arms is None


def _record_launches(b, launches: list[int]) -> None:
    """Append the engine's ``m_cap`` to ``launches`` at each fixed-capacity update ``b`` launches."""
    launch = b.engine.launch
    b.engine.launch = lambda *a, **kw: launches.append(b.engine.m_cap) or launch(*a, **kw)


@pytest.mark.parametrize("cls", [BKB, BBKB])
def test_past_the_row_limit_the_eager_update_runs_with_the_same_picks(cls, device, monkeypatch):
    """``m_cap × A`` over :data:`FIXED_ROWS_MAX` (lowered here to 16 slots of 300 arms): the fixed-capacity update
    runs while the dictionary fits 16 slots (the update that outgrows them ends in 32), then the eager one -- the
    picks of a run that is eager throughout. BBKB's picks are not replayed from graphs, as on the CPU."""
    import torchbkb.bandits.capacity as capacity

    monkeypatch.setattr(capacity, "FIXED_ROWS_MAX", 16 * 300)
    arms, f = problem(21, device)
    launches = []

    def no_replayed_picks(b):  # BBKB's picks replay from graphs on CUDA by default: its update would not prune
        if isinstance(b, BBKB):
            b.pick_graphs = None

    def recorded(b):
        no_replayed_picks(b)
        _record_launches(b, launches)

    eager, _ = run_picks(cls, arms, f, fixed=False, T=120, seed=21, setup=no_replayed_picks)
    fixed, b = run_picks(cls, arms, f, fixed=True, T=120, seed=21, setup=recorded)
    assert fixed == eager
    assert launches.count(16) >= 5 and set(launches) <= {16, 32} and launches.count(32) <= 1  # the outgrowing one
    assert b.dictionary_size > 16


def test_the_row_limit_leaves_bbkb_with_replayed_picks_on_the_fixed_update(monkeypatch):
    """Replayed picks take every arm from the fixed update (it does not prune then): the limit, measured for an update
    that prunes, does not apply; the same picks as the eager update."""
    import torchbkb.bandits.capacity as capacity
    from torchbkb.bandits.pick_graph import PickGraphs

    monkeypatch.setattr(capacity, "FIXED_ROWS_MAX", 16 * 300)
    arms, f = problem(22, "cpu")
    launches = []

    def setup(b):
        b.pick_graphs = PickGraphs(devices=("cpu",))
        _record_launches(b, launches)

    eager, _ = run_picks(BBKB, arms, f, fixed=False, T=120, seed=22)
    fixed, b = run_picks(BBKB, arms, f, fixed=True, T=120, seed=22, setup=setup)
    assert fixed == eager
    assert b.dictionary_size > 32 and launches.count(max(launches)) >= 3 and max(launches) >= 64
