"""An orthonormal basis of a growing Nyström subspace, and the history needed to move past rounds into it.

PKAWV with Nyström projections (004 Sec. 3.2, Eq. 7) works in ``H̃_t = span{φ(x̃) : x̃ ∈ I_t}``. With the
Cholesky factor ``K_I = L Lᵀ`` of the dictionary's kernel matrix, the coordinates

    φ̃(x) = L⁻¹ k_I(x) ∈ ℝ^m

are an orthonormal basis of ``H̃_t`` (``φ̃(x)ᵀφ̃(x') = k_I(x)ᵀ K_I⁻¹ k_I(x')``, the Nyström kernel), so
PKAWV on ``H̃_t`` is linear AWV on ``φ̃`` (004 App. H, Eq. 37 with ``Q^{-1/2}`` replaced by ``L⁻¹``).

Because ``L`` is lower triangular, adding a point ``x̃`` (Gram–Schmidt in the RKHS) leaves the old
coordinates untouched and appends one:

    l = φ̃(x̃),  δ² = k(x̃, x̃) - ‖l‖²,  α = L⁻ᵀ l,
    e(x) = (k(x, x̃) - lᵀ φ̃(x)) / δ = (k(x, x̃) - k_I(x)ᵀ α) / δ.

The regularized covariance and the target vector of the *past* rounds then gain one row/column,
``c = Σ_s φ̃(x_s) e(x_s)``, ``Σ_s e(x_s)²`` and ``Σ_s y_s e(x_s)`` -- the quantities of the column
update of 004 App. H, Algorithm 2 (``c_t``, ``d_t`` and the new entry of ``K_tᵀ Y_t``), expressed in
the orthonormal coordinates. Computing them needs the past inputs, so this class keeps the history
(`(t, d)` float64 inputs and `(t,)` outputs, as the paper's implementation does) and streams over it in chunks:
``O(t · m · d)`` time and ``O(chunk · m)`` extra memory per added point, ``O(m²)`` per round otherwise.

Example:
    >>> import torch
    >>> from torchbkb.online import IncrementalNystromBasis
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> basis = IncrementalNystromBasis(GaussianKernel(0.5))
    >>> S = torch.rand(6, 2, dtype=torch.float64)
    >>> for s in S:
    ...     l, delta = basis.residual(s[None])
    ...     basis.append(s[None], l, delta)
    >>> X = torch.rand(20, 2, dtype=torch.float64)
    >>> F, K = basis.features(X), GaussianKernel(0.5)(X, S)
    >>> bool(torch.allclose(F @ F.T, K @ torch.linalg.solve(GaussianKernel(0.5)(S, S), K.T)))
    True
"""

from __future__ import annotations

import math

import torch
from torchbkb.errors import CheckpointError, InputDataError, check_int, nonfinite_values_error
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.online._storage import GrowableRows
from torchbkb.online.saved_learner import SavedState, saved_tensor

__all__ = ["IncrementalNystromBasis", "offer_to_kors"]


