import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb.errors import InputDataError
from torchbkb.online import PKAWV, KernelAWV, TaylorEmbedding

from ._refs import (  # noqa: F401 (single_thread: an autouse fixture)
    DEVICES, DTYPES, awv_direct, close, corrupt_batch, kernel_forecasts_direct, learner_state, nystrom_pkawv_paper, rbf,
    same_state, single_thread, tol,
)


def _stream(n, d, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    X = (torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1) * scale
    y = torch.sin(3 * X[:, 0]) + 0.5 * X[:, -1] ** 2 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _kernel(A, B):  # float64-exact Gaussian kernel, σ = 1
    return torch.exp(-0.5 * ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("awv", [True, False])
def test_sherman_morrison_rounds_equal_a_direct_solve(dtype, device, awv):
    X, y = _stream(60, 2, seed=1)
    emb = TaylorEmbedding(2, 3)
    f = PKAWV(embedding=emb, lam=0.5, awv=awv)
    Xd, yd = X.to(device, dtype), y.to(device, dtype)
    preds = torch.cat([f.step(Xd[t : t + 1], yd[t : t + 1]) for t in range(60)])
    assert preds.dtype == dtype and preds.device.type == device
    Phi = emb(X)
    assert close(preds, awv_direct(Phi, y, 0.5, awv=awv), atol=tol(dtype))
    A = Phi.T @ Phi + 0.5 * torch.eye(Phi.shape[1], dtype=torch.float64)
    assert f.precision.dtype == torch.float64
    assert close(f.precision, torch.linalg.inv(A), atol=tol(dtype))
    assert close(f.b, Phi.T @ y, atol=tol(dtype) * 10)


@pytest.mark.parametrize("awv", [True, False])
@pytest.mark.parametrize("chunk", [8, 13, 64, 500])
def test_blocked_stream_equals_rank_one_rounds(awv, chunk):
    X, y = _stream(200, 3, seed=2)
    seq = PKAWV(embedding=TaylorEmbedding(3, 3), lam=1.0, awv=awv).fit_stream(X, y, chunk_size=1)
    blk = PKAWV(embedding=TaylorEmbedding(3, 3), lam=1.0, awv=awv)
    res = blk.fit_stream(X, y, chunk_size=chunk)
    assert close(res.predictions, seq.predictions, atol=1e-10)
    Phi = TaylorEmbedding(3, 3)(X)
    assert close(blk.precision, torch.linalg.inv(Phi.T @ Phi + torch.eye(20, dtype=torch.float64)), atol=1e-12)
    assert close(res.predictions[:80], awv_direct(Phi[:80], y[:80], 1.0, awv=awv), atol=1e-10)


def test_large_taylor_basis_forecasts_like_kernel_awv():
    X, y = _stream(150, 2, seed=3, scale=0.7)  # ‖x‖ <= 1
    emb = TaylorEmbedding(2, 14, lengthscale=1.0)  # kernel error <= 1/15! ≈ 8e-13
    p = PKAWV(embedding=emb, lam=1.0).fit_stream(X, y).predictions
    k = KernelAWV(_kernel, lam=1.0).fit_stream(X, y).predictions
    ref = kernel_forecasts_direct(rbf(X, X), y, 1.0)
    assert close(k, ref, atol=1e-10)
    assert close(p, ref, atol=1e-7)


def test_small_taylor_basis_is_close_but_not_equal():
    X, y = _stream(150, 2, seed=3, scale=0.7)
    ref = kernel_forecasts_direct(rbf(X, X), y, 1.0)
    gaps = [float((PKAWV(embedding=TaylorEmbedding(2, M), lam=1.0).fit_stream(X, y).predictions - ref).abs().max())
            for M in (1, 2, 4, 8)]
    assert gaps[0] > 1e-3 and all(a > b for a, b in zip(gaps, gaps[1:]))


def test_predict_is_pure_and_is_the_next_forecast():
    X, y = _stream(40, 2, seed=4)
    f = PKAWV(embedding=TaylorEmbedding(2, 3), lam=1.0)
    f.update(X[:30], y[:30])
    before = learner_state(f)
    q = f.predict(X[30:])
    assert same_state(before, learner_state(f)) and q.shape == (10,)
    assert torch.allclose(f.step(X[30:31], y[30:31]), q[:1], atol=1e-14)
    g = PKAWV(embedding=TaylorEmbedding(2, 3), lam=1.0)
    assert close(g.fit_stream(X[:31], y[:31]).predictions[-1:], q[:1], atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("awv", [True, False])
def test_kors_variant_matches_the_paper_algorithm(dtype, device, awv):
    X, y = _stream(120, 2, seed=5)
    f = PKAWV(kernel=_kernel, lam=1.0, dictionary="kors", mu=0.1, beta=1.0, epsilon=0.5, awv=awv, seed=3)
    res = f.fit_stream(X.to(device, dtype), y.to(device, dtype), chunk_size=16)
    X, y = X.to(dtype).double(), y.to(dtype).double()  # the reference sees the same (rounded) stream
    idx = f.basis_indices.cpu().tolist()
    assert idx == sorted(idx) and 3 <= len(idx) < 120 and f.num_features == len(idx)
    assert set(idx) <= set(f.dictionary.indices.tolist()) and f.num_skipped == len(f.dictionary) - len(idx)
    assert torch.equal(f.basis.points.cpu(), X[idx])
    ref = nystrom_pkawv_paper(rbf(X, X), y, 1.0, lambda t: [i for i in idx if i <= t], awv=awv)
    # float64 state either way; float32 outputs carry their own rounding (~6e-8 per unit of |ŷ|). The reference's
    # G = K_tIᵀK_tI + λK_II reaches cond ≈ 1.4e14 by t = 119: there LAPACK's solvers (gelsy, gelsd, LU) disagree
    # with each other by ~2e-7 and a reference run can land ~1e-7 away depending on rounding (memory alignment)
    # -- hence 1e-6, still far below what any algorithmic difference gives (> 1e-3).
    assert close(res.predictions, ref, atol=1e-6 if dtype == torch.float64 else 1e-5)
    assert close(f.predict(X[:5].to(device, dtype)), _nystrom_predict(X, y, idx, X[:5], awv),
                 atol=1e-6 if dtype == torch.float64 else tol(dtype))


def _nystrom_predict(X, y, idx, Q, awv):
    """f̂(q) for a next input q with the final dictionary (no new point): 004 Eq. 4 in kernel form."""
    K = rbf(torch.cat([X, Q]), X[idx])
    out = []
    for j in range(Q.shape[0]):
        rows = torch.cat([K[: X.shape[0]], K[X.shape[0] + j :][:1]]) if awv else K[: X.shape[0]]
        G = rows.T @ rows + rbf(X[idx], X[idx])
        alpha = torch.linalg.lstsq(G, K[: X.shape[0]].T @ y).solution
        out.append(K[X.shape[0] + j] @ alpha)
    return torch.stack(out)


def test_kors_variant_with_a_gpytorch_kernel():
    gpytorch = pytest.importorskip("gpytorch")
    X, y = _stream(80, 2, seed=6)
    k = gpytorch.kernels.RBFKernel().double()
    k.lengthscale = 1.0
    f = PKAWV(kernel=k, lam=1.0, dictionary="kors", mu=0.1, seed=0)
    res = f.fit_stream(X, y)
    idx = f.basis_indices.tolist()
    ref = nystrom_pkawv_paper(rbf(X, X), y, 1.0, lambda t: [i for i in idx if i <= t])
    assert close(res.predictions, ref, atol=1e-6)


def test_fixed_nystrom_dictionary_known_beforehand():
    X, y = _stream(100, 2, seed=7)
    idx = [3, 10, 11, 40, 77]
    f = PKAWV(kernel=_kernel, lam=1.0, dictionary=X[idx])
    res = f.fit_stream(X, y, chunk_size=32)
    ref = nystrom_pkawv_paper(rbf(X, X), y, 1.0, lambda t: idx)
    assert close(res.predictions, ref, atol=1e-8)


def test_kors_is_reproducible_and_the_dictionary_grows_slowly():
    X, y = _stream(1500, 2, seed=8)
    runs = [PKAWV(kernel=_kernel, lam=1.0, dictionary="kors", seed=11) for _ in range(2)]
    r = [f.fit_stream(X, y) for f in runs]
    assert torch.equal(r[0].predictions, r[1].predictions)
    assert torch.equal(runs[0].dictionary.indices, runs[1].dictionary.indices)
    m = len(runs[0].dictionary)
    first_half = int((runs[0].dictionary.indices < 750).sum())
    assert m < 150 and m - first_half < first_half


def test_update_equals_fit_stream_and_counts_rounds():
    X, y = _stream(50, 2, seed=9)
    a = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0).update(X[:20], y[:20]).update(X[20:], y[20:])
    b = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0)
    b.fit_stream(X, y, chunk_size=8)
    assert a.num_rounds == b.num_rounds == 50
    assert torch.allclose(a.precision, b.precision, atol=1e-13) and torch.allclose(a.b, b.b, atol=1e-13)


def test_float32_inputs_keep_a_float64_state():
    X, y = _stream(200, 2, seed=10)
    r64 = PKAWV(embedding=TaylorEmbedding(2, 3), lam=1.0).fit_stream(X, y)
    f = PKAWV(embedding=TaylorEmbedding(2, 3), lam=1.0)
    r32 = f.fit_stream(X.float(), y.float())
    assert r32.predictions.dtype == torch.float32 and f.precision.dtype == torch.float64
    assert close(r32.predictions, r64.predictions, atol=1e-4)


def test_state_dict_carries_the_state():
    X, y = _stream(30, 2, seed=11)
    f = PKAWV(embedding=TaylorEmbedding(2, 2), lam=0.25).update(X, y)
    sd = f.state_dict()
    assert float(sd["lam"]) == 0.25 and sd["precision"].shape == (6, 6) and sd["b"].shape == (6,)


def test_empty_kors_dictionary_forecasts_zero():
    f = PKAWV(kernel=_kernel, lam=1.0, dictionary="kors", mu=1.0, beta=1e-9, seed=0)  # p ≈ 0: nothing is sampled
    res = f.fit_stream(*_stream(20, 2))
    assert f.num_features == 0 and torch.equal(res.predictions, torch.zeros(20, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lam=0.0),
        dict(lam=-1.0),
        dict(lam=float("nan")),
        dict(lam=float("inf")),
        dict(lam="a"),
        dict(awv=1),
        dict(new_direction_rtol=1.5),
    ],
)
def test_bad_hyperparameters(kwargs):
    with pytest.raises(InputDataError, match="expected"):
        PKAWV(embedding=TaylorEmbedding(2, 2), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),  # neither embedding nor kernel
        dict(embedding=TaylorEmbedding(2, 2), kernel=_kernel),
        dict(embedding=TaylorEmbedding(2, 2), dictionary="kors"),
        dict(embedding=3),
        dict(kernel=_kernel),  # no dictionary
        dict(kernel=_kernel, dictionary="leverage"),
        dict(kernel=_kernel, dictionary="kors", mu=0.0),
        dict(kernel=_kernel, dictionary="kors", beta=-1.0),
        dict(kernel=_kernel, dictionary="kors", epsilon=-0.1),
        dict(kernel=_kernel, dictionary="kors", generator=0),
    ],
)
def test_bad_construction(kwargs):
    with pytest.raises(InputDataError, match="expected"):
        PKAWV(**kwargs)


