"""Exact baselines: Kernel-AWV (004 Eq. 3) and online kernel ridge regression, ``O(t²)`` per round.

Kernel-AWV forecasts ``ŷ_t = f̂_t(x_t)`` with ``f̂_t = argmin_f Σ_{s<t} (y_s - f(x_s))² + λ‖f‖² + f(x_t)²``.
By the representer theorem ``f̂_t = Σ_{s<=t} α_s k(x_s, ·)`` and

    ŷ_t = k_t(x_t)ᵀ (K_t + λ I)⁻¹ (y_1, ..., y_{t-1}, 0),

with ``K_t`` the kernel matrix of ``x_1..x_t``. Kernel ridge regression drops the ``f(x_t)²`` term:
``ŷ_t = k_{t-1}(x_t)ᵀ (K_{t-1} + λ I)⁻¹ Y_{t-1}``.

Both keep the Cholesky factor ``L`` of ``K_{t-1} + λ I`` (grown by one row per round: ``O(t²)`` time,
``O(t²)`` memory) and ``z = L⁻¹ Y_{t-1}``. With ``l = L⁻¹ k_{t-1}(x)`` and the Schur complement
``δ² = k(x, x) + λ - ‖l‖²``:

    KRR:        ŷ = lᵀ z,
    Kernel-AWV: ŷ = (λ / δ²) · lᵀ z        (the new row of ``L⁻¹`` applied to ``(Y, 0)``).

These are the exact references for PKAWV; use ``fit_stream(..., max_time=...)`` to cap them.

Example:
    >>> import torch
    >>> from torchbkb.online import KernelAWV, OnlineKRR
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(100, 2, dtype=torch.float64)
    >>> y = torch.sin(4 * X[:, 0])
    >>> awv, krr = KernelAWV(GaussianKernel(0.5), lam=1.0), OnlineKRR(GaussianKernel(0.5), lam=1.0)
    >>> r_awv, r_krr = awv.fit_stream(X, y), krr.fit_stream(X, y)
    >>> bool((r_awv.predictions.abs() <= r_krr.predictions.abs() + 1e-12).all())   # AWV shrinks KRR
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchbkb.errors import check_positive, nonfinite_values_error
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.online._storage import GrowableRows
from torchbkb.online.saved_learner import saved_tensor
from torchbkb.online.stream import OnlineLearner

__all__ = ["KernelAWV", "OnlineKRR"]


class _ExactKernelForecaster(OnlineLearner):
    """Shared state of :class:`KernelAWV` and :class:`OnlineKRR`: growing Cholesky of ``K + λI``."""

    _awv: bool = True

    def __init__(self, kernel: Callable, lam: float = 1.0):
        super().__init__()
        self.kernel: KernelAdapter = as_kernel(kernel)
        self.register_buffer("lam", torch.tensor(check_positive(lam, "lam"), dtype=torch.float64))
        self._X: GrowableRows | None = None  # (t, d) past inputs
        self._L: torch.Tensor | None = None  # (cap, cap) float64, L = _L[:t, :t], identity beyond t
        self._z: torch.Tensor | None = None  # (cap,) float64 storage, z = L⁻¹ Y
        self._t = 0

    @property
    def size(self) -> int:
        """Rounds stored (the size of the kernel matrix)."""
        return self._t

    def _init_state(self, X: torch.Tensor) -> None:
        self._X = GrowableRows((X.shape[-1],), X.dtype, X.device)
        self._L = torch.eye(256, dtype=torch.float64, device=X.device)
        self._z = torch.zeros(256, dtype=torch.float64, device=X.device)

    def _solve(self, k: torch.Tensor) -> torch.Tensor:
        """`(t, n)` -> `(t, n)` ``L⁻¹ k``.

        Solved against the whole contiguous `(cap, cap)` storage (identity beyond ``t``, right-hand side
        padded with zeros): the first ``t`` entries are ``L_t⁻¹ k``, and no ``t × t`` copy is made (a
        triangular solve on the strided view ``_L[:t, :t]`` would copy it every round).
        """
        t, cap = self._t, self._L.shape[0]
        rhs = k.new_zeros((cap, k.shape[1]))  # (cap, n)
        rhs[:t] = k
        return torch.linalg.solve_triangular(self._L, rhs, upper=False)[:t]

    def _forecast(self, X: torch.Tensor):
        """``(ŷ, l, δ², r)`` for `(n, d)` ``X``: `(n,)`, `(t, n)`, `(n,)`, `(n,)`; ``r`` is ``δ²`` before its
        clamp, NaN/inf exactly when a kernel value of the row is (``‖l‖² <= k(x, x) + λ`` cannot overflow)."""
        t, lam = self._t, float(self.lam)
        kxx = self.kernel.diag(X).to(torch.float64)  # (n,)
        if t == 0:
            zero = kxx.new_zeros(X.shape[0])
            return zero, kxx.new_zeros((0, X.shape[0])), kxx + lam, kxx
        l = self._solve(self.kernel(self._X.data, X).to(torch.float64))  # (t, n)
        base = l.T @ self._z[:t]  # (n,): KRR forecast
        raw = kxx + lam - (l * l).sum(0)
        delta2 = raw.clamp_min(lam)  # Schur complement of K + λI is >= λ
        return (lam / delta2 * base if self._awv else base), l, delta2, raw

    def _predict(self, X: torch.Tensor) -> torch.Tensor:
        return self._forecast(X)[0]

    def _round(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        yhat, l, delta2, raw = self._forecast(x)
        if not math.isfinite(raw.item()):  # checked before any write
            raise nonfinite_values_error("kernel", "values k(x, ·) of the new input x")
        t = self._t
        if t + 1 > self._L.shape[0]:
            self._reserve(t + 1)
        delta = delta2[0].sqrt()
        self._L[t, :t] = l[:, 0]
        self._L[t, t] = delta
        self._z[t] = (y[0].to(torch.float64) - l[:, 0] @ self._z[:t]) / delta
        self._X.append(x)
        self._t = t + 1
        return yhat

    def _own_state(self) -> dict:
        t = self._t
        return {} if self._X is None else {"X": self._X.data.clone(), "L": self._L[:t, :t].clone(),
                                           "z": self._z[:t].clone()}

    def _load_own(self, own: dict, device: torch.device) -> None:
        if self._ref is None:
            self._X, self._L, self._z, self._t = None, None, None, 0
            return
        X = saved_tensor(own, "X", (None, self._ref.shape[-1]), device=device).to(self._ref.dtype)
        t = X.shape[0]
        L = saved_tensor(own, "L", (t, t), device=device).to(torch.float64)
        z = saved_tensor(own, "z", (t,), device=device).to(torch.float64)
        self._init_state(self._ref)
        self._t = 0
        while self._L.shape[0] < t:  # the capacities the rounds grew through: the solves see the same storage
            self._reserve(self._L.shape[0] + 1)
        self._X.append(X)
        self._L[:t, :t], self._z[:t], self._t = L, z, t

    def _reserve(self, need: int) -> None:
        cap = max(need, int(self._L.shape[0] * 1.25) + 256)  # 1.25x growth: memory and solves stay <= ~1.6 t²
        L = torch.eye(cap, dtype=self._L.dtype, device=self._L.device)
        t = self._t
        L[:t, :t] = self._L[:t, :t]
        z = torch.zeros(cap, dtype=self._z.dtype, device=self._z.device)
        z[:t] = self._z[:t]
        self._L, self._z = L, z


class KernelAWV(_ExactKernelForecaster):
    """Exact Kernel-AWV (004 Eq. 3): ``ŷ_t = k_t(x_t)ᵀ (K_t + λI)⁻¹ (Y_{t-1}, 0)``; ``O(t²)`` per round.

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        lam: regularization ``λ > 0`` (a float64 buffer).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> awv = KernelAWV(GaussianKernel(1.0), lam=1.0)
        >>> x = torch.zeros(1, 2)
        >>> awv.update(x, torch.ones(1)).predict(x)   # (1, 1) (K + I)⁻¹ (1, 0) with K = ones(2, 2): 1/3
        tensor([0.3333])
    """

    _awv = True


class OnlineKRR(_ExactKernelForecaster):
    """Online kernel ridge regression: ``ŷ_t = k_{t-1}(x_t)ᵀ (K_{t-1} + λI)⁻¹ Y_{t-1}``; ``O(t²)`` per round.

    Kernel-AWV without the ``f(x_t)²`` term (the baseline of the paper's i.i.d. experiments).

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        lam: regularization ``λ > 0`` (a float64 buffer).

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> krr = OnlineKRR(GaussianKernel(1.0), lam=1.0)
        >>> x = torch.zeros(1, 2)
        >>> krr.update(x, torch.ones(1)).predict(x)   # k (k + λ)⁻¹ y = 1/2
        tensor([0.5000])
    """

    _awv = False
