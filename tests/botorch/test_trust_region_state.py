"""A trust-region BKB loop saved and resumed: through ``state_dict`` and ``torch.load(weights_only=True)``, or
``optimize(checkpoint=...)`` after a crash, it asks the batches of the loop never stopped; a state that does not
fit the loop raises a ``CheckpointError`` and changes nothing. NaN/inf values of the objective are its failures,
raised with the batch kept pending or skipped, as in ``torchbkb.run``."""

import io
import math

import pytest
import torch

from torchbkb import run
from torchbkb.bandits import BKB
from torchbkb.botorch import TrustRegionBKB
from torchbkb.errors import CheckpointError, InputDataError, ObjectiveError
from torchbkb.gp.kernels import GaussianKernel

F64 = torch.float64
BOUNDS = torch.tensor([[0.0] * 4, [1.0] * 4], dtype=F64)


def _f(X):
    return -((X - 0.3) ** 2).sum(-1) + 0.1 * torch.sin(10 * X).sum(-1)


def _loop(**kw):
    return TrustRegionBKB(BOUNDS, **{"batch_size": 6, "seed": 3, "local_points": 24, **kw})


def _steps(loop, until):
    while loop.Y.numel() < until:
        X = loop.ask()
        loop.tell(X, _f(X))


def _reloaded(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("kw", [dict(num_regions=2), dict(acquisition="bbkb")], ids=["thompson-2", "bbkb-1"])
def test_a_resumed_loop_asks_the_batches_of_the_loop_never_stopped(kw):
    """Saved past the regions' local-point limit (the next fit's points come from the saved model's lengthscales),
    loaded into a new loop through weights-only loading."""
    ref = _loop(**kw)
    _steps(ref, 64)
    state = _reloaded(ref.state_dict())
    assert any(len(r["owned"]) > 24 for r in state["regions"]) and all(r["fit_rows"] for r in state["regions"])
    _steps(ref, 110)
    resumed = _loop(**kw)
    resumed.load_state_dict(state)
    assert all(m is not None and m.train_inputs[0].shape[0] <= 24 for m in resumed.models)
    _steps(resumed, 110)
    assert torch.equal(resumed.X, ref.X) and torch.equal(resumed.Y, ref.Y)
    assert _same(resumed.state_dict(), ref.state_dict())


def test_a_state_saved_between_ask_and_tell_takes_the_pending_batch():
    ref = _loop()
    _steps(ref, 20)
    batch = ref.ask()
    state = _reloaded(ref.state_dict())
    ref.tell(batch, _f(batch))
    _steps(ref, 40)
    resumed = _loop()
    resumed.load_state_dict(state)
    resumed.tell(batch, _f(batch))
    _steps(resumed, 40)
    assert torch.equal(resumed.X, ref.X)


def test_optimize_with_a_checkpoint_resumes_after_a_crash(tmp_path):
    path = tmp_path / "turbo.ckpt"
    ref_X, _ = _loop().optimize(_f, 60)
    calls = []

    def crashing(X):
        calls.append(X.shape[0])
        if len(calls) == 5:
            raise RuntimeError("the simulator died")
        return _f(X)

    with pytest.raises(RuntimeError, match="simulator"):
        _loop().optimize(crashing, 60, checkpoint=path)
    X, Y = _loop().optimize(crashing, 60, checkpoint=path)  # the fifth batch again, and on
    assert torch.equal(X, ref_X) and torch.equal(Y, _f(ref_X))
    assert sum(calls[:4]) + sum(calls[5:]) == 60
    evaluated = len(calls)
    X_again, _ = _loop().optimize(crashing, 60, checkpoint=path)  # already done: nothing evaluated
    assert torch.equal(X_again, ref_X) and len(calls) == evaluated


def _bad_states(state):
    def edit(fn):
        s = _reloaded(state)
        fn(s)
        return s

    r0 = lambda s: s["regions"][0]  # noqa: E731
    yield "fields", edit(lambda s: s.pop("draws"))
    yield "settings", edit(lambda s: s["settings"].update(seed=4))
    yield "settings", edit(lambda s: s["settings"].update(bounds=2 * s["settings"]["bounds"]))
    yield "X", edit(lambda s: s.update(X=s["X"][:, :3]))
    yield "finite", edit(lambda s: s["X"].__setitem__((0, 0), float("nan")))
    yield "Y", edit(lambda s: s.update(Y=s["Y"][:-1]))
    yield "draws", edit(lambda s: s.update(draws=-1))
    yield "regions", edit(lambda s: s.update(regions=s["regions"][:1]))
    yield "owned", edit(lambda s: r0(s)["owned"].append(10**6))
    yield "length", edit(lambda s: r0(s)["trust_region"].update(length=float("nan")))
    yield "restart_triggered", edit(lambda s: r0(s)["trust_region"].update(restart_triggered=1))
    yield "hyper", edit(lambda s: next(iter(r0(s)["hyper"].values())).fill_(float("nan")))
    yield "fit_rows", edit(lambda s: r0(s).update(fit_seed=None))
    yield "fit_rows", edit(lambda s: r0(s).update(fit_rows=[]))
    yield "hyperparameters this loop", edit(lambda s: r0(s).update(hyper={"covar_module.raw_outputscale":
                                                                          torch.zeros(3, dtype=F64)}))
    yield "pending", edit(lambda s: s.update(pending=[5]))
    yield "asked", edit(lambda s: s.update(pending=[0, 1]))
    yield "X_failed", edit(lambda s: s.update(X_failed=s["X"][:2, :2]))
    yield "finite", edit(lambda s: s.update(X_failed=torch.full((1, 4), float("inf"), dtype=F64)))


def test_states_that_do_not_fit_raise_and_change_nothing():
    saved = _loop(num_regions=2)
    _steps(saved, 40)
    state = saved.state_dict()
    target = _loop(num_regions=2)
    _steps(target, 26)
    before = target.state_dict()
    cases = list(_bad_states(state))
    assert len(cases) == 19
    for match, bad in cases:
        with pytest.raises(CheckpointError, match=match):
            target.load_state_dict(bad)
        assert _same(target.state_dict(), before), match
    target.load_state_dict(_reloaded(state))  # the good one still loads
    assert _same(target.state_dict(), state)


def test_checkpoint_files_of_another_kind_are_refused(tmp_path):
    arms = torch.rand(30, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    objective = arms.sum(-1)
    bandit_run = lambda path: run(BKB(arms, GaussianKernel(0.2), noise=0.01, beta=0.3), objective,  # noqa: E731
                                  budget=5, checkpoint=path, progress=False)
    bandit_path = tmp_path / "bandit.ckpt"
    bandit_run(bandit_path)
    with pytest.raises(CheckpointError, match="trust_region"):
        _loop().optimize(_f, 20, checkpoint=bandit_path)
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        _loop().optimize(_f, 20, checkpoint=junk)
    turbo_path = tmp_path / "turbo.ckpt"
    _loop().optimize(_f, 20, checkpoint=turbo_path)
    with pytest.raises(CheckpointError, match="bandit"):
        bandit_run(turbo_path)


def _failing(rows_of_call):
    """``_f``, NaN at the given rows of given calls (``{call: [rows]}``); records each call's points."""
    calls = []

    def f(X):
        calls.append(X.clone())
        y = _f(X)
        y[rows_of_call.get(len(calls), [])] = float("nan")
        return y

    f.calls = calls
    return f


def test_skipped_failures_are_kept_apart_count_against_the_budget_and_resume(tmp_path):
    f = _failing({2: [0, 3], 4: [1]})
    loop = _loop(num_regions=2)
    X, Y = loop.optimize(f, 60, on_failure="skip")
    assert X.shape[0] + loop.X_failed.shape[0] == 60 == sum(c.shape[0] for c in f.calls)
    assert torch.equal(loop.X_failed, torch.cat([f.calls[1][[0, 3]], f.calls[3][[1]]]))
    assert torch.equal(Y, _f(X))
    path = tmp_path / "skip.ckpt"
    _loop(num_regions=2).optimize(_failing({2: [0, 3], 4: [1]}), 40, checkpoint=path, on_failure="skip")
    resumed = _loop(num_regions=2)
    X2, _ = resumed.optimize(_failing({}), 60, checkpoint=path, on_failure="skip")
    assert torch.equal(resumed.X_failed, loop.X_failed) and torch.equal(X2, X)


def test_a_raised_failure_keeps_the_batch_pending_and_the_next_call_evaluates_it(tmp_path):
    ref_X, _ = _loop().optimize(_f, 50)
    path = tmp_path / "raise.ckpt"
    f = _failing({3: [2]})
    loop = _loop()
    with pytest.raises(ObjectiveError, match=r"rows \[2\]"):
        loop.optimize(f, 50, checkpoint=path)
    assert loop.Y.numel() == sum(c.shape[0] for c in f.calls[:2])
    X, _ = loop.optimize(_f, 50)  # the same object: its pending batch first
    assert torch.equal(X, ref_X)
    with pytest.raises(ObjectiveError):
        _loop().optimize(_failing({3: [2]}), 50, checkpoint=tmp_path / "again.ckpt")
    X, _ = _loop().optimize(_f, 50, checkpoint=tmp_path / "again.ckpt")  # a new process: from the checkpoint
    assert torch.equal(X, ref_X)
    for args, match in (((_f, 10), "on_failure"), ((_f, -1), "budget"), ((_f, 2.0), "budget"), ((None, 10), "f:")):
        with pytest.raises(InputDataError, match=match):
            _loop().optimize(*args, **({"on_failure": "ignore"} if match == "on_failure" else {}))


def test_tell_takes_any_rows_of_the_batch_and_refuses_bad_ones_unchanged():
    loop = _loop()
    _steps(loop, 14)
    batch = loop.ask()
    before = loop.state_dict()
    for rows in ([0, 0], [0, 6], [1], (True, 2), "01"):
        with pytest.raises(InputDataError):
            loop.tell(batch[[0, 1]], _f(batch[[0, 1]]), rows=rows)
        assert _same(loop.state_dict(), before)
    loop.tell(batch[[4, 1]], _f(batch[[4, 1]]), rows=torch.tensor([4, 1]))
    assert torch.equal(loop.X[-2:], batch[[4, 1]]) and loop.ask().shape == (6, 4)
    loop.tell(batch[:0], _f(batch[:0]), rows=[])  # nothing of this batch: it is dropped
    batch = loop.ask()
    with pytest.raises(InputDataError, match="shape"):
        loop.tell(batch[:0], _f(batch[:0]))  # without rows, at least one point


def test_a_refused_initialize_changes_nothing():
    loop = _loop()
    X0 = torch.rand(10, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    bad = _f(X0)
    bad[3] = float("nan")
    with pytest.raises(InputDataError):
        loop.initialize(X0, bad)
    loop.initialize(X0, _f(X0))  # was: "expected a loop that has neither asked nor been told anything"
    assert loop.Y.numel() == 10 and loop.ask().shape == (6, 4)
