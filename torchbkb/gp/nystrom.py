"""Nyström embedding ``z(x) = K_S^{+1/2} k_S(x)`` (BKB paper 000, Sec. 3.1).

``z(x) = W k_S(x)`` with any ``W`` such that ``Wᵀ W = K_S⁺``, so ``z(x)ᵀ z(x') = k_S(x)ᵀ K_S⁺ k_S(x')`` --
the Nyström kernel. When ``K_S`` is well conditioned ``W = L⁻¹`` from its Cholesky factor (``m³/3``
flops); otherwise ``K_S = U diag(s) Uᵀ`` (``eigh``), eigenvalues below ``rtol · max(s)`` are dropped and
``W = diag(s)^(-1/2) Uᵀ`` (:func:`~torchbkb.gp.linalg.inv_sqrt_factor`). The output dimension is the
numerical rank ``r <= m`` of ``K_S``: a duplicated or collinear inducing point adds nothing and changes no
inner product.

Example:
    >>> import torch
    >>> from torchbkb import NystromEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> S = torch.rand(8, 2, dtype=torch.float64)
    >>> emb = NystromEmbedding(GaussianKernel(0.5), S)
    >>> Z = emb(torch.rand(100, 2, dtype=torch.float64))
    >>> tuple(Z.shape)
    (100, 8)
    >>> ZS = emb(S)                                  # on the dictionary itself z reproduces k exactly
    >>> bool(torch.allclose(ZS @ ZS.T, emb.kernel(S, S)))
    True
    >>> emb.set_inducing_points(torch.cat([S, S[:1]]))   # a duplicate: same rank, same Gram
    >>> emb.num_inducing, emb.rank
    (9, 8)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torchbkb.errors import InputDataError, check_matrix, check_same_device_dtype
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.gp.linalg import compute_dtype, inv_sqrt_factor, keep_dtype_on_apply

__all__ = ["NystromEmbedding", "chunked_rows"]

DEFAULT_CHUNK = 16384


class NystromEmbedding(nn.Module):
    """Nyström feature map of a kernel restricted to a dictionary of inducing points.

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor`` (see :mod:`torchbkb.gp.kernels`).
        inducing_points: `(m, d)` dictionary ``S``, ``m >= 1``, finite.
        rtol: relative eigenvalue threshold of the pseudo-inverse; default ``m · eps(dtype of S)``.
        chunk_size: rows embedded at once; embedding ``n`` points never materializes more than
            ``chunk_size × m`` kernel values besides the `(n, r)` output.
        projection: a whitening `(r, m)` of ``K_S`` the caller holds already (``Wᵀ W = K_S⁺``, ``1 <= r <= m``, in
            the dtype ``K_S`` is factorized in: float64 for float32 points), kept as a copy: no factorization. Its
            shape, dtype, device and finiteness are checked, not that it whitens ``K_S``.

    Attributes:
        inducing_points: `(m, d)` buffer.
        projection: `(r, m)` buffer ``W`` with ``Wᵀ W = K_S⁺`` (float64 unless ``m`` is huge).
        version: incremented each time the dictionary changes (posteriors use it to detect staleness).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> emb = NystromEmbedding(GaussianKernel(1.0), torch.zeros(1, 3))
        >>> emb(torch.zeros(4, 5, 3)).shape       # leading batch dims are kept
        torch.Size([4, 5, 1])
    """

    def __init__(
        self,
        kernel: Callable,
        inducing_points: torch.Tensor,
        *,
        rtol: float | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        projection: torch.Tensor | None = None,
    ):
        super().__init__()
        if int(chunk_size) < 1:
            raise InputDataError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
        if rtol is not None and not (0.0 <= float(rtol) < 1.0):
            raise InputDataError(f"rtol: expected a number in [0, 1), got {rtol!r}")
        self.kernel: KernelAdapter = as_kernel(kernel)
        self.rtol = None if rtol is None else float(rtol)
        self.chunk_size = int(chunk_size)
        self.version = 0
        if projection is None:
            S, W = self._factorize(inducing_points)
        else:
            S = self._check_points(inducing_points)
            W = _check_projection(projection, S)
        self.register_buffer("inducing_points", S)
        self.register_buffer("projection", W)

    # ------------------------------------------------------------------ dictionary
    @property
    def num_inducing(self) -> int:
        """``m``, the number of inducing points (duplicates included)."""
        return int(self.inducing_points.shape[0])

    @property
    def rank(self) -> int:
        """``r``, the embedding dimension (numerical rank of ``K_S``)."""
        return int(self.projection.shape[0])

    @property
    def dim(self) -> int:
        """``d``, the input dimension."""
        return int(self.inducing_points.shape[-1])

    def set_inducing_points(self, inducing_points: torch.Tensor, *, validate: bool = True) -> None:
        """Replace the dictionary (one ``m × m`` factorization). On error nothing changes.

        Args:
            inducing_points: `(m', d)` new dictionary.
            validate: check shape, finiteness, dtype and device (``False``: rows the caller took from data it
                checked, e.g. a dictionary replay; skips the finiteness scan and its host read).
        """
        S, W = self._factorize(inducing_points, ref=self.inducing_points, validate=validate)
        self.inducing_points = S
        self.projection = W
        self.version += 1

    def _factorize(self, S: torch.Tensor, ref: torch.Tensor | None = None,
                   validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        S = self._check_points(S, ref) if validate else S.detach()
        with torch.no_grad():
            K = self.kernel(S, S)  # (m, m)
            W = inv_sqrt_factor(K, self.rtol, name="K_S")  # (r, m)
        return S, W

    @staticmethod
    def _check_points(S: torch.Tensor, ref: torch.Tensor | None = None) -> torch.Tensor:
        """``S`` detached, checked as a dictionary `(m, d)` (like ``ref``'s, when given)."""
        check_matrix(S, "inducing_points", min_rows=1, d=None if ref is None else ref.shape[-1])
        if S.dim() != 2:
            raise InputDataError(f"inducing_points: expected shape (m, d), got shape {tuple(S.shape)}")
        if ref is not None:
            check_same_device_dtype(ref, S, "inducing_points", "the current inducing points")
        return S.detach()

    def _apply(self, fn, recurse: bool = True):
        # .to(dtype) moves the float64 projection across devices but never rounds it
        return keep_dtype_on_apply(self, ("projection",), fn, recurse, super()._apply)

    # ------------------------------------------------------------------ embedding
    def forward(self, X: torch.Tensor, out: torch.Tensor | None = None, *, validate: bool = True) -> torch.Tensor:
        """Embed points.

        Args:
            X: `(*b, n, d)` with the dtype and device of the inducing points.
            out: optional preallocated `(*b, n, r)` output (same dtype and device, contiguous), written
                chunk by chunk with ``matmul(out=)``; not for autograd. Embedding 10⁶ points repeatedly
                into one buffer saves the page faults of a fresh `(n, r)` output.
            validate: check ``X`` (``False``: points the caller checked already; skips a host read).

        Returns:
            `(*b, n, r)` features ``z(X)`` (``out`` if given); differentiable w.r.t. ``X`` when ``out`` is not.
        """
        if validate:
            self.check_input(X)
        batch, d = X.shape[:-1], X.shape[-1]
        flat = X.reshape(-1, d)  # (B*n, d): rows are independent
        W_T = self.projection.to(X.dtype).T  # (m, r)
        S = self.inducing_points
        grad = torch.is_grad_enabled() and (X.requires_grad or S.requires_grad)
        if out is None and (grad or flat.shape[0] <= self.chunk_size):
            Z = chunked_rows(lambda Xc: self.kernel(Xc, S) @ W_T, flat, self.chunk_size)
            return Z.reshape(*batch, self.rank)  # (*b, n, r)
        if out is None:
            out = X.new_empty((*batch, self.rank))
        else:
            want = (*batch, self.rank)
            if (not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != X.dtype
                    or out.device != X.device or not out.is_contiguous()):
                got = (f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                       else type(out).__name__)
                raise InputDataError(f"out: expected a contiguous tensor of shape {want}, {X.dtype} on {X.device}, got "
                                     f"{got}")
            if grad:
                raise InputDataError("out: expected no autograd through the embedding when writing into out=, got "
                                     "inputs that require grad")
        out_flat = out.view(-1, self.rank)  # (B*n, r)
        c = self.chunk_size
        for i in range(0, flat.shape[0], c):  # kernel block (c, m), projected straight into the output rows
            torch.matmul(self.kernel(flat[i : i + c], S), W_T, out=out_flat[i : i + c])
        return out

    def kernel_diag(self, X: torch.Tensor) -> torch.Tensor:
        """``k(x, x)`` for `(*b, n, d)` inputs, returned as `(*b, n)`."""
        return self.kernel.diag(X)

    def check_input(self, X: torch.Tensor, name: str = "X", *, finite: bool = True) -> None:
        """Raise :class:`~torchbkb.errors.InputDataError` unless ``X`` is a finite `(*b, n, d)` tensor
        with this embedding's ``d``, dtype and device (``finite=False``: all but the values, which the caller
        checks)."""
        check_matrix(X, name, d=self.dim, finite=finite)
        check_same_device_dtype(self.inducing_points, X, name, "the inducing points")


def _check_projection(W: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """``W`` `(r, m)` for the dictionary ``S`` `(m, d)`, checked as the ``projection`` argument promises."""
    m = S.shape[0]
    want = compute_dtype(S.dtype, m)
    if not isinstance(W, torch.Tensor) or W.dim() != 2 or not 1 <= W.shape[0] <= m or W.shape[1] != m:
        got = tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__
        raise InputDataError(f"projection: expected shape (r, {m}) with 1 <= r <= {m}, got {got}")
    if W.dtype != want or W.device != S.device:
        raise InputDataError(f"projection: expected {want} on {S.device}, got {W.dtype} on {W.device}")
    if not bool(torch.isfinite(W).all()):
        raise InputDataError("projection: expected finite values, got NaN or inf")
    return W.detach().clone()


def chunked_rows(fn: Callable[[torch.Tensor], torch.Tensor], X: torch.Tensor, chunk: int) -> torch.Tensor:
    """Apply a row-wise ``fn`` to `(n, d)` ``X`` in chunks of ``chunk`` rows.

    Args:
        fn: maps `(c, d)` to `(c, *w)`.
        X: `(n, d)`.
        chunk: rows per call.

    Returns:
        `(n, *w)` concatenation; a preallocated buffer when no gradient is needed.
    """
    n = X.shape[0]
    if n <= chunk:
        return fn(X)
    if torch.is_grad_enabled() and X.requires_grad:
        return torch.cat([fn(X[i : i + chunk]) for i in range(0, n, chunk)], dim=0)
    first = fn(X[:chunk])
    out = first.new_empty((n, *first.shape[1:]))
    out[:chunk] = first
    for i in range(chunk, n, chunk):
        out[i : i + chunk] = fn(X[i : i + chunk])
    return out
