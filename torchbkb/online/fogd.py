"""FOGD: Fourier Online Gradient Descent (Lu, Hoi, Wang, Zhao, Liu 2016), the paper's main competitor.

Random Fourier features of the Gaussian kernel ``exp(-‖x - x'‖² / 2σ²)``,

    z(x) = D^{-1/2} (cos(Ux), sin(Ux)) ∈ ℝ^{2D},    U ∈ ℝ^{D×d},  U_ij ~ N(0, 1/σ²),

so ``E[z(x)ᵀz(x')] = k(x, x')``, and online gradient descent on the square loss ``½(ŷ - y)²``:

    ŷ_t = w_tᵀ z(x_t),    w_{t+1} = w_t - η (ŷ_t - y_t) z(x_t).

004's experiments use ``D = 1000`` and ``η = 1/√n``. A round costs ``O(D d)``. ``fit_stream`` runs a
chunk of ``B`` rounds at once exactly: with ``a = Z w``, ``T = strictly_lower(Z Zᵀ)`` the forecasts solve
the unit lower-triangular system ``(I + ηT) ŷ = a + ηT y``.

Example:
    >>> import torch
    >>> from torchbkb.online import FOGD
    >>> X = torch.rand(1000, 2, dtype=torch.float64) * 2 - 1
    >>> y = torch.sin(2 * X[:, 0])
    >>> res = FOGD(d=2, lengthscale=1.0, num_features=100, lr=0.5, seed=0).fit_stream(X, y)
    >>> bool(res.losses[-250:].mean() < 0.1 * res.losses[:50].mean())
    True
"""

from __future__ import annotations

import torch

from torchbkb.errors import check_generator, check_int, check_positive
from torchbkb.online.saved_learner import check_bound_buffers
from torchbkb.online.stream import OnlineLearner

__all__ = ["FOGD"]


class FOGD(OnlineLearner):
    """Online gradient descent on random Fourier features.

    Args:
        d: input dimension.
        lengthscale: ``σ > 0`` of the Gaussian kernel.
        num_features: ``D``, the number of frequencies (``2D`` features).
        lr: step size ``η > 0`` (a buffer; the paper uses ``1/√n``).
        generator, seed: randomness of the frequencies.

    Attributes:
        frequencies: `(D, d)` float64 buffer ``U``.
        weights: `(2D,)` float64 buffer ``w`` (after the first input).

    Example:
        >>> import torch
        >>> f = FOGD(d=3, num_features=2000, seed=0)
        >>> X = torch.rand(5, 3, dtype=torch.float64)
        >>> Z = f.features(X)
        >>> bool((Z @ Z.T - torch.exp(-0.5 * torch.cdist(X, X) ** 2)).abs().max() < 0.1)
        True
    """

    def __init__(
        self,
        d: int,
        lengthscale: float = 1.0,
        num_features: int = 1000,
        lr: float = 0.01,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
    ):
        super().__init__()
        for name, v in (("d", d), ("num_features", num_features)):
            check_int(v, name)
        sigma = check_positive(lengthscale, "lengthscale")
        self.register_buffer("lr", torch.tensor(check_positive(lr, "lr"), dtype=torch.float64))
        self.register_buffer("lengthscale", torch.tensor(sigma, dtype=torch.float64))
        generator = check_generator(generator, seed)
        U = torch.randn(num_features, d, generator=generator, dtype=torch.float64) / sigma
        self.register_buffer("frequencies", U)
        self.register_buffer("weights", None)
        self.dim = d

    grown_buffers = ("weights",)

    def _load_own(self, own: dict, device: torch.device) -> None:
        check_bound_buffers(self, {"weights": (self.num_features,)})

    @property
    def num_features(self) -> int:
        """``2D``, the length of ``z(x)``."""
        return 2 * int(self.frequencies.shape[0])

    def features(self, X: torch.Tensor) -> torch.Tensor:
        """`(n, d)` -> `(n, 2D)` float64 ``z(X)``."""
        U = self.frequencies.to(X.device)
        proj = X.to(torch.float64) @ U.T  # (n, D)
        return torch.cat([proj.cos(), proj.sin()], dim=-1) / U.shape[0] ** 0.5

    def _expected_dim(self) -> int:
        return self.dim

    def _init_state(self, X: torch.Tensor) -> None:
        self.frequencies = self.frequencies.to(X.device)
        self.weights = torch.zeros(self.num_features, dtype=torch.float64, device=X.device)

    def _predict(self, X: torch.Tensor) -> torch.Tensor:
        return self.features(X) @ self.weights

    def _round(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.features(x)[0]  # (2D,)
        yhat = z @ self.weights
        self.weights.sub_(z * (float(self.lr) * (yhat - y[0].to(torch.float64))))
        return yhat.reshape(1)

    def _stream_block(self, X: torch.Tensor, y: torch.Tensor, deadline: float | None) -> torch.Tensor:
        if X.shape[0] < 8:  # short chunks: plain rounds
            return super()._stream_block(X, y, deadline)
        # blocks of 32 rounds: the (B, B) Gram costs 2D·B flops per round, the features 2D·d
        return torch.cat([self._block(X[i : i + 32], y[i : i + 32]) for i in range(0, X.shape[0], 32)])

    def _block(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Consecutive rounds at once (exact): `(B, d)`, `(B,)` -> `(B,)` forecasts."""
        lr = float(self.lr)
        Z = self.features(X)  # (B, 2D)
        yy = y.to(torch.float64)
        ar = torch.arange(Z.shape[0], device=Z.device)
        T = (Z @ Z.T) * (ar.unsqueeze(1) > ar.unsqueeze(0))  # (B, B): T[t, s] = z_tᵀ z_s for s < t
        eye = torch.eye(Z.shape[0], dtype=Z.dtype, device=Z.device)
        rhs = (Z @ self.weights + lr * (T @ yy)).unsqueeze(1)  # (B, 1)
        yhat = torch.linalg.solve_triangular(eye + lr * T, rhs, upper=False, unitriangular=True)[:, 0]
        self.weights.sub_(lr * (Z.T @ (yhat - yy)))
        return yhat
