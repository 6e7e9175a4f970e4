"""The DTC (deterministic training conditional) posterior on a Nyström embedding -- BKB's posterior.

With ``z = NystromEmbedding(S)``, pulled points ``X`` weighted by pull counts ``c`` and rewards ``y``
(``y_i`` the mean of the ``c_i`` rewards observed at ``x_i``)::

    V      = Zᵀ C Z + λ I                                   (r × r, r = rank of K_S)
    μ̃(x)   = z(x)ᵀ V⁻¹ Zᵀ C y
    σ̃²(x)  = (k(x, x) - ‖z(x)‖²) / λ + z(x)ᵀ V⁻¹ z(x)      RLS scale (000 Eq. 4, 001 Eq. 2)
    var(x) = λ · σ̃²(x)                                      GP scale (003 Eq. 4, the DTC variance)
    cov(x, x') = k(x, x') - z(x)ᵀ z(x') + λ z(x)ᵀ V⁻¹ z(x')   GP scale, joint

With ``S`` equal to the pulled points, ``var`` is the exact GP posterior variance. Only ``r × r`` matrices are
factorized (float64 for float32 inputs); the algebra is in :mod:`torchbkb.gp.functional`.

Example:
    >>> import torch
    >>> from torchbkb import DTCPosterior, ExactPosterior, NystromEmbedding
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> X = torch.rand(20, 2, dtype=torch.float64); y = torch.sin(6 * X[:, 0])
    >>> k = GaussianKernel(0.3)
    >>> post = DTCPosterior(NystromEmbedding(k, X), noise=0.1).fit(X, y)   # S = X: exact GP
    >>> exact = ExactPosterior(k, noise=0.1).fit(X, y)
    >>> Xq = torch.rand(5, 2, dtype=torch.float64)
    >>> all(torch.allclose(a, b) for a, b in zip(post(Xq), exact(Xq)))
    True
    >>> bool(torch.allclose(post.rls(Xq), post(Xq)[1] / 0.1))
    True
"""

from __future__ import annotations

import torch
from torch import nn

from torchbkb.errors import InputDataError, TorchBKBError, check_positive
from torchbkb.gp.dtc_fit import FIT_TENSORS, DTCFit
from torchbkb.gp.dtc_scoring import DTCScoring
from torchbkb.gp.functional import DTCState, chunked
from torchbkb.gp.linalg import check_units, compute_dtype, keep_dtype_on_apply
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.gp.observations import check_dtc_state, check_features, check_weighted_data
from torchbkb.gp.rank_one import RankOneDowndate
from torchbkb.gp.stable_scoring import AccuracyMonitor
from torchbkb.utils.host_copy import cached_float
from torchbkb.utils.state_loading import load_state_dict_atomically

__all__ = ["DTCPosterior", "RankOneDowndate"]


def _fit_tensor(name: str, doc: str) -> property:
    """A read-only view of one tensor of the posterior's fit (:class:`~torchbkb.gp.dtc_fit.DTCFit`)."""
    return property(lambda self: getattr(self._fit, name), doc=doc)


