"""The fitted state of a DTC posterior, held in one object: every DTC posterior keeps its fit as a :class:`DTCFit`.

With ``W`` the whitening of the dictionary's kernel (``Wᵀ W = K_S⁺``), features ``z(x) = W k_S(x)``
and ``V = Zᵀ N Z + λ I``, a fit is ``V⁻¹``, the weights ``w = V⁻¹ Zᵀ N y`` and the sums
``Zᵀ N Z``, ``Zᵀ N y``, on that ``W``. The operator on kernel rows ``(M, a)``
(:func:`~torchbkb.gp.functional.scoring_operator`) is derived from them once per ``λ``, and whatever else a
posterior derives from one fit is kept with it (:meth:`DTCFit.derived`).

Its holders: :class:`~torchbkb.DTCPosterior` (arbitrary points, batched; and through it ``BKBModel``'s engine) and
:class:`~torchbkb.gp.kernel_row_posterior.KernelRowPosterior` (the bandits' arm set). Both fit, update and score
through the methods here; the algebra is :mod:`torchbkb.gp.functional`'s.

A fit is never written in place: a rank-one update, a move to another device or a loaded state gives a new
:class:`DTCFit`, so two posteriors that share one (a shallow copy, BoTorch's fantasies) never see each other's changes,
and what was derived from a fit is never stale.

Example:
    >>> import torch
    >>> K_S = torch.tensor([[1.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> W = torch.linalg.inv(torch.linalg.cholesky(K_S))
    >>> Zt, n = W @ K_S, torch.ones(2, dtype=torch.float64)          # the two dictionary points, observed once each
    >>> fit = DTCFit.from_kernel_rows(W, Zt, n, torch.tensor([1.0, -1.0], dtype=torch.float64), lam=0.1)
    >>> new, _ = fit.updated(Zt.T[:1], torch.ones(1, dtype=torch.float64), n[:1], lam=0.1)   # one more pull
    >>> twice = DTCFit.from_kernel_rows(W, Zt[:, [0, 0, 1]], torch.ones(3, dtype=torch.float64),
    ...                                 torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64), lam=0.1)
    >>> bool(torch.allclose(new.V_inv, twice.V_inv) and torch.allclose(new.weights, twice.weights))
    True
    >>> mean, rls = new.score_rows(K_S, torch.ones(2, dtype=torch.float64), lam=0.1, chunk=64)
    >>> tuple(mean.shape), fit.V_inv is not new.V_inv
    ((2,), True)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from torchbkb.gp.functional import (
    DTCState, KernelRowFit, add_diagonal, chunked, fit_features, fit_kernel_rows, kernel_row_operator, observation_sums,
    score_features, score_kernel_rows, scoring_operator,
)
from torchbkb.gp.linalg import spd_inverse
from torchbkb.gp.rank_one import RankOneDowndate, downdate, sherman_morrison

__all__ = ["DTCFit", "FIT_TENSORS"]

FIT_TENSORS = ("ZtZ", "Zty", "V_inv", "weights")  # the fit's own tensors, as a posterior's state dict names them


class DTCFit:
    """A fitted DTC state on the whitening ``W`` (module docstring); not written after it is made.

    Args:
        W: `(r, m)` whitening of ``K_S``.
        V_inv: `(*b, r, r)` ``V⁻¹`` (compute dtype).
        weights: `(*b', r)` ``w`` (``b'`` may be wider than ``b``: fantasies share ``V``); ``ZtZ`` `(*b, r, r)` and
            ``Zty`` `(*b', r)` the sums. All three are ``None`` for a fit taken as ``W`` and ``V⁻¹`` alone (a
            bandit's fixed-capacity update), until :meth:`with_observations` gives them.
        since_refactor: rank-one updates since ``V⁻¹`` was last factorized.
    """

    def __init__(self, W: torch.Tensor, V_inv: torch.Tensor, weights: torch.Tensor | None = None,
                 ZtZ: torch.Tensor | None = None, Zty: torch.Tensor | None = None, *, since_refactor: int = 0):
        self.W, self.V_inv, self.weights, self.ZtZ, self.Zty = W, V_inv, weights, ZtZ, Zty
        self.since_refactor = since_refactor
        self._derived: dict = {}

    # ------------------------------------------------------------------ making one
    @classmethod
    def from_features(cls, W: torch.Tensor, rows, n: int, counts: torch.Tensor, y: torch.Tensor, lam: float, *,
                      dtype: torch.dtype, batch: torch.Size, device, step: int,
                      n_observed: int | None = None) -> DTCFit:
        """Fit ``n`` weighted rows whose features ``rows(i, j)`` gives `(*b, j - i, r)`, ``step`` rows at a time;
        rows past ``n_observed`` are hallucinated (:func:`~torchbkb.gp.functional.fit_features`)."""
        parts = fit_features(rows, n, counts, y, lam, rank=W.shape[0], dtype=dtype, batch=batch, device=device,
                             step=step, n_observed=n_observed)
        return cls(W, parts["V_inv"], parts["weights"], parts["ZtZ"], parts["Zty"])

    @classmethod
    def from_kernel_rows(cls, W: torch.Tensor, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor,
                         lam: float) -> DTCFit:
        """Fit observations given as feature columns ``Zt`` `(r, p)` with ``counts`` and ``reward_sums`` `(p,)` (no
        batch): a bandit's refit. The stacked operator (:meth:`stacked_operator`) comes with it."""
        return cls.from_kernel_row_fit(W, fit_kernel_rows(W, Zt, counts, reward_sums, lam), lam)

    @classmethod
    def from_kernel_row_fit(cls, W: torch.Tensor, fit: KernelRowFit, lam: float) -> DTCFit:
        """The fit of a :class:`~torchbkb.gp.functional.KernelRowFit` made with ``λ = lam``, its operator kept."""
        out = cls(W, fit.V_inv, fit.weights, fit.ZtZ, fit.Zty)
        out._derived["stacked"] = (lam, fit.operator)
        return out

    @classmethod
    def from_state(cls, W: torch.Tensor, state: DTCState, lam: float) -> DTCFit:
        """A :class:`~torchbkb.gp.functional.DTCState` computed with ``λ = lam``, operator included."""
        out = cls(W, state.V_inv, state.weights, state.ZtZ, state.Zty)
        out._derived["operator"] = (lam, (state.M, state.a))
        return out

    def with_observations(self, Zt: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor) -> DTCFit:
        """This ``W`` and ``V⁻¹`` with the sums and weights of the observations ``Zt`` `(r, p)`, ``counts``,
        ``reward_sums`` `(p,)` they were fitted on, in ``W``'s dtype: no factorization."""
        V_inv = self.V_inv.to(self.W.dtype)
        ZtZ, Zty = observation_sums(Zt, counts, reward_sums)
        return DTCFit(self.W, V_inv, (V_inv @ Zty.unsqueeze(-1)).squeeze(-1), ZtZ, Zty)

    def updated(self, Z: torch.Tensor, y: torch.Tensor | None, counts: torch.Tensor, lam: float, *,
                refactor_every: int = 64) -> tuple[DTCFit, RankOneDowndate | None]:
        """This fit with ``k`` more rows ``Z`` `(*b, k, r)` (compute dtype), rewards ``y`` `(*b, k)` (``None``:
        hallucinated, the pseudo-reward is the current mean, so ``w`` stays) and weights ``counts`` `(*b, k)`.

        Up to 4 rows are Sherman-Morrison steps, `O(r²)` each; more rows, or ``refactor_every`` steps since the
        last factorization, factorize ``V`` again. Returns the new fit and, for ``k == 1``, the
        :class:`~torchbkb.gp.rank_one.RankOneDowndate` of every quadratic form (``None`` otherwise)."""
        k = Z.shape[-2]
        c = counts.to(Z.dtype)
        ZtZ = self.ZtZ + (Z.transpose(-1, -2) * c.unsqueeze(-2)) @ Z  # (*b, r, r)
        y_eff = (Z @ self.weights.unsqueeze(-1)).squeeze(-1) if y is None else y.to(Z.dtype)  # (*b, k)
        Zty = self.Zty + ((c * y_eff).unsqueeze(-2) @ Z).squeeze(-2)  # (*b, r)
        since, result = self.since_refactor + k, None
        if since >= refactor_every or k > 4:
            V_inv, since = spd_inverse(add_diagonal(ZtZ, lam), name="V"), 0
            if k == 1:
                result = downdate(self.V_inv, Z[..., 0, :], c[..., 0])
        else:
            V_inv, result = sherman_morrison(self.V_inv, Z, c)
            result = result if k == 1 else None
        weights = self.weights if y is None else (V_inv @ Zty.unsqueeze(-1)).squeeze(-1)  # (*b, r)
        return DTCFit(self.W, V_inv, weights, ZtZ, Zty, since_refactor=since), result

    def moved(self, move: Callable[[torch.Tensor], torch.Tensor], W: torch.Tensor) -> DTCFit:
        """Each tensor through ``move`` (a posterior's ``.to()``: the device, never the dtype), on the whitening
        ``W`` as moved; this very fit when nothing changed."""
        tensors = {name: None if t is None else move(t) for name, t in self.tensors().items()}
        if W is self.W and all(t is getattr(self, name) for name, t in tensors.items()):
            return self
        return DTCFit(W, **tensors, since_refactor=self.since_refactor)

    def replaced(self, **tensors: torch.Tensor) -> DTCFit:
        """This fit with some of :data:`FIT_TENSORS` replaced (a loaded state dict), nothing derived kept."""
        return DTCFit(self.W, **(self.tensors() | tensors), since_refactor=self.since_refactor)

    # ------------------------------------------------------------------ reading one
    def tensors(self) -> dict[str, torch.Tensor | None]:
        """The fit's own tensors by their :data:`FIT_TENSORS` names."""
        return {name: getattr(self, name) for name in FIT_TENSORS}

    def derived(self, kind: Hashable, lam: float, make: Callable[[], object]) -> object:
        """``make()`` once for this fit, ``kind`` and ``λ``: what a holder derives from the fit is kept with it and
        dropped with it; one ``λ`` per kind (a changed noise replaces what the old one derived)."""
        held = self._derived.get(kind)  # read once: threads share a fitted posterior
        if held is None or held[0] != lam:
            held = self._derived[kind] = (lam, make())
        return held[1]

    def operator(self, lam: float, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M, a)`` `(*b, m, m)` and `(*b', m)` (:func:`~torchbkb.gp.functional.scoring_operator`), derived once per
        ``λ``, in ``dtype`` (default ``V⁻¹``'s)."""
        held = self._derived.get("stacked")
        if held is not None and held[0] == lam:
            M, a = held[1][:-1], held[1][-1]
        else:
            M, a = self.derived("operator", lam, lambda: scoring_operator(self.W, self.V_inv, self.weights, lam))
        return (M, a) if dtype is None else (M.to(dtype), a.to(dtype))

    def stacked_operator(self, lam: float) -> torch.Tensor:
        """`(m + 1, m)` ``[M; aᵀ]`` (no batch; :func:`~torchbkb.gp.functional.kernel_row_operator`), derived once per
        ``λ``, in ``V⁻¹``'s dtype."""
        return self.derived("stacked", lam, lambda: kernel_row_operator(self.W, self.V_inv, self.weights, lam))

    def state(self, lam: float) -> DTCState:
        """The whole :class:`~torchbkb.gp.functional.DTCState` at ``λ = lam``."""
        return DTCState(*self.operator(lam), self.V_inv, self.weights, self.ZtZ, self.Zty)

    def score_rows(self, K: torch.Tensor, kdiag: torch.Tensor, lam: float,
                   chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ̃, σ̃²)`` `(*b, n)` each, RLS scale, of points given by their kernel rows ``K`` `(*b, n, m)` and
        ``kdiag`` `(*b, n)`: one `(c × m)·(m × m)` product per chunk of ``chunk`` points, in ``K``'s dtype."""
        M, a = self.operator(lam, K.dtype)
        return score_kernel_rows(K, kdiag, M, a, lam, chunk)

    def score_features(self, Z: torch.Tensor, kdiag: torch.Tensor, lam: float,
                       chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ̃, σ̃²)`` `(*b, n)` each, RLS scale, of embedded points ``Z`` `(*b, n, r)` with ``kdiag`` `(*b, n)`,
        ``chunk`` points at a time, in ``Z``'s dtype."""
        return chunked(lambda i, j: score_features(Z[..., i:j, :], kdiag[..., i:j], self.V_inv, self.weights, lam),
                       Z.shape[-2], chunk)
