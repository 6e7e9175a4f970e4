"""``state_dict`` / ``load_state_dict`` of the online learners: a saved learner, loaded into a new one of the same
settings, forecasts and goes on learning bit for bit; a corrupt state is refused and changes nothing."""

import io

import pytest
import torch

from torchbkb.errors import CheckpointError
from torchbkb.online import FOGD, PKAWV, KernelAWV, OnlineKRR, ProsNKONS, TaylorEmbedding

from ._refs import DEVICES, rbf, single_thread  # noqa: F401 (autouse fixture)

_D = torch.rand(10, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
LEARNERS = {
    "KernelAWV": lambda dev: KernelAWV(rbf),
    "OnlineKRR": lambda dev: OnlineKRR(rbf),
    "PKAWV-KORS": lambda dev: PKAWV(kernel=rbf, dictionary="kors", seed=0),
    "PKAWV-Nystrom": lambda dev: PKAWV(kernel=rbf, dictionary=_D.to(dev)),
    "PKAWV-Taylor": lambda dev: PKAWV(embedding=TaylorEmbedding(2, degree=3)),
    "ProsNKONS": lambda dev: ProsNKONS(rbf, seed=0),
    "FOGD": lambda dev: FOGD(2, num_features=50, lr=0.1, seed=0),
}


def _stream(device, n=400):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    return X.to(device), torch.sin(4 * X[:, 0]).to(device)


def _saved(learner):
    buf = io.BytesIO()
    torch.save(learner.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _make(name, device):
    return LEARNERS[name](device).to(device)


@pytest.mark.parametrize("name", list(LEARNERS))
def test_a_loaded_learner_forecasts_and_learns_as_the_saved_one(name, device):
    X, y = _stream(device)
    a = _make(name, device).update(X[:250], y[:250])
    b = _make(name, device)
    b.load_state_dict(_saved(a))
    assert b.num_rounds == a.num_rounds == 250 and b.is_bound
    assert torch.equal(b.predict(X), a.predict(X))
    a.update(X[250:], y[250:])
    b.update(X[250:], y[250:])
    assert torch.equal(b.predict(X), a.predict(X)) and b.num_rounds == 400


@pytest.mark.parametrize("name", list(LEARNERS))
def test_a_fresh_state_makes_a_used_learner_fresh(name):
    X, y = _stream("cpu")
    used = _make(name, "cpu").update(X[:50], y[:50])
    used.load_state_dict(_make(name, "cpu").state_dict())
    assert not used.is_bound and used.num_rounds == 0
    used.update(X[:200], y[:200])
    assert torch.equal(used.predict(X), _make(name, "cpu").update(X[:200], y[:200]).predict(X))


def _corrupt(name, state, how):
    own = state["_extra_state"]["own"]
    if how == "extra":
        state["_extra_state"] = "not a dict"
    elif how == "rounds":
        state["_extra_state"]["num_rounds"] = -1
    elif name in ("KernelAWV", "OnlineKRR"):
        own["L"] = own["L"][:-1] if how == "shape" else own["L"].fill_(float("nan"))
    elif name == "FOGD":
        state["weights"] = state["weights"][:-1] if how == "shape" else state["weights"].fill_(float("nan"))
    else:
        key = "precision"
        state[key] = state[key][:-1] if how == "shape" else state[key].fill_(float("nan"))
    return state


@pytest.mark.parametrize("how", ["extra", "rounds", "shape", "nan"])
@pytest.mark.parametrize("name", list(LEARNERS))
def test_a_corrupt_state_is_refused_and_changes_nothing(name, how):
    X, y = _stream("cpu")
    target = _make(name, "cpu").update(X[:100], y[:100])
    before = target.predict(X)
    state = _corrupt(name, _saved(_make(name, "cpu").update(X[:250], y[:250])), how)
    with pytest.raises((CheckpointError, RuntimeError)):
        target.load_state_dict(state)
    assert target.num_rounds == 100 and torch.equal(target.predict(X), before)
    target.update(X[100:200], y[100:200])
    ref = _make(name, "cpu").update(X[:100], y[:100]).update(X[100:200], y[100:200])  # the same blocks
    assert torch.equal(target.predict(X), ref.predict(X))


def test_a_kors_generator_of_another_kind_is_refused():
    X, y = _stream("cpu")
    a = PKAWV(kernel=rbf, dictionary="kors", seed=0).update(X[:100], y[:100])
    state = _saved(a)
    state["dictionary._extra_state"]["generator"] = torch.zeros(3)
    b = PKAWV(kernel=rbf, dictionary="kors", seed=0)
    with pytest.raises(CheckpointError, match="generator"):
        b.load_state_dict(state)
    assert not b.is_bound and len(b.dictionary) == 0
