"""How a fitted DTC posterior scores raw points, one at a time or jointly: one `(c × m)·(m × m)` product against the
scoring operator ``M = Wᵀ (I/λ - V⁻¹) W`` (:func:`~torchbkb.gp.functional.scoring_operator`, the bandits'
derivation), or the feature form when that product cancels for this posterior (:mod:`torchbkb.gp.stable_scoring`);
the operator and the choice are derived once per fit and kept with it (:meth:`~torchbkb.gp.dtc_fit.DTCFit.derived`).

:class:`DTCScoring` holds these methods for :class:`~torchbkb.gp.dtc_posterior.DTCPosterior`, which owns every
attribute they read (the embedding, its fit ``_fit`` with ``V⁻¹``, the weights, ``ZᵀCZ``, ``ZᵀCy``, the data);
every change of the state is a new fit, so nothing derived is ever stale.

Example:
    >>> import torch
    >>> from torchbkb import DTCPosterior, NystromEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(30, 2, dtype=torch.float64); y = X.sum(-1)
    >>> post = DTCPosterior(NystromEmbedding(GaussianKernel(0.5), X[:8]), noise=0.01).fit(X, y)
    >>> Xq = torch.rand(5, 2, dtype=torch.float64)
    >>> mean, rls = post.score_embedded(post.embedding(Xq), post.embedding.kernel_diag(Xq))
    >>> bool(torch.allclose(rls, post.rls(Xq)) and torch.allclose(mean, post.mean(Xq)))
    True
"""

from __future__ import annotations

import torch

from torchbkb.gp.functional import add_diagonal
from torchbkb.gp.linalg import safe_cholesky
from torchbkb.gp.stable_scoring import feature_rls, stable_factor, whiten_rows

__all__ = ["DTCScoring"]


class DTCScoring:
    """Scoring of raw points for :class:`~torchbkb.gp.dtc_posterior.DTCPosterior` (see the module docstring)."""

    def joint(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint DTC posterior, GP scale, at a small set `(*b, q, d)` ``Xq``: ``(mean, cov)`` of shapes `(*b, q)` and
        `(*b, q, q)`, ``cov = K_qq - Z Zᵀ + λ Z V⁻¹ Zᵀ``."""
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

    def joint_factors(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean `(*b, q)` and features ``Z``, ``U = Z L⁻ᵀ`` `(*b, q, r)` (``L Lᵀ = V``) with the joint GP-scale
        covariance ``K_qq - Z Zᵀ + λ U Uᵀ``: what a lazy covariance needs, never a `(q, q)` block."""
        self._check_fresh()
        self.embedding.check_input(Xq, "Xq")
        L = safe_cholesky(add_diagonal(self.ZtZ, self.lam), name="V")  # (*b, r, r)
        w = torch.cholesky_solve(self.Zty.unsqueeze(-1), L)  # (*b, r, 1)
        K = self.embedding.kernel(Xq, self.embedding.inducing_points)  # (*b, q, m)
        Z = K.to(L.dtype) @ self.embedding.projection.transpose(-1, -2)  # (*b, q, r)
        return (Z @ w).squeeze(-1).to(Xq.dtype), Z.to(Xq.dtype), whiten_rows(L, Z).to(Xq.dtype)

    def _score_points(self, Xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score raw points with one `(c × m)·(m × m)` product (:meth:`score_cross`), or in the feature form
        when that one is inaccurate for this posterior (:mod:`torchbkb.gp.stable_scoring`)."""
        K = self.embedding.kernel(Xq, self.embedding.inducing_points)  # (*b, c, m)
        kdiag = self.embedding.kernel_diag(Xq)
        stable = self._stable_form()
        if stable is None:
            return self.score_cross(K, kdiag)
        L, w = stable
        Z = K.to(L.dtype) @ self.embedding.projection.transpose(-1, -2)  # (*b, c, r) features
        return (Z @ w).squeeze(-1).to(Xq.dtype), feature_rls(Z, kdiag, L, self.lam).to(Xq.dtype)

    def _stable_form(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(L, w)`` -- the Cholesky factor of ``V`` and ``w = V⁻¹ Zᵀ C y`` `(*b, r, 1)` -- when the one-product
        form cancels at the dictionary points, else ``None``; decided again after every change of the posterior (with
        the scoring operator). On float32 inputs it also checks the kernel values' precision (:attr:`_precision`)."""
        self._check_fresh()
        stable = self._fit.derived("stable", self.lam, self._derive_stable_form)[0]
        self._check_precision()  # after the form is kept: the check scores through it
        if stable is not None and torch.is_grad_enabled() and (self.ZtZ.requires_grad or self.Zty.requires_grad):
            L = safe_cholesky(add_diagonal(self.ZtZ, self.lam), name="V")  # conditioned on differentiable data
            return L, torch.cholesky_solve(self.Zty.unsqueeze(-1), L)
        return stable

    def _derive_stable_form(self) -> tuple:
        """``((L, w),)`` or ``(None,)``: :meth:`_stable_form`'s choice for the current fit, derived once with it."""
        S = self.embedding.inducing_points
        M, _ = self._scoring_operator(S.dtype)
        with torch.no_grad():
            K_SS = self.embedding.kernel(S, S)  # (m, m)
            L = stable_factor(K_SS, K_SS.diagonal(), self.embedding.projection, M, self.ZtZ, self.lam, S.dtype)
            return (None if L is None else (L, torch.cholesky_solve(self.Zty.unsqueeze(-1), L)),)

    def _check_precision(self) -> None:
        """On float32 kernel values (no batch), compare the variances at the dictionary points with a float64
        reference whenever the data have grown by a quarter since the last check (:attr:`_precision`)."""
        S = self.embedding.inducing_points
        if S.dtype == torch.float64 or self.batch_shape != torch.Size():
            return
        n = self.num_train + self.pending_X.shape[-2]
        if n and self._precision.due(n):
            X = torch.cat([self.train_X, self.pending_X], dim=-2)
            counts = torch.cat([self.train_counts, self.pending_counts], dim=-1)
            with torch.no_grad():
                self._precision.check(self.embedding.kernel, self.rls(S), S, X, counts, self.lam, S.dtype,
                                      stacklevel=None)  # the first line outside torchbkb, from any method

    def _scoring_operator(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``M = Wᵀ (I/λ - V⁻¹) W`` `(*b, m, m)` and ``a = Wᵀ w`` `(*b, m)` in ``dtype``.

        ``(k(x,x) - ‖z‖²)/λ + zᵀV⁻¹z = k(x,x)/λ - k_S(x)ᵀ M k_S(x)`` for ``z = W k_S(x)``, so raw points
        are scored without forming ``z``. The fit derives it on first use
        (:meth:`~torchbkb.gp.dtc_fit.DTCFit.operator`): every change of the state is a new fit.
        """
        return self._fit.operator(self.lam, dtype)
