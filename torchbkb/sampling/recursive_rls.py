"""Recursive ridge-leverage-score Nyström sampling (Musco & Musco 2017, Algorithm 2) and ``λ_max``.

003 (Vakili et al.) Lemma 3.8: a dictionary ``Z`` drawn by *RecursiveRLS-Nyström* has, with probability
``1 - δ``, ``m <= 384 d̃ log(3 d̃/δ)`` points (``d̃ = tr K(K + τ²I)⁻¹``) and

    λ_max = top eigenvalue of  K_X - K_XZ K_Z⁺ K_ZX  <=  τ²,

which is exactly what the sparse confidence width of 003 Theorem 3.5 needs
(``(2 + √λ_max/τ) C_k = 3 C_k``).

* :func:`recursive_rls` -- the sampler, ``O(n·m²)`` time and ``O(n·m)`` kernel evaluations, seeded.
* :func:`nystrom_lambda_max` -- ``λ_max`` of the Nyström residual, by Lanczos on the implicit operator
  ``v ↦ K_X v - Z (Zᵀ v)`` (``Z`` the Nyström features) applied in chunks of rows, so no ``n × n``
  matrix is ever formed; a dense path (``n × n`` ``eigvalsh``) for small ``n`` is the reference.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> from torchbkb.sampling.recursive_rls import recursive_rls, nystrom_lambda_max
    >>> X = torch.rand(400, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> k = GaussianKernel(0.2)
    >>> res = recursive_rls(X, k, noise=0.01, seed=1)
    >>> 10 < res.indices.numel() < 100                   # far fewer than n = 400 points
    True
    >>> lam_max = nystrom_lambda_max(X, k, X[res.indices])
    >>> lam_max <= 0.01                                 # Lemma 3.8: λ_max <= τ²
    True
"""

from __future__ import annotations

import math
from typing import NamedTuple
from collections.abc import Callable

import torch

from torchbkb.errors import (
    InputDataError, check_generator, check_int, check_matrix, check_positive, check_same_device_dtype
)
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.gp.linalg import compute_dtype, safe_cholesky

__all__ = ["recursive_rls", "RecursiveRLSResult", "nystrom_lambda_max", "ridge_scores", "check_oversample",
           "DEFAULT_OVERSAMPLE", "DEFAULT_BASE_SIZE"]

#: Practical oversampling ``q`` of :func:`recursive_rls`: ``p_i = min(1, q · l̃_i)``.
DEFAULT_OVERSAMPLE = 2.0
#: Practical size below which the recursion stops and keeps every point.
DEFAULT_BASE_SIZE = 32
#: Algorithm 2's leverage inflation: ``l̃_i = (3 / 2) · (coarse estimate)``, for both constant sets.
LEVERAGE_SCALE = 1.5


class RecursiveRLSResult(NamedTuple):
    """Output of :func:`recursive_rls`.

    Attributes:
        indices: `(m,)` long, sorted row indices of ``X`` in the dictionary (``m >= 1`` when ``n >= 1``).
        weights: `(m,)` float64, the weights ``1/√p_i`` of Algorithm 2's weighted sampling matrix
            (the Nyström kernel ``K_XZ K_Z⁺ K_ZX`` does not depend on them).
        probabilities: `(m,)` float64, the top-level inclusion probabilities ``p_i`` of the kept points.
        leverage: `(n,)` float64, the top-level leverage estimates ``l̃_i`` (``Σ l̃_i ≈ (3/2)·d̃``); when
            the base case kept every point (``levels == 0``) they are the prior bounds ``(3/2)·k(x_i, x_i)/τ²``.
        levels: depth of the recursion (0: every point was kept by the base case).
    """

    indices: torch.Tensor
    weights: torch.Tensor
    probabilities: torch.Tensor
    leverage: torch.Tensor
    levels: int


