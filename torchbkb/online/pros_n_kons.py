"""PROS-N-KONS (Calandriello, Lazaric, Valko, NeurIPS 2017): second-order online kernel learning on a KORS
Nyström embedding, restarted whenever the dictionary grows -- the competitor of 004's Fig. 3.

004 (Sec. 1 and 3.2) describes it as "an efficient approximation of KONS based on Nyström approximation and
restarts with per-round complexities O(m²)", "restarted whenever a point is added in the dictionary", whose
regret holds against the functions with ``|f(x_t)| <= C``. The NeurIPS paper itself is not among
torchbkb's papers; this is its published algorithm (docs/readings.md, section 14), for the square loss:

* KORS (:class:`~torchbkb.online.KORSDictionary`, 004's ``μ = β = 1``, ``ε = ½``) sees ``x_t`` first; if
  it adds ``x_t``, a new phase starts: the Nyström coordinates ``φ̃(x) = L⁻¹ k_I(x)`` of the new dictionary
  (``K_I = L Lᵀ``), ``w = 0``, ``A = αI`` and no pending gradient;
* otherwise the Online Newton Step: ``u_t = w_{t-1} - A_{t-1}⁻¹ g_{t-1}``;
* the forecast is ``ŷ_t = clip(φ̃_tᵀ u_t, -C, C)``, and ``w_t`` is ``u_t`` projected in the ``A_{t-1}`` norm on
  ``{w : |φ̃_tᵀ w| <= C}``: ``w_t = u_t - h(φ̃_tᵀ u_t) A_{t-1}⁻¹ φ̃_t / (φ̃_tᵀ A_{t-1}⁻¹ φ̃_t)``
  with ``h(z) = sign(z) max(|z| - C, 0)``;
* the gradient of the square loss ``(ŷ - y)²`` is ``g_t = 2(ŷ_t - y_t) φ̃_t`` and
  ``A_t = A_{t-1} + (σ/2) g_t g_tᵀ`` (Sherman–Morrison on ``A⁻¹``), ``σ`` the loss's exp-concavity:
  ``1/(8C²)`` for ``|ŷ|, |y| <= C``.

Any orthonormal coordinates of the dictionary's span give the same forecasts (the step is invariant to a
rotation of the features), so the paper's ``Σ^{-1/2} Uᵀ k_I(x)`` and the Cholesky coordinates used here agree.
A round costs ``O(m²)``; a restart too, since the coordinates grow by one row (no ``O(m³)`` decomposition).

Example:
    >>> import torch
    >>> from torchbkb.online import ProsNKONS
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(2000, 2, dtype=torch.float64) * 2 - 1
    >>> y = torch.sin(2 * X[:, 0]) * X[:, 1]
    >>> res = ProsNKONS(GaussianKernel(1.0), alpha=1.0, C=1.0, seed=0).fit_stream(X, y)
    >>> bool(res.losses[-500:].mean() < (y[-500:] ** 2).mean())    # beats forecasting 0
    True
"""

from __future__ import annotations

import torch

from torchbkb.errors import InputDataError, check_positive
from torchbkb.online.kors import KORSDictionary
from torchbkb.online.nystrom_basis import IncrementalNystromBasis, offer_to_kors
from torchbkb.online.saved_learner import check_bound_buffers, saved_counts
from torchbkb.online.stream import OnlineLearner

__all__ = ["ProsNKONS"]


