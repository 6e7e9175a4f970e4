import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import tol
from helpers import close, rbf
from torchbkb import NystromEmbedding
from torchbkb.errors import InputDataError, TorchBKBError
from torchbkb.gp.kernels import GaussianKernel


def _emb(S, ls=0.4, **kw):
    return NystromEmbedding(GaussianKernel(ls), S, **kw).to(S.device)


def test_nystrom_kernel_matches_formula(dtype, device):
    g = torch.Generator().manual_seed(0)
    S = torch.rand(12, 2, generator=g, dtype=torch.float64)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    emb = _emb(S.to(device, dtype))
    Z = emb(X.to(device, dtype)).double().cpu()
    K_xs, K_ss = rbf(X, S, 0.4), rbf(S, S, 0.4)
    ref = K_xs @ torch.linalg.solve(K_ss, K_xs.T)  # k_S(x)ᵀ K_S⁻¹ k_S(x')
    assert Z.shape == (40, 12)
    assert close(Z @ Z.T, ref, atol=tol(dtype) * 10)
    assert Z.dtype == torch.float64 and emb(X.to(device, dtype)).dtype == dtype


def test_exact_on_the_dictionary():
    S = torch.rand(10, 3, dtype=torch.float64)
    emb = _emb(S)
    Z = emb(S)
    assert close(Z @ Z.T, rbf(S, S, 0.4), atol=1e-10)


def test_duplicates_give_the_same_embedding_geometry(dtype):
    S = torch.rand(8, 2, dtype=torch.float64).to(dtype)
    X = torch.rand(30, 2, dtype=torch.float64).to(dtype)
    plain = _emb(S)
    dup = _emb(torch.cat([S, S[:3], S[:1]]))
    assert dup.num_inducing == 12 and dup.rank == plain.rank == 8
    Zp, Zd = plain(X), dup(X)
    assert close(Zp @ Zp.T, Zd @ Zd.T, atol=tol(dtype) * 10)


def test_collinear_points_with_a_linear_kernel():
    lin = lambda A, B: A @ B.transpose(-1, -2)  # noqa: E731
    S = torch.tensor([[1.0, 2.0], [2.0, 4.0], [-1.0, -2.0]], dtype=torch.float64)  # all on one line
    emb = NystromEmbedding(lin, S)
    assert emb.rank == 1
    X = torch.rand(5, 2, dtype=torch.float64)
    u = S[0] / S[0].norm()
    ref = (X @ u).unsqueeze(-1) * (X @ u).unsqueeze(-2)  # projection of the linear kernel on span(S)
    Z = emb(X)
    assert close(Z @ Z.T, ref, atol=1e-10)


def test_batch_dimensions_are_kept():
    S = torch.rand(5, 2, dtype=torch.float64)
    emb = _emb(S)
    X = torch.rand(3, 4, 7, 2, dtype=torch.float64)
    Z = emb(X)
    assert Z.shape == (3, 4, 7, 5)
    assert close(Z[1, 2], emb(X[1, 2]))


def test_chunking_bounds_intermediate_size_and_is_exact():
    S = torch.rand(16, 2, dtype=torch.float64)
    shapes = []
    k = GaussianKernel(0.3)

    def spy(A, B):
        shapes.append((A.shape[-2], B.shape[-2]))
        return k(A, B)

    emb = NystromEmbedding(spy, S, chunk_size=1000)
    ref = NystromEmbedding(k, S, chunk_size=10**6)
    X = torch.rand(10_500, 2, dtype=torch.float64)
    shapes.clear()
    Z = emb(X)
    assert max(a * b for a, b in shapes) <= 1000 * 16
    assert close(Z, ref(X))


def test_gradient_flows_to_inputs():
    S = torch.rand(6, 2, dtype=torch.float64)
    emb = _emb(S)
    X = torch.rand(4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: emb(x), (X,))


