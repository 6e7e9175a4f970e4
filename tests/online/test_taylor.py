import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb.errors import InputDataError
from torchbkb.online import TaylorEmbedding, taylor_degree, taylor_kernel_error_bound, taylor_num_features

from ._refs import DEVICES, DTYPES, rbf, taylor_truncated_kernel, tol, single_thread  # noqa: F401 (autouse fixture)


def _ball(n, d, radius, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    r = torch.rand(n, 1, generator=g, dtype=torch.float64) ** (1 / d) * radius
    return X / X.norm(dim=-1, keepdim=True) * r


def _eq6(X, k, sigma):
    """g_k(x) = Π_i x_i^{k_i} exp(-x_i²/2σ²) / (σ^{k_i} √(k_i!)), one multi-index at a time."""
    out = torch.ones(X.shape[0], dtype=torch.float64)
    for i, ki in enumerate(k):
        scale = sigma**ki * math.sqrt(math.factorial(ki))
        out = out * X[:, i] ** ki * torch.exp(-X[:, i] ** 2 / (2 * sigma**2)) / scale
    return out


@pytest.mark.parametrize("d,M", [(1, 5), (2, 3), (3, 4), (5, 2)])
def test_basis_is_every_multi_index_up_to_M(d, M):
    emb = TaylorEmbedding(d, M)
    want = {k for k in itertools.product(range(M + 1), repeat=d) if sum(k) <= M}
    got = [tuple(r) for r in emb.multi_indices.tolist()]
    assert len(got) == len(set(got)) == len(want) == math.comb(d + M, M) == emb.num_features
    assert set(got) == want
    assert [sum(k) for k in got] == sorted(sum(k) for k in got)  # ordered by degree


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_features_match_eq6(dtype, device):
    sigma = 0.7
    emb = TaylorEmbedding(3, 4, lengthscale=sigma)
    X = _ball(25, 3, 1.5, seed=1)
    F = emb(X.to(device, dtype))
    assert F.dtype == dtype and F.device.type == device and F.shape == (25, 35)
    ref = torch.stack([_eq6(X, k, sigma) for k in emb.multi_indices.tolist()], dim=-1)
    assert torch.allclose(F.double().cpu(), ref, rtol=tol(dtype), atol=tol(dtype))


def test_inner_product_is_the_truncated_taylor_series():
    for d, M, sigma in [(2, 6, 1.0), (4, 3, 0.5), (1, 9, 2.0)]:
        X, Y = _ball(30, d, 2.0, seed=2), _ball(20, d, 2.0, seed=3)
        emb = TaylorEmbedding(d, M, lengthscale=sigma)
        assert torch.allclose(emb(X) @ emb(Y).T, taylor_truncated_kernel(X, Y, sigma, M), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_error_decreases_with_M_and_is_below_1e_3_at_M_8(dtype):
    X = _ball(200, 3, 1.0, seed=4)
    K = rbf(X, X, 1.0)
    errors = []
    for M in range(0, 9):
        F = TaylorEmbedding(3, M, lengthscale=1.0)(X.to(dtype)).double()
        err = (F @ F.T - K).abs()
        bound = (X @ X.T).abs() ** (M + 1) / math.factorial(M + 1)  # 004 Lemma 13, pointwise
        assert bool((err <= bound + tol(dtype)).all())
        assert float(err.max()) <= taylor_kernel_error_bound(1.0, M) + tol(dtype)
        errors.append(float(err.max()))
    assert all(a > b for a, b in zip(errors, errors[1:]))
    assert errors[8] < 1e-3


def test_taylor_degree_is_theorem_4():
    # M = ceil(8R²/σ² ∨ 2 log(n / (λ ∧ 1)))
    assert taylor_degree(1000, 0.5, 1.0) == math.ceil(2 * math.log(2000))  # 16
    assert taylor_degree(1000, 3.0, 2.0) == 32  # 8·4 > 2 log 1000
    assert taylor_degree(10**6, 1.0, 1.0, lengthscale=2.0) == math.ceil(2 * math.log(10**6))
    assert taylor_degree(1, 1.0, 0.0) == 0
    assert taylor_num_features(8, 4) == 495 and taylor_num_features(8, 2) == 45


@given(n=st.integers(1, 10**9), lam=st.floats(1e-6, 1e3), R=st.floats(0, 10), sigma=st.floats(0.1, 10))
@settings(max_examples=50, deadline=None)
def test_taylor_degree_properties(n, lam, R, sigma):
    M = taylor_degree(n, lam, R, sigma)
    assert M >= 8 * R * R / sigma**2 - 1e-9 and M >= 2 * math.log(n / min(lam, 1.0)) - 1e-9
    assert M >= taylor_degree(max(n // 2, 1), lam, R, sigma)  # non-decreasing in n


@given(
    d=st.integers(1, 5),
    M=st.integers(0, 4),
    batch=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    n=st.integers(1, 6),
)
@settings(max_examples=40, deadline=None)
def test_shapes(d, M, batch, n):
    emb = TaylorEmbedding(d, M)
    X = torch.rand(*batch, n, d, dtype=torch.float64)
    F = emb(X)
    assert F.shape == (*batch, n, math.comb(d + M, M))
    assert torch.allclose(F.reshape(-1, F.shape[-1]), emb(X.reshape(-1, d)), atol=1e-15)


def test_gradients_flow():
    X = torch.rand(4, 2, dtype=torch.float64, requires_grad=True)
    TaylorEmbedding(2, 3)(X).sum().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all()


def test_state_dict_and_to():
    emb = TaylorEmbedding(2, 2, lengthscale=0.3)
    sd = emb.state_dict()
    assert float(sd["lengthscale"]) == 0.3 and sd["lengthscale"].dtype == torch.float64
    assert emb.to(torch.float32)(torch.rand(3, 2)).dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(d=0, degree=2),
        dict(d=2.0, degree=2),
        dict(d=2, degree=-1),
        dict(d=2, degree=True),
        dict(d=2, degree=2, lengthscale=0.0),
        dict(d=2, degree=2, lengthscale=-1.0),
        dict(d=2, degree=2, lengthscale=float("nan")),
        dict(d=2, degree=2, lengthscale=float("inf")),
        dict(d=30, degree=20),  # C(50, 20) features: refused
    ],
)
def test_bad_constructor_arguments(kwargs):
    with pytest.raises(InputDataError, match="expected"):
        TaylorEmbedding(**kwargs)


@pytest.mark.parametrize(
    "X",
    [
        torch.rand(3, 4),  # wrong d
        torch.rand(3),  # not a matrix
        torch.tensor([[0.1, float("nan"), 0.2]]),
        torch.ones(2, 3, dtype=torch.long),
        [[0.0, 0.0, 0.0]],
    ],
)
def test_bad_inputs(X):
    with pytest.raises(InputDataError, match="expected"):
        TaylorEmbedding(3, 2)(X)


@pytest.mark.parametrize("args",
                         [(0, 1.0, 1.0), (10, 0.0, 1.0), (10, 1.0, -1.0), (10, 1.0, float("nan")), (10, 1.0, 1.0, 0.0)])
def test_bad_taylor_degree_arguments(args):
    with pytest.raises(InputDataError, match="expected"):
        taylor_degree(*args)
