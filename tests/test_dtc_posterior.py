import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from conftest import tol
from helpers import close, bkb_eq4, exact_gp, rbf, spy_factorizations, titsias_dtc
from torchbkb import DTCPosterior, NystromEmbedding
from torchbkb.errors import InputDataError, TorchBKBError
from torchbkb.gp.kernels import GaussianKernel

LS = 0.3


def _data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    Xq = torch.rand(25, d, generator=g, dtype=torch.float64)
    return X, y, Xq


def _post(S, lam, **kw):
    return DTCPosterior(NystromEmbedding(GaussianKernel(LS), S), noise=lam, **kw).to(S.device)


def test_dictionary_equal_to_training_points_is_the_exact_gp(dtype, device):
    X, y, Xq = _data()
    lam = 0.05
    post = _post(X.to(device, dtype), lam).fit(X.to(device, dtype), y.to(device, dtype))
    mean, var = post(Xq.to(device, dtype))
    m_ref, cov_ref = exact_gp(rbf(X, X, LS), rbf(X, Xq, LS), rbf(Xq, Xq, LS), y, lam)
    t = tol(dtype)
    assert mean.dtype == dtype and var.dtype == dtype
    assert close(mean.double().cpu(), m_ref, atol=t * 10)
    assert close(var.double().cpu(), cov_ref.diagonal(), atol=t * 10)
    jm, jcov = post.joint(Xq[:6].to(device, dtype))
    assert close(jcov.double().cpu(), cov_ref[:6, :6], atol=t * 10)


def test_subset_dictionary_is_titsias_dtc():
    X, y, Xq = _data()
    S = X[::4]
    tau2 = 0.1
    post = _post(S, tau2).fit(X, y)
    m_ref, cov_ref = titsias_dtc(rbf(S, S, LS), rbf(X, S, LS), rbf(Xq, S, LS), rbf(Xq, Xq, LS), y, tau2)
    mean, var = post(Xq)
    assert close(mean, m_ref, atol=1e-9)
    assert close(var, cov_ref.diagonal(), atol=1e-9)
    assert close(post.joint(Xq)[1], cov_ref, atol=1e-9)


def test_bkb_eq4_is_gp_scale_over_lambda():
    X, y, Xq = _data()
    S = X[::3]
    lam = 0.02
    post = _post(S, lam).fit(X, y)
    m_ref, rls_ref = bkb_eq4(rbf(S, S, LS), rbf(X, S, LS), rbf(Xq, S, LS), torch.ones(len(Xq), dtype=torch.float64), y,
                             lam)
    assert close(post.mean(Xq), m_ref, atol=1e-9)
    assert close(post.rls(Xq), rls_ref, atol=1e-7)
    assert close(post(Xq)[1] / lam, rls_ref, atol=1e-7)


def test_counts_equal_repeated_rows():
    X, y, Xq = _data(n=10)
    counts = torch.tensor([1, 3, 1, 2, 1, 1, 4, 1, 1, 2], dtype=torch.float64)
    rep = counts.long()
    Xr = X.repeat_interleave(rep, 0)
    yr = torch.randn(len(Xr), dtype=torch.float64)
    y_mean = torch.zeros(10, dtype=torch.float64).index_add_(0, torch.arange(10).repeat_interleave(rep), yr) / counts
    a = _post(X[:5], 0.1).fit(X, y_mean, counts)
    b = _post(X[:5], 0.1).fit(Xr, yr)
    for u, v in zip(a(Xq), b(Xq)):
        assert close(u, v, atol=1e-10)


def test_thousand_rank_one_updates_stay_within_1e8_of_a_refit():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(1000, 2, generator=g, dtype=torch.float64)
    y = torch.randn(1000, generator=g, dtype=torch.float64)
    S = X[:30]
    inc = _post(S, 0.01).fit(X[:0], y[:0])
    for i in range(1000):
        inc.update(X[i], y[i])
    ref = _post(S, 0.01).fit(X, y)
    Xq = torch.rand(200, 2, generator=g, dtype=torch.float64)
    assert (inc(Xq)[0] - ref(Xq)[0]).abs().max() < 1e-8
    assert (inc(Xq)[1] - ref(Xq)[1]).abs().max() < 1e-8
    assert (inc.V_inv - ref.V_inv).abs().max() < 1e-8