def test_set_inducing_points_is_one_call():
    S = torch.rand(6, 2, dtype=torch.float64)
    emb = _emb(S)
    v0 = emb.version
    S2 = torch.rand(9, 2, dtype=torch.float64)
    emb.set_inducing_points(S2)
    assert emb.version == v0 + 1 and emb.num_inducing == 9
    assert close(emb(S2) @ emb(S2).T, rbf(S2, S2, 0.4), atol=1e-10)


def _bad_inducing():
    good = torch.rand(4, 2, dtype=torch.float64)
    nan = good.clone()
    nan[1, 0] = float("nan")
    inf = good.clone()
    inf[0, 1] = float("inf")
    return st.sampled_from(
        [
            ("empty", torch.empty(0, 2, dtype=torch.float64), "at least 1 rows"),
            ("nan", nan, "NaN/inf"),
            ("inf", inf, "NaN/inf"),
            ("rank1", good[0], r"expected shape \(\*batch, n, d\)"),
            ("rank3", good[None], r"expected shape \(m, d\)"),
            ("wrong d", torch.rand(4, 3, dtype=torch.float64), "trailing dimension d=2"),
            ("dtype", good.float(), "expected dtype torch.float64"),
            ("int", torch.ones(4, 2, dtype=torch.long), "floating dtype"),
        ]
    )


@settings(max_examples=30, deadline=None)
@given(_bad_inducing())
def test_bad_inducing_points_leave_state_unchanged(case):
    _, S_bad, msg = case
    emb = _emb(torch.rand(5, 2, dtype=torch.float64))
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    with pytest.raises(InputDataError, match=msg):
        emb.set_inducing_points(S_bad)
    after = emb.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert emb.version == 0


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 20),
    d=st.integers(1, 4),
    m=st.integers(1, 8),
    batch=st.lists(st.integers(1, 3), max_size=2),
)
def test_shapes(n, d, m, batch):
    emb = _emb(torch.rand(m, d, dtype=torch.float64), ls=1.0)
    Z = emb(torch.rand(*batch, n, d, dtype=torch.float64))
    assert Z.shape == (*batch, n, emb.rank) and emb.rank <= m


def test_bad_queries():
    emb = _emb(torch.rand(5, 2, dtype=torch.float64))
    with pytest.raises(InputDataError, match="trailing dimension d=2"):
        emb(torch.rand(3, 3, dtype=torch.float64))
    with pytest.raises(InputDataError, match="expected dtype torch.float64"):
        emb(torch.rand(3, 2))
    with pytest.raises(TorchBKBError, match="NaN/inf"):
        emb(torch.tensor([[0.0, float("nan")]], dtype=torch.float64))
    with pytest.raises(InputDataError, match="chunk_size"):
        NystromEmbedding(GaussianKernel(1.0), torch.rand(2, 2), chunk_size=0)


def test_forward_into_preallocated_out_equals_forward():
    from torchbkb.gp.kernels import GaussianKernel

    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 700, 3, generator=g, dtype=torch.float64)
    emb = NystromEmbedding(GaussianKernel(lengthscale=1.3, outputscale=0.7), X[0, :25], chunk_size=128)
    ref = emb(X)
    buf = torch.full((2, 700, emb.rank), float("nan"), dtype=torch.float64)
    with torch.no_grad():
        got = emb(X, out=buf)
    assert got.data_ptr() == buf.data_ptr() and torch.allclose(got, ref, atol=1e-12)
    with torch.no_grad():  # a long no-grad input without out= takes the same chunked path
        assert torch.allclose(emb(X.reshape(1400, 3)), ref.reshape(1400, -1), atol=1e-12)
    for bad in (torch.empty(2, 700, emb.rank + 1, dtype=torch.float64), torch.empty(2, 700, emb.rank),
                torch.empty(2, emb.rank, 700, dtype=torch.float64).mT):
        with pytest.raises(InputDataError, match="out: expected"):
            emb(X, out=bad)
    with pytest.raises(InputDataError, match="autograd"):
        emb(X.clone().requires_grad_(), out=buf)