class ProsNKONS(OnlineLearner):
    """PROS-N-KONS for the square loss: KONS in a KORS Nyström embedding, restarted at every dictionary growth.

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        alpha: ``α > 0``, the regularization ``A_0 = αI`` of each phase (004's experiments: ``λ = 1``).
        C: ``C > 0``, the bound on the forecasts (the feasible set ``|φ̃_tᵀ w| <= C``).
        sigma: the exp-concavity of the loss (default ``1/(8C²)``, that of the square loss on ``[-C, C]``);
            ``A`` grows by ``(σ/2) g gᵀ``.
        mu, beta, epsilon: KORS parameters (004 and the paper: ``μ = β = 1``, ``ε = ½``).
        generator, seed: randomness of KORS.
        new_direction_rtol: a point KORS adds whose squared residual is below ``new_direction_rtol · k(x, x)``
            adds no coordinate (it is numerically in the span); the phase still restarts.

    Attributes:
        weights: `(m,)` float64 buffer ``w_t``. precision: `(m, m)` float64 buffer ``A_t⁻¹``.
        gradient: `(m,)` float64 buffer ``g_t`` (zero right after a restart).
        dictionary: the :class:`~torchbkb.online.KORSDictionary`.
        num_phases: phases started so far (one per dictionary addition); ``num_restarts`` is ``num_phases - 1``.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> f = ProsNKONS(GaussianKernel(1.0), C=1.0, beta=100.0, seed=0)   # β large: the first point joins
        >>> f.step(torch.zeros(1, 2), torch.tensor([1.0]))                  # a new phase forecasts 0
        tensor([0.])
        >>> f.num_features, f.num_restarts
        (1, 0)
        >>> f.predict(torch.zeros(1, 2))          # u = -A⁻¹g, g = 2(0 - 1)·1, A = 1 + (1/16)·4
        tensor([1.])
    """

    def __init__(
        self,
        kernel,
        alpha: float = 1.0,
        C: float = 1.0,
        *,
        sigma: float | None = None,
        mu: float = 1.0,
        beta: float = 1.0,
        epsilon: float = 0.5,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        new_direction_rtol: float = 1e-9,
    ):
        super().__init__()
        self.register_buffer("alpha", torch.tensor(check_positive(alpha, "alpha"), dtype=torch.float64))
        self.register_buffer("C", torch.tensor(check_positive(C, "C"), dtype=torch.float64))
        sig = 1.0 / (8.0 * float(self.C) ** 2) if sigma is None else check_positive(sigma, "sigma")
        self.register_buffer("sigma", torch.tensor(sig, dtype=torch.float64))
        rtol = float(new_direction_rtol)
        if not 0.0 <= rtol < 1.0:
            raise InputDataError(f"new_direction_rtol: expected a number in [0, 1), got {new_direction_rtol!r}")
        self.new_direction_rtol = rtol
        self.dictionary = KORSDictionary(kernel, mu=mu, beta=beta, epsilon=epsilon, generator=generator, seed=seed)
        self.basis = IncrementalNystromBasis(self.dictionary.kernel)
        self.register_buffer("weights", None)
        self.register_buffer("precision", None)
        self.register_buffer("gradient", None)
        self.register_buffer("_cols", torch.zeros(0, dtype=torch.long))  # KORS positions of the basis points
        self.num_phases = 0
        self._offered = 0

    grown_buffers = ("weights", "precision", "gradient", "_cols")

    @property
    def num_restarts(self) -> int:
        """Phases started after the first one."""
        return max(self.num_phases - 1, 0)

    @property
    def num_features(self) -> int:
        """``m``, the dimension of the current embedding (0 before the first dictionary point)."""
        return 0 if self.weights is None else int(self.weights.shape[0])

    # ------------------------------------------------------------------ hooks
    def _own_state(self) -> dict:
        return {"num_phases": self.num_phases, "offered": self._offered}

    def _load_own(self, own: dict, device: torch.device) -> None:
        self.num_phases, self._offered = saved_counts(own, ("num_phases", "offered"))
        m = self.num_features
        check_bound_buffers(self, {"weights": (m,), "precision": (m, m), "gradient": (m,)})

    def _init_state(self, X: torch.Tensor) -> None:
        self._cols = self._cols.to(X.device)
        self._restart(0, X.device)

    def _restart(self, m: int, device) -> None:
        """A new phase on an ``m``-dimensional embedding: ``w = 0``, ``A = αI``, no pending gradient."""
        self.weights = torch.zeros(m, dtype=torch.float64, device=device)
        self.precision = torch.eye(m, dtype=torch.float64, device=device) / float(self.alpha)
        self.gradient = torch.zeros(m, dtype=torch.float64, device=device)

    def _predict(self, X: torch.Tensor) -> torch.Tensor:
        F = self.basis.features(X)  # (n, m)
        u = self.weights - self.precision @ self.gradient  # (m,)
        C = float(self.C)
        return (F @ u).clamp(-C, C)

    def _round(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        phi = self._offer(x)  # (m,), after a restart if KORS added x
        P = self.precision
        u = self.weights - P @ self.gradient  # (m,)
        nu = float(phi @ u) if phi.numel() else 0.0
        C = float(self.C)
        yhat = min(max(nu, -C), C)
        excess = nu - yhat  # h(ν)
        if excess != 0.0:
            Pphi = P @ phi  # (m,)
            u = u - Pphi * (excess / float(phi @ Pphi))  # A-norm projection on |φ̃ᵀw| <= C
        self.weights = u
        g = phi * (2.0 * (yhat - float(y[0])))  # (m,): ∇(ŷ - y)² = 2(ŷ - y) φ̃
        Pg = P @ g
        scale = 0.5 * float(self.sigma)
        P.sub_(torch.outer(Pg, Pg) * (scale / (1.0 + scale * float(g @ Pg))))  # (A + s g gᵀ)⁻¹
        self.gradient = g
        return torch.tensor([yhat], dtype=torch.float64, device=x.device)

    def _offer(self, x: torch.Tensor) -> torch.Tensor:
        """Offer ``x`` to KORS; on an addition grow the coordinates and restart. Returns ``φ̃(x)`` `(m,)`."""
        l, added, delta, _ = offer_to_kors(self.dictionary, self.basis, self._cols, x, self._offered,
                                           self.new_direction_rtol)
        self._offered += 1
        if not added:
            return l
        if delta is not None:
            self.basis.append(x, l, delta)
            self._cols = torch.cat([self._cols, self._cols.new_tensor([len(self.dictionary) - 1])])
            l = torch.cat([l, l.new_tensor([delta])])
        self.num_phases += 1
        self._restart(int(l.shape[0]), x.device)
        return l
