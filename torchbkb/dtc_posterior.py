"""The DTC (deterministic training conditional) posterior on a Nyström embedding -- BKB's posterior.

With ``z = NystromEmbedding(S)``, pulled points ``X`` weighted by pull counts ``c`` and rewards ``y``
(``y_i`` the mean of the ``c_i`` rewards observed at ``x_i``)::

    V      = Zᵀ C Z + λ I                                   (r × r, r = rank of K_S)
    μ̃(x)   = z(x)ᵀ V⁻¹ Zᵀ C y
    σ̃²(x)  = (k(x, x) - ‖z(x)‖²) / λ + z(x)ᵀ V⁻¹ z(x)      RLS scale (000 Eq. 4, 001 Eq. 2)
    var(x) = λ · σ̃²(x)                                      GP scale (003 Eq. 4, the DTC variance)
    cov(x, x') = k(x, x') - z(x)ᵀ z(x') + λ z(x)ᵀ V⁻¹ z(x')   GP scale, joint

With ``S`` equal to the pulled points, ``var`` is the exact GP posterior variance.

Only ``r × r`` matrices are ever factorized (in float64 for float32 inputs); scoring ``n`` points
costs one `(n × r)·(r × r)` product plus ``O(n·r)``, chunked over ``n``.

Example:
    >>> import torch
    >>> from torchbkb import DTCPosterior, ExactPosterior, NystromEmbedding
    >>> from torchbkb.kernels import GaussianKernel
    >>> X = torch.rand(20, 2, dtype=torch.float64); y = torch.sin(6 * X[:, 0])
    >>> k = GaussianKernel(0.3)
    >>> post = DTCPosterior(NystromEmbedding(k, X), noise=0.1).fit(X, y)   # S = X: exact GP
    >>> mean, var = post(torch.rand(5, 2, dtype=torch.float64))
    >>> exact = ExactPosterior(k, noise=0.1).fit(X, y)
    >>> Xq = torch.rand(5, 2, dtype=torch.float64)
    >>> all(torch.allclose(a, b) for a, b in zip(post(Xq), exact(Xq)))
    True
    >>> bool(torch.allclose(post.rls(Xq), post(Xq)[1] / 0.1))
    True
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from torchbkb.errors import InputDataError, TorchBKBError, check_finite, check_positive
from torchbkb.nystrom import NystromEmbedding
from torchbkb.stable_scoring import AccuracyMonitor, feature_rls, stable_factor, whiten_rows
from torchbkb.utils.linalg import check_units, compute_dtype, keep_dtype_on_apply, safe_cholesky, spd_inverse

__all__ = ["DTCPosterior", "RankOneDowndate", "ridge_solve", "scoring_operator", "score_kernel_rows", "score_kernel_columns", "rls_kernel_columns", "fit_kernel_row_operator"]


class RankOneDowndate(NamedTuple):
    """What a rank-one update ``V ← V + c·z zᵀ`` does to every quadratic form ``aᵀ V⁻¹ a``.

    ``aᵀ V_new⁻¹ a = aᵀ V_old⁻¹ a - coef · (aᵀ direction)²``, so cached RLS variances of embedded arms
    ``Z_A`` are downdated in ``O(A·r)`` by ``rls -= coef * (Z_A @ direction) ** 2``.

    Attributes:
        direction: `(*b, r)` ``u = V_old⁻¹ z`` (compute dtype).
        coef: `(*b,)` ``c / (1 + c · zᵀ u)``.
    """

    direction: torch.Tensor
    coef: torch.Tensor


class DTCPosterior(nn.Module):
    """DTC posterior of a zero-mean GP with Gaussian noise ``λ`` on a :class:`NystromEmbedding`.

    The training set may carry leading batch dimensions (`(*b, n, d)`, independent posteriors, as
    BoTorch's fantasies need); queries `(*b', q, d)` broadcast against them.

    Args:
        embedding: the Nyström embedding (its dictionary can be replaced with :meth:`set_inducing_points`).
        noise: ``λ > 0``, the regularization (= noise variance in the GP reading).
        refactor_every: rank-one updates between two exact refactorizations of ``V``.
        chunk_size: query points scored at once (default: the embedding's ``chunk_size``).

    Example:
        >>> import torch
        >>> from torchbkb.kernels import GaussianKernel
        >>> X = torch.rand(30, 1, dtype=torch.float64); y = X[:, 0] ** 2
        >>> post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[:5]), noise=0.01).fit(X, y)
        >>> refit = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[:5]), noise=0.01).fit(X[:29], y[:29])
        >>> _ = refit.update(X[29:], y[29:])               # rank-one update == refit
        >>> Xq = torch.linspace(0, 1, 7, dtype=torch.float64)[:, None]
        >>> bool(torch.allclose(post(Xq)[1], refit(Xq)[1]))
        True
    """

    def __init__(
        self,
        embedding: NystromEmbedding,
        noise: float,
        *,
        refactor_every: int = 64,
        chunk_size: int | None = None,
    ):
        super().__init__()
        if not isinstance(embedding, NystromEmbedding):
            raise InputDataError(f"embedding: expected a NystromEmbedding, got {type(embedding).__name__}")
        if int(refactor_every) < 1:
            raise InputDataError(f"refactor_every: expected an integer >= 1, got {refactor_every!r}")
        self.embedding = embedding
        self.register_buffer("noise", torch.tensor(check_positive(noise, "noise"), dtype=torch.float64))
        self.refactor_every = int(refactor_every)
        self.chunk_size = int(chunk_size or embedding.chunk_size)
        self._precision = AccuracyMonitor("DTCPosterior")  # float32 kernel values vs a float64 reference
        S = embedding.inducing_points
        with torch.no_grad():
            check_units(float(embedding.kernel_diag(S).max()), self.lam, S.dtype, "DTCPosterior")
        empty_X = S.new_empty((0, embedding.dim))
        self._set_state(self._build(empty_X, S.new_empty((0,)), S.new_empty((0,))), empty_X, S.new_empty((0,)), S.new_empty((0,)), empty_X, S.new_empty((0,)))

    # ------------------------------------------------------------------ properties
    @property
    def lam(self) -> float:
        """``λ`` as a Python float."""
        return float(self.noise)

    @property
    def num_train(self) -> int:
        """Number of observed rows (pending, hallucinated rows not included)."""
        return int(self.train_X.shape[-2])

    @property
    def batch_shape(self) -> torch.Size:
        """Leading batch shape of the training data."""
        return self.train_X.shape[:-2]

    def _apply(self, fn, recurse: bool = True):
        # .to(dtype) moves the float64 r×r state across devices but never rounds it
        before = (self.V_inv, self.weights, self.embedding.projection)
        out = keep_dtype_on_apply(self, ("ZtZ", "Zty", "V_inv", "weights", "noise"), fn, recurse, super()._apply)
        if any(a is not b for a, b in zip(before, (self.V_inv, self.weights, self.embedding.projection))):
            self._op = None  # moved or cast: the scoring operator is derived again (a no-op .to() keeps it:
        return out  # BoTorch's analytic acquisitions call .to(X) on every forward)

    # ------------------------------------------------------------------ fitting
    def fit(
        self,
        X: torch.Tensor,
        y: torch.Tensor,
        counts: torch.Tensor | None = None,
        *,
        features: torch.Tensor | None = None,
    ) -> "DTCPosterior":
        """Condition on observed data (replacing any previous data and pending points).

        Args:
            X: `(*b, n, d)` pulled points (``n`` may be 0).
            y: `(*b, n)` rewards; with ``counts``, ``y_i`` is the **mean** of the ``counts_i`` rewards at ``x_i``.
            counts: `(*b, n)` positive pull counts (weights); default all ones.
            features: optional `(*b, n, r)` ``z(X)`` already computed with this embedding (bandits cache
                the embedding of all arms); skips re-embedding ``X``.

        Returns:
            ``self``.
        """
        X, y, counts = self._check_data(X, y, counts, "X", "y")
        if features is not None and (not isinstance(features, torch.Tensor) or features.shape != (*X.shape[:-1], self.embedding.rank)):
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise InputDataError(f"features: expected shape {(*X.shape[:-1], self.embedding.rank)}, got {got}")
        return self._fit_validated(X, y, counts, features)

    def _fit_validated(self, X, y, counts, features=None) -> "DTCPosterior":
        """:meth:`fit` without input checks, for callers that validated their data once (the bandits)."""
        state = self._build(X, y, counts, features=features)
        self._set_state(state, X, y, counts, X.new_empty((*X.shape[:-2], 0, X.shape[-1])), X.new_empty((*X.shape[:-2], 0)))
        return self

    def refit(self) -> "DTCPosterior":
        """Re-embed the stored data (observed and pending) with the embedding's current dictionary."""
        X_all = torch.cat([self.train_X, self.pending_X], dim=-2)
        w_all = torch.cat([self.train_counts, self.pending_counts], dim=-1)
        y_all = torch.cat([self.train_y, self.train_y.new_zeros(self.pending_counts.shape)], dim=-1)
        n_obs = self.num_train
        # pending rows are hallucinated: they enter V but their pseudo-reward is the posterior mean
        state = self._build(X_all, y_all, w_all, n_observed=n_obs)
        self._set_state(state, self.train_X, self.train_y, self.train_counts, self.pending_X, self.pending_counts)
        return self

    def set_inducing_points(self, inducing_points: torch.Tensor) -> "DTCPosterior":
        """Replace the dictionary and refit on the stored data. On error nothing changes."""
        old = (self.embedding.inducing_points, self.embedding.projection, self.embedding.version)
        self.embedding.set_inducing_points(inducing_points)
        try:
            return self.refit()
        except Exception:
            self.embedding.inducing_points, self.embedding.projection, self.embedding.version = old
            raise

    # ------------------------------------------------------------------ updates
    def update(self, x: torch.Tensor, y: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> RankOneDowndate | None:
        """Add points by rank-one updates of ``V⁻¹`` (periodically refactorized exactly).

        With ``y=None`` the points are *hallucinated* (BBKB/GP-BUCB): they are conditioned on with a
        pseudo-reward equal to the current posterior mean, which leaves ``μ̃`` exactly unchanged and makes
        the variance exact for the enlarged design.

        Args:
            x: `(*b, k, d)` or `(d,)` new points.
            y: `(*b, k)` rewards (means over ``counts``), or ``None`` to hallucinate.
            counts: `(*b, k)` positive weights; default ones.

        Returns:
            For a single point, the :class:`RankOneDowndate` that maps old quadratic forms to new ones
            (``None`` when several points were added).
        """
        if isinstance(x, torch.Tensor) and x.dim() == 1:
            x = x.unsqueeze(0)  # (1, d)
            if y is not None and isinstance(y, torch.Tensor) and y.dim() == 0:
                y = y.reshape(1)
            if counts is not None and isinstance(counts, torch.Tensor) and counts.dim() == 0:
                counts = counts.reshape(1)
        self._check_fresh()
        x, y_chk, counts = self._check_data(x, y, counts, "x", "y", allow_none_y=True)
        with torch.no_grad():
            Z = self.embedding(x)  # (*b, k, r)
        result = self.update_features(Z, y_chk, counts)
        if y_chk is None:
            self.pending_X = torch.cat([self.pending_X.expand(*x.shape[:-2], *self.pending_X.shape[-2:]), x], dim=-2)
            self.pending_counts = torch.cat([self.pending_counts.expand(*x.shape[:-2], self.pending_counts.shape[-1]), counts], dim=-1)
        else:
            self.train_X = torch.cat([self.train_X.expand(*x.shape[:-2], *self.train_X.shape[-2:]), x], dim=-2)
            self.train_y = torch.cat([self.train_y.expand(*x.shape[:-2], self.train_y.shape[-1]), y_chk], dim=-1)
            self.train_counts = torch.cat([self.train_counts.expand(*x.shape[:-2], self.train_counts.shape[-1]), counts], dim=-1)
        return result

    def update_features(self, Z: torch.Tensor, y: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> RankOneDowndate | None:
        """:meth:`update` on already-embedded points (no stored data is appended; used by bandits that
        keep their own record and embed their arms once).

        Args:
            Z: `(*b, k, r)` features in the compute dtype (see :attr:`ZtZ`).
            y: `(*b, k)` or ``None`` (hallucinated).
            counts: `(*b, k)` positive weights; default ones.

        Returns:
            The :class:`RankOneDowndate` of the last point when ``k == 1``, else ``None``.
        """
        if Z.dim() == 1:
            Z = Z.unsqueeze(0)
        Z = Z.to(self.ZtZ.dtype)
        k = Z.shape[-2]
        c = torch.ones(Z.shape[:-1], dtype=Z.dtype, device=Z.device) if counts is None else counts.to(Z.dtype)
        ZtZ = self.ZtZ + (Z.transpose(-1, -2) * c.unsqueeze(-2)) @ Z  # (*b, r, r)
        if y is None:
            y_eff = (Z @ self.weights.unsqueeze(-1)).squeeze(-1)  # (*b, k): pseudo-reward = current mean
        else:
            y_eff = y.to(Z.dtype)
        Zty = self.Zty + ((c * y_eff).unsqueeze(-2) @ Z).squeeze(-2)  # (*b, r)
        self._since_refactor += k
        result = None
        if self._since_refactor >= self.refactor_every or k > 4:
            V_inv = spd_inverse(_add_diag(ZtZ, self.lam), name="V")
            self._since_refactor = 0
            if k == 1:
                u = (self.V_inv @ Z[..., 0, :].unsqueeze(-1)).squeeze(-1)
                result = RankOneDowndate(u, c[..., 0] / (1.0 + c[..., 0] * (Z[..., 0, :] * u).sum(-1)))
        else:
            V_inv = self.V_inv
            for j in range(k):  # k <= 4 Sherman-Morrison steps, O(r²) each
                z, cj = Z[..., j, :], c[..., j]
                u = (V_inv @ z.unsqueeze(-1)).squeeze(-1)  # (*b, r)
                coef = cj / (1.0 + cj * (z * u).sum(-1))  # (*b,)
                V_inv = V_inv - coef[..., None, None] * (u.unsqueeze(-1) * u.unsqueeze(-2))
                result = RankOneDowndate(u, coef)
            if k != 1:
                result = None
        self.ZtZ, self.Zty, self.V_inv = ZtZ, Zty, V_inv
        self._op = None
        if y is not None:
            self.weights = (V_inv @ Zty.unsqueeze(-1)).squeeze(-1)  # (*b, r)
        return result

    # ------------------------------------------------------------------ prediction
    def forward(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and **GP-scale** variance ``λ·σ̃²``.

        Args:
            Xq: `(*b, q, d)` query points (dtype/device of the inducing points).

        Returns:
            ``(mean, var)``, each `(*b, q)` in ``Xq``'s dtype; differentiable w.r.t. ``Xq``.
        """
        mean, rls = self._mean_rls(Xq)
        return mean, rls * self.lam

    def rls(self, Xq: torch.Tensor) -> torch.Tensor:
        """The papers' ``σ̃²`` (RLS scale) = GP-scale variance / λ, shape `(*b, q)`."""
        return self._mean_rls(Xq)[1]

    def mean(self, Xq: torch.Tensor) -> torch.Tensor:
        """Posterior mean ``μ̃``, shape `(*b, q)`."""
        return self._mean_rls(Xq)[0]

    def score_embedded(self, Z: torch.Tensor, kdiag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and **RLS-scale** variance of already-embedded points (BKB caches the arms' embedding).

        Args:
            Z: `(*b, n, r)` features ``z(x)`` from this posterior's embedding.
            kdiag: `(*b, n)` prior variances ``k(x, x)``.

        Returns:
            ``(mean, rls)``, each `(*b, n)` in ``Z``'s dtype.
        """
        n = Z.shape[-2]
        c = self.chunk_size
        if n <= c:
            return self._score_chunk(Z, kdiag)
        parts = [self._score_chunk(Z[..., i : i + c, :], kdiag[..., i : i + c]) for i in range(0, n, c)]
        return torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=-1)

    def score_cross(self, K: torch.Tensor, kdiag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and **RLS-scale** variance from cross-covariances with the dictionary, without embedding.

        ``σ̃² = k/λ - k_Sᵀ M k_S`` and ``μ̃ = k_Sᵀ a`` (:meth:`_scoring_operator`): one `(n × m)·(m × m)`
        product, chunked over ``n`` -- what a bandit that caches the kernel rows ``k(S, arms)`` needs.

        Args:
            K: `(*b, n, m)` ``k(x, s_j)`` for the inducing points in this embedding's order (a transposed
                view of a cached `(m, n)` block is fine).
            kdiag: `(*b, n)` ``k(x, x)``.

        Returns:
            ``(mean, rls)``, each `(*b, n)` in ``K``'s dtype.
        """
        self._check_fresh()
        M, a = self._scoring_operator(K.dtype)
        return score_kernel_rows(K, kdiag, M, a, self.lam, self.chunk_size)

    def joint(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint DTC posterior over a small set of points, GP scale.

        Args:
            Xq: `(*b, q, d)`.

        Returns:
            ``(mean, cov)`` of shapes `(*b, q)` and `(*b, q, q)`:
            ``cov = K_qq - Z Zᵀ + λ Z V⁻¹ Zᵀ``.
        """
        self._check_fresh()
        self.embedding.check_input(Xq, "Xq")
        K = self.embedding.kernel(Xq, self.embedding.inducing_points)  # (*b, q, m)
        Kqq = self.embedding.kernel(Xq, Xq)  # (*b, q, q)
        stable = self._stable_form()
        if stable is not None:  # the feature form: Kqq - Z Zᵀ + λ (L⁻¹Zᵀ)ᵀ (L⁻¹Zᵀ)
            L, w = stable
            Z = K.to(L.dtype) @ self.embedding.projection.transpose(-1, -2)  # (*b, q, r)
            mean = (Z @ w).squeeze(-1)
            U = whiten_rows(L, Z)  # (*b, q, r)
            cov = (Kqq.to(L.dtype) - Z @ Z.transpose(-1, -2) + self.lam * (U @ U.transpose(-1, -2))).to(Xq.dtype)
            return mean.to(Xq.dtype), 0.5 * (cov + cov.transpose(-1, -2))
        M, a = self._scoring_operator(Xq.dtype)
        mean = (K @ a.unsqueeze(-1)).squeeze(-1)
        # Z Zᵀ - λ Z V⁻¹ Zᵀ = λ K M Kᵀ
        cov = Kqq - self.lam * (K @ M @ K.transpose(-1, -2))
        return mean, 0.5 * (cov + cov.transpose(-1, -2))

    def effective_dimension(self) -> torch.Tensor:
        """``Σ_i c_i σ̃²(x_i)`` over the observed rows (RLS scale) -- the estimate of ``d_eff`` of 000 Eq. 5."""
        if self.num_train == 0:
            return torch.zeros(self.batch_shape, dtype=self.ZtZ.dtype, device=self.ZtZ.device)
        return (self.rls(self.train_X) * self.train_counts).sum(-1)

    # ------------------------------------------------------------------ internals
    def _mean_rls(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_fresh()
        self.embedding.check_input(Xq, "Xq")
        n = Xq.shape[-2]
        c = self.chunk_size
        if n <= c:
            return self._score_points(Xq)
        parts = [self._score_points(Xq[..., i : i + c, :]) for i in range(0, n, c)]
        return torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=-1)

    def _score_points(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score raw points with one `(c × m)·(m × m)` product (:meth:`score_cross`), or in the feature form
        when that one is inaccurate for this posterior (:mod:`torchbkb.stable_scoring`)."""
        K = self.embedding.kernel(Xq, self.embedding.inducing_points)  # (*b, c, m)
        kdiag = self.embedding.kernel_diag(Xq)
        stable = self._stable_form()
        if stable is None:
            return self.score_cross(K, kdiag)
        L, w = stable
        Z = K.to(L.dtype) @ self.embedding.projection.transpose(-1, -2)  # (*b, c, r) features
        return (Z @ w).squeeze(-1).to(Xq.dtype), feature_rls(Z, kdiag, L, self.lam).to(Xq.dtype)

    def _stable_form(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(L, w)`` -- the Cholesky factor of ``V`` and ``w = V⁻¹ Zᵀ C y`` `(*b, r, 1)` -- when the one-product form
        cancels at the dictionary points, else ``None``; decided again after every change of the posterior (with
        the scoring operator). On float32 inputs it also checks the kernel values' precision (:attr:`_precision`)."""
        self._check_fresh()
        M, _ = self._scoring_operator(self.embedding.inducing_points.dtype)
        if self._stable is None:
            S = self.embedding.inducing_points
            with torch.no_grad():
                K_SS = self.embedding.kernel(S, S)  # (m, m)
                L = stable_factor(K_SS, K_SS.diagonal(), self.embedding.projection, M, self.ZtZ, self.lam, S.dtype)
                self._stable = (None if L is None else (L, torch.cholesky_solve(self.Zty.unsqueeze(-1), L)),)
                n = self.num_train + self.pending_X.shape[-2]
                if S.dtype != torch.float64 and self.batch_shape == torch.Size() and n and self._precision.due(n):
                    X = torch.cat([self.train_X, self.pending_X], dim=-2)
                    counts = torch.cat([self.train_counts, self.pending_counts], dim=-1)
                    self._precision.check(self.embedding.kernel, self.rls(S), S, X, counts, self.lam, S.dtype, stacklevel=5)
        stable = self._stable[0]
        if stable is not None and torch.is_grad_enabled() and (self.ZtZ.requires_grad or self.Zty.requires_grad):
            L = safe_cholesky(_add_diag(self.ZtZ, self.lam), name="V")  # conditioned on differentiable data
            return L, torch.cholesky_solve(self.Zty.unsqueeze(-1), L)
        return stable

    def _scoring_operator(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``M = Wᵀ (I/λ - V⁻¹) W`` `(*b, m, m)` and ``a = Wᵀ w`` `(*b, m)` in ``dtype``.

        ``(k(x,x) - ‖z‖²)/λ + zᵀV⁻¹z = k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` for ``z = W k_S(x)``, so raw points are
        scored without forming ``z``. Derived from the state on first use after each change (every state
        change goes through :meth:`_set_state`, :meth:`update_features` or ``_apply``, which drop it).
        """
        if self._op is None:
            self._op = scoring_operator(self.embedding.projection, self.V_inv, self.weights, self.lam)
            self._stable = None  # the choice of the scoring form follows the operator
        M, a = self._op
        return M.to(dtype), a.to(dtype)

    def _score_chunk(self, Z: torch.Tensor, kdiag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        V_inv = self.V_inv.to(Z.dtype)  # (*b, r, r)
        mean = (Z @ self.weights.to(Z.dtype).unsqueeze(-1)).squeeze(-1)  # (*b, c)
        sq = (Z * Z).sum(-1)  # ‖z‖², (*b, c)
        quad = ((Z @ V_inv) * Z).sum(-1)  # zᵀ V⁻¹ z: the one (c×r)(r×r) product
        rls = (kdiag - sq).clamp_min(0.0) / self.lam + quad.clamp_min(0.0)
        return mean, rls

    def _build(self, X, y, counts, n_observed: int | None = None, features: torch.Tensor | None = None) -> dict:
        """ZtZ, Zty, V⁻¹ and weights from scratch (rows past ``n_observed`` are hallucinated), embedding ``X``
        in chunks of :attr:`chunk_size` rows: never an `(n, r)` feature matrix beyond a chunk."""
        emb = self.embedding
        r = emb.rank
        dtype = compute_dtype(emb.inducing_points.dtype, r)
        batch = X.shape[:-2]
        if X.shape[-2] == 0:  # the prior: V = λI, no factorization needed
            V_inv = torch.eye(r, dtype=dtype, device=X.device).expand(*batch, r, r) / self.lam
            zeros = X.new_zeros((*batch, r), dtype=dtype)
            return {"ZtZ": X.new_zeros((*batch, r, r), dtype=dtype), "Zty": zeros, "V_inv": V_inv.clone(), "weights": zeros.clone()}
        c = counts.to(dtype)
        n_obs = X.shape[-2] if n_observed is None else n_observed
        rows = (lambda a, b: features[..., a:b, :].to(dtype)) if features is not None else (lambda a, b: self._embed(X[..., a:b, :], dtype))
        ZtZ_obs, Zty = self._feature_sums(rows, 0, n_obs, c, y.to(dtype), None, features is not None)
        V_inv_obs, weights = ridge_solve(ZtZ_obs, Zty, self.lam)
        if X.shape[-2] == n_obs:
            return {"ZtZ": ZtZ_obs, "Zty": Zty, "V_inv": V_inv_obs, "weights": weights}
        ZtZ_p, Zty_p = self._feature_sums(rows, n_obs, X.shape[-2], c, None, weights, features is not None)  # hallucinated: the mean
        ZtZ = ZtZ_obs + ZtZ_p
        return {"ZtZ": ZtZ, "Zty": Zty + Zty_p, "V_inv": spd_inverse(_add_diag(ZtZ, self.lam), name="V"), "weights": weights}

    def _embed(self, X: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return self.embedding(X).to(dtype)

    def _feature_sums(self, rows, start: int, end: int, c, y, weights, whole: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``Σ c z zᵀ`` `(*b, r, r)` and ``Σ c y z`` `(*b, r)` over rows ``start:end`` (``y = zᵀ weights`` when
        ``y`` is None), one chunk of :attr:`chunk_size` rows at a time (all at once when ``whole``)."""
        step = max(end - start, 1) if whole else self.chunk_size
        ZtZ = Zty = None
        for i in range(start, max(end, start + 1), step):
            j = min(i + step, end)
            Z, ci = rows(i, j), c[..., i:j]
            yi = y[..., i:j] if y is not None else (Z @ weights.unsqueeze(-1)).squeeze(-1)
            A, b = (Z.transpose(-1, -2) * ci.unsqueeze(-2)) @ Z, ((ci * yi).unsqueeze(-2) @ Z).squeeze(-2)
            ZtZ, Zty = (A, b) if ZtZ is None else (ZtZ + A, Zty + b)
        return ZtZ, Zty

    def _set_state(self, state, X, y, counts, pending_X, pending_counts) -> None:
        buffers = self._buffers  # every name is a tensor buffer after __init__: plain dict stores
        for name, value in (*state.items(), ("train_X", X), ("train_y", y), ("train_counts", counts), ("pending_X", pending_X), ("pending_counts", pending_counts)):
            if name in buffers:
                buffers[name] = value
            else:
                self.register_buffer(name, value)
        self._since_refactor = 0
        self._emb_version = self.embedding.version
        self._op = self._stable = None

    def _check_fresh(self) -> None:
        if self._emb_version != self.embedding.version:
            raise TorchBKBError(
                "DTCPosterior: expected the embedding's dictionary it was fitted with, got a changed one "
                "(call refit() or set_inducing_points() on the posterior)"
            )

    def _check_data(self, X, y, counts, xname, yname, allow_none_y: bool = False):
        emb = self.embedding
        emb.check_input(X, xname)
        shape = X.shape[:-1]
        if y is None and not allow_none_y:
            raise InputDataError(f"{yname}: expected a tensor of shape {tuple(shape)}, got None")
        if y is not None:
            if not isinstance(y, torch.Tensor):
                raise InputDataError(f"{yname}: expected a torch.Tensor of shape {tuple(shape)}, got {type(y).__name__}")
            if y.shape != shape:
                raise InputDataError(f"{yname}: expected shape {tuple(shape)} (matching {xname}), got {tuple(y.shape)}")
            if y.dtype != X.dtype or y.device != X.device:
                raise InputDataError(f"{yname}: expected dtype {X.dtype} on {X.device}, got {y.dtype} on {y.device}")
            check_finite(y, yname)
        if counts is None:
            counts = torch.ones(shape, dtype=X.dtype, device=X.device)
        else:
            if not isinstance(counts, torch.Tensor) or counts.shape != shape:
                got = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
                raise InputDataError(f"counts: expected shape {tuple(shape)}, got {got}")
            if counts.device != X.device:
                raise InputDataError(f"counts: expected device {X.device}, got {counts.device}")
            counts = counts.to(X.dtype)
            check_finite(counts, "counts")
            if bool((counts <= 0).any()):
                raise InputDataError(f"counts: expected positive weights, got min {float(counts.min())}")
        if self.train_X.shape[:-2] != torch.Size() and X.shape[:-2] != self.train_X.shape[:-2] and xname == "x":
            try:
                torch.broadcast_shapes(X.shape[:-2], self.train_X.shape[:-2])
            except RuntimeError:
                raise InputDataError(
                    f"{xname}: expected batch shape broadcastable with {tuple(self.train_X.shape[:-2])}, got {tuple(X.shape[:-2])}"
                ) from None
        return X.detach(), (None if y is None else y.detach()), counts.detach()