def test_multi_point_update_and_counts_match_refit():
    X, y, Xq = _data()
    c = torch.full((6,), 2.0, dtype=torch.float64)
    inc = _post(X[:8], 0.05).fit(X[:34], y[:34])
    inc.update(X[34:], y[34:], counts=c)
    ref = _post(X[:8], 0.05).fit(X, y, torch.cat([torch.ones(34, dtype=torch.float64), c]))
    for u, v in zip(inc(Xq), ref(Xq)):
        assert close(u, v, atol=1e-10)


def test_hallucinated_updates_freeze_the_mean_and_equal_a_refit_of_the_variance():
    X, y, Xq = _data()
    S = X[:10]
    post = _post(S, 0.05).fit(X[:30], y[:30])
    mean0 = post.mean(Xq)
    downs = [post.update(X[30 + j]) for j in range(5)]  # y=None: hallucinated
    assert all(d is not None for d in downs)
    assert close(post.mean(Xq), mean0, atol=1e-10)
    # the variance equals a posterior whose design includes the pending points
    ref = _post(S, 0.05).fit(X[:35], torch.cat([y[:30], torch.zeros(5, dtype=torch.float64)]))
    assert close(post.rls(Xq), ref.rls(Xq), atol=1e-10)
    # refit keeps pending points pending
    post.refit()
    assert close(post.mean(Xq), mean0, atol=1e-10)
    assert close(post.rls(Xq), ref.rls(Xq), atol=1e-10)


def test_rank_one_downdate_maps_cached_variances():
    X, y, Xq = _data()
    post = _post(X[:10], 0.05).fit(X[:20], y[:20])
    Zq = post.embedding(Xq)
    kd = torch.ones(len(Xq), dtype=torch.float64)
    rls0 = post.score_embedded(Zq, kd)[1]
    d = post.update(X[25])
    rls1 = post.score_embedded(Zq, kd)[1]
    assert close(rls0 - d.coef * (Zq @ d.direction) ** 2, rls1, atol=1e-10)


def test_float32_close_to_float64_and_factorized_in_float64():
    X, y, Xq = _data()
    p64 = _post(X[:15], 0.05).fit(X, y)
    p32 = _post(X[:15].float(), 0.05).fit(X.float(), y.float())
    assert p32.V_inv.dtype == torch.float64
    m32, v32 = p32(Xq.float())
    assert m32.dtype == torch.float32
    m64, v64 = p64(Xq)
    assert close(m32.double(), m64, atol=5e-3) and close(v32.double(), v64, atol=5e-3)


def test_duplicate_dictionary_points_change_nothing():
    X, y, Xq = _data()
    S = X[:10]
    a = _post(S, 0.05).fit(X, y)
    b = _post(torch.cat([S, S[:4]]), 0.05).fit(X, y)
    for u, v in zip(a(Xq), b(Xq)):
        assert close(u, v, atol=1e-9)


def test_batch_dimensions():
    X, y, Xq = _data()
    post = _post(X[:10], 0.05).fit(X, y)
    Xb = Xq.reshape(5, 5, 2)
    mb, vb = post(Xb)
    m, v = post(Xq)
    assert mb.shape == (5, 5) and close(mb.reshape(-1), m) and close(vb.reshape(-1), v)
    # batched training sets are independent posteriors
    Xt = torch.stack([X[:20], X[20:]])
    yt = torch.stack([y[:20], y[20:]])
    pb = _post(X[:10], 0.05).fit(Xt, yt)
    m0 = _post(X[:10], 0.05).fit(X[:20], y[:20]).mean(Xq)
    m1 = _post(X[:10], 0.05).fit(X[20:], y[20:]).mean(Xq)
    out = pb.mean(Xq.expand(2, -1, -1))
    assert close(out[0], m0) and close(out[1], m1)
    # batched update (fantasy-style) from an unbatched posterior
    pf = _post(X[:10], 0.05).fit(X[:30], y[:30])
    pf.update(X[30:32].expand(3, 2, 2), torch.randn(3, 2, dtype=torch.float64))
    assert pf.mean(Xq).shape == (3, 25)


def test_chunked_scoring_equals_unchunked():
    X, y, _ = _data()
    big = torch.rand(5000, 2, dtype=torch.float64)
    a = _post(X[:10], 0.05, chunk_size=700).fit(X, y)
    b = _post(X[:10], 0.05, chunk_size=10**6).fit(X, y)
    for u, v in zip(a(big), b(big)):
        assert close(u, v, atol=1e-12)


