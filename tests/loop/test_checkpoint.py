"""Checkpoints: atomic, durable, versioned writes; typed errors for unusable files; a fingerprint of the arms,
kernel, noise and settings checked on load; loads that fail change nothing."""

import os
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchbkb
from torchbkb import BBKB, BKB, GPUCB, CheckpointError, Random
from torchbkb.experiment.checkpoint import FORMAT_VERSION, read_checkpoint, save_checkpoint
from torchbkb.gp.kernels import GaussianKernel

from helpers import same_state

pytestmark = pytest.mark.usefixtures("one_thread")

A = 120
ARMS = torch.rand(A, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
F = torch.sin(5 * ARMS[:, 0]) * torch.cos(3 * ARMS[:, 1]) + ARMS[:, 1]


def _bkb(arms=ARMS, noise=0.01, lengthscale=0.2, beta=0.3, seed=0):
    return BKB(arms, GaussianKernel(lengthscale), noise=noise, beta=beta, seed=seed)


def _continuation(bandit, steps=15):
    out = []
    for _ in range(steps):
        i = bandit.ask()
        bandit.tell(i, F[i])
        out += i.tolist()
    return out


def test_a_checkpoint_records_its_format_version_and_resumes(tmp_path):
    ckpt = tmp_path / "run.ckpt"
    ref = torchbkb.run(_bkb(), F, 40, progress=False)
    torchbkb.run(_bkb(), F, 25, progress=False, checkpoint=ckpt)
    state = read_checkpoint(ckpt)
    assert state["format"] == "torchbkb.run" and state["version"] == FORMAT_VERSION
    assert "fingerprint" in state["bandit"]
    resumed = torchbkb.run(_bkb(seed=9), F, 40, progress=False, checkpoint=ckpt)
    assert resumed.index == ref.index and resumed.reward == ref.reward


def test_writes_use_a_unique_temporary_file_fsync_then_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace",
                        lambda a, b: (calls.append(("replace", os.path.basename(a))), real_replace(a, b))[1])
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, {"bandit": {}, "history": {}, "batches": 0})
    save_checkpoint(path, {"bandit": {}, "history": {}, "batches": 1})
    assert calls[0] == "fsync" and calls[1][0] == "replace"  # the file is synced before it is renamed
    assert calls[1][1] != calls[4][1]  # every write has its own temporary name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.ckpt"]  # nothing left behind
    assert read_checkpoint(path)["batches"] == 1


def test_two_writers_on_one_path_never_crash_each_other(tmp_path):
    path = tmp_path / "shared.ckpt"
    errors = []

    def writer(k):
        try:
            for b in range(30):
                save_checkpoint(path, {"bandit": {"w": k}, "history": {}, "batches": b})
        except Exception as e:  # pragma: no cover - the failure this test looks for
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert read_checkpoint(path)["batches"] == 29  # whole, from one of the writers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.ckpt"]


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", b"PK\x03\x04 truncated zip"])
def test_empty_or_foreign_files_are_typed_errors(tmp_path, content):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(content)
    bandit = _bkb()
    before = bandit.state_dict()
    with pytest.raises(CheckpointError, match="checkpoint"):
        torchbkb.run(bandit, F, 5, progress=False, checkpoint=path)
    assert same_state(bandit.state_dict(), before)


