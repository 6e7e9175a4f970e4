"""The one numerics helper module: safe Cholesky, PSD inverse square roots, SPD inverses.

Rules:

* small matrices (``n <= UPCAST_MAX``) coming in as float32/float16/bfloat16 are factorized in
  float64 and the result is returned in float64 -- callers cast back for the big products;
* jitter is dtype-aware: it starts at ``eps(dtype) * mean(diag)`` and grows tenfold per retry;
* every retry past the first emits a :class:`~torchbkb.errors.NumericsWarning`;
* if nothing works, a :class:`~torchbkb.errors.NumericsError` says what was tried.

All factorizations call ``torch.linalg`` functions through the module attribute at call time, so
tests can patch ``torch.linalg.cholesky_ex`` / ``torch.linalg.eigh`` to check complexity contracts.

Example:
    >>> import torch
    >>> from torchbkb.gp.linalg import safe_cholesky, psd_inv_sqrt
    >>> A = torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    >>> L = safe_cholesky(A)
    >>> L.dtype, torch.allclose(L @ L.T, A.double())
    (torch.float64, True)
    >>> W = psd_inv_sqrt(torch.ones(2, 2, dtype=torch.float64))  # rank one: one direction kept
    >>> tuple(W.shape)
    (1, 2)
"""

from __future__ import annotations

import math

import warnings

import torch

from torchbkb.errors import InputDataError, NumericsError, NumericsWarning
from torchbkb.utils.host_copy import to_dtype

__all__ = [
    "UPCAST_MAX",
    "compute_dtype",
    "safe_cholesky",
    "spd_inverse",
    "psd_inv_sqrt",
    "inv_sqrt_factor",
    "cholesky_whitening_ex",
    "whitening",
    "accepts_cholesky",
    "default_rtol",
    "keep_dtype_on_apply",
    "check_units",
]

#: Matrices up to this size are factorized in float64 whatever their input dtype.
UPCAST_MAX = 16384


def compute_dtype(dtype: torch.dtype, n: int) -> torch.dtype:
    """The dtype in which an ``n x n`` matrix of ``dtype`` is factorized."""
    if dtype == torch.float64 or n > UPCAST_MAX:
        return dtype
    return torch.float64


def default_rtol(m: int, dtype: torch.dtype) -> float:
    """Relative eigenvalue threshold of a pseudo-inverse, ``m * eps(dtype)`` like ``numpy.linalg.pinv``.

    ``dtype`` is the dtype the matrix was *computed* in (its entries carry that precision).
    """
    return max(m, 1) * torch.finfo(dtype).eps


def safe_cholesky(A: torch.Tensor, *, max_tries: int = 6, name: str = "matrix") -> torch.Tensor:
    """Lower Cholesky factor of the SPD matrix ``A``, escalating diagonal jitter if needed.

    Args:
        A: `(*batch, n, n)` symmetric positive (semi)definite matrix.
        max_tries: jitter escalations before giving up.
        name: the matrix's name in warnings and errors.

    Returns:
        `(*batch, n, n)` lower-triangular ``L`` with ``L Lᵀ = A + jitter·I``, in :func:`compute_dtype`.

    Raises:
        NumericsError: if ``A`` is not positive definite even with the largest jitter.
    """
    n = A.shape[-1]
    dtype = compute_dtype(A.dtype, n)
    A = A if A.dtype == dtype else A.to(dtype)
    L, info = torch.linalg.cholesky_ex(A)
    if not (int(info) if info.dim() == 0 else bool(info.any())):  # one matrix: read its flag, no reduction
        return L
    if not bool(torch.isfinite(A.detach()).all()):  # no jitter helps: say so (an optimizer backs off on it)
        err = NumericsError(f"{name}: expected a finite positive definite {n}x{n} matrix, got NaN/inf entries")
        err.nonfinite = True
        raise err
    diag_mean = A.detach().diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(torch.finfo(dtype).tiny)
    jitter = float(torch.finfo(dtype).eps * diag_mean) * 10.0
    eye = torch.eye(n, dtype=dtype, device=A.device)
    for _ in range(max_tries):
        L, info = torch.linalg.cholesky_ex(A + jitter * eye)
        if not bool((info != 0).any()):
            warnings.warn(
                f"{name} ({n}x{n}, {dtype}) was not numerically positive definite; added jitter {jitter:.2e}",
                NumericsWarning,
                stacklevel=2,
            )
            return L
        jitter *= 100.0
    raise NumericsError(
        f"{name}: expected a positive definite {n}x{n} matrix, got one whose Cholesky factorization "
        f"failed even with jitter {jitter / 100.0:.2e} (dtype {dtype}); check for NaN/inf or a negative noise"
    )