def recursive_rls(
    X: torch.Tensor,
    kernel: Callable,
    noise: float,
    *,
    oversample: float | str = DEFAULT_OVERSAMPLE,
    base_size: int | None = None,
    delta: float = 0.01,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    chunk_size: int = 4096,
) -> RecursiveRLSResult:
    """Draw a Nyström dictionary by recursive ridge-leverage-score sampling (Musco & Musco, Algorithm 2).

    The recursion, unrolled bottom-up:

    1. nested uniform halvings ``X = X_0 ⊇ X_1 ⊇ ... ⊇ X_L``: every point survives each level with
       probability 1/2 independently (Algorithm 2, line 2); ``L`` is the first level with
       ``|X_L| <= base`` and the base case keeps all of ``X_L`` with weight 1 (line 1);
    2. for ``l = L-1, ..., 0``: with the weighted dictionary ``(Ŝ, w)`` drawn at level ``l+1``,
       estimate the ridge leverage scores of every point of ``X_l`` (lines 4-5)::

           l̃_i = (3/2) · (k(x_i, x_i) - k_Ŝ(x_i)ᵀ (K_ŜŜ + τ² W⁻²)⁻¹ k_Ŝ(x_i)) / τ²,   W = diag(w)

       (``(K_ŜŜ + τ²W⁻²)⁻¹`` is Algorithm 2's ``Ŝ(ŜᵀKŜ + τ²I)⁻¹Ŝᵀ`` for the weighted sampling
       matrix ``Ŝ = S W``; one ``m × m`` Cholesky, ``O(|X_l|·m²)``), then keep ``x_i`` with probability
       ``p_i = min(1, q · l̃_i)`` and weight ``1/√p_i`` (lines 6-7).

    Constants -- exactly one of two sets:

    * ``oversample="theory"``: Algorithm 2 verbatim, run with ``δ' = delta / 3`` so that the guarantee
      is Lemma 3.8's (Musco & Musco Theorem 7 holds with probability ``1 - 3δ'``): base case
      ``|X_l| <= 192 log(1/δ_l)``, ``q = 16 log(Σ_i l̃_i / δ_l)``, with ``δ_l = δ'/3^l`` at recursion
      depth ``l`` (each recursive call gets ``δ/3``). These constants are worst-case: for
      ``delta = 0.01`` the base case alone keeps every point of sets up to ~1,100 points (192 log 300).
    * ``oversample=q`` (a float, default :data:`DEFAULT_OVERSAMPLE` = 2): the same recursion with the
      constant ``q`` in place of ``16 log(Σ l̃/δ_l)`` and ``base_size`` (default
      :data:`DEFAULT_BASE_SIZE` = 32) in place of ``192 log(1/δ_l)``. The ``3/2`` inflation is kept.
      This is the practical regime (Musco & Musco's own code also replaces the constants by small
      ones); ``λ_max <= τ²`` is then not guaranteed but checked empirically (``tests/test_recursive_rls.py``:
      ``λ_max <= τ²`` in at least 90% of seeded runs on GP-like problems) and can always be measured
      with :func:`nystrom_lambda_max` -- which is what :class:`~torchbkb.bandits.SBPE` does. Measured:
      ``m ≈ 3-6 × d̃`` (the coarse-level estimates overestimate ``l_i`` by up to ~2x, times 3/2, times
      ``q``), and ``q = 1`` already misses ``λ_max <= τ²`` in about half the runs for Matérn-5/2.

    Deviation: if the top level keeps no point at all (possible only when every ``p_i < 1``), the
    point with the largest ``l̃_i`` is kept (``p = 1``), so the dictionary is never empty; adding
    points only shrinks ``K_X - K_XZ K_Z⁺ K_ZX``, so this cannot hurt ``λ_max``.

    Args:
        X: `(n, d)` points (duplicates allowed), ``n >= 1``.
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        noise: ``τ² > 0``, the ridge (the GP noise variance; ``λ_max <= τ²`` is the target).
        oversample: ``"theory"`` or a float ``q > 0`` (see above).
        base_size: the practical base-case size (ignored with ``"theory"``), an integer ``>= 1``.
        delta: failure probability ``δ ∈ (0, 1/32)`` of Lemma 3.8 (used by ``"theory"`` only).
        generator: a ``torch.Generator`` (its state advances); or give ``seed``. Do not share a seed
            with the generator that drew ``X``: the halvings would then be a function of ``X`` (not uniform).
        seed: seed of a fresh generator when ``generator`` is ``None`` (``None``: nondeterministic).
        chunk_size: rows scored at once (peak memory ``O(chunk_size · m)``).

    Returns:
        A :class:`RecursiveRLSResult`.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.rand(300, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        >>> a = recursive_rls(X, GaussianKernel(0.2), 0.01, seed=3)
        >>> b = recursive_rls(X, GaussianKernel(0.2), 0.01, seed=3)
        >>> bool(torch.equal(a.indices, b.indices)), a.indices.numel() < 100
        (True, True)
        >>> recursive_rls(X[:50], GaussianKernel(0.1), 0.01, oversample="theory").levels  # 50 <= 192 log(300)
        0
    """
    k = as_kernel(kernel)
    check_matrix(X, "X", min_rows=1)
    if X.dim() != 2:
        raise InputDataError(f"X: expected shape (n, d), got shape {tuple(X.shape)}")
    lam = check_positive(noise, "noise")
    theory = check_oversample(oversample)
    if not (isinstance(delta, (int, float)) and 0.0 < float(delta) < 1.0 / 32.0):
        raise InputDataError(f"delta: expected 0 < delta < 1/32 (Lemma 3.8), got {delta!r}")
    if base_size is None:
        base_size = DEFAULT_BASE_SIZE
    check_int(base_size, "base_size")
    check_int(chunk_size, "chunk_size")
    generator = check_generator(generator, seed)

    n = X.shape[0]
    X = X.detach()
    delta0 = float(delta) / 3.0  # Algorithm 2 run at δ/3 gives Lemma 3.8's 1 - δ

    def base(level: int) -> float:
        return 192.0 * math.log(1.0 / (delta0 / 3.0**level)) if theory else float(base_size)

    # 1. nested halvings: depth_i = number of successive heads of point i (P(depth >= l) = 2^-l)
    u = torch.rand(n, generator=generator, dtype=torch.float64)  # (n,) in [0, 1)
    depth = torch.floor(-torch.log2(1.0 - u)).to(torch.long).to(X.device)  # (n,) 1-u in (0, 1]
    L = 0
    while int((depth >= L).sum()) > base(L):
        L += 1
    device = X.device
    sel = (depth >= L).nonzero().squeeze(1)  # base case: keep all of X_L, weight 1
    w = torch.ones(sel.numel(), dtype=torch.float64, device=device)
    p_sel = torch.ones_like(w)
    lev = None
    with torch.no_grad():
        for level in range(L - 1, -1, -1):
            pts = (depth >= level).nonzero().squeeze(1)  # (n_l,) indices of X_l
            lev = LEVERAGE_SCALE * ridge_scores(k, X[pts], X[sel], w, lam, chunk_size)  # (n_l,)
            if theory:
                dl = delta0 / 3.0**level
                q = 16.0 * math.log(max(float(lev.sum()), 1.0) / dl)
            else:
                q = float(oversample)
            p = (q * lev).clamp(0.0, 1.0)  # (n_l,)
            draw = torch.rand(pts.numel(), generator=generator, dtype=torch.float64).to(device)
            keep = draw < p
            if level == 0 and not bool(keep.any()):
                keep[int(torch.argmax(lev))] = True  # never return an empty dictionary (see docstring)
                p[int(torch.argmax(lev))] = 1.0
            sel, p_sel = pts[keep], p[keep]
            w = p_sel.rsqrt()
    if lev is None:  # no recursion: every point kept; report the prior scores (3/2)·k(x,x)/τ² as l̃
        lev = LEVERAGE_SCALE * k.diag(X).detach().to(torch.float64) / lam
    order = torch.argsort(sel)
    return RecursiveRLSResult(sel[order], w[order], p_sel[order], lev, L)


