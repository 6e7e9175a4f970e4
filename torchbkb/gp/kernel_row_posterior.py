"""The DTC posterior of a fixed arm set, held as what its dictionary's kernel rows need.

A sketched bandit scores its ``A`` arms from the dictionary's kernel rows ``K_{S,A}`` `(m, A)`: with ``W`` the
whitening of ``K_S`` (``Wᵀ W = K_S⁺``), ``Z = K_{S,A}ᵀ Wᵀ`` the arms' features, ``V = Zᵀ N Z + λ I`` on the
pulled arms and the scoring operator ``[M; aᵀ]`` (:func:`~torchbkb.gp.functional.fit_kernel_row_operator`)::

    μ̃(a) = aᵀ k_S(a),    σ̃²(a) = k(a, a)/λ - k_S(a)ᵀ M k_S(a)

This object keeps that state -- the fit (``W``, ``V⁻¹``, the weights and sums: a
:class:`~torchbkb.gp.dtc_fit.DTCFit`, as every DTC posterior holds it), ``M`` in the rows' dtype, the scores and
which arms were scored -- and is written only by its methods: :meth:`refit` and :meth:`score` (the eager update,
which may score a subset of the arms: pruning), :meth:`adopt` (the fixed-capacity update, pruned or not),
:meth:`clear` (the prior). Where the rows come from (cached, streamed) is the caller's; the algebra is
:mod:`torchbkb.gp.functional`'s. :meth:`dtc_state` gives the whole :class:`~torchbkb.gp.functional.DTCState`,
which a :class:`~torchbkb.DTCPosterior` takes as it is (:meth:`~torchbkb.DTCPosterior.set_state`): the bandits'
posterior is this fit, not a second one.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> from torchbkb.gp.linalg import inv_sqrt_factor
    >>> arms = torch.rand(50, 2, dtype=torch.float64); k = GaussianKernel(0.5)
    >>> post = KernelRowPosterior(torch.ones(50, dtype=torch.float64), lam=0.1)
    >>> S, pulled = torch.tensor([3, 7, 11]), torch.tensor([3, 7, 11, 20])
    >>> K_SA = k(arms[S], arms)
    >>> Ma = post.refit(K_SA, inv_sqrt_factor(K_SA[:, S]), pulled, torch.ones(4, dtype=torch.float64),
    ...                 torch.tensor([1.0, 0.5, 0.2, 0.1], dtype=torch.float64))
    >>> post.score(K_SA, Ma, chunk=16)
    >>> tuple(post.mean.shape), bool((post.rls >= 0).all()), post.scored is None
    ((50,), True, True)
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from torchbkb.errors import TorchBKBError
from torchbkb.gp.dtc_fit import DTCFit
from torchbkb.gp.functional import DTCState, fit_kernel_rows_ex, rls_kernel_columns, score_kernel_columns
from torchbkb.utils.host_copy import HOST_DTYPES, to_dtype

__all__ = ["KernelRowPosterior", "checked_once"]


class KernelRowPosterior:
    """The DTC state of ``A`` arms scored from kernel rows (module docstring).

    Args:
        kdiag: `(A,)` ``k(a, a)`` of the arms.
        lam: ``λ > 0``.

    Attributes:
        fit: the :class:`~torchbkb.gp.dtc_fit.DTCFit` (``None``: the prior, no dictionary); :attr:`W` and
            :attr:`V_inv` are its.
        M: `(m, m)` the variance operator on kernel rows, in the rows' dtype.
        mean: `(A,)` ``μ̃``; rls: `(A,)` ``σ̃²`` (RLS scale) of the :attr:`scored` arms, the prior bound
            ``k(a, a)/λ`` of the others.
        scored: `(k,)` ascending, the arms whose variance was scored (``None``: every arm).
        arms_scored: how many variances the last scoring computed.
    """

    def __init__(self, kdiag: torch.Tensor, lam: float):
        self.kdiag, self.lam = kdiag, float(lam)
        self.prior_rls = kdiag / self.lam  # the largest σ̃² can be
        self.clear()

    def clear(self) -> None:
        """The prior: no dictionary, ``z ≡ 0``, ``μ̃ = 0``, ``σ̃² = k/λ``."""
        self.fit: DTCFit | None = None
        self.M: torch.Tensor | None = None
        self.mean = torch.zeros_like(self.kdiag)
        self.rls = self.prior_rls.clone()
        self.scored: torch.Tensor | None = None
        self._K_scored = None  # (m, k) the scored arms' kernel columns, for their features
        self._rls_full: torch.Tensor | None = None
        self._Z: torch.Tensor | None = None
        self.arms_scored = 0

    @property
    def fitted(self) -> bool:
        """Whether there is a dictionary (a fit)."""
        return self.fit is not None

    @property
    def W(self) -> torch.Tensor | None:
        """`(r, m)` whitening of ``K_S`` in the rows' slot order (``None``: the prior, no dictionary)."""
        return None if self.fit is None else self.fit.W

    @property
    def V_inv(self) -> torch.Tensor | None:
        """`(r, r)` ``V⁻¹`` (``None``: the prior)."""
        return None if self.fit is None else self.fit.V_inv

    def require_fit(self, owner: str) -> None:
        """A :class:`~torchbkb.errors.TorchBKBError` naming ``owner`` while there is no dictionary."""
        if self.fit is None:
            raise TorchBKBError(f"{owner}: expected a dictionary (after the first reward), got none")

    def refit(self, K_SA, W: torch.Tensor, pulled: torch.Tensor, counts: torch.Tensor,
              reward_sums: torch.Tensor) -> torch.Tensor:
        """Set ``W`` `(r, m)` and refit ``V⁻¹`` from the pulled arms `(p,)` (float64 ``counts`` and ``reward_sums``
        `(p,)`) with rows ``K_SA`` `(m, A)` (a tensor or streamed rows); returns ``[M; aᵀ]`` `(m + 1, m)` float64
        for :meth:`score`. The features formed from an older ``W`` are dropped."""
        return self.take_fit(DTCFit.from_kernel_rows(W, _pulled_features(W, K_SA, pulled), counts, reward_sums,
                                                     self.lam))

    def snapshot(self) -> dict:
        """The state as it is now, for :meth:`restore` (its tensors are replaced, never written in place: nothing is
        copied)."""
        return dict(self.__dict__)

    def restore(self, snapshot: dict) -> None:
        """The state as at :meth:`snapshot`."""
        self.__dict__.update(snapshot)

    def fit_unchecked(self, K_SA, W: torch.Tensor, pulled: torch.Tensor, counts: torch.Tensor,
                      reward_sums: torch.Tensor) -> tuple[DTCFit, torch.Tensor]:
        """:meth:`refit`'s fit with no host read and nothing set: ``(fit, info)``, ``info`` the 0-d Cholesky flag of
        ``V`` (zero: :meth:`take_fit` it; else the fit is not to be used)."""
        fit, info = fit_kernel_rows_ex(W, _pulled_features(W, K_SA, pulled), counts, reward_sums, self.lam)
        return DTCFit.from_kernel_row_fit(W, fit, self.lam), info

    def take_fit(self, fit: DTCFit) -> torch.Tensor:
        """Make ``fit`` (fitted with this ``λ``) the state; returns its ``[M; aᵀ]`` `(m + 1, m)` for :meth:`score`.
        The features formed from an older ``W`` are dropped."""
        if fit.W is not self.W:
            self._Z = None
        self.fit = fit
        return fit.stacked_operator(self.lam)

    def score(self, K_SA, Ma: torch.Tensor, chunk: int, survivors: torch.Tensor | None = None,
              mean: torch.Tensor | None = None) -> None:
        """Score from ``K_SA`` `(m, A)` and ``Ma`` `(m + 1, m)` in the rows' dtype: every arm's mean and variance,
        or, with ``survivors`` `(k,)` ascending (and their ``mean`` `(A,)` computed already), the variances of
        those arms only."""
        M = Ma[:-1]
        K_scored = None
        with checked_once(K_SA):
            if survivors is not None:
                rls = self.prior_rls.clone()  # σ̃² <= k/λ for the arms not scored
                K_scored = _columns(K_SA, survivors)  # (m, k): kept for the scored arms' features
                rls[survivors] = rls_kernel_columns(K_scored, self.kdiag[survivors], M, self.lam, chunk)
            elif mean is not None:
                rls = rls_kernel_columns(K_SA, self.kdiag, M, self.lam, chunk)
            else:
                mean, rls = score_kernel_columns(K_SA, self.kdiag, Ma, self.lam, chunk)
        self.mean, self.rls, self.scored, self._K_scored = mean, rls, survivors, K_scored
        self.M, self._rls_full = M, None
        self.arms_scored = self.kdiag.numel() if survivors is None else int(survivors.numel())

    def adopt(self, W: torch.Tensor, V_inv: torch.Tensor, M: torch.Tensor, mean: torch.Tensor,
              rls: torch.Tensor, scored: torch.Tensor | None = None, K_SA: torch.Tensor | None = None) -> None:
        """Take a state computed elsewhere (the fixed-capacity update): every arm scored, or the arms ``scored``
        `(k,)` ascending (the prior bound in ``rls`` for the others) with the rows ``K_SA`` `(m, A)` they came from."""
        self.fit = DTCFit(W, V_inv)  # its sums and weights are formed when asked (dtc_state)
        self.M, self.mean, self._Z = M, mean, None
        self.restore_scores(rls, scored, K_SA)
        self.arms_scored = self.kdiag.numel() if scored is None else int(scored.numel())

    def dtc_state(self, K_SA, pulled: torch.Tensor, counts: torch.Tensor, reward_sums: torch.Tensor) -> DTCState:
        """The whole :class:`~torchbkb.gp.functional.DTCState` (``M``, ``a``, ``V⁻¹``, the weights, ``ZᵀNZ``,
        ``ZᵀNy``, in ``W``'s dtype): the last refit's as computed, or after :meth:`adopt` formed from this ``W`` and
        ``V⁻¹`` with the rows ``K_SA`` `(m, A)` of the pulled arms `(p,)` (float64 ``counts`` and ``reward_sums``
        `(p,)`) -- no factorization either way."""
        self.require_fit("KernelRowPosterior")
        if self.fit.weights is None:
            self.fit = self.fit.with_observations(_pulled_features(self.W, K_SA, pulled), counts, reward_sums)
        return self.fit.state(self.lam)

    def restore_scores(self, rls: torch.Tensor, scored: torch.Tensor | None, K_SA) -> None:
        """Set the variances and the scored arms as saved (a checkpoint), their kernel columns read from ``K_SA``."""
        self.rls, self.scored, self._rls_full = rls, scored, None
        self._K_scored = None if scored is None else _columns(K_SA, scored)

    def full_scores(self, K_SA, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ̃, σ̃²)`` of every arm `(A,)` each; the variances :meth:`score` skipped are computed once."""
        if self.scored is None:
            return self.mean, self.rls
        if self._rls_full is None:
            with torch.no_grad():
                rest = torch.ones_like(self.kdiag, dtype=torch.bool)
                rest[self.scored] = False
                rest = rest.nonzero().squeeze(1)  # (A - k,)
                rls = self.rls.clone()
                with checked_once(K_SA):
                    rls[rest] = rls_kernel_columns(K_SA[:, rest], self.kdiag[rest], self.M, self.lam, chunk)
                self._rls_full = rls
        return self.mean, self._rls_full

    def features(self, rows_of) -> torch.Tensor:
        """`(A, r)` the arms' features, formed once per ``W`` by ``rows_of()`` (a callable giving them)."""
        if self._Z is None:
            self._Z = rows_of()
        return self._Z

    def scored_features(self, streamed_rows_of) -> torch.Tensor:
        """`(k, r)` features of the :attr:`scored` arms from the kernel columns kept by :meth:`score` (streamed
        columns are read through ``streamed_rows_of(columns, W)``)."""
        if self.scored is None or self.W is None:
            raise TorchBKBError("KernelRowPosterior: expected a scoring that skipped arms (prune), got none")
        if not isinstance(self._K_scored, torch.Tensor):
            return streamed_rows_of(self._K_scored, self.W)
        return self._K_scored.T @ self.W.T.to(self._K_scored.dtype)  # (k, m)·(m, r)


