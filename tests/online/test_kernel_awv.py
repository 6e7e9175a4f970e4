import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb.errors import InputDataError
from torchbkb.online import PKAWV, KernelAWV, OnlineKRR

from ._refs import DEVICES, DTYPES, close, kernel_forecasts_direct, rbf, single_thread, tol  # noqa: F401 (autouse)


def _kernel(A, B):
    return torch.exp(-0.5 * ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1) / 0.25)  # σ = 0.5


def _stream(n, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    return X, torch.cos(3 * X[:, 0]) * X[:, -1] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls,awv", [(KernelAWV, True), (OnlineKRR, False)])
def test_forecasts_equal_the_closed_form(cls, awv, dtype, device):
    X, y = _stream(80, seed=1)
    f = cls(_kernel, lam=0.5)
    res = f.fit_stream(X.to(device, dtype), y.to(device, dtype), chunk_size=16)
    assert res.predictions.dtype == dtype and res.predictions.device.type == device
    X, y = X.to(dtype).double(), y.to(dtype).double()
    assert close(res.predictions, kernel_forecasts_direct(rbf(X, X, 0.5), y, 0.5, awv=awv), atol=tol(dtype))
    Q = torch.rand(7, 2, dtype=torch.float64)
    K = rbf(torch.cat([X, Q]), torch.cat([X, Q]), 0.5)
    want = [kernel_forecasts_direct(K[idx][:, idx], torch.cat([y, torch.zeros(1, dtype=torch.float64)]), 0.5, awv=awv,
                                    rounds=[80])[0]
            for idx in ([*range(80), 80 + j] for j in range(7))]
    assert close(f.predict(Q.to(device, dtype)), torch.stack(want), atol=tol(dtype))


def test_storage_grows_past_its_initial_capacity():
    X, y = _stream(300, seed=2)  # initial capacity is 256 rows
    f = KernelAWV(_kernel, lam=1.0)
    res = f.fit_stream(X, y)
    assert f.size == 300
    rounds = [0, 1, 255, 256, 257, 299]
    assert close(res.predictions[rounds], kernel_forecasts_direct(rbf(X, X, 0.5), y, 1.0, rounds=rounds), atol=1e-10)


def test_linear_kernel_awv_is_linear_awv():
    X, y = _stream(60, d=3, seed=3)
    k = KernelAWV(lambda A, B: A @ B.transpose(-1, -2), lam=0.7).fit_stream(X, y).predictions
    p = PKAWV(embedding=lambda A: A, lam=0.7).fit_stream(X, y, chunk_size=1).predictions
    assert close(k, p, atol=1e-10)


def test_awv_shrinks_the_krr_forecast():
    # same λ, same past: ŷ_AWV = λ/δ² · ŷ_KRR with δ² = k(x,x) + λ - ‖l‖² >= λ
    X, y = _stream(50, seed=4)
    awv, krr = KernelAWV(_kernel, 1.0).update(X, y), OnlineKRR(_kernel, 1.0).update(X, y)
    Q = torch.rand(20, 2, dtype=torch.float64)
    a, r = awv.predict(Q), krr.predict(Q)
    assert bool((a.abs() <= r.abs() + 1e-15).all()) and bool((a * r >= 0).all())


def test_max_time_stops_the_stream():
    X, y = _stream(400, seed=5)
    f = KernelAWV(_kernel, lam=1.0)
    res = f.fit_stream(X, y, max_time=1e-9)
    assert res.stopped_early and 1 <= res.n_rounds < 400 and f.num_rounds == res.n_rounds == f.size
    assert res.n_total == 400 and res.summary()["stopped_early"] is True


def test_gpytorch_kernel():
    gpytorch = pytest.importorskip("gpytorch")
    X, y = _stream(40, seed=6)
    k = gpytorch.kernels.RBFKernel().double()
    k.lengthscale = 0.5
    res = KernelAWV(k, lam=1.0).fit_stream(X, y)
    assert close(res.predictions, kernel_forecasts_direct(rbf(X, X, 0.5), y, 1.0), atol=1e-8)


@pytest.mark.parametrize("lam", [0.0, -1.0, float("nan"), None])
def test_bad_lambda(lam):
    with pytest.raises(InputDataError, match="expected"):
        KernelAWV(_kernel, lam=lam)


def test_bad_kernel():
    with pytest.raises(InputDataError, match="expected"):
        OnlineKRR(3.0, lam=1.0)


@given(bad=st.sampled_from(["nan", "wrong_d", "dtype", "y_shape"]), cls=st.sampled_from([KernelAWV, OnlineKRR]))
@settings(max_examples=20, deadline=None)
def test_bad_inputs_leave_the_state_untouched(bad, cls):
    X, y = _stream(10, seed=7)
    f = cls(_kernel, 1.0).update(X[:5], y[:5])
    before = (f.size, f.predict(X[5:]).clone())
    Xb, yb = X[5:].clone(), y[5:].clone()
    if bad == "nan":
        Xb[2, 1] = float("nan")
    elif bad == "wrong_d":
        Xb = torch.rand(5, 3, dtype=torch.float64)
    elif bad == "dtype":
        Xb, yb = Xb.float(), yb.float()
    else:
        yb = yb[:3]
    with pytest.raises(InputDataError, match="expected"):
        f.update(Xb, yb)
    assert f.size == before[0] and torch.equal(f.predict(X[5:]), before[1])