def test_gradients_through_mean_and_variance():
    X, y, _ = _data()
    post = _post(X[:10], 0.05).fit(X, y)
    Xq = torch.rand(4, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: post(x)[0], (Xq,))
    assert torch.autograd.gradcheck(lambda x: post(x)[1], (Xq,))
    assert torch.autograd.gradcheck(lambda x: post.joint(x)[1], (Xq,))


def test_empty_training_set_is_the_prior():
    X, _, Xq = _data()
    post = _post(X[:10], 0.5)
    mean, var = post(Xq)
    assert close(mean, torch.zeros_like(mean)) and close(var, torch.ones_like(var))


def test_stale_embedding_is_detected_and_set_inducing_points_refits():
    X, y, Xq = _data()
    post = _post(X[:10], 0.05).fit(X, y)
    post.embedding.set_inducing_points(X[:12])
    with pytest.raises(TorchBKBError, match="changed"):
        post(Xq)
    post.refit()
    ref = _post(X[:12], 0.05).fit(X, y)
    assert close(post(Xq)[1], ref(Xq)[1])
    post.set_inducing_points(X[:5])
    assert close(post(Xq)[0], _post(X[:5], 0.05).fit(X, y)(Xq)[0])


# ----------------------------------------------------------------------------- complexity contract
def test_only_m_by_m_is_ever_factorized(monkeypatch):
    sizes = spy_factorizations(monkeypatch)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(600, 2, generator=g, dtype=torch.float64)
    y = torch.randn(600, generator=g, dtype=torch.float64)
    m = 25
    post = _post(X[:m], 0.05).fit(X, y)
    post(torch.rand(3000, 2, dtype=torch.float64))
    post.joint(torch.rand(7, 2, dtype=torch.float64))
    for i in range(100):
        post.update(X[i], None if i % 2 else y[i])
    post.set_inducing_points(X[:m])
    post.rls(X)
    assert sizes, "the spy saw no factorization at all"
    assert max(max(s) for s in sizes) <= m


# ----------------------------------------------------------------------------- bad inputs
def _snapshot(post):
    return {k: v.clone() for k, v in post.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


def _bad_fit_cases():
    X, y, _ = _data(n=8)
    nanX = X.clone()
    nanX[0, 0] = float("nan")
    infy = y.clone()
    infy[2] = float("inf")
    return [
        ((nanX, y, None), "NaN/inf"),
        ((X, infy, None), "y: expected finite"),
        ((X, y[:-1], None), r"y: expected shape \(8,\)"),
        ((X[:, :1], y, None), "trailing dimension d=2"),
        ((X[0], y, None), r"expected shape \(\*batch, n, d\)"),
        ((X.float(), y.float(), None), "expected dtype torch.float64"),
        ((X, y.float(), None), "y: expected dtype torch.float64"),
        ((X, y, torch.zeros(8, dtype=torch.float64)), "counts: expected positive"),
        ((X, y, -torch.ones(8, dtype=torch.float64)), "counts: expected positive"),
        ((X, y, torch.ones(7, dtype=torch.float64)), r"counts: expected shape \(8,\)"),
        ((X, None, None), "expected a tensor of shape"),
    ]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_bad_fit_cases()), st.booleans())
def test_bad_fit_and_update_inputs_leave_state_unchanged(case, as_update):
    (X, y, counts), msg = case
    assume(not (as_update and y is None))  # update(x, None) is a valid hallucinated update
    Xg, yg, _ = _data(n=12, seed=3)
    post = _post(Xg[:5], 0.05).fit(Xg, yg)
    before = _snapshot(post)
    if as_update and X.dim() == 1:  # update() takes a single (d,) point, so y of 8 is the mismatch
        msg = r"y: expected shape \(1,\)"
    with pytest.raises(InputDataError, match=msg):
        if as_update:
            post.update(X, y, counts)
        else:
            post.fit(X, y, counts)
    assert _same(before, _snapshot(post))


@pytest.mark.parametrize("case", ["nan", "width", "y", "counts", "scalar"])
def test_bad_features_leave_state_unchanged(case):
    Xg, yg, _ = _data(n=12, seed=3)
    post = _post(Xg[:5], 0.05).fit(Xg, yg)
    before = _snapshot(post)
    r = post.ZtZ.shape[-1]
    Z, y, counts = torch.rand(2, r, dtype=torch.float64), None, None
    if case == "nan":
        Z[0, 0] = float("nan")
    elif case == "width":
        Z = torch.rand(2, r + 1, dtype=torch.float64)
    elif case == "y":
        y = torch.tensor([0.0, float("inf")], dtype=torch.float64)
    elif case == "counts":
        counts = torch.tensor([1.0, -1.0], dtype=torch.float64)
    else:
        Z = 1.0
    with pytest.raises(InputDataError, match="expected"):
        post.update_features(Z, y, counts)
    assert _same(before, _snapshot(post))