def nystrom_lambda_max(
    X: torch.Tensor,
    kernel: Callable,
    inducing_points: torch.Tensor | None,
    *,
    method: str = "auto",
    tol: float = 1e-6,
    atol: float | None = None,
    max_iter: int = 200,
    dense_max: int = 128,
    chunk_size: int = 2048,
    seed: int = 0,
) -> float:
    """``λ_max``: the top eigenvalue of the Nyström residual ``K_X - K_XZ K_Z⁺ K_ZX`` (003 Sec. 3.2).

    With the Nyström features ``z(x) = K_Z^{+1/2} k_Z(x)`` (:class:`~torchbkb.NystromEmbedding`,
    ``Z_X`` of shape `(n, r)`), the residual is the implicit PSD operator
    ``v ↦ K_X v - Z_X (Z_Xᵀ v)``. ``K_X v`` is accumulated over blocks of ``chunk_size`` rows
    (``chunk_size × n`` kernel values at a time), so nothing ``n × n`` is ever formed; the operator is
    applied ``O(#iterations)`` times, each costing ``O(n²·d + n·r)``.

    Lanczos with full reorthogonalization (float64 vectors) from a seeded random start; it stops
    when the residual of the top Ritz pair ``|β_j s_j|`` is below ``tol·θ + atol``, at an invariant
    subspace, or after
    ``min(max_iter, n)`` steps. The top Ritz value ``θ`` is a lower bound on ``λ_max`` converging
    to it; the tridiagonal problems solved are at most ``max_iter × max_iter``.

    Args:
        X: `(n, d)` points, ``n >= 1``.
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        inducing_points: `(m, d)` dictionary (same dtype/device as ``X``), or ``None`` / `(0, d)` for
            an empty one (then ``λ_max`` is the top eigenvalue of ``K_X``).
        method: ``"lanczos"``, ``"dense"`` (``eigvalsh`` of the formed ``n × n`` residual: the reference
            for tests, ``O(n³)``), or ``"auto"`` (dense when ``n <= dense_max``).
        tol: relative tolerance of the Lanczos stopping rule.
        atol: absolute tolerance; default ``1e-8 · max_x k(x, x)`` (a residual whose top eigenvalue is at
            the rounding level would otherwise never converge in the relative sense).
        max_iter: Lanczos steps at most.
        dense_max: the ``"auto"`` switch point.
        chunk_size: rows per kernel block.
        seed: seed of the Lanczos start vector.

    Returns:
        ``λ_max >= 0`` as a Python float (clamped at 0 against rounding).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.rand(50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> k = GaussianKernel(0.3)
        >>> nystrom_lambda_max(X, k, X) < 1e-10                      # Z = X: no residual
        True
        >>> top = float(torch.linalg.eigvalsh(k(X, X))[-1])
        >>> abs(nystrom_lambda_max(X, k, None, method="lanczos") - top) < 1e-8 * top   # Z = ∅: K_X
        True
    """
    kern = as_kernel(kernel)
    check_matrix(X, "X", min_rows=1)
    if X.dim() != 2:
        raise InputDataError(f"X: expected shape (n, d), got shape {tuple(X.shape)}")
    if inducing_points is not None:
        check_matrix(inducing_points, "inducing_points", d=X.shape[-1])
        if inducing_points.dim() != 2:
            raise InputDataError(f"inducing_points: expected shape (m, d), got shape {tuple(inducing_points.shape)}")
        check_same_device_dtype(X, inducing_points, "inducing_points", "X")
        if inducing_points.shape[0] == 0:
            inducing_points = None
    if method not in ("auto", "dense", "lanczos"):
        raise InputDataError(f"method: expected 'auto', 'dense' or 'lanczos', got {method!r}")
    if not (isinstance(tol, (int, float)) and 0.0 < float(tol) < 1.0):
        raise InputDataError(f"tol: expected a number in (0, 1), got {tol!r}")
    if atol is not None and not (isinstance(atol, (int, float)) and 0.0 <= float(atol) < math.inf):
        raise InputDataError(f"atol: expected a finite number >= 0, got {atol!r}")
    for name, v in (("max_iter", max_iter), ("dense_max", dense_max), ("chunk_size", chunk_size)):
        check_int(v, name)
    n = X.shape[0]
    X = X.detach()
    with torch.no_grad():
        if inducing_points is None:
            Z = X.new_zeros((n, 0), dtype=torch.float64)
        else:
            Z = NystromEmbedding(kern, inducing_points.detach(), chunk_size=chunk_size)(X).to(torch.float64)  # (n, r)
        if method == "dense" or (method == "auto" and n <= dense_max):
            R = kern(X, X).to(torch.float64) - Z @ Z.T  # (n, n): reference path only
            top = float(torch.linalg.eigvalsh(0.5 * (R + R.T))[-1])
            return max(top, 0.0)
        if atol is None:
            atol = 1e-8 * float(kern.diag(X).abs().max())

        def matvec(v: torch.Tensor) -> torch.Tensor:  # (n,) -> (n,)
            out = torch.empty_like(v)
            for i in range(0, n, chunk_size):
                out[i : i + chunk_size] = kern(X[i : i + chunk_size], X).to(torch.float64) @ v  # (c, n)(n,)
            return out - Z @ (Z.T @ v)

        g = torch.Generator().manual_seed(int(seed))
        v0 = torch.randn(n, generator=g, dtype=torch.float64).to(X.device)
        top = _lanczos_top(matvec, v0, float(tol), float(atol), min(int(max_iter), n))
    return max(top, 0.0)


