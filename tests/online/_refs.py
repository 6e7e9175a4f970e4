"""Independent float64 reference formulas for the online tests, written from paper 004 (not the package)."""

import copy
import math

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]


def tol(dtype):
    return 1e-9 if dtype == torch.float64 else 2e-3


def rbf(A, B, ls=1.0):
    """exp(-‖a - b‖² / (2 ls²)), computed from differences."""
    d2 = ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1)
    return torch.exp(-0.5 * d2 / ls**2)


def taylor_truncated_kernel(A, B, sigma, M):
    """Σ_{j<=M} Q_j(x, x') of 004 App. F.2: exp(-(‖x‖²+‖x'‖²)/2σ²) Σ_j (xᵀx'/σ²)^j / j!."""
    s = A @ B.T / sigma**2
    series = sum(s**j / math.factorial(j) for j in range(M + 1))
    return torch.exp(-(A.pow(2).sum(-1)[:, None] + B.pow(2).sum(-1)[None, :]) / (2 * sigma**2)) * series


def awv_direct(Phi, y, lam, awv=True):
    """Linear AWV (awv=True) or ridge (awv=False), one fresh solve per round."""
    n, D = Phi.shape
    out = torch.empty(n, dtype=torch.float64)
    for t in range(n):
        rows = Phi[: t + 1] if awv else Phi[:t]
        A = rows.T @ rows + lam * torch.eye(D, dtype=torch.float64)
        b = Phi[:t].T @ y[:t]
        out[t] = Phi[t] @ torch.linalg.solve(A, b)
    return out


def kernel_forecasts_direct(K, y, lam, awv=True, rounds=None):
    """Kernel-AWV ŷ_t = k_t(x_t)ᵀ(K_t + λI)⁻¹(Y_{t-1}, 0) (004 Eq. 3), or KRR without the current point."""
    n = K.shape[0]
    rounds = range(n) if rounds is None else rounds
    out = []
    for t in rounds:
        m = t + 1 if awv else t
        Yp = torch.cat([y[:t], torch.zeros(m - t, dtype=torch.float64)])
        alpha = torch.linalg.solve(K[:m, :m] + lam * torch.eye(m, dtype=torch.float64), Yp)
        out.append(K[t, :m] @ alpha)
    return torch.stack(out)


def nystrom_pkawv_paper(K, y, lam, dict_at, awv=True):
    """004 App. H, Algorithm 2 in closed form: with I_t = dict_at(t) (stream indices),
    α_t = (K_{t,I}ᵀ K_{t,I} + λ K_{I,I})⁻¹ K_{t,I}ᵀ (Y_{t-1}, 0),  ŷ_t = k_I(x_t)ᵀ α_t."""
    n = K.shape[0]
    out = torch.zeros(n, dtype=torch.float64)
    for t in range(n):
        idx = list(dict_at(t))
        if not idx:
            continue
        rows = t + 1 if awv else t
        KtI = K[:rows][:, idx]
        G = KtI.T @ KtI + lam * K[idx][:, idx]
        Yp = torch.cat([y[:t], torch.zeros(rows - t, dtype=torch.float64)])
        alpha = torch.linalg.lstsq(G, KtI.T @ Yp).solution
        out[t] = K[t, idx] @ alpha
    return out


def close(a, b, atol):
    return bool(torch.allclose(a.double().cpu(), b.double().cpu(), rtol=0.0, atol=atol))


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Online learners run many tiny ops; intra-op threads only add synchronization (pathologically so on an
    oversubscribed machine: 10x slower on a shared 2-core VM). Imported by each test module."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def learner_state(f):
    """A copy of a learner's ``state_dict`` (extra states included) and its round count, to check that a failed
    call changed nothing."""
    return copy.deepcopy(dict(f.state_dict())) | {"t": f.num_rounds}


def same_state(a, b):
    """Equal nested states: dicts, lists and tensors (bit for bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # nan == nan here


def corrupt_batch(X, y, bad):
    """``(X, y)`` of ``n`` good rows turned into the bad input named ``bad`` (a copy; the originals are kept)."""
    n = X.shape[0]
    Xb, yb = X.clone(), y.clone()
    if bad == "nan_x":
        Xb[-1, 0] = float("nan")
    elif bad == "inf_y":
        yb[-1] = float("inf")
    elif bad == "wrong_d":
        Xb = torch.rand(n, X.shape[1] + 1, dtype=torch.float64)
    elif bad == "y_len":
        yb = torch.zeros(n + 1, dtype=torch.float64)
    elif bad == "y_2d":
        yb = yb[:, None]
    elif bad == "dtype":
        Xb, yb = Xb.float(), yb.float()
    elif bad == "int_x":
        Xb = torch.ones(n, X.shape[1], dtype=torch.long)
    elif bad == "x_1d":
        Xb = Xb[0]
    elif bad == "list_y":
        yb = yb.tolist()
    elif bad == "empty":
        Xb, yb = Xb[:0], yb[:0]
    else:
        raise ValueError(f"bad: unknown kind {bad!r}")
    return Xb, yb