@pytest.mark.parametrize("noise", [0.0, -1.0, float("nan"), float("inf"), "a"])
def test_bad_noise(noise):
    with pytest.raises(InputDataError, match="noise"):
        _post(torch.rand(3, 2, dtype=torch.float64), noise)


def test_bad_embedding_type():
    with pytest.raises(InputDataError, match="expected a NystromEmbedding"):
        DTCPosterior(GaussianKernel(1.0), noise=0.1)


def test_fit_with_precomputed_features_equals_fit():
    g = torch.Generator().manual_seed(5)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X[:, 0])
    c = torch.randint(1, 4, (40,), generator=g).to(torch.float64)
    emb = NystromEmbedding(GaussianKernel(0.3), X[:7])
    a = DTCPosterior(emb, noise=0.05).fit(X, y, c)
    b = DTCPosterior(emb, noise=0.05).fit(X, y, c, features=emb(X))
    assert close(a.V_inv, b.V_inv, 1e-12) and close(a.weights, b.weights, 1e-12)
    with pytest.raises(InputDataError, match=r"features: expected shape \(40, 7\)"):
        DTCPosterior(emb, noise=0.05).fit(X, y, c, features=emb(X)[:, :3])


def test_to_float32_keeps_the_float64_factorizations():
    X, y, Xq = _data()
    post = _post(X[:10], 0.05).fit(X, y)
    V_inv = post.V_inv.clone()
    W = post.embedding.projection.clone()
    post.to(torch.float32)
    assert post.V_inv.dtype == torch.float64 and torch.equal(post.V_inv, V_inv)
    assert post.embedding.projection.dtype == torch.float64 and torch.equal(post.embedding.projection, W)
    assert post.embedding.inducing_points.dtype == torch.float32


@pytest.mark.parametrize("whitening", ["cholesky", "eigh"])
def test_kernel_row_operator_and_column_scoring_are_000_eq4(whitening):
    """The bandits' per-step refit (fit_kernel_row_operator, then the mean aᵀK and rls_kernel_columns, or both at
    once by score_kernel_columns, on kernel rows stored one per inducing point) equals 000 Eq. 4 with weighted
    (repeated) observations."""
    from torchbkb.gp.functional import fit_kernel_row_operator, rls_kernel_columns, score_kernel_columns
    from torchbkb.gp.linalg import inv_sqrt_factor, psd_inv_sqrt

    X, y, Xq = _data()
    S, lam = X[::3], 0.02
    counts = torch.arange(1, len(X) + 1, dtype=torch.float64) % 3 + 1
    K_ss = rbf(S, S, LS)
    W = inv_sqrt_factor(K_ss) if whitening == "cholesky" else psd_inv_sqrt(K_ss)
    Zt = W @ rbf(S, X, LS)
    Ma, V_inv = fit_kernel_row_operator(W, Zt, counts, counts * y, lam)
    K_SQ = rbf(S, Xq, LS)  # (m, q)
    mean, rls = Ma[-1] @ K_SQ, rls_kernel_columns(K_SQ, torch.ones(len(Xq), dtype=torch.float64), Ma[:-1], lam,
                                                  chunk_size=7)
    rep = torch.repeat_interleave(torch.arange(len(X)), counts.long())  # every pull as its own row
    m_ref, rls_ref = bkb_eq4(K_ss, rbf(X[rep], S, LS), rbf(Xq, S, LS), torch.ones(len(Xq), dtype=torch.float64), y[rep],
                             lam)
    assert close(mean, m_ref, atol=1e-9)
    assert close(rls, rls_ref, atol=1e-7)
    # mean and rls at once
    one_product = score_kernel_columns(K_SQ, torch.ones(len(Xq), dtype=torch.float64), Ma, lam, chunk_size=7)
    assert close(one_product[0], m_ref, atol=1e-9) and close(one_product[1], rls_ref, atol=1e-7)
    assert close(V_inv, torch.linalg.inv(Zt @ torch.diag(counts) @ Zt.T + lam * torch.eye(len(W), dtype=torch.float64)),
                 atol=1e-9)
