"""KORS: Kernel Online Row Sampling (Calandriello, Lazaric, Valko 2017, Alg. 1), the dictionary of 004 Sec. 3.2.

Each incoming point ``x_t`` is scored by its approximate ridge leverage score against the current
dictionary ``I_{t-1}`` (weights ``1/p_j``) *plus itself* (weight 1),

    τ̃_t = (1 + ε)/μ · (k(x_t, x_t) - k̄_tᵀ (K̄ + μ I)⁻¹ k̄_t)
         = (1 + ε) · s / (1 + s),      s = (k(x_t, x_t) - ā_tᵀ (W^½ K_I W^½ + μ I)⁻¹ ā_t) / μ,

where ``K̄``/``k̄_t`` are the kernel matrix/vector of ``I_{t-1} ∪ {x_t}`` scaled by ``√weight`` and
``ā_t = W^½ k_I(x_t)``; the second form follows from Sherman–Morrison. ``x_t`` enters with probability
``p_t = min(1, β τ̃_t)`` and weight ``1/p_t``; points are never dropped, so ``I_1 ⊂ I_2 ⊂ ...``.
With ``β = 12 log(n/δ)``, w.p. ``1 - δ`` every projection satisfies ``‖(I - P_t) C_t^½‖² <= μ`` and
``|I_n| <= 9 d_eff(μ) log(2n/δ)²`` (004 Proposition 5); the paper's experiments use ``μ = β = 1``,
``ε = 1/2``.

The state is ``T = L⁻¹`` for the Cholesky factor ``L`` of ``W^½ K_I W^½ + μ I`` (eigenvalues ``>= μ``, so
it is well conditioned); adding a point appends one row to ``T`` in ``O(m²)``, scoring costs ``O(m²)``.

Note: the paper's Python listing (004 App. H.2) multiplies the kernel by ``1/p`` on *each* side
(``W K W``); the KORS paper's selection matrix has entries ``1/√p``, i.e. ``W^½ K W^½``, which is the
unbiased estimate of the covariance. torchbkb follows the KORS paper.

Example:
    >>> import torch
    >>> from torchbkb.online import KORSDictionary
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> kors = KORSDictionary(GaussianKernel(1.0), mu=1.0, beta=1.0, epsilon=0.5, seed=0)
    >>> X = torch.rand(2000, 2, dtype=torch.float64) * 2 - 1
    >>> added = [kors.offer(X[t : t + 1], index=t) for t in range(2000)]
    >>> 1 <= len(kors) < 150          # a few dozen points summarize 2000 inputs
    True
    >>> kors.indices[:3].tolist() == [t for t, a in enumerate(added) if a][:3]
    True
"""

from __future__ import annotations

import math

import torch
from torchbkb.errors import (
    CheckpointError,
    InputDataError,
    check_generator,
    check_matrix,
    check_nonnegative,
    check_positive,
    nonfinite_values_error,
)
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.online.saved_learner import SavedState, saved_tensor

__all__ = ["KORSDictionary"]