class DTCPosterior(DTCScoring, nn.Module):
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
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.rand(30, 1, dtype=torch.float64); y = X[:, 0] ** 2
        >>> post = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[:5]), noise=0.01).fit(X, y)
        >>> refit = DTCPosterior(NystromEmbedding(GaussianKernel(0.2), X[:5]), noise=0.01).fit(X[:29], y[:29])
        >>> _ = refit.update(X[29:], y[29:])               # rank-one update == refit
        >>> Xq = torch.linspace(0, 1, 7, dtype=torch.float64)[:, None]
        >>> bool(torch.allclose(post(Xq)[1], refit(Xq)[1]))
        True
    """

    def __init__(self, embedding: NystromEmbedding, noise: float, *, refactor_every: int = 64,
                 chunk_size: int | None = None):
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
        self._set_state(self._build(empty_X, S.new_empty((0,)), S.new_empty((0,))), empty_X, S.new_empty((0,)),
                        S.new_empty((0,)), empty_X, S.new_empty((0,)))

    @property
    def lam(self) -> float:
        """``λ`` as a Python float, read from the device once per value of :attr:`noise` (a new tensor or an
        in-place write reads it again)."""
        return cached_float(self, self.noise, "_lam_cache")

    @property
    def num_train(self) -> int:
        """Number of observed rows (pending, hallucinated rows not included)."""
        return int(self.train_X.shape[-2])

    @property
    def batch_shape(self) -> torch.Size:
        """Leading batch shape of the training data."""
        return self.train_X.shape[:-2]

    # ------------------------------------------------------------------ the fit, as module state
    ZtZ = _fit_tensor("ZtZ", "`(*b, r, r)` ``Zᵀ C Z`` over observed and pending rows (compute dtype: float64 for "
                             "float32 inputs).")
    Zty = _fit_tensor("Zty", "`(*b', r)` ``Zᵀ C y`` (pending rows enter with their posterior mean).")
    V_inv = _fit_tensor("V_inv", "`(*b, r, r)` ``V⁻¹``.")
    weights = _fit_tensor("weights", "`(*b', r)` ``w = V⁻¹ Zᵀ C y`` of the observed rows.")

    def _apply(self, fn, recurse: bool = True):
        # .to(dtype) moves the float64 r×r state across devices but never rounds it; a no-op .to() keeps the fit
        # and what was derived from it (BoTorch's analytic acquisitions call .to(X) on every forward)
        out = keep_dtype_on_apply(self, ("noise",), fn, recurse, super()._apply)
        self._fit = self._fit.moved(lambda t: t.to(device=fn(t).device), self.embedding.projection)
        return out

    def __setstate__(self, state: dict) -> None:
        if "_fit" not in state:  # pickled before DTCFit: the fit was four buffers, with two caches beside them
            parts = {name: state["_buffers"].pop(name) for name in FIT_TENSORS}
            W = state["_modules"]["embedding"].projection
            state["_fit"] = DTCFit(W, **parts, since_refactor=state.pop("_since_refactor", 0))
            state.pop("_op", None), state.pop("_stable", None)
        super().__setstate__(state)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``, every entry or none
        (:func:`~torchbkb.utils.state_loading.load_state_dict_atomically`); the posterior scores with the loaded fit."""
        return load_state_dict_atomically(self, nn.Module.load_state_dict, state_dict, strict, assign=assign)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, t in self._fit.tensors().items():  # the fit under the names it has always had
            destination[prefix + name] = t if keep_vars else t.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        loaded, errors = {}, len(error_msgs)
        for name, own in self._fit.tensors().items():
            key = prefix + name
            if key in unexpected_keys:
                unexpected_keys.remove(key)  # nn.Module knows its buffers only
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
            elif not isinstance(state_dict[key], torch.Tensor) or state_dict[key].shape != own.shape:
                got = getattr(state_dict[key], "shape", type(state_dict[key]).__name__)
                error_msgs.append(f"size mismatch for {key}: expected shape {tuple(own.shape)}, got {got}")
            else:
                loaded[name] = state_dict[key].detach().to(own).clone()
        if len(error_msgs) == errors and loaded:
            self._fit = self._fit.replaced(**loaded)  # a new fit: nothing derived from the old one is kept

    # ------------------------------------------------------------------ fitting
    def fit(self, X: torch.Tensor, y: torch.Tensor, counts: torch.Tensor | None = None, *,
            features: torch.Tensor | None = None) -> DTCPosterior:
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
        X, y, counts = check_weighted_data(self.embedding, X, y, counts, "X", "y")
        if (features is not None
            and (not isinstance(features, torch.Tensor) or features.shape != (*X.shape[:-1], self.embedding.rank))):
            got = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise InputDataError(f"features: expected shape {(*X.shape[:-1], self.embedding.rank)}, got {got}")
        return self._fit_validated(X, y, counts, features)

    def _fit_validated(self, X, y, counts, features=None) -> DTCPosterior:
        """:meth:`fit` without input checks, for callers that validated their data once (the bandits)."""
        state = self._build(X, y, counts, features=features)
        self._set_state(state, X, y, counts, X.new_empty((*X.shape[:-2], 0, X.shape[-1])),
                        X.new_empty((*X.shape[:-2], 0)))
        return self

    def set_state(self, X: torch.Tensor, y: torch.Tensor, counts: torch.Tensor | None, state: DTCState) -> DTCPosterior:
        """Condition on observed data whose fit the caller holds already: no factorization (a bandit's posterior is its
        state, :meth:`~torchbkb.gp.kernel_row_posterior.KernelRowPosterior.dtc_state`). Replaces any previous data and
        pending points; on error nothing changes.

        Args:
            X, y, counts: as :meth:`fit`.
            state: this embedding's :class:`~torchbkb.gp.functional.DTCState` of ``(X, y, counts)`` in the compute
                dtype (that of :attr:`state`), kept as copies. Its shapes, dtypes, device and finiteness are checked,
                not that it fits the data.

        Returns:
            ``self``.
        """
        X, y, counts = check_weighted_data(self.embedding, X, y, counts, "X", "y")
        emb = self.embedding
        check_dtc_state(state, X.shape[:-2], emb.rank, emb.num_inducing, self.ZtZ.dtype, emb.inducing_points.device)
        own = type(state)(*(t.detach().clone() for t in state))  # tensors of its own: a user may write into them
        b = X.shape[:-2]
        self._set_state(DTCFit.from_state(emb.projection, own, self.lam), X, y, counts,
                        X.new_empty((*b, 0, X.shape[-1])), X.new_empty((*b, 0)))
        return self

    @property
    def state(self) -> DTCState:
        """The fitted state, :class:`~torchbkb.gp.functional.DTCState` (its operator derived on first use)."""
        self._check_fresh()
        return self._fit.state(self.lam)

    def refit(self) -> DTCPosterior:
        """Re-embed the stored data (observed and pending) with the embedding's current dictionary."""
        X_all = torch.cat([self.train_X, self.pending_X], dim=-2)
        w_all = torch.cat([self.train_counts, self.pending_counts], dim=-1)
        y_all = torch.cat([self.train_y, self.train_y.new_zeros(self.pending_counts.shape)], dim=-1)
        n_obs = self.num_train
        # pending rows are hallucinated: they enter V but their pseudo-reward is the posterior mean
        state = self._build(X_all, y_all, w_all, n_observed=n_obs)
        self._set_state(state, self.train_X, self.train_y, self.train_counts, self.pending_X, self.pending_counts)
        return self

    def set_inducing_points(self, inducing_points: torch.Tensor) -> DTCPosterior:
        """Replace the dictionary and refit on the stored data. On error nothing changes."""
        old = (self.embedding.inducing_points, self.embedding.projection, self.embedding.version)
        self.embedding.set_inducing_points(inducing_points)
        try:
            return self.refit()
        except Exception:
            self.embedding.inducing_points, self.embedding.projection, self.embedding.version = old
            raise

    # ------------------------------------------------------------------ updates
    def update(self, x: torch.Tensor, y: torch.Tensor | None = None,
               counts: torch.Tensor | None = None) -> RankOneDowndate | None:
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
        if isinstance(x, torch.Tensor) and x.dim() == 1:  # one point: (d,) -> (1, d), scalars -> (1,)
            x = x.unsqueeze(0)
            y, counts = (t.reshape(1) if isinstance(t, torch.Tensor) and t.dim() == 0 else t for t in (y, counts))
        self._check_fresh()
        x, y_chk, counts = check_weighted_data(self.embedding, x, y, counts, "x", "y", allow_none_y=True,
                                               batch=self.train_X.shape[:-2])
        with torch.no_grad():
            Z = self.embedding(x, validate=False)  # (*b, k, r); x checked just above
        result = self.update_features(Z, y_chk, counts)
        b = x.shape[:-2]
        if y_chk is None:
            self.pending_X, self.pending_counts = _grow(self.pending_X, x, b, 2), _grow(self.pending_counts, counts, b,
                                                                                        1)
        else:
            self.train_X, self.train_y = _grow(self.train_X, x, b, 2), _grow(self.train_y, y_chk, b, 1)
            self.train_counts = _grow(self.train_counts, counts, b, 1)
        return result

    def update_features(self, Z: torch.Tensor, y: torch.Tensor | None = None,
                        counts: torch.Tensor | None = None) -> RankOneDowndate | None:
        """:meth:`update` on already-embedded points (no stored data is appended; used by bandits that
        keep their own record and embed their arms once).

        Args:
            Z: `(*b, k, r)` features in the compute dtype (see :attr:`ZtZ`).
            y: `(*b, k)` or ``None`` (hallucinated).
            counts: `(*b, k)` positive weights; default ones.

        Returns:
            The :class:`RankOneDowndate` of the last point when ``k == 1``, else ``None``.
        """
        Z = check_features(Z, y, counts, self.ZtZ.shape[-1]).to(self.ZtZ.dtype)  # (*b, k, r); nothing stored yet
        c = torch.ones(Z.shape[:-1], dtype=Z.dtype, device=Z.device) if counts is None else counts
        self._fit, result = self._fit.updated(Z, y, c, self.lam, refactor_every=self.refactor_every)
        return result

    # ------------------------------------------------------------------ prediction
    def forward(self, Xq: torch.Tensor, *, validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and **GP-scale** variance ``λ·σ̃²`` at `(*b, q, d)` ``Xq`` (dtype/device of the inducing
        points): ``(mean, var)``, each `(*b, q)` in ``Xq``'s dtype, differentiable w.r.t. ``Xq``.
        ``validate=False`` skips the checks of ``Xq`` (a caller that made them: their host read)."""
        mean, rls = self._mean_rls(Xq, validate)
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
        self._check_fresh()
        return self._fit.score_features(Z, kdiag, self.lam, self.chunk_size)

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
        return self._fit.score_rows(K, kdiag, self.lam, self.chunk_size)

    def effective_dimension(self) -> torch.Tensor:
        """``Σ_i c_i σ̃²(x_i)`` over the observed rows (RLS scale) -- the estimate of ``d_eff`` of 000 Eq. 5."""
        if self.num_train == 0:
            return torch.zeros(self.batch_shape, dtype=self.ZtZ.dtype, device=self.ZtZ.device)
        return (self.rls(self.train_X) * self.train_counts).sum(-1)

    # ------------------------------------------------------------------ internals
    def _mean_rls(self, Xq: torch.Tensor, validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_fresh()
        if validate:
            self.embedding.check_input(Xq, "Xq")
        return chunked(lambda i, j: self._score_points(Xq[..., i:j, :]), Xq.shape[-2], self.chunk_size)

    def _build(self, X, y, counts, n_observed: int | None = None, features: torch.Tensor | None = None) -> DTCFit:
        """The fit from scratch (:meth:`DTCFit.from_features`), embedding ``X`` in chunks of :attr:`chunk_size`
        rows: never an `(n, r)` feature matrix beyond a chunk."""
        dtype = compute_dtype(self.embedding.inducing_points.dtype, self.embedding.rank)
        step = max(X.shape[-2], 1) if features is not None else self.chunk_size  # given features: one pass
        rows = (lambda a, b: features[..., a:b, :].to(dtype)) if features is not None else (
                lambda a, b: self._embed(X[..., a:b, :], dtype))
        return DTCFit.from_features(self.embedding.projection, rows, X.shape[-2], counts, y, self.lam, dtype=dtype,
                                    batch=X.shape[:-2], device=X.device, step=step, n_observed=n_observed)

    def _embed(self, X: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        with torch.no_grad():
            return self.embedding(X).to(dtype)

    def _set_state(self, fit: DTCFit, X, y, counts, pending_X, pending_counts) -> None:
        buffers = self._buffers  # every name is a tensor buffer after __init__: plain dict stores
        for name, value in (("train_X", X), ("train_y", y), ("train_counts", counts), ("pending_X", pending_X),
                            ("pending_counts", pending_counts)):
            if name in buffers:
                buffers[name] = value
            else:
                self.register_buffer(name, value)
        self._fit = fit
        self._emb_version = self.embedding.version

    def _check_fresh(self) -> None:
        if self._emb_version != self.embedding.version:
            raise TorchBKBError(
                "DTCPosterior: expected the embedding's dictionary it was fitted with, got a changed one "
                "(call refit() or set_inducing_points() on the posterior)"
            )


def _grow(old: torch.Tensor, new: torch.Tensor, batch: torch.Size, trailing: int) -> torch.Tensor:
    """``old`` `(*b, n, ...)` expanded to ``batch`` and ``new`` appended along its first of ``trailing`` core dims."""
    return torch.cat([old.expand(*batch, *old.shape[-trailing:]), new], dim=-trailing)