def checked_once(K):
    """``K.checked_once()`` for rows computed on demand that read their chunks' finiteness once
    (:class:`~torchbkb.bandits.kernel_rows.StreamedKernelRows`); nothing for a tensor."""
    return K.checked_once() if hasattr(K, "checked_once") else nullcontext()


def _columns(K, idx: torch.Tensor):
    """``K.index_select(1, idx)`` for `(m, A)` rows ``K`` and `(k,)` long ``idx``: the same values; NumPy's gather on a
    contiguous CPU tensor in float32 or float64 (about twice as fast as torch's along the last dimension)."""
    if (isinstance(K, torch.Tensor) and K.device.type == "cpu" and K.dtype in HOST_DTYPES and K.is_contiguous()
            and not K.requires_grad and idx.device.type == "cpu"):
        return torch.from_numpy(K.numpy().take(idx.numpy(), axis=1))
    return K.index_select(1, idx)


def _pulled_features(W: torch.Tensor, K_SA, pulled: torch.Tensor) -> torch.Tensor:
    """`(r, p)` the features ``W k_S(a)`` of the pulled arms `(p,)`, from the rows ``K_SA`` `(m, A)` (a tensor or
    streamed rows), in ``W``'s dtype."""
    return W @ to_dtype(K_SA.T[pulled], W.dtype).T
