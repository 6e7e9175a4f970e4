import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import same_state
from torchbkb import BKB, GPUCB, EpsGreedy, Random
from torchbkb.errors import InputDataError, TorchBKBError
from torchbkb.gp.kernels import GaussianKernel

ARMS = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
F = -((ARMS - 0.4) ** 2).sum(-1)


def _bandits():
    k = GaussianKernel(0.3)
    return [
        ("bkb", lambda: BKB(ARMS, k, noise=0.1, q_bar=2.0, beta=0.3, seed=0)),
        ("gpucb", lambda: GPUCB(ARMS, k, noise=0.1, beta=0.3, seed=0)),
        ("eps", lambda: EpsGreedy(ARMS, 0.2, seed=0)),
        ("random", lambda: Random(ARMS, seed=0)),
    ]


def _warm(make, steps=5):
    b = make()
    for _ in range(steps):
        i = b.ask()
        b.tell(i, F[i])
    return b


BAD_TELLS = [
    (lambda i: (torch.tensor([(int(i) + 1) % 30]), torch.tensor([0.0])), "were asked"),
    (lambda i: (torch.tensor([30]), torch.tensor([0.0])), r"in \[0, 30\)"),
    (lambda i: (torch.tensor([-1]), torch.tensor([0.0])), r"in \[0, 30\)"),
    (lambda i: (i, torch.tensor([0.0, 1.0])), "expected 1 rewards"),
    (lambda i: (i, torch.tensor([float("nan")])), "finite"),
    (lambda i: (i, torch.tensor([float("inf")])), "finite"),
    (lambda i: (i.double(), torch.tensor([0.0])), "integer tensor"),
    (lambda i: (torch.tensor([], dtype=torch.long), torch.tensor([])), "at least one"),
    (lambda i: (i, "x"), "rewards"),
]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_bandits()), st.sampled_from(BAD_TELLS))
def test_bad_tell_leaves_state_unchanged_and_ask_repeats(bandit_case, bad):
    _, make = bandit_case
    b = _warm(make)
    asked = b.ask()
    before = b.state_dict()
    make_bad, msg = bad
    idx, y = make_bad(asked)
    with pytest.raises(TorchBKBError, match=msg):
        b.tell(idx, y)
    assert same_state(before, b.state_dict())
    assert torch.equal(b.ask(), asked)


@pytest.mark.parametrize("name,make", _bandits())
def test_tell_twice_is_rejected_and_discard_resolves(name, make):
    b = _warm(make, 3)
    i = b.ask()
    b.tell(i, F[i])
    with pytest.raises(InputDataError, match="were asked"):
        b.tell(i, F[i])
    j = b.ask()
    b.discard(j)
    assert len(b.pending) == 0 and b.t == 4


@pytest.mark.parametrize("name,make", _bandits())
def test_a_column_of_rewards_reads_as_a_vector_and_a_matrix_is_refused(name, make):
    """BoTorch's ``Y`` `(k, 1)` is told as `(k,)`; a `(k, 2)` matrix raises and changes nothing."""
    a, b = _warm(make), _warm(make)
    i, j = a.ask(), b.ask()
    assert torch.equal(i, j)
    before = b.state_dict()
    with pytest.raises(InputDataError, match="one per index"):
        b.tell(j, torch.stack([F[j], F[j]], -1))
    assert same_state(before, b.state_dict())
    a.tell(i, F[i])
    b.tell(j, F[j].unsqueeze(-1))
    assert same_state(a.state_dict(), b.state_dict()) and torch.equal(a.ask(), b.ask())


@pytest.mark.parametrize(
    "arms,msg",
    [
        (torch.tensor([[0.0, float("nan")]]), "NaN/inf"),
        (torch.rand(3), r"expected shape \(\*batch, n, d\)"),
        (torch.rand(2, 3, 2), r"expected shape \(A, d\)"),
        (torch.empty(0, 2), "at least 1 rows"),
        (torch.ones(3, 2, dtype=torch.long), "floating"),
    ],
)
def test_bad_arms(arms, msg):
    with pytest.raises(InputDataError, match=msg):
        BKB(arms, GaussianKernel(1.0), noise=0.1)
    with pytest.raises(InputDataError, match=msg):
        Random(arms)


