import warnings

import pytest
import torch

from torchbkb.errors import NumericsError, NumericsWarning
from torchbkb.gp.linalg import compute_dtype, psd_inv_sqrt, safe_cholesky, spd_inverse


def test_cholesky_upcasts_small_float32():
    A = torch.tensor([[4.0, 2.0], [2.0, 3.0]])
    L = safe_cholesky(A)
    assert L.dtype == torch.float64
    assert torch.allclose(L @ L.T, A.double())
    assert compute_dtype(torch.float32, 10**6) == torch.float32


def test_cholesky_jitter_escalates_with_warning():
    v = torch.rand(5, 1, dtype=torch.float64)
    A = v @ v.T  # rank one: not positive definite
    with pytest.warns(NumericsWarning, match="added jitter"):
        L = safe_cholesky(A, name="rank-one")
    assert torch.allclose(L @ L.T, A, atol=1e-10)


def test_cholesky_typed_error_on_indefinite():
    with pytest.raises(NumericsError, match="expected a positive definite 2x2 matrix"):
        safe_cholesky(torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64))


def test_spd_inverse_is_symmetric_inverse():
    B = torch.rand(6, 6, dtype=torch.float64)
    A = B @ B.T + 0.1 * torch.eye(6, dtype=torch.float64)
    Ainv = spd_inverse(A)
    assert torch.allclose(Ainv, Ainv.T) and torch.allclose(Ainv @ A, torch.eye(6, dtype=torch.float64), atol=1e-9)


@pytest.mark.parametrize("shape", [(6,), (96,), (3, 40)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_spd_inverse_is_exactly_symmetric(shape, dtype):
    """spd_inverse does not symmetrize: it relies on cholesky_inverse mirroring the triangle it computes."""
    n = shape[-1]
    B = torch.randn(*shape[:-1], n, n + 5, dtype=dtype, generator=torch.Generator().manual_seed(n))
    Ainv = spd_inverse(B @ B.transpose(-1, -2) + 0.1 * torch.eye(n, dtype=dtype))
    assert torch.equal(Ainv, Ainv.transpose(-1, -2))


def test_psd_inv_sqrt_drops_null_space():
    v = torch.rand(4, 2, dtype=torch.float64)
    K = v @ v.T  # rank 2
    W = psd_inv_sqrt(K)
    assert W.shape == (2, 4)
    assert torch.allclose(W.T @ W, torch.linalg.pinv(K, hermitian=True), atol=1e-8)
    with pytest.raises(NumericsError, match="positive eigenvalue"):
        psd_inv_sqrt(torch.zeros(3, 3, dtype=torch.float64))


def test_no_warning_when_well_conditioned():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        safe_cholesky(torch.eye(3))


def test_inv_sqrt_factor_takes_cholesky_when_well_conditioned_and_eigh_otherwise(monkeypatch):
    from torchbkb.gp.linalg import inv_sqrt_factor

    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    K = torch.exp(-torch.cdist(X, X) ** 2 / (2 * 0.3**2))
    calls = []
    real = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda A: calls.append(A.shape) or real(A))
    W = inv_sqrt_factor(K)
    assert W.shape == (12, 12) and torch.equal(W, W.tril()) and not calls  # L⁻¹, no eigendecomposition
    assert torch.allclose(W.T @ W, torch.linalg.inv(K), rtol=1e-6, atol=1e-6 * float(torch.linalg.inv(K).abs().max()))
    Kd = torch.exp(-torch.cdist(torch.cat([X, X[:3]]), torch.cat([X, X[:3]])) ** 2 / (2 * 0.3**2))  # 3 duplicates
    W = inv_sqrt_factor(Kd)
    assert W.shape == (12, 15) and calls == [(15, 15)]  # the pivot test sends it to eigh: rank 12
    assert torch.allclose(W.T @ W, torch.linalg.pinv(Kd, hermitian=True),
                          atol=1e-6 * float(torch.linalg.inv(K).abs().max()))