def _learners():
    return [
        PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0),
        PKAWV(kernel=_kernel, lam=1.0, dictionary="kors", mu=0.1, seed=0),
    ]


@given(
    which=st.integers(0, 1),
    bad=st.sampled_from(["nan_x", "inf_y", "wrong_d", "y_len", "y_2d", "dtype", "int_x", "x_1d", "list_y", "empty"]),
    n=st.integers(1, 5),
)
@settings(max_examples=60, deadline=None)
def test_bad_inputs_raise_and_leave_the_state_untouched(which, bad, n):
    f = _learners()[which]
    X, y = _stream(12, 2, seed=12)
    f.update(X[:6], y[:6])
    before = learner_state(f)
    Xb, yb = corrupt_batch(X[6 : 6 + n], y[6 : 6 + n], bad)
    for call in (lambda: f.update(Xb, yb), lambda: f.fit_stream(Xb, yb),
                 lambda: f.predict(Xb) if bad not in ("inf_y", "y_len", "y_2d", "list_y") else f.update(Xb, yb)):
        with pytest.raises(InputDataError, match="expected"):
            call()
        assert same_state(before, learner_state(f))
    if n > 1 and bad not in ("x_1d", "empty"):
        with pytest.raises(InputDataError, match="expected"):
            f.step(Xb, yb)
    assert same_state(before, learner_state(f))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_device_mismatch_raises():
    X, y = _stream(10, 2)
    f = PKAWV(embedding=TaylorEmbedding(2, 2), lam=1.0).update(X, y)
    with pytest.raises(InputDataError, match="expected"):
        f.update(X.cuda(), y.cuda())