def test_truncated_checkpoints_are_typed_errors(tmp_path):
    path = tmp_path / "run.ckpt"
    torchbkb.run(_bkb(), F, 20, progress=False, checkpoint=path)
    data = path.read_bytes()
    for cut in (len(data) // 3, len(data) - 7):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError):
            torchbkb.run(_bkb(), F, 25, progress=False, checkpoint=path)


def test_other_formats_and_versions_are_refused(tmp_path):
    path = tmp_path / "x.ckpt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="a dict"):
        read_checkpoint(path)
    torch.save({"format": "something else", "version": 2, "bandit": {}, "history": {}}, path)
    with pytest.raises(CheckpointError, match="format"):
        read_checkpoint(path)
    torch.save({"format": "torchbkb.run", "version": FORMAT_VERSION + 1, "bandit": {}, "history": {}}, path)
    with pytest.raises(CheckpointError, match="version"):
        read_checkpoint(path)


@pytest.mark.parametrize(
    "other",
    [
        lambda: _bkb(arms=ARMS.flip(0)),  # other arms, same A
        lambda: _bkb(noise=0.02),  # another noise
        lambda: _bkb(lengthscale=0.25),  # another kernel
        lambda: _bkb(beta=0.5),  # another width
        lambda: BKB(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, q_bar=4.0, seed=0),  # another q̄
        lambda: GPUCB(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, seed=0),  # another algorithm
    ],
)
def test_a_checkpoint_of_another_problem_is_refused_and_changes_nothing(tmp_path, other):
    path = tmp_path / "run.ckpt"
    torchbkb.run(_bkb(), F, 15, progress=False, checkpoint=path)
    bandit = other()
    for _ in range(3):  # a bandit in the middle of its own run
        i = bandit.ask()
        bandit.tell(i, F[i])
    before, twin = bandit.state_dict(), other()
    twin.load_state_dict(before)
    with pytest.raises(CheckpointError):
        torchbkb.run(bandit, F, 30, progress=False, checkpoint=path)
    assert same_state(bandit.state_dict(), before)
    assert _continuation(bandit) == _continuation(twin)


def test_a_renamed_field_is_refused_before_anything_is_overwritten(tmp_path):
    path = tmp_path / "run.ckpt"
    torchbkb.run(_bkb(), F, 15, progress=False, checkpoint=path)
    state = torch.load(path, weights_only=True)
    state["bandit"]["Counts"] = state["bandit"].pop("counts")
    torch.save(state, path)
    bandit = _bkb()
    before = bandit.state_dict()
    with pytest.raises(CheckpointError, match="counts"):
        torchbkb.run(bandit, F, 30, progress=False, checkpoint=path)
    assert same_state(bandit.state_dict(), before)
    assert bandit.t == 0 and len(bandit.pending) == 0


def test_a_checkpoint_path_in_a_missing_directory_fails_before_any_evaluation(tmp_path):
    calls = []

    def objective(idx):
        calls.append(idx)
        return F[idx]

    with pytest.raises(CheckpointError, match="directory"):
        torchbkb.run(_bkb(), objective, 10, progress=False, checkpoint=tmp_path / "missing" / "run.ckpt")
    with pytest.raises(CheckpointError, match="directory"):
        torchbkb.run(_bkb(), objective, 10, progress=False, checkpoint=tmp_path)
    assert calls == []


def test_version_one_checkpoints_still_load_with_a_warning(tmp_path):
    path = tmp_path / "old.ckpt"
    torchbkb.run(_bkb(), F, 12, progress=False, checkpoint=path)
    state = torch.load(path, weights_only=True)
    old = {k: state[k] for k in ("bandit", "history", "objective", "batches")}
    del old["bandit"]["fingerprint"], old["bandit"]["exclusions"]
    torch.save(old, path)
    with pytest.warns(RuntimeWarning, match="cannot be verified"):
        hist = torchbkb.run(_bkb(), F, 20, progress=False, checkpoint=path)
    assert hist.index == torchbkb.run(_bkb(), F, 20, progress=False).index


def _mid_run(cls):
    if cls is BBKB:
        bandit = BBKB(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, batch_bound=3.0, seed=0)
    elif cls is Random:
        bandit = Random(ARMS, seed=0)
    else:
        bandit = cls(ARMS, GaussianKernel(0.2), noise=0.01, beta=0.3, seed=0)
    for _ in range(6):
        i = bandit.ask()
        bandit.tell(i, F[i])
    return bandit


_REPLACEMENTS = st.sampled_from([None, "x", -1, 10**9, 0.5, [], {}, [1, "a"], torch.zeros(3),
                                 torch.full((A,), float("nan")), torch.zeros(A, dtype=torch.long)])


def _corrupt_and_load(cls, field, value, delete, part):
    """Corrupt one field of ``part(state)`` of a mid-run state and load it into a bandit one step further: it
    loads, or it raises CheckpointError and the target's state and continuation are those it had."""
    source, target = _mid_run(cls), _mid_run(cls)
    i = target.ask()
    target.tell(i, F[i])  # the target is one step further: a load would change it
    state = source.state_dict()
    fields = part(state)
    key = sorted(k for k in fields if k != "class")[field % (len(fields) - ("class" in fields))]
    if delete:
        del fields[key]
    else:
        fields[key] = value
    before = target.state_dict()
    try:
        target.load_state_dict(state)
    except CheckpointError:
        assert same_state(target.state_dict(), before)
        twin = _mid_run(cls)
        twin.load_state_dict(before)
        assert _continuation(target, 4) == _continuation(twin, 4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cls=st.sampled_from([BKB, BBKB, GPUCB, Random]), field=st.integers(0, 100), value=_REPLACEMENTS,
       delete=st.booleans())
def test_any_corrupted_field_either_loads_or_changes_nothing(cls, field, value, delete):
    _corrupt_and_load(cls, field, value, delete, lambda state: state)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cls=st.sampled_from([BKB, BBKB, GPUCB]), field=st.integers(0, 100), value=_REPLACEMENTS, delete=st.booleans())