def spd_inverse(A: torch.Tensor, *, name: str = "matrix") -> torch.Tensor:
    """Inverse of the SPD matrix ``A`` through :func:`safe_cholesky`, symmetrized.

    Args:
        A: `(*batch, n, n)` symmetric positive definite.

    Returns:
        `(*batch, n, n)` ``A⁻¹`` in :func:`compute_dtype`, exactly symmetric (``cholesky_inverse``
        computes one triangle and mirrors it; ``test_spd_inverse_is_exactly_symmetric`` holds it to that).
    """
    return torch.cholesky_inverse(safe_cholesky(A, name=name))


def psd_inv_sqrt(K: torch.Tensor, rtol: float | None = None, *, name: str = "K_S") -> torch.Tensor:
    """Reduced pseudo-inverse square root ``W = diag(s)^(-1/2) Uᵀ`` of a PSD matrix ``K = U diag(s) Uᵀ``.

    Eigenvalues below ``rtol * max(s)`` are dropped, so duplicate or collinear points do not break it:
    ``Wᵀ W = K⁺`` and ``(W k)ᵀ (W k') = kᵀ K⁺ k'``.

    Args:
        K: `(m, m)` symmetric positive semidefinite (e.g. a kernel matrix of inducing points).
        rtol: relative eigenvalue threshold; default :func:`default_rtol` of ``K``'s input dtype.
        name: the matrix's name in errors.

    Returns:
        `(r, m)` matrix ``W`` in float64 (or ``K``'s dtype if it is large), ``r`` the numerical rank.

    Raises:
        NumericsError: if no eigenvalue is positive (e.g. a zero kernel), or the decomposition fails (``nonfinite``
            when ``K`` holds NaN/inf).
    """
    m = K.shape[-1]
    if rtol is None:
        rtol = default_rtol(m, K.dtype)
    dtype = compute_dtype(K.dtype, m)
    Kd = K.to(dtype)
    Kd = 0.5 * (Kd + Kd.transpose(-1, -2))
    try:
        s, U = torch.linalg.eigh(Kd)
    except torch.linalg.LinAlgError as exc:  # LAPACK may not converge on NaN/inf entries
        finite = bool(torch.isfinite(Kd).all())
        err = NumericsError(f"{name}: expected a PSD matrix, got " +
                            ("one whose eigendecomposition failed" if finite else "NaN/inf entries"))
        err.nonfinite = not finite
        raise err from exc
    smax = s.max()
    if not bool(smax > 0):
        err = NumericsError(f"{name}: expected a PSD matrix with a positive eigenvalue, got max eigenvalue "
                            f"{float(smax):.3e}")
        err.nonfinite = not math.isfinite(float(smax))
        raise err
    keep = s > rtol * smax
    s, U = s[keep], U[:, keep]  # (r,), (m, r)
    return U.T / s.sqrt().unsqueeze(-1)  # (r, m)


def inv_sqrt_factor(K: torch.Tensor, rtol: float | None = None, *, name: str = "K_S") -> torch.Tensor:
    """A whitening ``W`` with ``Wᵀ W = K⁺``: ``L⁻¹`` from a Cholesky factor when ``K`` is well conditioned,
    :func:`psd_inv_sqrt` (``eigh``, null space dropped) otherwise.

    Any ``W`` with ``Wᵀ W = K⁺`` gives the same Nyström inner products ``(W k)ᵀ (W k') = kᵀ K⁺ k'``, so the
    two branches define the same embedding up to a rotation of its features. The Cholesky branch
    (``m³/3`` flops, about 10× faster than ``eigh`` at ``m = 100``) is taken when the factorization
    succeeds and every pivot ``L_ii²`` -- the variance of point ``i`` given the points before it -- is
    above ``100 · rtol · max_i L_ii²`` (a backward-stable factorization whose smallest pivot is well above
    rounding); a duplicated or nearly collinear point fails the test and the eigendecomposition handles
    it exactly as before.

    Args:
        K: `(m, m)` symmetric positive semidefinite.
        rtol: relative eigenvalue threshold of the ``eigh`` branch (default :func:`default_rtol`); the
            Cholesky branch's relative pivot threshold is ``100 · rtol``.
        name: the matrix's name in errors.

    Returns:
        `(r, m)` ``W`` (``r = m``, lower triangular, on the Cholesky branch) in :func:`compute_dtype`.

    Example:
        >>> import torch
        >>> K = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
        >>> W = inv_sqrt_factor(K)
        >>> bool(torch.allclose(W.T @ W, torch.linalg.inv(K)))
        True
        >>> tuple(inv_sqrt_factor(torch.ones(2, 2, dtype=torch.float64)).shape)   # rank one: eigh branch
        (1, 2)
    """
    W, flags = cholesky_whitening_ex(K)
    return whitening(K, W, flags.tolist(), rtol, name=name)  # one read of the device