def test_complexity_contract_only_small_matrices_are_factorized(monkeypatch):
    """Fixed embedding: only the (b, b) Woodbury blocks are factorized, never a D×D or t×t matrix;
    KORS: nothing is factorized at all (the subspace grows by triangular appends)."""
    shapes = []
    real_chol = torch.linalg.cholesky_ex

    def spy_chol(A, *a, **k):
        shapes.append(tuple(A.shape))
        return real_chol(A, *a, **k)

    def forbidden(*a, **k):
        raise AssertionError("unexpected factorization")

    monkeypatch.setattr(torch.linalg, "cholesky_ex", spy_chol)
    for name in ("cholesky", "eigh", "inv", "solve", "lstsq", "svd"):
        monkeypatch.setattr(torch.linalg, name, forbidden)
    X, y = _stream(700, 2, seed=13)
    f = PKAWV(embedding=TaylorEmbedding(2, 5), lam=1.0)  # D = 21
    f.fit_stream(X, y, chunk_size=256)
    assert shapes and max(s[0] for s in shapes) <= 64 and f.precision.shape == (21, 21)
    shapes.clear()
    g = PKAWV(kernel=_kernel, lam=1.0, dictionary="kors", mu=0.1, seed=0)
    g.fit_stream(X[:300], y[:300])
    assert shapes == [] and g.num_features > 5