class IncrementalNystromBasis(SavedState):
    """Orthonormal coordinates ``φ̃(x) = L⁻¹ k_I(x)`` of a dictionary that only grows.

    Args:
        kernel: a ``gpytorch.kernels.Kernel`` or a callable ``(X1, X2) -> Tensor``.
        chunk_size: history rows processed at once when a point is added.

    Everything is computed in float64: inputs are cast before the kernel is evaluated, because the
    dictionary of an online sampler may contain nearly collinear points whose new directions are
    small differences of kernel values.

    Attributes:
        points: `(m, d)` float64 dictionary (``None`` before the first point).
        history_size: rounds recorded with :meth:`record`.
    """

    def __init__(self, kernel, *, chunk_size: int = 16384):
        super().__init__()
        check_int(chunk_size, "chunk_size")
        self.kernel: KernelAdapter = as_kernel(kernel)
        self.chunk_size = chunk_size
        self.register_buffer("points", None)
        self.register_buffer("_T", None)  # (m, m) float64 lower-triangular L⁻¹ with L Lᵀ = K_I
        self._X: GrowableRows | None = None  # (t, d) past inputs, stream dtype
        self._y: GrowableRows | None = None  # (t,) past outputs, float64

    grown_buffers = ("points", "_T")

    def get_extra_state(self) -> dict:
        """The recorded history (the points and ``L⁻¹`` are buffers)."""
        return {"X": None if self._X is None else self._X.data.clone(),
                "y": None if self._y is None else self._y.data.clone()}

    def set_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`get_extra_state`, checked."""
        if not isinstance(state, dict) or (state.get("X") is None) != (state.get("y") is None):
            raise CheckpointError("state: expected a Nyström basis's history (X and y, or neither), got another value")
        if state["X"] is None:
            self._X = self._y = None
            return
        device = None if self.points is None else self.points.device  # the points are loaded before
        X = saved_tensor(state, "X", (None, None), device=device)
        y = saved_tensor(state, "y", (X.shape[0],), device=device)
        self._X = self._y = None
        self.record(X, y)

    @property
    def size(self) -> int:
        """``m``, the number of basis directions."""
        return 0 if self.points is None else int(self.points.shape[0])

    @property
    def history_size(self) -> int:
        """How many points the basis keeps in its history (``0`` before the first)."""
        return 0 if self._X is None else self._X.n

    def kernel_to_dictionary(self, X: torch.Tensor) -> torch.Tensor:
        """`(n, d)` -> `(n, m)` float64 ``k(X, I)``."""
        if self.size == 0:
            return torch.zeros((X.shape[0], 0), dtype=torch.float64, device=X.device)
        return self.kernel(X.to(torch.float64), self.points).to(torch.float64)

    def features(self, X: torch.Tensor, k_XI: torch.Tensor | None = None) -> torch.Tensor:
        """Coordinates ``φ̃(X) = k(X, I) L⁻ᵀ``.

        Args:
            X: `(n, d)` inputs.
            k_XI: optional precomputed `(n, m)` float64 ``k(X, I)``.

        Returns:
            `(n, m)` float64.
        """
        if k_XI is None:
            k_XI = self.kernel_to_dictionary(X)
        if self.size == 0:
            return k_XI
        return k_XI @ self._T.T  # (n, m)

    def residual(
        self, x: torch.Tensor, k_xI: torch.Tensor | None = None, k_xx: float | None = None
    ) -> tuple[torch.Tensor, float]:
        """``(l, δ)`` of a candidate: ``l = φ̃(x)`` `(m,)` and ``δ = sqrt(k(x,x) - ‖l‖²)`` (clamped at 0).

        Args:
            x: `(1, d)` candidate.
            k_xI: optional precomputed `(m,)` float64 ``k(I, x)``.
            k_xx: optional precomputed ``k(x, x)``.
        """
        kxx = (float(self.kernel.diag(x.to(torch.float64)).to(torch.float64).reshape(())) if k_xx is None
               else float(k_xx))
        kI = self.kernel_to_dictionary(x)[0] if k_xI is None else k_xI
        l = self.features(x, kI.reshape(1, -1))[0]  # (m,)
        return l, max(kxx - float(l @ l), 0.0) ** 0.5

    def new_direction_moments(self, x: torch.Tensor, l: torch.Tensor, delta: float) -> tuple[torch.Tensor, float,
                                                                                             float]:
        """Moments of the new coordinate ``e`` (of candidate ``x``) over the recorded history.

        Args:
            x: `(1, d)` candidate about to be appended.
            l: `(m,)` its current coordinates.
            delta: its residual norm ``δ > 0``.

        Returns:
            ``(c, ee, ye)``: `(m,)` ``Σ_s φ̃(x_s) e(x_s)``, ``Σ_s e(x_s)²`` and ``Σ_s y_s e(x_s)``.
        """
        m, dev = self.size, x.device
        x = x.to(torch.float64)
        g = torch.zeros(m, dtype=torch.float64, device=dev)  # Σ_s k_I(x_s) e_s
        ee = torch.zeros((), dtype=torch.float64, device=dev)
        ye = torch.zeros((), dtype=torch.float64, device=dev)
        if self.history_size == 0:
            return g, 0.0, 0.0
        alpha = self._T.T @ l if m else l  # (m,): K_I⁻¹ k_I(x)
        Xh, yh = self._X.data, self._y.data
        cols = torch.cat([self.points, x]) if m else x  # (m + 1, d): one kernel call per chunk
        for i in range(0, Xh.shape[0], self.chunk_size):
            Kc = self.kernel(Xh[i : i + self.chunk_size], cols).to(torch.float64)  # (c, m + 1)
            KcI, kc = Kc[:, :m], Kc[:, m]
            e = (kc - KcI @ alpha) / delta if m else kc / delta  # (c,) new coordinate of each past input
            if m:
                g += KcI.T @ e
            ee += e @ e
            ye += yh[i : i + self.chunk_size] @ e
        c = self._T @ g if m else g  # (m,): L⁻¹ Σ k_I(x_s) e_s = Σ φ̃(x_s) e_s
        return c, float(ee), float(ye)

    def append(self, x: torch.Tensor, l: torch.Tensor, delta: float) -> None:
        """Add ``x`` (with its :meth:`residual` ``(l, δ)``, ``δ > 0``) as a new direction."""
        if not (0 < delta < math.inf):
            raise InputDataError(f"delta: expected a finite residual norm > 0 (a new direction), got {delta!r}")
        if not bool(torch.isfinite(l).all()):
            raise InputDataError("l: expected finite coordinates, got NaN/inf")
        m = self.size
        T = torch.zeros((m + 1, m + 1), dtype=torch.float64, device=x.device)
        if m:
            T[:m, :m] = self._T
            T[m, :m] = -(l @ self._T) / delta  # last row of [[L, 0], [lᵀ, δ]]⁻¹
        T[m, m] = 1.0 / delta
        self._T = T
        x = x.detach().to(torch.float64)
        self.points = x.clone() if m == 0 else torch.cat([self.points, x], dim=0)

    def record(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Append past rounds `(k, d)`, `(k,)` to the history."""
        if self._X is None:
            self._X = GrowableRows((X.shape[-1],), torch.float64, X.device)
            self._y = GrowableRows((), torch.float64, X.device)
        self._X.append(X.to(torch.float64))
        self._y.append(y.to(torch.float64))


