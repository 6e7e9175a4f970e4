"""BBKB's in-batch loop on host arrays (HostInBatch) against the same loop in torch (TensorInBatch): the same picks,
in-batch variances and hallucinated V⁻¹ in float64; no tensor operation per pick; rows read in chunks alike."""

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from helpers import Dispatches, TorchRows, batch_strategies
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.bandits.batch_selection import in_batch_state, select_batch
from torchbkb.bandits.host_in_batch import HostInBatch, host_rows
from torchbkb.bandits.kernel_rows import FeatureRows, StreamedKernelRows
from torchbkb.bandits.tensor_in_batch import TensorInBatch
from torchbkb.gp.kernels import GaussianKernel
from torchbkb.gp.linalg import inv_sqrt_factor


def _problem(seed, A=150, m=10, lam=0.5, dominant=False):
    g = torch.Generator().manual_seed(seed)
    arms = torch.rand(A, 2, generator=g, dtype=torch.float64)
    X = arms[torch.randint(0, A, (80,), generator=g)]
    if dominant:  # one arm well ahead: batches are runs of it, interrupted
        best = arms[:1]
        X = torch.cat([best.repeat(6, 1), X])
        y = 5.0 - 20.0 * ((X - best) ** 2).sum(-1)
    else:
        y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(X.shape[0], generator=g, dtype=torch.float64)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[:m]), noise=lam).fit(X, y)
    Z = post.embedding(arms)
    mean, rls = post.score_embedded(Z, torch.ones(A, dtype=torch.float64))
    return Z, mean, rls, post.V_inv


def test_the_state_is_chosen_by_where_the_rows_can_be_read():
    Z, mean, rls, V_inv = _problem(0)
    assert isinstance(in_batch_state(Z, mean, rls, V_inv, 1.0, None), HostInBatch)
    assert isinstance(in_batch_state(TorchRows(Z), mean, rls, V_inv, 1.0, None), TensorInBatch)
    assert isinstance(in_batch_state(Z.half(), mean.half(), rls.half(), V_inv, 1.0, None), TensorInBatch)
    assert host_rows(Z.half()) is None and host_rows(Z[None]) is None


@settings(max_examples=40, deadline=None)
@given(lazy=st.booleans(), **batch_strategies(max_cap=80))
# rounding puts x_i's refreshed UCB below its closed form in one state only: the arms between are refreshed, and
# the arm just refreshed at that UCB is not counted twice (it was, and the evaluation counts parted: 127 and 128)
@example(lazy=True, seed=248, alpha=1.0, C=13.0, cap=None, stop_rule="sum", dominant=True)
def test_host_and_torch_states_select_the_same_batch_in_float64(seed, alpha, C, cap, stop_rule, dominant, lazy):
    Z, mean, rls, V_inv = _problem(seed, dominant=dominant)
    kw = dict(alpha=alpha, batch_bound=C, max_batch_size=cap, stop_rule=stop_rule, lazy=lazy)
    host = select_batch(Z, mean, rls, V_inv, **kw)
    ref = select_batch(TorchRows(Z), mean, rls, V_inv, validate=False, **kw)
    assert host.indices.tolist() == ref.indices.tolist()
    assert host.ucb_evaluations == ref.ucb_evaluations
    torch.testing.assert_close(host.rls_start, ref.rls_start, rtol=0, atol=0)
    torch.testing.assert_close(host.rls_in_batch, ref.rls_in_batch, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(host.V_inv, ref.V_inv, rtol=1e-12, atol=1e-13)


def _alternating(A=2000, r=12):
    """Many arms of like UCB: picks alternate (one run each), more runs than ``r``."""
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(A, r, generator=g, dtype=torch.float64) / 3
    mean = 0.01 * torch.randn(A, generator=g, dtype=torch.float64)
    return Z, mean, 1 + torch.rand(A, generator=g, dtype=torch.float64), torch.eye(r, dtype=torch.float64)


def test_long_batches_past_r_hallucinations_agree_and_float32_stays_float32():
    """Past ``r`` runs both states switch to the direct form; float32 features keep float32 scores."""
    Z, mean, rls, V_inv = _alternating()
    kw = dict(alpha=1.0, batch_bound=1e4, max_batch_size=150)
    host = select_batch(Z, mean, rls, V_inv, **kw)
    ref = select_batch(TorchRows(Z), mean, rls, V_inv, validate=False, **kw)
    runs = sum(1 for j in range(1, 150) if host.indices[j] != host.indices[j - 1])
    assert runs > 2 * Z.shape[1] and host.indices.tolist() == ref.indices.tolist()
    torch.testing.assert_close(host.V_inv, ref.V_inv, rtol=1e-12, atol=1e-13)
    f32 = select_batch(Z.float(), mean.float(), rls.float(), V_inv, **kw)
    assert f32.rls_in_batch.dtype == torch.float32 and f32.V_inv.dtype == torch.float64
    assert len(f32.indices) == 150


def test_feature_rows_read_on_the_host_are_the_features():
    g = torch.Generator().manual_seed(1)
    arms = torch.rand(60, 2, generator=g, dtype=torch.float64)
    k = GaussianKernel(0.3)
    S = torch.tensor([2, 9, 30])
    K_SA = k(arms[S], arms)
    W = inv_sqrt_factor(K_SA[:, S])
    Z = (W @ K_SA).T
    index = torch.tensor([1, 5, 40, 59])
    rows, sub = FeatureRows(K_SA, W).host_rows(), FeatureRows(K_SA, W, index=index).host_rows()
    torch.testing.assert_close(torch.from_numpy(rows(index.numpy())), Z[index])
    torch.testing.assert_close(torch.from_numpy(sub(torch.tensor([3, 0]).numpy())), Z[[59, 1]])
    torch.testing.assert_close(torch.from_numpy(rows(7)), Z[7])
    assert FeatureRows(StreamedKernelRows(k, arms[S], arms, chunk_size=16), W).host_rows() is None


def test_rows_read_in_chunks_give_the_same_batch():
    Z, mean, rls, V_inv = _problem(5, dominant=True)
    kw = dict(alpha=1.0, batch_bound=12.0)
    whole = select_batch(Z, mean, rls, V_inv, **kw)
    for chunk in (1, 3, 64):
        part = select_batch(Z, mean, rls, V_inv, chunk_size=chunk, **kw)
        assert part.indices.tolist() == whole.indices.tolist()
        torch.testing.assert_close(part.rls_in_batch, whole.rls_in_batch, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("picks", [20, 120])
def test_a_host_batch_dispatches_a_fixed_number_of_tensor_operations(picks):
    """The picks run on NumPy views: a batch dispatches its start and its result, nothing a pick."""
    Z, mean, rls, V_inv = _alternating()
    with Dispatches() as ops:
        sel = select_batch(Z, mean, rls, V_inv, alpha=1.0, batch_bound=1e4, max_batch_size=picks, validate=False)
    assert len(sel.indices) == picks and len(set(sel.indices.tolist())) > 5
    assert ops.count <= 20