def test_eps_greedy_and_random():
    with pytest.raises(InputDataError, match="epsilon"):
        EpsGreedy(ARMS, 1.5)
    b = EpsGreedy(ARMS, 0.0, seed=1)
    for _ in range(10):
        i = b.ask()
        b.tell(i, F[i])
    assert set(b.history["index"][1:]) == {b.history["index"][0]}  # ε = 0: exploit the only pulled arm
    r = Random(ARMS, seed=2)
    seen = set()
    for _ in range(200):
        i = r.ask()
        r.tell(i, F[i])
        seen.add(int(i))
    assert len(seen) == 30


def test_load_state_dict_checks_the_class():
    with pytest.raises(InputDataError, match="expected a GPUCB checkpoint"):
        GPUCB(ARMS, GaussianKernel(1.0), noise=0.1).load_state_dict(Random(ARMS).state_dict())


class _FixedBatch(Random):
    """Asks one given batch (repeats allowed)."""

    def __init__(self, batch):
        super().__init__(ARMS, seed=0)
        self.batch = batch

    def _select(self):
        return torch.tensor(self.batch)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_pending_is_a_multiset_told_in_any_order_and_in_parts(data):
    """A batch with repeated arms, told in any order and in parts: each told index takes out one pending
    occurrence (the earliest, like ``list.remove``); telling more copies of an arm than are pending, or an
    arm that is not pending, is rejected with the state unchanged; the batch ends when nothing is left."""
    batch = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=12))
    b = _FixedBatch(batch)
    assert b.ask().tolist() == batch
    order = data.draw(st.permutations(range(len(batch))))
    cuts = sorted(data.draw(st.sets(st.integers(1, len(batch) - 1), max_size=3))) if len(batch) > 1 else []
    reference = list(batch)
    for lo, hi in zip([0, *cuts], [*cuts, len(batch)]):
        part = [batch[j] for j in order[lo:hi]]
        extra = data.draw(st.integers(0, 6))
        if reference.count(extra) == part.count(extra):  # one copy too many (or an arm never asked)
            before = b.state_dict()
            with pytest.raises(InputDataError, match="were asked"):
                b.tell(torch.tensor(part + [extra]), torch.zeros(len(part) + 1, dtype=torch.float64))
            assert same_state(before, b.state_dict())
        b.tell(torch.tensor(part), F[torch.tensor(part)])
        for a in part:
            reference.remove(a)
        assert b.pending.tolist() == reference == b.pending_ids
    assert b.t == len(batch) and b.history["index"] == [batch[j] for j in order] and b.batch_id == 1
    assert len(b.ask()) == len(batch) and b.batch_id == 2  # the batch ended: a new one is asked


def test_run_hands_the_objective_the_asked_arms_without_reading_the_tensor_ask_returned(monkeypatch):
    """``torchbkb.run`` takes the asked arms from :attr:`pending_ids` (the host's copy) and tells the very tensor
    ``ask`` returned: on a GPU a read of that tensor would be one more host synchronization per batch."""
    import types

    from torchbkb import run

    b = _FixedBatch([3, 1, 3, 4])
    asked, read, ask, tolist = [], [], b.ask, torch.Tensor.tolist

    def recording_ask(self):
        asked.append(ask())
        return asked[-1]

    def recording_tolist(t):
        read.extend(i for i, a in enumerate(asked) if t is a)
        return tolist(t)

    b.ask = types.MethodType(recording_ask, b)
    monkeypatch.setattr(torch.Tensor, "tolist", recording_tolist)
    hist = run(b, F, budget=10, progress=False)
    assert len(asked) == 3 and not read
    assert hist.index == [3, 1, 3, 4, 3, 1, 3, 4, 3, 1]  # the last batch cut to the budget
