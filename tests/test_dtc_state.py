"""One DTC state: the operator both posteriors derive one way, a posterior's state handed to another without a
factorization, and an embedding built on a whitening its caller holds."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import tol
from helpers import close, rbf, spy_factorizations
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.errors import InputDataError
from torchbkb.gp.functional import DTCState, kernel_row_operator, ridge_solve, scoring_operator
from torchbkb.gp.kernels import GaussianKernel

LS = 0.3


def _fitted(n=30, m=8, d=2, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64).to(device, dtype)
    y = torch.sin(5 * X.sum(-1))
    counts = torch.randint(1, 4, (n,), generator=g).to(device, dtype)
    post = DTCPosterior(NystromEmbedding(GaussianKernel(LS), X[:m]), noise=0.05).fit(X, y, counts)
    return post, X, y, counts


def _spd_inverse(B):
    return torch.linalg.inv(B @ B.mT + 0.1 * torch.eye(B.shape[-1], dtype=B.dtype))


def test_the_operator_is_the_formula_in_float64():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(4, 6, generator=g, dtype=torch.float64)
    V_inv = _spd_inverse(torch.randn(4, 4, generator=g, dtype=torch.float64))
    w, lam = torch.randn(4, generator=g, dtype=torch.float64), 0.1
    M, a = scoring_operator(W, V_inv, w, lam)
    M_ref = W.T @ (torch.eye(4, dtype=torch.float64) / lam - V_inv) @ W
    assert M.shape == (6, 6) and close(M, M_ref, 1e-10) and close(a, W.T @ w, 1e-12)
    Ma = kernel_row_operator(W, V_inv, w, lam)  # the same products, written into one block
    assert Ma.shape == (7, 6) and torch.equal(Ma[:-1], M) and torch.equal(Ma[-1], a)


def test_a_batched_operator_is_each_batch_s_operator_and_fantasies_may_share_v():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(3, 5, generator=g, dtype=torch.float64)
    V_inv = _spd_inverse(torch.randn(4, 1, 3, 3, generator=g, dtype=torch.float64))  # shared by 2 fantasies
    w = torch.randn(4, 2, 3, generator=g, dtype=torch.float64)
    M, a = scoring_operator(W, V_inv, w, 0.2)
    assert M.shape == (4, 1, 5, 5) and a.shape == (4, 2, 5)
    for i in range(4):
        for j in range(2):
            Mij, aij = scoring_operator(W, V_inv[i, 0], w[i, j], 0.2)
            assert close(M[i, 0], Mij, 1e-12) and close(a[i, j], aij, 1e-12)


def test_the_operator_carries_gradients():
    W = torch.eye(2, dtype=torch.float64)
    V_inv = torch.eye(2, dtype=torch.float64).requires_grad_()
    w = torch.ones(2, dtype=torch.float64, requires_grad=True)
    M, a = scoring_operator(W, V_inv, w, 1.0)
    (M.sum() + a.sum()).backward()  # d/dV⁻¹ of Σ (I - V⁻¹) = -1 everywhere; d/dw of Σ Wᵀw = W 1
    assert close(V_inv.grad, -torch.ones(2, 2, dtype=torch.float64)) and close(w.grad, torch.ones(2,
                                                                                                  dtype=torch.float64))


def test_a_state_handed_over_predicts_the_same_without_a_factorization(dtype, device, monkeypatch):
    post, X, y, counts = _fitted(dtype=dtype, device=device)
    state, emb = post.state, post.embedding
    sizes = spy_factorizations(monkeypatch)
    twin = DTCPosterior(NystromEmbedding(emb.kernel, emb.inducing_points, projection=emb.projection), noise=0.05)
    twin.set_state(X, y, counts, state)
    assert sizes == []  # no factorization: the state is taken as it is
    Xq = torch.rand(40, 2, dtype=torch.float64).to(device, dtype)
    for a, b in zip(post(Xq), twin(Xq)):
        assert torch.equal(a, b)
    for a, b in zip(post.joint(Xq[:5]), twin.joint(Xq[:5])):
        assert torch.equal(a, b)
    assert twin.num_train == X.shape[0] and torch.equal(twin.V_inv, state.V_inv)
    twin.V_inv.mul_(2.0)  # copies: a write into one posterior's buffers leaves the other's as they were
    assert not torch.equal(twin.V_inv, post.V_inv)


def test_a_state_equals_a_fit_from_the_formula():
    post, X, y, counts = _fitted()
    Z = post.embedding(X)
    ZtZ, Zty = (Z.T * counts) @ Z, Z.T @ (counts * y)
    V_inv, w = ridge_solve(ZtZ, Zty, 0.05)
    state = post.state
    assert close(state.ZtZ, ZtZ, 1e-10) and close(state.Zty, Zty, 1e-10) and close(state.V_inv, V_inv, 1e-8)
    M, a = scoring_operator(post.embedding.projection, V_inv, w, 0.05)
    assert close(state.M, M, 1e-6) and close(state.a, a, 1e-8)


def test_a_batched_state_is_handed_over():
    post, X, y, counts = _fitted()
    Xb, yb, cb = X.expand(3, -1, -1), torch.stack([y, -y, 2 * y]), counts.expand(3, -1)
    post.fit(Xb, yb, cb)
    twin = DTCPosterior(post.embedding, noise=0.05).set_state(Xb, yb, cb, post.state)
    Xq = torch.rand(3, 6, 2, dtype=torch.float64)
    for a, b in zip(post(Xq), twin(Xq)):
        assert torch.equal(a, b)


def _bad_states():
    post, X, y, counts = _fitted()
    s = post.state
    nan = s.V_inv.clone()
    nan[0, 0] = float("nan")
    return [
        (s._replace(V_inv=nan), "finite"),
        (s._replace(ZtZ=s.ZtZ[:-1]), r"state.ZtZ: expected shape"),
        (s._replace(weights=s.weights.float()), "state.weights: expected shape"),
        (s._replace(M=s.M[:-1]), "state.M: expected shape"),
        (tuple(s), "expected a DTCState"),
        (None, "expected a DTCState"),
    ]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(_bad_states()))
def test_a_bad_state_is_refused_and_changes_nothing(case):
    state, msg = case
    post, X, y, counts = _fitted(seed=1)
    before = {k: v.clone() for k, v in post.state_dict().items()}
    Xq = torch.rand(7, 2, dtype=torch.float64)
    ref = post(Xq)
    with pytest.raises(InputDataError, match=msg):
        post.set_state(X[:5], y[:5], counts[:5], state)
    after = post.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(a, b) for a, b in zip(ref, post(Xq)))


def test_an_embedding_on_a_given_whitening_is_the_factorized_one(dtype, monkeypatch):
    S = torch.rand(9, 2, dtype=torch.float64).to(dtype=dtype)
    emb = NystromEmbedding(GaussianKernel(LS), S)
    sizes = spy_factorizations(monkeypatch)
    given_W = NystromEmbedding(GaussianKernel(LS), S, projection=emb.projection)
    assert sizes == [] and torch.equal(given_W.projection, emb.projection)
    assert given_W.projection.data_ptr() != emb.projection.data_ptr()  # a copy
    X = torch.rand(20, 2, dtype=torch.float64).to(dtype=dtype)
    assert torch.equal(given_W(X), emb(X))
    Z = given_W(X).double()
    assert close(Z @ Z.T, rbf(X.double(), S.double(), LS) @ torch.linalg.solve(rbf(S.double(), S.double(), LS),
                                                                               rbf(S.double(), X.double(), LS)),
                 tol(dtype) * 10)


@pytest.mark.parametrize("case", ["shape", "rank", "dtype", "nan", "type"])
def test_a_bad_whitening_is_refused(case):
    S = torch.rand(4, 2, dtype=torch.float64)
    W = NystromEmbedding(GaussianKernel(LS), S).projection
    bad = {"shape": W[:, :3], "rank": torch.cat([W, W[:1]]), "dtype": W.float(),
           "nan": W.clone().fill_(float("nan")), "type": W.tolist()}[case]
    with pytest.raises(InputDataError, match="projection: expected"):
        NystromEmbedding(GaussianKernel(LS), S, projection=bad)


def test_the_state_type_is_the_posteriors_fields():
    post = _fitted()[0]
    s = post.state
    assert isinstance(s, DTCState) and s.V_inv is post.V_inv and s.ZtZ is post.ZtZ and s.weights is post.weights
