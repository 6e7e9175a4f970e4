"""PKAWV: Kernel-AWV projected on a subspace (004 Eq. 4), with a fixed embedding or a KORS Nyström dictionary.

At round ``t`` PKAWV forecasts ``ŷ_t = f̂_t(x_t)`` with

    f̂_t = argmin_{f ∈ H̃_t}  Σ_{s<t} (y_s - f(x_s))² + λ‖f‖² + f(x_t)²,

which, in orthonormal coordinates ``φ̃`` of ``H̃_t`` (004 App. H, Eq. 37), is linear AWV:

    ŷ_t = φ̃_tᵀ A_t⁻¹ b_{t-1},   A_t = Σ_{s<=t} φ̃_s φ̃_sᵀ + λ I   (the current input is included),
    b_{t-1} = Σ_{s<t} y_s φ̃_s.

* **Fixed embedding** (``PKAWV(embedding=..., lam=...)``, 004 Sec. 3.1 / App. H Alg. 1): ``φ̃`` is any
  feature map with orthonormal basis functions -- :class:`~torchbkb.online.TaylorEmbedding` (Eq. 6),
  a :class:`~torchbkb.NystromEmbedding` on a dictionary known beforehand (``dictionary=<tensor>``) --
  and ``A_t⁻¹`` is kept by Sherman–Morrison, ``O(D²)`` per round. ``fit_stream``/``update`` process a
  chunk of ``B`` rounds at once with the exact Woodbury identity (same forecasts, matrix-matrix
  products instead of ``B`` rank-one updates).
* **Nyström with KORS** (``PKAWV(kernel=..., lam=..., dictionary="kors", mu=..., beta=..., epsilon=...)``,
  004 Sec. 3.2 / App. H Alg. 2): on receiving ``x_t`` KORS (:class:`~torchbkb.online.KORSDictionary`)
  decides whether ``x_t`` joins ``I_t``; ``H̃_t = span{φ(x̃): x̃ ∈ I_t}``. When it grows, the new
  orthonormal direction is appended (:class:`~torchbkb.online.IncrementalNystromBasis`) and ``A``,
  ``A⁻¹`` and ``b`` gain one row and column (block inverse, ``O(m²)`` plus one pass over the history);
  otherwise a round costs ``O(m²)``.

``awv=False`` drops the ``f(x_t)²`` term (the "Projected-KRR" of the paper's i.i.d. experiments).

Example:
    >>> import torch
    >>> from torchbkb.online import PKAWV, TaylorEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(300, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    >>> y = torch.cos(2 * X[:, 0]) - X[:, 1] ** 2
    >>> taylor = PKAWV(embedding=TaylorEmbedding(2, degree=3), lam=1.0)
    >>> nys = PKAWV(kernel=GaussianKernel(1.0), lam=1.0, dictionary="kors", mu=1.0, beta=1.0, seed=0)
    >>> r1, r2 = taylor.fit_stream(X, y), nys.fit_stream(X, y)
    >>> taylor.num_features, nys.num_features == len(nys.dictionary) < 80
    (10, True)
    >>> bool(r1.average_loss < 0.1 and r2.average_loss < 0.1)
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchbkb.errors import InputDataError, NumericsError, check_positive, nonfinite_values_error
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.online.kors import KORSDictionary
from torchbkb.online.nystrom_basis import IncrementalNystromBasis, offer_to_kors
from torchbkb.online.saved_learner import check_bound_buffers, saved_counts
from torchbkb.online.stream import OnlineLearner
from torchbkb.gp.linalg import compute_dtype, safe_cholesky

__all__ = ["PKAWV"]

#: Chunks shorter than this run as rank-one rounds (the blocked algebra only pays off for larger blocks).
BLOCK_MIN = 8


class PKAWV(OnlineLearner):
    """Projected Kernel-AWV forecaster (004 Eq. 4).

    Args:
        embedding: a feature map `(n, d) -> (n, D)` whose coordinates are orthonormal in the RKHS
            (e.g. :class:`~torchbkb.online.TaylorEmbedding`). Exclusive with ``kernel``.
        lam: regularization ``λ > 0``.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor`` for the Nyström variant.
        dictionary: with ``kernel``: ``"kors"`` (online KORS dictionary) or an `(m, d)` tensor of
            inducing points known beforehand (then a fixed :class:`~torchbkb.NystromEmbedding`).
        mu, beta, epsilon: KORS parameters ``μ, β > 0``, ``ε >= 0`` (004 Prop. 5; the paper's experiments
            use ``μ = β = 1``, ``ε = 1/2``).
        awv: keep the AWV term ``f(x_t)²`` (``False``: projected kernel ridge regression).
        generator, seed: randomness of KORS.
        history_chunk: rows of the history processed at once when the KORS dictionary grows.
        new_direction_rtol: a point sampled by KORS whose squared residual ``k(x,x) - ‖φ̃(x)‖²`` is below
            ``new_direction_rtol · k(x,x)`` is numerically in ``H̃_t`` already: it joins the KORS
            dictionary (its weight matters for later scores) but adds no direction (counted in
            :attr:`num_skipped`; in exact arithmetic the span would not change either).

    Attributes:
        lam: float64 buffer ``λ``.
        precision: `(D, D)` buffer ``A⁻¹`` of the rounds learned so far (float64 unless ``D`` is huge).
        b: `(D,)` buffer ``Σ y_s φ̃_s``.
        dictionary: the :class:`~torchbkb.online.KORSDictionary` (``None`` for a fixed embedding).

    Example:
        >>> import torch
        >>> from torchbkb.online import TaylorEmbedding
        >>> f = PKAWV(embedding=TaylorEmbedding(1, degree=2), lam=1.0)
        >>> x = torch.tensor([[0.0]])
        >>> f.step(x, torch.tensor([1.0]))      # φ = (1, 0, 0): ŷ = φᵀ(φφᵀ + I)⁻¹·0
        tensor([0.])
        >>> f.predict(x)                         # φᵀ(2φφᵀ + I)⁻¹ φ·1 = 1/3
        tensor([0.3333])
    """

    def __init__(
        self,
        embedding: Callable | None = None,
        lam: float = 1.0,
        *,
        kernel: Callable | None = None,
        dictionary: str | torch.Tensor | None = None,
        mu: float = 1.0,
        beta: float = 1.0,
        epsilon: float = 0.5,
        awv: bool = True,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        history_chunk: int = 16384,
        new_direction_rtol: float = 1e-9,
    ):
        super().__init__()
        self.register_buffer("lam", torch.tensor(check_positive(lam, "lam"), dtype=torch.float64))
        if not isinstance(awv, bool):
            raise InputDataError(f"awv: expected True or False, got {awv!r}")
        self.awv = awv
        if (embedding is None) == (kernel is None):
            raise InputDataError(
                "expected exactly one of embedding=... (fixed features) or kernel=... (Nyström), "
                f"got embedding={type(embedding).__name__}, kernel={type(kernel).__name__}"
            )
        self.dictionary: KORSDictionary | None = None
        self.basis: IncrementalNystromBasis | None = None
        if embedding is not None:
            if dictionary is not None:
                raise InputDataError(f"dictionary: expected None with a fixed embedding, got {dictionary!r}")
            if not callable(embedding):
                raise InputDataError(f"embedding: expected a callable (n, d) -> (n, D), got {type(embedding).__name__}")
        elif isinstance(dictionary, torch.Tensor):
            embedding = NystromEmbedding(kernel, dictionary)
        elif dictionary == "kors":
            self.dictionary = KORSDictionary(kernel, mu=mu, beta=beta, epsilon=epsilon, generator=generator, seed=seed)
            self.basis = IncrementalNystromBasis(self.dictionary.kernel, chunk_size=history_chunk)
        else:
            raise InputDataError(f"dictionary: expected 'kors' or an (m, d) tensor of inducing points, got "
                                 f"{dictionary!r}")
        self.embedding = embedding
        rtol = float(new_direction_rtol)
        if not 0.0 <= rtol < 1.0:
            raise InputDataError(f"new_direction_rtol: expected a number in [0, 1), got {new_direction_rtol!r}")
        self.new_direction_rtol = rtol
        self.register_buffer("precision", None)  # (D, D) A⁻¹
        self.register_buffer("b", None)  # (D,)
        self.register_buffer("_cols", torch.zeros(0, dtype=torch.long))  # KORS positions of the basis points
        self.num_skipped = 0
        self._offered = 0  # inputs offered to KORS (stream positions of dictionary points)

    grown_buffers = ("precision", "b", "_cols")

    # ------------------------------------------------------------------ info
    @property
    def num_features(self) -> int:
        """``D``: the dimension of ``H̃_t`` (the dictionary size for KORS; 0 before the first input)."""
        return 0 if self.b is None else int(self.b.shape[0])

    @property
    def basis_indices(self) -> torch.Tensor | None:
        """Stream positions of the points spanning ``H̃_t`` (KORS points minus the skipped ones)."""
        return None if self.dictionary is None else self.dictionary.indices[self._cols]

    def _expected_dim(self) -> int | None:
        d = getattr(self.embedding, "dim", None)
        return d if isinstance(d, int) else None

    # ------------------------------------------------------------------ hooks
    def _own_state(self) -> dict:
        return {"num_skipped": self.num_skipped, "offered": self._offered}

    def _load_own(self, own: dict, device: torch.device) -> None:
        self.num_skipped, self._offered = saved_counts(own, ("num_skipped", "offered"))
        D = self.num_features
        check_bound_buffers(self, {"precision": (D, D), "b": (D,)})

    def _init_state(self, X: torch.Tensor) -> None:
        if self.embedding is not None:
            D = self._embed(X[:1]).shape[-1]
            dtype = compute_dtype(X.dtype, D)
        else:
            D, dtype = 0, torch.float64
            self._cols = self._cols.to(X.device)
        self.precision = torch.eye(D, dtype=dtype, device=X.device) / float(self.lam)
        self.b = torch.zeros(D, dtype=dtype, device=X.device)

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        F = self.embedding(X)
        if not isinstance(F, torch.Tensor) or F.dim() != 2 or F.shape[0] != X.shape[0]:
            raise InputDataError(
                f"embedding: expected an (n, D) tensor for (n, d) inputs, got {getattr(F, 'shape', type(F).__name__)} "
                f"for {tuple(X.shape)}"
            )
        dtype = self.precision.dtype if self.precision is not None else compute_dtype(X.dtype, F.shape[-1])
        return F.to(dtype)

    def _predict(self, X: torch.Tensor) -> torch.Tensor:
        F = self._embed(X) if self.embedding is not None else self.basis.features(X)  # (n, D)
        PF = F @ self.precision  # (n, D): rows (A⁻¹ φ)ᵀ, A symmetric
        num = PF @ self.b  # (n,)
        if not self.awv:
            return num
        return num / (1.0 + (PF * F).sum(-1))  # φᵀ(A + φφᵀ)⁻¹b = φᵀA⁻¹b / (1 + φᵀA⁻¹φ)

    def _round(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            return self._rank_one(self._embed(x)[0], y)
        v = self._kors_features(x)  # KORS first: I_t may contain x_t (004 App. H, Alg. 2)
        out = self._rank_one(v, y)
        self.basis.record(x, y)
        return out

    def _stream_block(self, X: torch.Tensor, y: torch.Tensor, deadline: float | None) -> torch.Tensor:
        if self.embedding is None or X.shape[0] < BLOCK_MIN:
            return super()._stream_block(X, y, deadline)
        F, yy = self._embed(X), y.to(self.b.dtype)  # (n, D), (n,)
        good = int(torch.isfinite(F).all(-1).to(torch.int64).cumprod(0).sum())  # rows before a non-finite one
        # Woodbury blocks cost ~2D² + 2bD + 2b² flops per round: b ~ D/4 balances them (measured on CPU)
        b = 64 if F.shape[1] < 300 else 128
        out = []
        for i in range(0, good, b):
            try:
                out.append(self._woodbury_block(F[i : min(i + b, good)], yy[i : min(i + b, good)]))
            except NumericsError as err:  # raised before the block wrote anything
                err.rows, err.forecasts = (i,), torch.cat(out) if out else F.new_empty(0)
                raise
        if good < F.shape[0]:
            err = nonfinite_values_error("embedding", "features of the new input x")
            err.rows, err.forecasts = (good,), torch.cat(out) if out else F.new_empty(0)
            raise err
        return torch.cat(out)

    # ------------------------------------------------------------------ linear AWV algebra
    def _rank_one(self, v: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One round on features `(D,)`: forecast, then Sherman–Morrison ``A⁻¹ ← (A + vvᵀ)⁻¹`` and
        ``b += y v``."""
        P, b = self.precision, self.b
        Pv = P @ v  # (D,)
        s = 1.0 + v @ Pv
        if not math.isfinite(s.item()):  # NaN/inf iff a feature is (A⁻¹ is positive definite); before any write
            raise nonfinite_values_error("embedding", "features of the new input x")
        yhat = (Pv @ b) / s if self.awv else Pv @ b
        P.sub_(torch.outer(Pv, Pv / s))
        b.add_(v * y.to(b.dtype))
        return yhat.reshape(1)

    def _woodbury_block(self, F: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``B`` consecutive rounds at once, exactly.

        With ``P = A_0⁻¹``, ``K = F P Fᵀ`` and ``I + K = L Lᵀ``, Woodbury on the first ``t`` rows gives
        ``ŷ_t = q_t - Σ_{i<=t} (L⁻¹K)_{it} (L⁻¹W)_{it}`` where ``W[:, t] = F P (b_0 + Σ_{s<t} y_s φ_s)``
        and ``q_t = W_{tt}`` (leading blocks of a Cholesky factor are the factors of leading blocks);
        without the AWV term the sum stops at ``i < t``.

        Args:
            F: `(B, D)` features. y: `(B,)` outputs (state dtype).

        Returns:
            `(B,)` forecasts.
        """
        P, b = self.precision, self.b
        B = F.shape[0]
        G = F @ P  # (B, D)
        K = G @ F.T  # (B, B)
        K = 0.5 * (K + K.T)
        eye = torch.eye(B, dtype=K.dtype, device=K.device)
        L = safe_cholesky(K + eye, name="I + F A⁻¹ Fᵀ").to(K.dtype)  # (B, B)
        ar = torch.arange(B, device=K.device)
        # (B, B): [s, t] iff s < t (no triu: it is parallelized even when tiny)
        strict = ar.unsqueeze(1) < ar.unsqueeze(0)
        csum = torch.cumsum(K * y.unsqueeze(0), dim=1)  # (B, B): [:, t] = Σ_{s<=t} K[:, s] y_s
        # [:, t] = F P b_{t-1}
        W = torch.cat([torch.zeros_like(csum[:, :1]), csum[:, :-1]], dim=1) + (G @ b).unsqueeze(1)
        sol = torch.linalg.solve_triangular(L, torch.cat([K, W, G], dim=1), upper=False)  # (B, 2B + D)
        U, V, Z = sol[:, :B], sol[:, B : 2 * B], sol[:, 2 * B :]
        upper = (ar.unsqueeze(1) <= ar.unsqueeze(0)) if self.awv else strict  # i <= t (AWV) or i < t (KRR)
        corr = (U * V * upper).sum(0)  # (B,)
        yhat = W.diagonal() - corr
        P.sub_(Z.T @ Z)  # P ← P - P Fᵀ (I + K)⁻¹ F P
        P.copy_(0.5 * (P + P.T))
        b.add_(F.T @ y)
        return yhat

    # ------------------------------------------------------------------ Nyström / KORS
    def _kors_features(self, x: torch.Tensor) -> torch.Tensor:
        """Offer ``x`` to KORS, grow ``H̃`` if it is sampled, return ``φ̃(x)`` `(m,)` in the current basis."""
        kors, basis = self.dictionary, self.basis
        l, added, delta, mom = offer_to_kors(kors, basis, self._cols, x, self._offered, self.new_direction_rtol,
                                             moments=True)
        self._offered += 1
        if delta is None:  # not sampled, or numerically in H̃ already: the span does not change
            self.num_skipped += int(added)
            return l
        c, ee, ye = mom  # the new coordinate's moments over the rounds s < t
        self._grow(c, ee + float(self.lam), ye)
        basis.append(x, l, delta)
        self._cols = torch.cat([self._cols, self._cols.new_tensor([len(kors) - 1])])
        return torch.cat([l, l.new_tensor([delta])])  # the new point's own coordinates

    def _grow(self, c: torch.Tensor, d: float, yb: float) -> None:
        """``A ← [[A, c], [cᵀ, d]]``, ``b ← [b, yb]``; ``A⁻¹`` by the block (Schur complement) inverse."""
        P, m = self.precision, self.num_features
        Pc = P @ c  # (m,)
        sig = max(d - float(c @ Pc), float(self.lam))  # Schur complement of a matrix >= λI is >= λ
        new = torch.empty((m + 1, m + 1), dtype=P.dtype, device=P.device)
        new[:m, :m] = P + torch.outer(Pc, Pc) / sig
        new[:m, m] = -Pc / sig
        new[m, :m] = -Pc / sig
        new[m, m] = 1.0 / sig
        self.precision = new
        self.b = torch.cat([self.b, self.b.new_tensor([yb])])
