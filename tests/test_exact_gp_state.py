"""ExactGPState: the one exact-GP state of the bandits (grown in place) and of BKBModel (conditioned on fantasies)."""

import pytest
import torch

from torchbkb import ExactPosterior
from torchbkb.botorch import BKBModel
from torchbkb.errors import InputDataError, NumericsError, TorchBKBError
from torchbkb.gp import ExactGPState
from torchbkb.gp.kernels import GaussianKernel

F64 = torch.float64
K = GaussianKernel(0.4)


def _data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64)
    return X, torch.sin(5 * X).sum(-1), 0.01 + 0.1 * torch.rand(n, generator=g, dtype=F64)


def _same(a: ExactGPState, b: ExactGPState, Xq: torch.Tensor) -> bool:
    return all(torch.allclose(u, v, atol=1e-10) for u, v in zip(a.joint(Xq), b.joint(Xq)))


def test_growing_row_by_row_in_place_equals_a_fit_on_all_rows():
    X, y, noise = _data(40)
    state = ExactGPState(K, X[:0], y[:0], noise[:0])  # the prior
    for i in range(40):  # past the first reservation of 16 rows, twice
        l, delta, beta = state.grow_(X[i], y[i], noise[i])
        assert l.shape == (i,) and delta > 0
    full = ExactGPState(K, X, y, noise)
    assert _same(state, full, torch.rand(9, 2, dtype=F64))
    assert torch.allclose(state.factor, full.factor) and torch.allclose(state.whitened_targets, full.whitened_targets)
    assert state.num_train == 40 and torch.equal(state.train_X, X)


def test_a_hallucinated_row_keeps_the_mean_and_new_noise_for_it_equals_a_fit_with_that_noise():
    X, y, noise = _data(12)
    state = ExactGPState(K, X[:11], y[:11], noise[:11])
    Xq = torch.rand(6, 2, dtype=F64)
    mean_before = state(Xq)[0]
    state.grow_(X[11], None, noise[11])
    assert torch.allclose(state(Xq)[0], mean_before, atol=1e-12)  # a hallucination: the mean stays
    old, new = state.renoise_last_(noise[11] / 3)  # e.g. a third pull of the same point
    assert new < old
    target = torch.cat([y[:11], state.train_y[11:]])  # the hallucinated row's target: the mean there
    ref = ExactGPState(K, X, target, torch.cat([noise[:11], noise[11:] / 3]))
    assert _same(state, ref, Xq)


def test_new_targets_for_some_rows_equal_a_fit_with_them_and_truncating_equals_a_fit_on_the_first_rows():
    X, y, noise = _data(20)
    state = ExactGPState(K, X[:15], y[:15], noise[:15])
    for i in range(15, 20):
        state.grow_(X[i], None, noise[i])
    state.retarget_(torch.tensor([15, 17]), y[[15, 17]])
    target = state.train_y.clone()
    assert torch.allclose(target[[15, 17]], y[[15, 17]])
    Xq = torch.rand(5, 2, dtype=F64)
    assert _same(state, ExactGPState(K, X, target, noise), Xq)
    state.truncate_(15)
    assert state.num_train == 15 and _same(state, ExactGPState(K, X[:15], y[:15], noise[:15]), Xq)
    state.grow_(X[19], y[19], noise[19])  # growth continues after the rows dropped
    idx = torch.tensor([*range(15), 19])
    assert _same(state, ExactGPState(K, X[idx], y[idx], noise[idx]), Xq)


def test_a_conditioned_state_is_not_moved_by_its_parent_growing_in_place():
    X, y, noise = _data(30)
    parent = ExactGPState(K, X[:20], y[:20], noise[:20])
    parent.grow_(X[20], y[20], noise[20])
    Xf = X[21:24].clone().requires_grad_(True)  # a fantasy with a graph: the child shares the parent's block
    child = parent.condition(Xf, y[21:24], noise[21:24])
    Xq = torch.rand(4, 2, dtype=F64)
    before = [t.detach().clone() for t in child(Xq)]
    parent.retarget_(torch.tensor([3]), torch.tensor([9.0], dtype=F64))
    for i in range(21, 30):
        parent.grow_(X[i], y[i], noise[i])
    assert all(torch.equal(a.detach(), b) for a, b in zip(child(Xq), before))


def test_in_place_methods_refuse_a_state_they_cannot_grow_and_leave_it_unchanged():
    X, y, noise = _data(10)
    batched = ExactGPState(K, X.expand(2, 10, 2), y.expand(2, 10), noise.expand(2, 10))
    with pytest.raises(TorchBKBError, match="one unbatched block"):
        batched.grow_(X[0], y[0], noise[0])
    two = ExactGPState(K, X[:8], y[:8], noise[:8]).condition(X[8:].requires_grad_(True), y[8:], noise[8:])
    with pytest.raises(TorchBKBError, match="one unbatched block"):
        two.truncate_(3)
    assert two.num_train == 10
    state = ExactGPState(K, X, y, noise)
    with pytest.raises(TorchBKBError, match="without observed residual"):
        state.renoise_last_(noise[-1])
    for n in (11, -1, 2.5, True):  # past the observations (the capacity holds more rows), not a count
        with pytest.raises(InputDataError, match=r"expected an integer in \[0, 10\]"):
            state.truncate_(n)
    assert state.num_train == 10 and torch.equal(state.train_X, X)
    twin = ExactGPState(K, X[:1], y[:1], torch.full((1,), 1e-300, dtype=F64))
    L = twin.factor.clone()
    with pytest.raises(NumericsError, match="Schur"):  # the same point again without noise
        twin.grow_(X[0], y[0], torch.zeros((), dtype=F64))
    assert twin.num_train == 1 and torch.equal(twin.factor, L)


def test_the_bandits_and_botorch_hold_an_exact_gp_in_the_same_object():
    X, y, _ = _data(25)
    post = ExactPosterior(K, noise=0.05).fit(X, y)
    assert isinstance(post.state, ExactGPState)
    assert torch.equal(post.L, post.state.factor) and torch.equal(post.Liy, post.state.whitened_targets)
    model = BKBModel(X, y.unsqueeze(-1), kernel=GaussianKernel(0.05), noise=0.05, seed=0)  # near-complete: exact
    assert model.engine.is_exact and isinstance(model.engine.exact_state, ExactGPState)
    import torchbkb.botorch.exact_state as old_path  # the module's path before it moved to torchbkb.gp

    assert old_path.ExactGPState is ExactGPState