def test_a_corrupted_algorithm_state_is_rolled_back(cls, field, value, delete):
    """The algorithm's own part is applied after the base fields: when it fails, the base fields are restored too."""
    _corrupt_and_load(cls, field, value, delete, lambda state: state["algorithm"])


@pytest.mark.parametrize("cls", [BKB, BBKB, GPUCB])
def test_an_empty_algorithm_state_is_refused_and_rolled_back(cls):
    target = _mid_run(cls)
    state = _mid_run(cls).state_dict()
    state["algorithm"] = {}
    before = target.state_dict()
    with pytest.raises(CheckpointError, match="failed with KeyError"):
        target.load_state_dict(state)
    assert same_state(target.state_dict(), before)


def test_a_checkpoint_directory_that_disappears_mid_run_is_a_typed_error(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    calls = []

    def objective(idx):
        calls.append(idx)
        if len(calls) == 5:
            for p in folder.iterdir():
                p.unlink()
            folder.rmdir()
        return F[idx]

    with pytest.raises(CheckpointError, match="writable directory"):
        torchbkb.run(_bkb(), objective, 20, progress=False, checkpoint=folder / "run.ckpt")


@pytest.mark.parametrize(
    "field,value",
    [("rls", torch.zeros(3, dtype=torch.float64)), ("rls", torch.full((A,), float("nan"), dtype=torch.float64)),
     ("dictionary", torch.tensor([0, A + 5])), ("order", "abc")],
)
def test_algorithm_fields_of_the_wrong_kind_are_refused_before_loading(field, value):
    """A field the algorithm would accept silently (a short or NaN variance vector, out-of-range indices) is refused."""
    target = _mid_run(BKB)
    state = _mid_run(BKB).state_dict()
    state["algorithm"][field] = value
    before = target.state_dict()
    with pytest.raises(CheckpointError, match=field):
        target.load_state_dict(state)
    assert same_state(target.state_dict(), before)


@pytest.mark.parametrize("cls", [BKB, GPUCB, Random])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reward_sums_of_another_dtype_are_refused(cls, dtype):
    """The sums are float64 in every bandit: a state with other sums would fail at the next ``tell``, so the load
    refuses it (nothing is silently converted) and changes nothing."""
    target = _mid_run(cls)
    state = _mid_run(cls).state_dict()
    state["reward_sums"] = state["reward_sums"].to(dtype)
    before = target.state_dict()
    with pytest.raises(CheckpointError, match="reward_sums of dtype float64"):
        target.load_state_dict(state)
    assert same_state(target.state_dict(), before)


def test_a_dictionary_as_large_as_the_arm_set_still_loads_smaller_ones():
    arms = ARMS[:6]
    big = BKB(arms, GaussianKernel(0.2), noise=0.01, beta=50.0, q_bar=1e6, seed=0)
    small = BKB(arms, GaussianKernel(0.2), noise=0.01, beta=50.0, q_bar=1e6, seed=0)
    for b, steps in ((big, 60), (small, 3)):
        for _ in range(steps):
            i = b.ask()
            b.tell(i, F[:6][i])
    assert big.dictionary_size == 6 and small.dictionary_size < 6
    big.load_state_dict(small.state_dict())
    assert big.dictionary_size == small.dictionary_size
