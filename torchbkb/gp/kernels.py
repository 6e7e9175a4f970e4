"""Kernel adapter: any ``gpytorch.kernels.Kernel`` or a plain callable ``k(X1, X2) -> Tensor``.

torchbkb only ever needs two things from a kernel: dense cross-covariances ``k(X1, X2)`` of shape
`(*batch, n1, n2)` and the diagonal ``k(x, x)`` of shape `(*batch, n)` -- the latter without forming
an ``n x n`` matrix. :func:`as_kernel` wraps whatever the user has into a :class:`KernelAdapter` that
offers exactly these two calls (and is an ``nn.Module``, so ``.to()`` moves a wrapped GPyTorch kernel).

:class:`GaussianKernel` is a small, fast built-in ``s · exp(-‖x - x'‖² / (2ℓ²))`` (the papers' Gaussian
kernel of "width σ²" is ``lengthscale = sqrt(σ²)``).

Example:
    >>> import torch, gpytorch
    >>> from torchbkb.gp.kernels import as_kernel, GaussianKernel
    >>> X = torch.rand(5, 2, dtype=torch.float64)
    >>> k = as_kernel(gpytorch.kernels.RBFKernel())
    >>> k(X, X[:3]).shape, k.diag(X).shape
    (torch.Size([5, 3]), torch.Size([5]))
    >>> g = as_kernel(GaussianKernel(lengthscale=1.0))
    >>> bool(torch.allclose(g.diag(X), torch.ones(5, dtype=torch.float64)))
    True
    >>> f = as_kernel(lambda A, B: (A @ B.transpose(-1, -2) + 1.0) ** 2)   # any callable works
    >>> bool(torch.allclose(f.diag(X), torch.diagonal(f(X, X))))
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from torchbkb.errors import InputDataError, check_positive

__all__ = ["KernelAdapter", "GaussianKernel", "as_kernel", "centred_right", "gaussian_cross", "matern_cross"]


class GaussianKernel(nn.Module):
    """Gaussian (RBF) kernel ``outputscale · exp(-‖x - x'‖² / (2 · lengthscale²))``.

    Args:
        lengthscale: ``ℓ > 0``; the papers' "width σ²" is ``ℓ = sqrt(σ²)`` (see :meth:`from_width`).
        outputscale: ``s > 0``, the prior variance ``k(x, x)``.

    Both are buffers, so ``.to()`` and ``state_dict()`` carry them.

    Example:
        >>> import torch
        >>> k = GaussianKernel.from_width(5.0)        # BBKB paper: σ² = 5
        >>> float(k(torch.zeros(1, 2), torch.ones(1, 2)))  # exp(-2 / 10)
        0.818...
    """

    def __init__(self, lengthscale: float = 1.0, outputscale: float = 1.0):
        super().__init__()
        self.register_buffer(
            "lengthscale", torch.tensor(check_positive(lengthscale, "lengthscale"), dtype=torch.float64)
        )
        self.register_buffer(
            "outputscale", torch.tensor(check_positive(outputscale, "outputscale"), dtype=torch.float64)
        )

    @classmethod
    def from_width(cls, sigma2: float, outputscale: float = 1.0) -> GaussianKernel:
        """The kernel ``exp(-‖x - x'‖² / (2σ²))`` of the BKB/BBKB papers."""
        return cls(lengthscale=math.sqrt(check_positive(sigma2, "sigma2")), outputscale=outputscale)

    def forward(self, X1: torch.Tensor, X2: torch.Tensor | None = None) -> torch.Tensor:
        """Args: X1 `(*b, n1, d)`, X2 `(*b, n2, d)` (``None``: ``X1``, as a GPyTorch kernel reads ``k(X)``).
        Returns: `(*b, n1, n2)`.

        Both inputs are centred before they are scaled: ``x - c`` is exact for inputs near ``c``, while ``x / ℓ``
        would round away the differences of inputs far from the origin (float32 arms offset by 10⁶)."""
        X2 = X1 if X2 is None else X2
        return gaussian_cross(X1, X2, self.outputscale.to(X1.dtype), self.lengthscale.to(X1.dtype))

    def against(self, X2: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``X1 -> self(X1, X2)`` for a fixed ``X2``, the same values, with ``X2`` centred and scaled once
        (:func:`centred_right`; the hyperparameters are read now: for a kernel that stays as it is while used). A
        subclass with its own ``forward`` is called as is."""
        if type(self).forward is not GaussianKernel.forward:
            return lambda X1: self(X1, X2)
        return _fixed_right(self, X2, self.outputscale.to(X2.dtype), self.lengthscale.to(X2.dtype), None)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """Args: X `(*b, n, d)`. Returns: `(*b, n)` constant ``outputscale``."""
        return self.outputscale.to(device=X.device, dtype=X.dtype).expand(X.shape[:-1]).clone()


def gaussian_cross(
    A: torch.Tensor, B: torch.Tensor, outputscale: torch.Tensor | None = None, lengthscale: torch.Tensor | None = None,
    right: tuple | None = None,
) -> torch.Tensor:
    """``s · exp(-‖(a - b)/ℓ‖² / 2)`` for all pairs of rows, via one matrix product.
Both inputs are centred on the mean of ``B`` first (``B`` is the small side in torchbkb: inducing points), *then*
    scaled: ``a - c`` is exact for inputs near ``c``, so the expansion ``‖a‖² + ‖b‖² - 2 aᵀb`` does not
    cancel catastrophically for inputs far from the origin (float32 inputs offset by 10⁶ keep their differences, which
    ``a / ℓ`` first would round away). Without autograd the `(n1, n2)` block is made by one
    fused ``addmm`` and in-place passes, with ``s`` folded into the exponent.

    Args:
        A: `(*b, n1, d)`; B: `(*b, n2, d)`.
        outputscale: optional scalar tensor ``s > 0`` (default 1).
        lengthscale: optional `()` or `(d,)` tensor ``ℓ > 0`` (default 1: already-scaled inputs).
        right: ``B``'s side as :func:`centred_right` gave it for this ``B`` and ``lengthscale`` (the same values),
            optionally with a fourth entry, ``(log s, ‖b'‖² - 2 log s)`` formed once for many calls.

    Returns:
        `(*b, n1, n2)`.
    """
    A, B, an, bn, grad = _centred_scaled(A, B, outputscale, lengthscale, right)
    if grad:
        K = torch.exp(-0.5 * (an + bn - 2.0 * (A @ B.transpose(-1, -2))).clamp_min(0.0))
        return K if outputscale is None else outputscale * K
    # no autograd: one fused GEMM, then in place: -½(‖a‖² - 2aᵀb + ‖b‖²) + log s, capped at log s, exp
    log_s, shift = right[3] if right is not None and len(right) == 4 else _log_scale_shift(outputscale, bn, A)
    if A.dim() == 2:
        K = torch.addmm(an, A, B.T, beta=1.0, alpha=-2.0)
    else:
        K = (A @ B.transpose(-1, -2)).mul_(-2.0).add_(an)
    return K.add_(shift).mul_(-0.5).clamp_(max=log_s).exp_()


def matern_cross(
    A: torch.Tensor,
    B: torch.Tensor,
    nu: float,
    outputscale: torch.Tensor | None = None,
    lengthscale: torch.Tensor | None = None,
    right: tuple | None = None,
) -> torch.Tensor:
    """The Matérn kernel of smoothness ``nu`` (½, 3/2 or 5/2) for all pairs of rows, with the same centring as
    :func:`gaussian_cross` and one matrix product for the distances (GPyTorch's ``MaternKernel`` computes the same
    values through its lazy path, several times slower on `(4000, 4000)` blocks).

    Args:
        A: `(*b, n1, d)`; B: `(*b, n2, d)`; nu: ``0.5``, ``1.5`` or ``2.5``.
        outputscale: optional scalar ``s``; lengthscale: optional `()` or `(d,)` ``ℓ``.
        right: ``B``'s side as :func:`centred_right` gave it (the same values).

    Returns:
        `(*b, n1, n2)`.

    Example:
        >>> import torch, gpytorch
        >>> X = torch.rand(5, 3, dtype=torch.float64)
        >>> ref = gpytorch.kernels.MaternKernel(nu=2.5).double()(X, X).to_dense()
        >>> ls = torch.tensor(0.6931, dtype=torch.float64)  # gpytorch's default lengthscale
        >>> bool(torch.allclose(matern_cross(X, X, 2.5, lengthscale=ls), ref, atol=1e-4))
        True
    """
    same = A is B  # k(X, X): a zero distance on the diagonal, not the expansion's rounding (GPyTorch's x1_eq_x2)
    A, B, an, bn, grad = _centred_scaled(A, B, outputscale, lengthscale, right)
    if not grad:  # the (n1, n2) block in place: a few passes over memory instead of a dozen temporaries
        d2 = (A @ B.transpose(-1, -2)).mul_(-2.0).add_(an).add_(bn)
        if same:
            d2.diagonal(dim1=-2, dim2=-1).zero_()
        r = d2.clamp_min_(1e-30).sqrt_()
        if nu != 0.5:
            r.mul_(math.sqrt(3.0 if nu == 1.5 else 5.0))
        poly = None if nu == 0.5 else (r + 1.0 if nu == 1.5 else r.mul(1.0 / 3.0).add_(1.0).mul_(r).add_(1.0))
        K = r.neg_().exp_() if poly is None else poly.mul_(r.neg_().exp_())
        return K if outputscale is None else K.mul_(outputscale)
    d2 = an + bn - 2.0 * (A @ B.transpose(-1, -2))
    if same:  # in place: the subtraction's backward does not read its output
        d2.diagonal(dim1=-2, dim2=-1).zero_()
    r = d2.clamp_min(1e-30).sqrt()  # GPyTorch's floor: finite gradients
    if nu == 0.5:
        K = torch.exp(-r)
    elif nu == 1.5:
        r = r * math.sqrt(3.0)
        K = (1.0 + r) * torch.exp(-r)
    else:
        r = r * math.sqrt(5.0)
        K = (1.0 + r + r * r / 3.0) * torch.exp(-r)
    return K if outputscale is None else outputscale * K


def _log_scale_shift(outputscale, bn: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log s, ‖b'‖² - 2 log s)`` `((), (*b, 1, n2))` in ``like``'s dtype and device: :func:`gaussian_cross`'s
    constants of its right side."""
    log_s = (torch.zeros((), dtype=like.dtype, device=like.device) if outputscale is None
             else outputscale.to(device=like.device, dtype=like.dtype).log())
    return log_s, bn - 2.0 * log_s


def centred_right(B: torch.Tensor, lengthscale: torch.Tensor | None) -> tuple:
    """``(c, B', ‖b'‖²)``: the right side of :func:`gaussian_cross` and :func:`matern_cross` -- the centre
    ``c`` `(*b, 1, d)` (the mean of ``B``), ``B' = (B - c) / ℓ`` `(*b, n2, d)` and its squared norms `(*b, 1, n2)`
    -- to compute once for a ``B`` that many calls share (the arm set of a bandit's kernel rows)."""
    c = B.detach().mean(-2, keepdim=True)  # (*b, 1, d)
    B = B - c
    if lengthscale is not None:
        B = B / lengthscale
    return c, B, (B * B).sum(-1).unsqueeze(-2)


def _centred_scaled(A: torch.Tensor, B: torch.Tensor, outputscale, lengthscale, right: tuple | None = None) -> tuple:
    """``(A', B', ‖a'‖² (*b, n1, 1), ‖b'‖² (*b, 1, n2), grad)``: both inputs centred on the mean of ``B`` (the
    kernel does not depend on it), then divided by ``lengthscale``; ``grad`` says whether autograd must see the
    block. ``right`` is :func:`centred_right` of ``B``, computed already."""
    c, B, bn = centred_right(B, lengthscale) if right is None else right[:3]
    A = A - c
    if lengthscale is not None:
        A = A / lengthscale
    an = (A * A).sum(-1).unsqueeze(-1)  # (*b, n1, 1)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (A, B, outputscale))
    return A, B, an, bn, grad


class KernelAdapter(nn.Module):
    """Uniform view of a kernel: ``adapter(X1, X2)`` dense and ``adapter.diag(X)``.

    Args:
        kernel: a ``gpytorch.kernels.Kernel``, an ``nn.Module`` with ``forward(X1, X2)`` (and optionally
            ``diag(X)``), or any callable ``(X1, X2) -> Tensor`` that broadcasts leading batch dims.
        diag: optional callable ``X -> (*b, n)``; if absent the diagonal is computed without forming
            ``n x n`` by evaluating the kernel on `(*b, n, 1, d)` pairs.
        frozen: the kernel's hyperparameters never change while this adapter is used (a copy no one else holds,
            such as a model's posterior keeps): a stationary kernel's lengthscale and outputscale are then read once
            per device and dtype, not at every call (a moved adapter reads them again).
    """

    def __init__(self, kernel: Callable, diag: Callable | None = None, *, frozen: bool = False):
        super().__init__()
        self.frozen, self._hyper_cache = bool(frozen), None
        if isinstance(kernel, KernelAdapter):
            diag = diag or kernel._diag_fn
            kernel = kernel.kernel
        if not callable(kernel):
            raise InputDataError(
                f"kernel: expected a gpytorch Kernel or a callable (X1, X2) -> Tensor, got {type(kernel).__name__}"
            )
        self.kernel = kernel if isinstance(kernel, nn.Module) else _CallableModule(kernel)
        self._diag_fn = diag
        self._is_gpytorch = _is_gpytorch_kernel(kernel)
        self._stationary = _plain_stationary_parts(kernel) if self._is_gpytorch else None

    def extra_repr(self) -> str:
        return "fast stationary path" if self._stationary is not None else ""

    def forward(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        """Dense cross-covariance.

        Args:
            X1: `(*b, n1, d)`.
            X2: `(*b, n2, d)`.

        Returns:
            `(*b, n1, n2)` tensor ``k(X1, X2)``.
        """
        if self._stationary is not None:  # (Scale)RBF or Matérn kernel: one GEMM + exp instead of GPyTorch's lazy path
            ls, s = self._hyperparameters(X1)
            if ls.numel() in (1, X1.shape[-1]) and X1.shape[-1] == X2.shape[-1]:
                nu = getattr(self._stationary[0], "nu", None)
                return gaussian_cross(X1, X2, s, ls) if nu is None else matern_cross(X1, X2, nu, s, ls)
        return _dense(self.kernel(X1, X2))

    def against(self, X2: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``X1 -> self(X1, X2)`` for a fixed ``X2`` `(n2, d)`, the same values; on the Gaussian and Matérn paths
        ``X2`` is centred and scaled once (the hyperparameters are read now: for a kernel that stays as it is
        while used, as a bandit's does)."""
        inner = self.kernel.fn if isinstance(self.kernel, _CallableModule) else self.kernel
        if hasattr(inner, "against") and not self._is_gpytorch:
            return inner.against(X2)
        if self._stationary is not None:
            ls, s = self._hyperparameters(X2)
            if ls.numel() in (1, X2.shape[-1]):
                return _fixed_right(self, X2, s, ls, getattr(self._stationary[0], "nu", None))
        return lambda X1: self(X1, X2)

    def diag(self, X: torch.Tensor) -> torch.Tensor:
        """Diagonal ``k(x_i, x_i)`` without forming ``n x n``.

        Args:
            X: `(*b, n, d)`.

        Returns:
            `(*b, n)`.
        """
        if self._diag_fn is not None:
            return self._diag_fn(X)
        if self._stationary is not None and self._stationary[0].raw_lengthscale.shape[-1] in (1, X.shape[-1]):
            s = self._hyperparameters(X)[1]  # k(x, x) = s (1 bare): GPyTorch's diagonal is exactly that
            return (X.new_ones(()) if s is None else s).expand(X.shape[:-1]).clone()
        if self._is_gpytorch:
            return _dense(self.kernel(X, X, diag=True))
        inner = self.kernel
        if isinstance(inner, _CallableModule):
            inner = inner.fn
        if hasattr(inner, "diag") and callable(inner.diag):
            return inner.diag(X)
        Xp = X.unsqueeze(-2)  # (*b, n, 1, d): n independent 1x1 kernel evaluations
        out = self.forward(Xp, Xp)
        if out.shape[-2:] != (1, 1) or out.shape[:-2] != X.shape[:-1]:
            raise InputDataError(
                f"kernel: expected k((*b, n, 1, d), (*b, n, 1, d)) to have shape (*b, n, 1, 1), got "
                f"{tuple(out.shape)}; pass diag=... to as_kernel"
            )
        return out[..., 0, 0]

    def _hyperparameters(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A stationary kernel's lengthscale `(1,)` or `(d,)` and outputscale `()` (``None`` bare) on ``X``'s device
        and dtype; read once per device and dtype when :attr:`frozen` (and no gradient is asked for)."""
        key = (X.device, X.dtype)
        cached = self._hyper_cache  # read once: threads share a model's posterior
        if self.frozen and cached is not None and cached[0] == key:
            return cached[1]
        base, scale = self._stationary
        ls = base.lengthscale.reshape(-1).to(device=X.device, dtype=X.dtype)
        s = None if scale is None else scale.outputscale.to(device=X.device, dtype=X.dtype)
        if self.frozen and not (torch.is_grad_enabled() and (ls.requires_grad or (s is not None and s.requires_grad))):
            self._hyper_cache = (key, (ls, s))
        return ls, s

    def _apply(self, fn, recurse: bool = True):
        self._hyper_cache = None  # moved or cast: read the hyperparameters again
        return super()._apply(fn, recurse)


def as_kernel(kernel: Callable, diag: Callable | None = None) -> KernelAdapter:
    """Wrap ``kernel`` in a :class:`KernelAdapter` (returned as is if it already is one)."""
    if isinstance(kernel, KernelAdapter) and diag is None:
        return kernel
    return KernelAdapter(kernel, diag=diag)


def _fixed_right(kernel: Callable, X2: torch.Tensor, s, ls, nu) -> Callable[[torch.Tensor], torch.Tensor]:
    """``X1 -> kernel(X1, X2)`` through :func:`gaussian_cross` (``nu`` ``None``) or :func:`matern_cross` with
    ``X2``'s side computed once; with autograd on, ``kernel`` itself (the block must be differentiable)."""
    with torch.no_grad():
        right = centred_right(X2, ls)
        if nu is None:  # gaussian_cross's constants of this side, formed once as it forms them
            right = (*right, _log_scale_shift(s, right[2], X2))

    def rows(X1: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return kernel(X1, X2)
        return gaussian_cross(X1, X2, s, ls, right) if nu is None else matern_cross(X1, X2, nu, s, ls, right)

    return rows


class _CallableModule(nn.Module):
    """Holds a plain callable so the adapter can always treat its kernel as a module."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        return self.fn(X1, X2)


def _dense(out):
    """A kernel's output as a strided tensor: a LinearOperator's or a sparse tensor's dense values, a strided tensor
    as it is (tested by type and layout, not ``hasattr``, which Dynamo 2.4 cannot trace on a tensor)."""
    if isinstance(out, torch.Tensor):
        return out if out.layout == torch.strided else out.to_dense()
    return out.to_dense() if hasattr(out, "to_dense") else out


def _is_gpytorch_kernel(kernel: object) -> bool:
    try:
        from gpytorch.kernels import Kernel
    except ImportError:  # pragma: no cover - gpytorch is a dependency
        return False
    return isinstance(kernel, Kernel)


def _plain_stationary_parts(kernel) -> tuple | None:
    """``(base, scale)`` if ``kernel`` is an ``RBFKernel`` or a ``MaternKernel`` (ν ∈ {½, 3/2, 5/2}), bare or in a
    ``ScaleKernel``, with no batch shape and no active dims (``scale`` is ``None`` for a bare kernel), else ``None``
    (the generic GPyTorch path)."""
    from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

    scale = None
    if type(kernel) is ScaleKernel:
        scale, kernel = kernel, kernel.base_kernel
        if scale.batch_shape != torch.Size([]) or scale.active_dims is not None:
            return None
    plain = type(kernel) is RBFKernel or (type(kernel) is MaternKernel and kernel.nu in (0.5, 1.5, 2.5))
    if not plain or kernel.batch_shape != torch.Size([]) or kernel.active_dims is not None:
        return None
    return kernel, scale