class KORSDictionary(SavedState):
    """Online ridge-leverage-score sampling of a growing dictionary (points are never dropped).

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        mu: ``μ > 0``, the regularization of the leverage scores (the accuracy of the projection).
        beta: ``β > 0``, the oversampling factor.
        epsilon: ``ε >= 0``, the accuracy of the approximate scores.
        generator: a seeded ``torch.Generator`` (CPU) for the Bernoulli draws.
        seed: convenience alternative to ``generator``.

    Kernels are evaluated in float64 (inputs are cast), so a float32 stream gets the same scores as its
    float64 copy.

    Attributes:
        points: `(m, d)` float64 dictionary (on the stream's device).
        probabilities: `(m,)` float64 inclusion probabilities ``p_j`` (weights are ``1/p_j``).
        indices: `(m,)` long, the value of ``index`` passed to :meth:`offer` when each point entered.
        last_probability: the probability computed by the latest :meth:`offer`.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> kors = KORSDictionary(GaussianKernel(1.0), mu=1.0, beta=1.0, epsilon=0.5, seed=0)
        >>> kors.probability(torch.zeros(1, 2))    # empty dictionary: s = k(x,x)/μ = 1, p = 1.5 · 1/2
        tensor([0.7500], dtype=torch.float64)
        >>> kors.add(torch.zeros(1, 2), p=1.0, index=0)
        >>> kors.probability(torch.tensor([[0.0, 0.0], [5.0, 5.0]]))   # covered point: s = 1 - 1/2
        tensor([0.5000, 0.7500], dtype=torch.float64)
    """

    def __init__(
        self,
        kernel,
        mu: float = 1.0,
        beta: float = 1.0,
        epsilon: float = 0.5,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
    ):
        super().__init__()
        self.kernel: KernelAdapter = as_kernel(kernel)
        self.register_buffer("mu", torch.tensor(check_positive(mu, "mu"), dtype=torch.float64))
        self.register_buffer("beta", torch.tensor(check_positive(beta, "beta"), dtype=torch.float64))
        self.register_buffer("epsilon", torch.tensor(check_nonnegative(epsilon, "epsilon"), dtype=torch.float64))
        generator = check_generator(generator, seed)
        self.generator = generator
        self.register_buffer("points", None)
        self._dtype: torch.dtype | None = None  # dtype of the first input; later inputs must match
        self.register_buffer("probabilities", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("indices", torch.zeros(0, dtype=torch.long))
        self.register_buffer("_T", None)  # (m, m) lower-triangular L⁻¹, L Lᵀ = W^½ K_I W^½ + μ I
        self.last_probability = float("nan")

    grown_buffers = ("points", "probabilities", "indices", "_T")

    def get_extra_state(self) -> dict:
        """The generator's state, the stream's dtype and the last probability (the points are buffers)."""
        return {"generator": self.generator.get_state(), "last_probability": self.last_probability,
                "dtype": None if self._dtype is None else str(self._dtype).split(".")[-1]}

    def set_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`get_extra_state`, checked (against the points loaded before it)."""
        gen = saved_tensor(state, "generator", (None,), floating=False)
        dtype = state.get("dtype")
        dtype = None if dtype is None else getattr(torch, dtype, None) if isinstance(dtype, str) else False
        m, p = len(self), state.get("last_probability")
        shapes = [None if t is None else tuple(t.shape) for t in (self.points, self._T)]
        if (gen.dtype != torch.uint8 or not isinstance(p, float) or (dtype is None) != (m == 0)
                or (m and not isinstance(dtype, torch.dtype)) or tuple(self.probabilities.shape) != (m,)
                or (m and (shapes[0] is None or shapes[0][0] != m or shapes[1] != (m, m)))):
            raise CheckpointError(f"state: expected a KORS dictionary's state over {m} points, got one that does not "
                                  f"match them")
        self.generator.set_state(gen)
        self._dtype, self.last_probability = dtype, p

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    # ------------------------------------------------------------------ scores
    def probability(self, X: torch.Tensor) -> torch.Tensor:
        """Inclusion probabilities ``min(1, β τ̃)`` of the rows of ``X`` against the current dictionary.

        Pure; each row is scored on its own (as if it were the next point).

        Args:
            X: `(n, d)` candidates.

        Returns:
            `(n,)` float64 probabilities.
        """
        self._check(X)
        with torch.no_grad():
            kIx = self.kernel_to_dictionary(X)  # (n, m)
            kxx = self.kernel_diag(X)  # (n,)
            return self._probability(kIx, kxx)

    def offer(self, x: torch.Tensor, index: int | None = None) -> bool:
        """Score one point, draw ``z ~ Bernoulli(p)`` and add the point (weight ``1/p``) if ``z = 1``.

        Args:
            x: `(1, d)` point.
            index: its position in the stream, stored in :attr:`indices` (default ``-1``).

        Returns:
            Whether ``x`` was added.
        """
        self._check(x)
        if x.shape[0] != 1:
            raise InputDataError(f"x: expected shape (1, d), got {tuple(x.shape)}")
        with torch.no_grad():
            kIx, kxx = self.checked_kernel_values(x)
            p = self.probability_from_kernel(kIx, kxx)
            if not self.draw_uniform() < p:
                return False
            self.add(x, p, -1 if index is None else int(index), k_xI=kIx, k_xx=kxx)
        return True

    # ------------------------------------------------------------------ building blocks (shared with PKAWV)
    def checked_kernel_values(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """`(m,)` float64 ``k(I, x)`` and ``k(x, x)`` of `(1, d)` ``x``, checked before any draw: a
        :class:`~torchbkb.errors.NumericsError` when one is NaN/inf (kernel values do not overflow their sum)."""
        kIx = self.kernel_to_dictionary(x)[0]
        kxx = float(self.kernel_diag(x).reshape(()))
        if not math.isfinite(kxx + float(kIx.sum())):
            raise nonfinite_values_error("kernel", "values k(x, ·) of the new input x against the dictionary")
        return kIx, kxx

    def probability_from_kernel(self, k_xI: torch.Tensor, k_xx: float) -> float:
        """``min(1, β τ̃)`` of one point from its `(m,)` float64 ``k(I, x)`` and ``k(x, x)``; sets
        :attr:`last_probability`."""
        p = float(self._probability(k_xI.reshape(1, -1),
                                    torch.tensor([float(k_xx)], dtype=torch.float64, device=k_xI.device))[0])
        self.last_probability = p
        return p

    def draw_uniform(self) -> float:
        """One ``U(0, 1)`` draw from the generator (``z = 1`` iff it is ``< p``)."""
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def add(
        self, x: torch.Tensor, p: float, index: int = -1, *, k_xI: torch.Tensor | None = None, k_xx: float | None = None
    ) -> None:
        """Append `(1, d)` ``x`` with inclusion probability ``p`` (weight ``1/p``) in ``O(m²)``."""
        self._check(x)
        if not 0.0 < float(p) <= 1.0:
            raise InputDataError(f"p: expected a probability in (0, 1], got {p!r}")
        with torch.no_grad():
            kIx = self.kernel_to_dictionary(x)[0] if k_xI is None else k_xI.to(torch.float64)
            kxx = float(self.kernel_diag(x).reshape(())) if k_xx is None else float(k_xx)
            for name, ok, given in (("k_xI", bool(torch.isfinite(kIx).all()), k_xI is not None),
                                    ("k_xx", math.isfinite(kxx), k_xx is not None)):
                if not ok and given:
                    raise InputDataError(f"{name}: expected finite kernel values, got NaN/inf")
                if not ok:
                    raise nonfinite_values_error("kernel", "values k(x, ·) of x against the dictionary")
            self._add(x, kIx, kxx, float(p), int(index))

    def kernel_to_dictionary(self, X: torch.Tensor) -> torch.Tensor:
        """`(n, d)` -> `(n, m)` float64 ``k(X, I)`` (evaluated on float64 copies)."""
        if len(self) == 0:
            return torch.zeros((X.shape[0], 0), dtype=torch.float64, device=X.device)
        return self.kernel(X.to(torch.float64), self.points).to(torch.float64)  # (n, m)

    def kernel_diag(self, X: torch.Tensor) -> torch.Tensor:
        """`(n, d)` -> `(n,)` float64 ``k(x, x)``."""
        return self.kernel.diag(X.to(torch.float64)).to(torch.float64)

    # ------------------------------------------------------------------ internals
    def _probability(self, kIx: torch.Tensor, kxx: torch.Tensor) -> torch.Tensor:
        """`(n, m)`, `(n,)` -> `(n,)` ``min(1, β (1+ε) s/(1+s))``."""
        mu = float(self.mu)
        if len(self) == 0:
            s = kxx / mu
        else:
            a = kIx * self.probabilities.rsqrt()  # (n, m): W^½ k_I(x)
            u = a @ self._T.T  # (n, m): L⁻¹ a per row
            s = (kxx - (u * u).sum(-1)).clamp_min(0.0) / mu
        tau = (1.0 + float(self.epsilon)) * s / (1.0 + s)
        return (float(self.beta) * tau).clamp(0.0, 1.0)

    def _add(self, x: torch.Tensor, kIx: torch.Tensor, kxx: float, p: float, index: int) -> None:
        """Grow ``T = L⁻¹`` by one row: ``L_new = [[L, 0], [lᵀ, δ]]``."""
        mu = float(self.mu)
        m = len(self)
        dev = x.device
        self._dtype = x.dtype
        if m == 0:
            T = torch.full((1, 1), (kxx / p + mu) ** -0.5, dtype=torch.float64, device=dev)
            self.points = x.detach().to(torch.float64).clone()
        else:
            col = kIx * self.probabilities.rsqrt() / p**0.5  # (m,): new column of W^½ K W^½, x weighted 1/√p
            l = self._T @ col  # (m,): L⁻¹ col
            delta2 = kxx / p + mu - float(l @ l)
            delta = max(delta2, mu) ** 0.5  # the Schur complement is >= μ in exact arithmetic
            T = torch.zeros((m + 1, m + 1), dtype=torch.float64, device=dev)
            T[:m, :m] = self._T
            T[m, :m] = -(l @ self._T) / delta  # last row of [[L, 0], [lᵀ, δ]]⁻¹
            T[m, m] = 1.0 / delta
            self.points = torch.cat([self.points, x.detach().to(torch.float64)], dim=0)
        self._T = T
        self.probabilities = torch.cat([self.probabilities, torch.tensor([p], dtype=torch.float64, device=dev)])
        self.indices = torch.cat([self.indices, torch.tensor([index], dtype=torch.long, device=dev)])

    def _check(self, X: object) -> None:
        check_matrix(X, "x", d=None if self.points is None else self.points.shape[-1])
        if X.dim() != 2:
            raise InputDataError(f"x: expected shape (n, d), got shape {tuple(X.shape)}")
        if ((self._dtype is not None and X.dtype != self._dtype)
                or (self.points is not None and X.device != self.points.device)):
            where = self.points.device if self.points is not None else X.device
            raise InputDataError(
                f"x: expected dtype {self._dtype} on {where} (like the points offered before), got dtype {X.dtype} on "
                f"{X.device}"
            )
        if self.probabilities.device != X.device:
            self.probabilities = self.probabilities.to(X.device)
            self.indices = self.indices.to(X.device)