# ---------------------------------------------------------------------------------------- helpers
def check_oversample(oversample) -> bool:
    """``True`` for the theory constants, ``False`` for a valid float, else an error."""
    if isinstance(oversample, str):
        if oversample != "theory":
            raise InputDataError(f"oversample: expected 'theory' or a float > 0, got {oversample!r}")
        return True
    if isinstance(oversample, bool):
        raise InputDataError(f"oversample: expected 'theory' or a float > 0, got {oversample!r}")
    check_positive(oversample, "oversample")
    return False


def ridge_scores(k: KernelAdapter, Xc: torch.Tensor, S: torch.Tensor, w: torch.Tensor, lam: float,
                 chunk: int) -> torch.Tensor:
    """``(k(x,x) - k_S(x)ᵀ (K_SS + λ W⁻²)⁻¹ k_S(x)) / λ`` for the rows of `(n, d)` ``Xc``; `(n,)` float64."""
    kd = k.diag(Xc).to(torch.float64)  # (n,)
    if S.shape[0] == 0:
        return kd.clamp_min(0.0) / lam
    m = S.shape[0]
    dtype = compute_dtype(S.dtype, m)
    M = k(S, S).to(dtype) + torch.diag(lam / (w.to(dtype) ** 2))  # (m, m) = K_SS + λ W⁻²
    L = safe_cholesky(0.5 * (M + M.T), name="K_SS + noise·W⁻²")
    quad = torch.empty(Xc.shape[0], dtype=dtype, device=Xc.device)
    for i in range(0, Xc.shape[0], chunk):
        KSc = k(S, Xc[i : i + chunk]).to(dtype)  # (m, c)
        Q = torch.linalg.solve_triangular(L, KSc, upper=False)  # (m, c) = L⁻¹ K_Sc
        quad[i : i + chunk] = (Q * Q).sum(0)
    return (kd - quad.to(torch.float64)).clamp_min(0.0) / lam


def _lanczos_top(matvec: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor, tol: float, atol: float,
                 k: int) -> float:
    """Top eigenvalue of a symmetric operator by Lanczos with full reorthogonalization."""
    n = v0.shape[0]
    Q = v0.new_zeros((n, k))  # (n, k) Lanczos basis
    alphas: list[float] = []
    betas: list[float] = []
    q = v0 / v0.norm()
    q_prev = torch.zeros_like(q)
    b_prev = 0.0
    theta = 0.0
    for j in range(k):
        Q[:, j] = q
        w = matvec(q)
        a = float(q @ w)
        w = w - a * q - b_prev * q_prev
        for _ in range(2):  # full reorthogonalization, twice is enough
            w = w - Q[:, : j + 1] @ (Q[:, : j + 1].T @ w)
        b = float(w.norm())
        alphas.append(a)
        T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            T = T + torch.diag(off, 1) + torch.diag(off, -1)  # (j+1, j+1) tridiagonal
        evals, evecs = torch.linalg.eigh(T)
        theta = float(evals[-1])
        resid = b * abs(float(evecs[-1, -1]))
        if resid <= tol * abs(theta) + atol or b <= atol:
            break
        betas.append(b)
        q_prev, q, b_prev = q, w / b, b
    return theta
