import pytest
import torch
from hypothesis import given, settings, strategies as st

from torchbkb.errors import InputDataError
from torchbkb.online import ProsNKONS

from ._refs import (  # noqa: F401 (single_thread: an autouse fixture)
    DEVICES, DTYPES, close, corrupt_batch, learner_state, rbf, same_state, single_thread,
)


def _stream(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    noise = 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    y = (torch.sin(3 * X[:, 0]) + 0.5 * X[:, -1] ** 2 + noise).clamp(-1, 1)
    return X, y


def _kernel(A, B):
    return torch.exp(-0.5 * ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1))


def pros_n_kons_paper(X, y, additions, alpha, C, sigma):
    """The algorithm in the paper's form: phases start at the rounds KORS adds a point; inside a phase the
    embedding is Σ^{-1/2} Uᵀ k_I(x) of the eigendecomposition K_I = U Σ Uᵀ; the matrix A is kept (not its
    inverse) and the projection on |φᵀw| <= C solves the KKT system of min (w - u)ᵀA(w - u)."""
    out, I = [], []
    for t in range(X.shape[0]):
        if t in additions:
            I.append(t)
            m = len(I)
            evals, U = torch.linalg.eigh(rbf(X[I], X[I]))
            E = U / evals.sqrt()  # φ(x) = Eᵀ k_I(x)
            w, A, g = torch.zeros(m, dtype=torch.float64), alpha * torch.eye(m, dtype=torch.float64), torch.zeros(m,
                    dtype=torch.float64)
        if not I:
            out.append(0.0)
            continue
        phi = E.T @ rbf(X[t : t + 1], X[I])[0]
        u = w - torch.linalg.solve(A, g)
        nu = float(phi @ u)
        yhat = min(max(nu, -C), C)
        if nu != yhat:  # active constraint φᵀw = ŷ: [[2A, φ], [φᵀ, 0]] [w; ν] = [2Au; ŷ]
            m = phi.shape[0]
            KKT = torch.zeros(m + 1, m + 1, dtype=torch.float64)
            KKT[:m, :m], KKT[:m, m], KKT[m, :m] = 2 * A, phi, phi
            w = torch.linalg.solve(KKT, torch.cat([2 * A @ u, torch.tensor([yhat], dtype=torch.float64)]))[:m]
        else:
            w = u
        g = 2 * (yhat - float(y[t])) * phi
        A = A + 0.5 * sigma * torch.outer(g, g)
        out.append(yhat)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("C", [1.0, 0.3])
def test_forecasts_match_the_paper_algorithm(dtype, device, C):
    X, y = _stream(150, 2, seed=4)
    f = ProsNKONS(_kernel, alpha=1.0, C=C, mu=0.1, beta=1.0, epsilon=0.5, seed=2)
    res = f.fit_stream(X.to(device, dtype), y.to(device, dtype))
    X, y = X.to(dtype).double(), y.to(dtype).double()
    additions = f.dictionary.indices.cpu().tolist()
    assert 3 <= len(additions) < 150 and f.num_features == len(additions) and f.num_restarts == len(additions) - 1
    ref = pros_n_kons_paper(X, y, set(additions), 1.0, C, 1.0 / (8 * C * C))
    assert close(res.predictions, ref, atol=1e-8 if dtype == torch.float64 else 1e-5)
    assert float(res.predictions.abs().max()) <= C * (1 + 1e-7)  # float32 rounds C itself
    if C < 1:
        assert float((ref.abs() == C).float().mean()) > 0.1  # the projection was exercised


def test_restart_forecasts_zero_and_forgets_the_phase():
    f = ProsNKONS(_kernel, C=1.0, beta=1e6, seed=0)  # every point with a new direction joins the dictionary
    x0, x1 = torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 2), 3.0, dtype=torch.float64)
    f.step(x0, torch.tensor([1.0], dtype=torch.float64))
    assert float(f.predict(x0)) > 0.5
    assert float(f.step(x1, torch.tensor([-1.0], dtype=torch.float64))) == 0.0  # a new phase starts from w = 0
    assert f.num_restarts == 1 and f.num_features == 2
    assert torch.equal(f.weights, torch.zeros(2, dtype=torch.float64))


def test_predict_is_pure_and_is_the_next_forecast_without_a_new_point():
    X, y = _stream(80, 2, seed=7)
    f = ProsNKONS(_kernel, mu=0.5, seed=1).update(X[:60], y[:60])
    m = len(f.dictionary)
    state = learner_state(f)
    p = f.predict(X[60:61])
    assert same_state(state, learner_state(f))
    out = f.step(X[60:61], y[60:61])
    if len(f.dictionary) == m:  # no restart at this round: the forecast is the one predicted
        assert torch.equal(out, p)


def test_update_equals_fit_stream_and_is_reproducible():
    X, y = _stream(100, 3, seed=9)
    a = ProsNKONS(_kernel, seed=5).fit_stream(X, y).predictions
    f = ProsNKONS(_kernel, seed=5)
    b = torch.cat([f.step(X[i : i + 1], y[i : i + 1]) for i in range(100)])
    assert torch.equal(a, b) and f.num_rounds == 100


@pytest.mark.parametrize("kwargs",
                         [dict(alpha=0.0), dict(C=-1.0), dict(sigma=0.0), dict(alpha="a"), dict(mu=0.0),
                          dict(beta=-1.0), dict(new_direction_rtol=1.5)])
def test_bad_hyperparameters(kwargs):
    with pytest.raises(InputDataError, match="expected"):
        ProsNKONS(_kernel, **kwargs)


@given(bad=st.sampled_from(["nan_x", "inf_y", "wrong_d", "y_len", "dtype", "empty"]), n=st.integers(1, 4))
@settings(max_examples=30, deadline=None)
def test_bad_inputs_raise_and_leave_the_state_untouched(bad, n):
    X, y = _stream(12, 2, seed=12)
    f = ProsNKONS(_kernel, mu=0.1, seed=0).update(X[:6], y[:6])
    before = learner_state(f)
    Xb, yb = corrupt_batch(X[6 : 6 + n], y[6 : 6 + n], bad)
    with pytest.raises(InputDataError, match="expected"):
        f.update(Xb, yb)
    assert same_state(before, learner_state(f)) and f.num_rounds == 6