def ridge_solve(ZtZ: torch.Tensor, Zty: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``V⁻¹`` and the weights ``V⁻¹ Zᵀ C y`` for ``V = Zᵀ C Z + λ I``.

    Args:
        ZtZ: `(*b, r, r)` ``Zᵀ C Z``.
        Zty: `(*b, r)` ``Zᵀ C y``.
        lam: ``λ > 0``.

    Returns:
        ``(V_inv, weights)``, `(*b, r, r)` and `(*b, r)`, in the compute dtype of ``ZtZ``.
    """
    V_inv = spd_inverse(_add_diag(ZtZ, lam), name="V")
    return V_inv, (V_inv @ Zty.to(V_inv.dtype).unsqueeze(-1)).squeeze(-1)


def scoring_operator(W: torch.Tensor, V_inv: torch.Tensor, weights: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``M = Wᵀ (I/λ - V⁻¹) W`` and ``a = Wᵀ w``: the DTC posterior as operators on kernel rows ``k_S(x)``.

    ``(k(x,x) - ‖z‖²)/λ + zᵀV⁻¹z = k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` and ``μ̃(x) = k_S(x)ᵀ a`` for ``z = W k_S(x)``.

    Args:
        W: `(r, m)` whitening of ``K_S`` (``Wᵀ W = K_S⁺``).
        V_inv: `(*b, r, r)`.
        weights: `(*b, r)`.
        lam: ``λ``.

    Returns:
        ``(M, a)``: `(*b, m, m)` symmetric and `(*b, m)`, in ``V_inv``'s dtype.
    """
    W = W.to(V_inv.dtype)
    r = W.shape[0]
    inner = torch.eye(r, dtype=W.dtype, device=W.device) / lam - V_inv  # (*b, r, r), PSD
    M = W.transpose(-1, -2) @ inner @ W
    a = (weights.unsqueeze(-2) @ W).squeeze(-2)
    return 0.5 * (M + M.transpose(-1, -2)), a


def fit_kernel_row_operator(
    W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit the DTC posterior of weighted observations and return it as one operator on kernel rows.

    With ``V = Zᵀ N Z + λ I``: ``M = Wᵀ (I/λ - V⁻¹) W`` and ``a = Wᵀ V⁻¹ Zᵀ (N y)`` -- the same
    quantities as :func:`ridge_solve` followed by :func:`scoring_operator`, stacked as ``[M; aᵀ]`` for
    :func:`score_kernel_columns` (or ``M`` for :func:`rls_kernel_columns` and ``a`` in one product) and computed with as few `(r, r)` passes as possible (this is a
    bandit's per-step refit). The difference ``I/λ - V⁻¹`` is taken in the `(r, r)` feature
    space, where both terms are ``O(1/λ)``, before ``W`` (whose entries grow like ``1/√(smallest
    eigenvalue of K_S)``) is applied: subtracting ``Wᵀ W/λ - Wᵀ V⁻¹ W`` after it loses the small
    variances of well-sampled points to rounding.

    Args:
        W: `(r, m)` whitening of ``K_S`` (``Wᵀ W = K_S⁺``), compute dtype.
        Zt: `(r, p)` features ``z(x) = W k_S(x)`` of the observed points (one column each), same dtype.
        counts: `(p,)` positive weights ``N``.
        reward_sums: `(p,)` ``N y`` (sum of the rewards observed at each point).
        lam: ``λ > 0``.

    Returns:
        ``(Ma, V_inv)``: `(m + 1, m)` ``[M; aᵀ]`` (``M`` symmetric up to rounding) and the `(r, r)` ``V⁻¹``.

    Example:
        >>> import torch
        >>> K_S = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
        >>> W = torch.linalg.inv(torch.linalg.cholesky(K_S))
        >>> Zt = W @ K_S                       # the two dictionary points observed once each
        >>> Ma, V_inv = fit_kernel_row_operator(W, Zt, torch.ones(2, dtype=torch.float64), torch.tensor([1.0, -1.0], dtype=torch.float64), 0.1)
        >>> M, a = scoring_operator(W, *ridge_solve(Zt @ Zt.T, Zt @ torch.tensor([1.0, -1.0], dtype=torch.float64), 0.1), 0.1)
        >>> bool(torch.allclose(Ma[:-1], M) and torch.allclose(Ma[-1], a))
        True
    """
    m = W.shape[1]
    V_inv, weights = ridge_solve((Zt * counts.to(Zt.dtype)) @ Zt.T, Zt @ reward_sums.to(Zt.dtype), lam)
    Ma = W.new_empty((m + 1, m))
    torch.matmul(weights.unsqueeze(0), W, out=Ma[m:])  # aᵀ = (V⁻¹ Zᵀ N y)ᵀ W
    inner = V_inv.neg()
    inner.diagonal().add_(1.0 / lam)  # I/λ - V⁻¹, PSD
    torch.matmul(W.T, inner @ W, out=Ma[:m])
    return Ma, V_inv


def score_kernel_rows(
    K: torch.Tensor, kdiag: torch.Tensor, M: torch.Tensor, a: torch.Tensor, lam: float, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ``k_Sᵀ a`` and RLS variance ``k/λ - k_Sᵀ M k_S`` (clamped at 0) of points given by their
    kernel rows, chunked over the points: one `(c × m)·(m × m)` product per chunk.

    Args:
        K: `(*b, n, m)` kernel rows ``k(x, s_j)``.
        kdiag: `(*b, n)` ``k(x, x)``.
        M, a: :func:`scoring_operator` output, cast to ``K``'s dtype by the caller.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        ``(mean, rls)``, each `(*b, n)`.
    """
    n, c = K.shape[-2], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[..., i : i + c, :]  # (*b, c, m)
        mean = (Kc @ a.unsqueeze(-1)).squeeze(-1)
        quad = ((Kc @ M) * Kc).sum(-1)
        parts.append((mean, (kdiag[..., i : i + c] / lam - quad).clamp_min_(0.0)))
    return _join(parts)


def score_kernel_columns(K: torch.Tensor, kdiag: torch.Tensor, Ma: torch.Tensor, lam: float, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`score_kernel_rows` for kernel rows stored as columns -- a cache `(m, n)` holding one
    contiguous row ``k(s_j, ·)`` per inducing point -- with the operator stacked as ``[M; aᵀ]``
    (:func:`fit_kernel_row_operator`): one `(m + 1, m)·(m, c)` product per chunk gives ``M k_S`` and
    the mean together (one pass over ``K``). Variances as in :func:`rls_kernel_columns`.

    Args:
        K: `(m, n)` ``k(s_j, x)``.
        kdiag: `(n,)` ``k(x, x)``.
        Ma: `(m + 1, m)` ``[M; aᵀ]`` in ``K``'s dtype.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        ``(mean, rls)``, each `(n,)`.

    Example:
        >>> import torch
        >>> K = torch.rand(3, 5, dtype=torch.float64)
        >>> M = torch.eye(3, dtype=torch.float64); a = torch.ones(3, dtype=torch.float64)
        >>> kd = torch.full((5,), 10.0, dtype=torch.float64)
        >>> rows = score_kernel_rows(K.T, kd, M, a, 0.5, 2)
        >>> cols = score_kernel_columns(K, kd, torch.cat([M, a[None]]), 0.5, 2)
        >>> all(torch.allclose(r, c) for r, c in zip(rows, cols))
        True
    """
    n, c = K.shape[-1], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[:, i : i + c]  # (m, c)
        P = Ma @ Kc  # (m + 1, c)
        parts.append((P[-1], _rls_from_products(P[:-1], Kc, kdiag[i : i + c], lam)))
    return _join(parts)


def rls_kernel_columns(K: torch.Tensor, kdiag: torch.Tensor, M: torch.Tensor, lam: float, chunk_size: int) -> torch.Tensor:
    """RLS variances ``k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` of points given by their kernel rows stored as columns --
    a cache `(m, n)` holding one contiguous row ``k(s_j, ·)`` per inducing point, as the bandits keep it --
    one `(m, m)·(m, c)` product per chunk, clamped to ``[0, k(x,x)/λ]``: ``M`` is PSD, so a DTC variance never
    exceeds the prior's, and the clamp keeps rounding from breaking that bound (a bandit that skips arms by
    it relies on it). The mean is one more product, ``aᵀ K``, or see :func:`score_kernel_columns`.

    Args:
        K: `(m, n)` ``k(s_j, x)``.
        kdiag: `(n,)` ``k(x, x)``.
        M: `(m, m)` :func:`scoring_operator`'s ``M`` in ``K``'s dtype.
        lam: ``λ``.
        chunk_size: points per chunk.

    Returns:
        `(n,)` RLS-scale variances.

    Example:
        >>> import torch
        >>> K = torch.rand(3, 5, dtype=torch.float64); M = torch.eye(3, dtype=torch.float64)
        >>> kd = torch.full((5,), 10.0, dtype=torch.float64)
        >>> rls = rls_kernel_columns(K, kd, M, 0.5, 2)
        >>> bool(torch.allclose(rls, score_kernel_rows(K.T, kd, M, torch.zeros(3, dtype=torch.float64), 0.5, 2)[1]))
        True
    """
    n, c = K.shape[-1], chunk_size
    parts = []
    for i in range(0, max(n, 1), c):
        Kc = K[:, i : i + c]  # (m, c)
        parts.append(_rls_from_products(M @ Kc, Kc, kdiag[i : i + c], lam))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _rls_from_products(MK: torch.Tensor, K: torch.Tensor, kdiag: torch.Tensor, lam: float) -> torch.Tensor:
    """``k/λ - Σ_j (M K)_j K_j`` column-wise from ``MK = M K`` `(m, c)` (overwritten), clamped to ``[0, k/λ]``."""
    quad = MK.mul_(K).sum(0).clamp_min_(0.0)  # (c,)
    return (kdiag / lam - quad).clamp_min_(0.0)


def _join(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate chunked ``(mean, rls)`` pairs along the last dimension."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=-1)


def _add_diag(A: torch.Tensor, value: float) -> torch.Tensor:
    """``A + value·I`` for `(*b, n, n)` ``A`` (a new tensor)."""
    out = A.clone()
    out.diagonal(dim1=-2, dim2=-1).add_(value)
    return out
