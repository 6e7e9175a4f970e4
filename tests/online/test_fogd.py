import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb.errors import InputDataError
from torchbkb.online import FOGD

from ._refs import DEVICES, DTYPES, close, rbf, tol, single_thread  # noqa: F401 (autouse fixture)


def _stream(n, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    return X, torch.sin(2 * X.sum(-1))


def _fogd_direct(U, X, y, lr):
    """ŷ_t = w_tᵀz_t, w_{t+1} = w_t - η(ŷ_t - y_t) z_t with z = D^{-1/2}(cos Ux, sin Ux)."""
    Z = torch.cat([torch.cos(X @ U.T), torch.sin(X @ U.T)], dim=-1) / U.shape[0] ** 0.5
    w = torch.zeros(Z.shape[1], dtype=torch.float64)
    out = []
    for t in range(X.shape[0]):
        out.append(w @ Z[t])
        w = w - lr * (out[-1] - y[t]) * Z[t]
    return torch.stack(out), w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [1, 9, 128])
def test_forecasts_follow_the_gradient_recursion(dtype, device, chunk):
    X, y = _stream(200, seed=1)
    f = FOGD(d=2, lengthscale=0.5, num_features=50, lr=0.3, seed=0)
    res = f.fit_stream(X.to(device, dtype), y.to(device, dtype), chunk_size=chunk)
    X, y = X.to(dtype).double(), y.to(dtype).double()
    want, w = _fogd_direct(f.frequencies.cpu(), X, y, 0.3)
    assert res.predictions.dtype == dtype and close(res.predictions, want, atol=tol(dtype))
    assert close(f.weights, w, atol=1e-9)


def test_random_features_approximate_the_kernel():
    X = torch.rand(30, 3, dtype=torch.float64)
    f = FOGD(d=3, lengthscale=0.5, num_features=20000, seed=1)
    Z = f.features(X)
    assert Z.shape == (30, 40000)
    assert float((Z @ Z.T - rbf(X, X, 0.5)).abs().max()) < 0.05
    assert torch.allclose((Z * Z).sum(-1), torch.ones(30, dtype=torch.float64))  # cos² + sin² = 1
    U = f.frequencies
    assert abs(float(U.std()) - 2.0) < 0.05  # U_ij ~ N(0, 1/σ²)


def test_seed_reproducibility_and_step():
    X, y = _stream(30, seed=2)
    a, b = FOGD(2, seed=3), FOGD(2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.frequencies, b.frequencies)
    preds = torch.cat([a.step(X[t : t + 1], y[t : t + 1]) for t in range(30)])
    assert close(preds, b.fit_stream(X, y).predictions, atol=1e-13)


@pytest.mark.parametrize(
    "kwargs",
    [dict(d=0), dict(d=2.5), dict(d=2, num_features=0), dict(d=2, lr=0.0), dict(d=2, lengthscale=-1.0),
     dict(d=2, generator="g")]
)
def test_bad_hyperparameters(kwargs):
    with pytest.raises(InputDataError, match="expected"):
        FOGD(**kwargs)


@given(bad=st.sampled_from(["nan", "wrong_d", "dtype", "y_shape"]))
@settings(max_examples=12, deadline=None)
def test_bad_inputs_leave_the_weights_untouched(bad):
    X, y = _stream(10, seed=4)
    f = FOGD(2, num_features=10, lr=0.1, seed=0).update(X[:5], y[:5])
    w = f.weights.clone()
    Xb, yb = X[5:].clone(), y[5:].clone()
    if bad == "nan":
        Xb[0, 0] = float("inf")
    elif bad == "wrong_d":
        Xb = torch.rand(5, 3, dtype=torch.float64)
    elif bad == "dtype":
        Xb, yb = Xb.float(), yb.float()
    else:
        yb = yb[:, None]
    with pytest.raises(InputDataError, match="expected"):
        f.update(Xb, yb)
    assert torch.equal(f.weights, w) and f.num_rounds == 5