def cholesky_whitening_ex(K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`inv_sqrt_factor`'s Cholesky branch with no host read: ``(L⁻¹, flags)`` for `(m, m)` ``K``, ``flags``
    `(3,)` ``[info, min L_ii, max L_ii]`` for :func:`whitening` to read (with whatever else the caller reads)."""
    m = K.shape[-1]
    dtype = compute_dtype(K.dtype, m)
    L, info = torch.linalg.cholesky_ex(to_dtype(K, dtype))  # reads the lower triangle only
    lo, hi = torch.aminmax(L.diagonal())  # pivots L_ii² > 0: compared through L_ii
    eye = torch.eye(m, dtype=dtype, device=K.device)
    return torch.linalg.solve_triangular(L, eye, upper=False), torch.stack((info.to(dtype), lo, hi))  # (m, m), L⁻¹


def whitening(K: torch.Tensor, W: torch.Tensor, flags: list[float], rtol: float | None = None, *,
              name: str = "K_S") -> torch.Tensor:
    """:func:`inv_sqrt_factor` of ``K`` from :func:`cholesky_whitening_ex`'s ``W`` and its ``flags`` read on the
    host: ``W`` when the factorization succeeded with every pivot well above rounding, else :func:`psd_inv_sqrt`."""
    rtol = default_rtol(K.shape[-1], K.dtype) if rtol is None else rtol
    return W if accepts_cholesky(flags, rtol) else psd_inv_sqrt(K, rtol, name=name)


def accepts_cholesky(flags: list[float], rtol: float) -> bool:
    """Whether :func:`cholesky_whitening_ex`'s ``flags`` (on the host) take its ``L⁻¹``: no failure, and the smallest
    pivot ``L_ii²`` above ``100 · rtol`` times the largest."""
    failed, lo, hi = flags
    return failed == 0 and lo * lo > 100.0 * rtol * hi * hi


def keep_dtype_on_apply(module, names: tuple[str, ...], fn, recurse: bool, super_apply):
    """``nn.Module._apply`` that moves the buffers ``names`` across devices but keeps their dtype.

    ``module.to(torch.float32)`` (which BoTorch acquisitions call as ``model.to(X)``) must not round the
    float64 factorizations of small matrices (rule 5 above): those buffers follow devices only.

    Args:
        module: the module being converted.
        names: its buffer names holding compute-dtype factorizations.
        fn, recurse: the arguments of ``_apply``.
        super_apply: the parent class's bound ``_apply``.
    """
    saved = {n: module._buffers[n] for n in names if module._buffers.get(n) is not None}
    out = super_apply(fn, recurse)
    for n, old in saved.items():
        module._buffers[n] = old.to(device=module._buffers[n].device)
    return out


def check_units(kmax: float, lam: float, dtype: torch.dtype, name: str) -> None:
    """Refuse a kernel scale ``kmax = max k(x, x)`` or a noise ``λ`` outside ``[tiny^{1/3}, max^{1/3}]`` of ``dtype``.

    The DTC and GP algebra forms products of up to three such quantities (``M ~ 1/(λ · λ_min(K_S))``); inside
    this range they stay representable and the results are invariant to the units (rescale the kernel and the
    noise by ``c`` and the rewards by ``√c``: the same choices); outside it they under- or overflow.
    """
    info = torch.finfo(dtype)
    lo, hi = info.tiny ** (1 / 3), info.max ** (1 / 3)
    for what, v in (("the kernel's prior variance max k(x, x)", kmax), ("the noise", lam)):
        if not lo <= v <= hi:
            raise InputDataError(
                f"{name}: expected {what} in [{lo:.1e}, {hi:.1e}] for {dtype}, got {v:.3e}; rescale the rewards "
                f"(the kernel's output scale and the noise follow the rewards' units squared)"
            )