def offer_to_kors(kors, basis: IncrementalNystromBasis, cols: torch.Tensor, x: torch.Tensor, index: int,
                  rtol: float, *, moments: bool = False) -> tuple[torch.Tensor, bool, float | None, tuple | None]:
    """Offer `(1, d)` ``x`` to a KORS dictionary whose points ``cols`` span ``basis``: the step PKAWV and
    Pros-N-KONS share.

    Args:
        kors: the :class:`~torchbkb.online.KORSDictionary` (``x`` joins it when sampled).
        basis: the orthonormal coordinates of the span of the KORS points at positions ``cols``.
        cols: `(m,)` long, the KORS positions of the basis points.
        x: `(1, d)` the new input. index: its stream position.
        rtol: a sampled point whose squared residual is below ``rtol · k(x, x)`` adds no direction.
        moments: also compute a new direction's :meth:`IncrementalNystromBasis.new_direction_moments`.

    Returns:
        ``(l, added, delta, mom)``: `(m,)` ``φ̃(x)`` in the current basis, whether KORS added ``x``, the residual
        norm ``δ > 0`` when ``x`` is a new direction (``None`` otherwise; the caller appends it to ``basis``), and
        with ``moments`` the new direction's moments (``None`` when there is none).

    Raises:
        NumericsError: ``x``'s kernel values (against the dictionary, itself, or with ``moments`` the history) hold
            NaN/inf. Nothing changed: the values are checked before the add, and a draw already made is put back.
    """
    k_all, kxx = kors.checked_kernel_values(x)  # (m_kors,) float64
    last_p = kors.last_probability
    p = kors.probability_from_kernel(k_all, kxx)
    l = basis.features(x, k_all[cols].reshape(1, -1))[0]  # (m,)
    draws = kors.generator.get_state() if moments else None
    if not kors.draw_uniform() < p:
        return l, False, None, None
    delta2 = kxx - float(l @ l)
    delta = delta2**0.5 if delta2 > rtol * kxx else None
    mom = None
    if moments and delta is not None:
        mom = basis.new_direction_moments(x, l, delta)
        if not math.isfinite(mom[1] + mom[2] + float(mom[0].sum())):
            kors.generator.set_state(draws)
            kors.last_probability = last_p
            raise nonfinite_values_error("kernel", "values k(x, x_s) of the new input x against the past inputs")
    kors.add(x, p, index, k_xI=k_all, k_xx=kxx)
    return l, True, delta, mom
