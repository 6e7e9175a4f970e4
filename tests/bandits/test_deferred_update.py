"""BBKB with the GPU's defaults (fixed-capacity update, device loop, replayed picks; forced here on any device)
defers a batch end's update to the next ``ask``, which reads the update's flags with the batch's picks: one host read
per batch. The choices, the read-outs between ``tell`` and ``ask``, checkpoints and copies are the eager ones."""

import copy
import pickle

import pytest
import torch
from helpers import HostReads

from torchbkb import BBKB
from torchbkb.bandits.pick_graph import PickGraphs
from torchbkb.errors import NumericsError
from torchbkb.gp.kernels import GaussianKernel

T = 400


def _cadata(device, A=3000):
    import torchbkb.datasets

    arms, _ = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device)
    _, values = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device, standardize_rewards=False)
    return arms[:A], values[:A]


def _bandit(arms, deferred: bool, kernel=None, **kw):
    """BBKB at the paper's Cadata settings; ``deferred``: the GPU's defaults with graphs on any device (the update
    deferred), else the CPU's (eager update, lazy loop)."""
    b = BBKB(arms, kernel or GaussianKernel.from_width(5.0), noise=0.2, beta=0.894, batch_bound=2.0, seed=3, **kw)
    b.fixed_capacity = b.device_loop = deferred
    b.pick_graphs = PickGraphs(devices=("cpu", "cuda")) if deferred else None
    return b


def _drive(b, values, T, picks=None, every=None):
    """Ask and tell to ``T`` evaluations (host rewards); ``every(b)`` after each tell. Returns the picks."""
    picks = [] if picks is None else picks
    while b.t < T:
        idx = b.ask()
        ids = idx.tolist()
        picks += ids
        b.tell(idx, values[idx].cpu().tolist())
        if every is not None:
            every(b)
    return picks


def test_the_deferred_update_makes_the_eager_choices(device):
    arms, values = _cadata(device)
    eager, deferred = _bandit(arms, False), _bandit(arms, True)
    assert _drive(eager, values, T) == _drive(deferred, values, T)
    assert eager.batch_sizes == deferred.batch_sizes and max(eager.batch_sizes) > 10
    assert deferred.engine.m_cap > 16  # a deferred update outgrew its slots on the way and was run again
    torch.testing.assert_close(deferred.arm_means, eager.arm_means, rtol=1e-9, atol=1e-9)
    assert torch.equal(deferred.dictionary, eager.dictionary)
    assert deferred.num_resparsifications == eager.num_resparsifications


def test_a_batch_reads_the_device_once(device):
    """``tell`` with host rewards reads nothing of the device; ``ask`` reads the update's flags with its picks, once
    when the batch ends within the first replays (1.25 × the last batch + 2 picks, in whole replays of 32), once
    more per 32 picks past them -- beside the float64 accuracy check, when the dictionary has grown by a quarter."""
    arms, values = _cadata(device)
    b = _bandit(arms, True)
    _drive(b, values, 60)  # past the first update (never deferred)
    asks, tells = [], []
    while b.t < T:
        last = b.batch_sizes[-1]
        with HostReads() as r:
            idx = b.ask()
        asks.append((len(r.calls), last, int(idx.numel())))
        y = values[idx].cpu().tolist()
        with HostReads() as r:
            b.tell(idx, y)
        tells.append(len(r.calls))
    assert set(tells) == {1}  # the rewards' host copy, made from the host list given (no device read)
    extra = [calls - 1 - max(0, -(-(n - -(-(int(1.25 * last) + 2) // 32) * 32) // 32)) for calls, last, n in asks]
    assert min(extra) == 0 and sum(e > 0 for e in extra) <= 6, asks


def test_read_outs_between_tell_and_ask_run_the_update_first(device):
    """Whatever reads the posterior after a ``tell`` (means, dictionary, counters, widths' sums, a checkpoint) runs
    the deferred update first, then the run goes on with the eager choices."""
    arms, values = _cadata(device)
    eager = _bandit(arms, False)
    picks = _drive(eager, values, T)
    readers = [lambda b: b.arm_means.sum(), lambda b: b.dictionary, lambda b: b.num_resparsifications,
               lambda b: b.log_sum, lambda b: b.scores(), lambda b: b.state_dict(), lambda b: b.deff,
               lambda b: b.row_posterior.mean, lambda b: b.embeddings_computed]
    step = [0]

    def read(b):
        step[0] += 1
        got = readers[step[0] % len(readers)](b)
        if step[0] % len(readers) == 2:
            assert got == b.num_resparsifications  # the update ran: one per told batch
    b = _bandit(arms, True)
    assert _drive(b, values, T, every=read) == picks
    torch.testing.assert_close(b.arm_means, eager.arm_means, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("how", ["state_dict", "pickle", "deepcopy"])
def test_a_bandit_saved_with_an_update_owed_resumes_with_the_same_choices(how, device):
    arms, values = _cadata(device)
    picks = _drive(_bandit(arms, False), values, T)
    b = _bandit(arms, True)
    first = _drive(b, values, 150)
    if how == "state_dict":
        twin = _bandit(arms, True)
        twin.load_state_dict(b.state_dict())
    elif how == "pickle":
        twin = pickle.loads(pickle.dumps(b))
    else:
        twin = copy.deepcopy(b)
    assert _drive(twin, values, T, list(first)) == picks
    assert _drive(b, values, T, list(first)) == picks


def test_non_finite_kernel_rows_of_new_arms_raise_at_the_next_ask(device):
    """A new arm's kernel row with a NaN: the ask that runs the deferred update says so (a typed error naming the
    arm) and leaves the row cache as before; the bandit still selects on the posterior it had."""
    arms, values = _cadata(device, A=1000)
    bad = set()

    class Broken(GaussianKernel):  # NaN rows for arms pulled while ``bad`` (a pulled arm's row is computed alone)
        def forward(self, x1, x2, **kw):
            K = super().forward(x1, x2, **kw)
            return torch.full_like(K, torch.nan) if bad and x1.shape[0] == 1 else K

    b = _bandit(arms, True, kernel=Broken.from_width(5.0))
    _drive(b, values, 60)
    while True:  # a batch that pulls an arm for the first time
        idx = b.ask()
        if set(idx.tolist()) - set(b.history["index"]):
            break
        b.tell(idx, values[idx].cpu().tolist())
    bad.add(1)
    b.tell(idx, values[idx].cpu().tolist())  # the new rows are computed at the next ask
    with pytest.raises(NumericsError, match="rows of arms"):
        b.ask()
    bad.clear()
    assert b.ask().numel() >= 1  # on the posterior it had, as after an eager update that raised


def test_a_run_records_the_eager_history_and_resumes(tmp_path, device):
    """``torchbkb.run`` reads a deferred update's dictionary size after the next ``ask`` (no read of its own): the
    eager run's history, also through a checkpoint and a resumed run."""
    import torchbkb

    arms, values = _cadata(device, A=2000)
    runs = []
    for deferred in (False, True):  # each: 150 evaluations (the last batch cut short), checkpointed, resumed to 300
        path = str(tmp_path / f"run{deferred}.ckpt")
        first = torchbkb.run(_bandit(arms, deferred), values, 150, progress=False, checkpoint=path, checkpoint_every=2)
        runs.append((first, torchbkb.run(_bandit(arms, deferred), values, 300, progress=False, checkpoint=path)))
    (eager_first, eager), (first, resumed) = runs
    assert first.dictionary_size == eager_first.dictionary_size and -1 not in first.dictionary_size
    assert resumed.index == eager.index and resumed.dictionary_size == eager.dictionary_size
