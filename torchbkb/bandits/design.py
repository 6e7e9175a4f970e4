"""Uncertainty-reduction design with a sparse posterior (003 Sec. 4.1) -- also S-BPE's in-batch rule.

At step ``j`` the point of largest sparse posterior variance is chosen,
``x_j = argmax_{x ∈ X} σ̄_{j-1}(x)``, where ``σ̄²_{j-1}`` is the DTC (Titsias/SVGP) variance of 003 Eq. 4
given the previous points ``X_{j-1}`` and inducing points ``Z^{(j-1)}`` drawn by recursive RLS over
``X_{j-1}`` (Lemma 3.8). No reward is used, which is what keeps the sparse confidence intervals of
Theorem 3.5 valid afterwards. With the design in hand, the rewards are collected and ``μ̄_n`` is the
regressor of Theorem 4.1 (``‖f - μ̄_n‖_∞ = O(√(γ(n)/n · log(|X|/δ)))``).

* :class:`UncertaintyExplorer` -- the sequential rule over a finite candidate set (the S-BPE batch
  builder and the design below share it);
* :func:`uncertainty_design` -- ``n`` design points, their rewards and the fitted sparse regressor;
* :func:`linf_error` -- ``max_x |f(x) - μ̄(x)|`` on a set of points against a known ``f``.

Example:
    >>> import torch
    >>> from torchbkb.gp.kernels import GaussianKernel
    >>> from torchbkb.bandits.design import uncertainty_design, linf_error
    >>> grid = torch.linspace(0, 1, 200, dtype=torch.float64)[:, None]
    >>> f = lambda X: torch.sin(6 * X[:, 0])
    >>> res = uncertainty_design(grid, GaussianKernel(0.2), 1e-4, 20, lambda i: f(grid[i]), seed=0)
    >>> res.indices.shape, linf_error(res.regressor, f, grid) < 0.05
    (torch.Size([20]), True)
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple
from collections.abc import Callable

import torch

from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.bandits.sketched_fit import sketched_fit
from torchbkb.errors import (InputDataError, NumericsError, TorchBKBError, check_generator, check_int, check_matrix,
                             check_finite, check_positive, nonfinite_rows_error)
from torchbkb.gp.kernels import KernelAdapter, as_kernel
from torchbkb.gp.nystrom import DEFAULT_CHUNK
from torchbkb.objectives import as_objective
from torchbkb.sampling.recursive_rls import DEFAULT_OVERSAMPLE, check_oversample, nystrom_lambda_max

__all__ = ["UncertaintyExplorer", "UncertaintyDesign", "uncertainty_design", "linf_error", "theory_rls_delta"]


def theory_rls_delta(delta: float, batches: int = 1) -> Callable[[int], float]:
    """The recursive-RLS confidence schedule ``δ_j = 3δ / (π² B j²)`` of 003 Theorem 4.1 (``B = 1``) and
    Theorem 5.2 (``B`` batches), so that ``Σ_{i,j} δ_j <= δ/2``; clamped below Lemma 3.8's ``1/32``.

    Example:
        >>> round(theory_rls_delta(0.1)(2), 6)        # 3·0.1 / (π² · 4)
        0.007599
    """
    check_positive(delta, "delta")
    check_int(batches, "batches")
    return functools.partial(_schedule_at, float(delta), int(batches))  # a partial, not a closure: it pickles


def _schedule_at(delta: float, batches: int, j: int) -> float:
    return min(3.0 * delta / (math.pi**2 * batches * max(int(j), 1) ** 2), 0.999 / 32.0)


class UncertaintyExplorer:
    """Sequential maximal-variance selection over a finite candidate set with recursive-RLS inducing points.

    Every ``refresh`` picks the dictionary is redrawn by :func:`~torchbkb.sampling.recursive_rls.recursive_rls`
    over all points picked so far, the candidates are re-embedded (``O(A·m²)``) and the DTC posterior is
    refit on the picks (no rewards: the variance does not depend on them). With ``refresh=1`` this is
    003 Sec. 4.1 / Algorithm 1 line 6 verbatim. Between two refreshes the dictionary is kept and each
    pick is a rank-one *hallucinated* update of ``V`` (:meth:`DTCPosterior.update_features` with
    ``y=None``), which downdates the candidates' variances in ``O(A·m)`` -- exact for the kept dictionary.

    Ties in the argmax go to the lowest candidate index (with an empty design all prior variances
    ``k(x, x)`` are equal for a stationary kernel, so the first pick is candidate 0).

    Args:
        candidates: `(A, d)` finite candidate set.
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``τ² > 0``.
        oversample: recursive-RLS oversampling (a float or ``"theory"``, see :func:`recursive_rls`).
        base_size: recursive-RLS base-case size (practical constants only).
        rls_delta: ``δ_j`` of Lemma 3.8 for the refresh at ``j`` picks: a float, or a callable ``j -> δ_j``
            (default :func:`theory_rls_delta` of ``0.01``); used by ``oversample="theory"`` only.
        refresh: picks between two dictionary refreshes, an integer ``>= 1``.
        generator: the ``torch.Generator`` of the recursive-RLS draws (its state advances).
        chunk_size: candidates embedded/scored at once.

    Attributes:
        picks: `(j,)` long, candidate indices in the order picked (repeats possible).
        dictionary: `(m,)` long, positions in :attr:`picks` of the current inducing points.
        refreshes: how many times the dictionary was redrawn.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> cand = torch.linspace(0, 1, 101, dtype=torch.float64)[:, None]
        >>> ex = UncertaintyExplorer(cand, GaussianKernel(0.3), 0.01, generator=torch.Generator().manual_seed(0))
        >>> ex.run(3).tolist()            # the lowest index first (equal prior variances), then the gaps
        [0, 100, 50]
    """

    def __init__(
        self,
        candidates: torch.Tensor,
        kernel: Callable,
        noise: float,
        *,
        oversample: float | str = DEFAULT_OVERSAMPLE,
        base_size: int | None = None,
        rls_delta: float | Callable[[int], float] | None = None,
        refresh: int = 1,
        generator: torch.Generator | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ):
        check_matrix(candidates, "candidates", min_rows=1)
        if candidates.dim() != 2:
            raise InputDataError(f"candidates: expected shape (A, d), got shape {tuple(candidates.shape)}")
        self.kernel: KernelAdapter = as_kernel(kernel)
        self.lam = check_positive(noise, "noise")
        check_oversample(oversample)
        check_int(refresh, "refresh")
        check_int(chunk_size, "chunk_size")
        generator = check_generator(generator, 0)
        if rls_delta is None:
            rls_delta = theory_rls_delta(0.01)
        elif not callable(rls_delta):
            d = float(rls_delta)
            if not 0.0 < d < 1.0 / 32.0:
                raise InputDataError(f"rls_delta: expected 0 < rls_delta < 1/32 or a callable j -> δ_j, got "
                                     f"{rls_delta!r}")
            rls_delta = (lambda j, _d=d: _d)
        self.candidates = candidates.detach()
        self.oversample = oversample
        self.base_size = base_size
        self.rls_delta = rls_delta
        self.refresh = int(refresh)
        self.generator = generator
        self.chunk_size = int(chunk_size)
        with torch.no_grad():
            self.kdiag = self.kernel.diag(self.candidates).detach()  # (A,)
        check_finite(self.kdiag, "kernel: prior variances k(x, x)")
        self.refreshes = 0
        self._picks: list[int] = []
        self._dict_at = 0  # number of picks the current dictionary was drawn from
        self.dictionary = torch.zeros(0, dtype=torch.long, device=candidates.device)
        self._post: DTCPosterior | None = None
        self._Z: torch.Tensor | None = None  # (A, r) candidates embedded with the current dictionary
        self._rls = self.kdiag / self.lam  # (A,) RLS-scale variance; the prior before any pick

    # ------------------------------------------------------------------ state
    @property
    def picks(self) -> torch.Tensor:
        """`(j,)` long, the candidates picked so far."""
        return torch.as_tensor(self._picks, dtype=torch.long, device=self.candidates.device).reshape(-1)

    @property
    def dictionary_size(self) -> int:
        """``m``, the number of inducing points currently in use (0 before the first pick)."""
        return int(self.dictionary.numel())

    def variance(self) -> torch.Tensor:
        """`(A,)` GP-scale sparse posterior variance ``σ̄²`` of the candidates given the picks so far."""
        return self._rls * self.lam

    # ------------------------------------------------------------------ selection
    def step(self) -> int:
        """Pick ``argmax σ̄`` (lowest index on ties), condition on it, and return its candidate index."""
        i = int(torch.argmax(self._rls))
        self._picks.append(i)
        with torch.no_grad():
            if self._post is None or len(self._picks) - self._dict_at >= self.refresh:
                try:
                    self._refresh()
                except NumericsError:  # nothing changed but the generator's draws
                    self._picks.pop()
                    raise
            else:
                z = self._Z[i]  # (r,)
                down = self._post.update_features(z.unsqueeze(0))  # hallucinated, V ← V + z zᵀ
                proj = self._Z @ down.direction.to(self._Z.dtype)  # (A,) zᵀ V_old⁻¹ z_new
                self._rls = (self._rls - down.coef.to(self._rls.dtype) * proj * proj).clamp_min(0.0)
        return i

    def run(self, n: int) -> torch.Tensor:
        """Make ``n`` more picks.

        Args:
            n: number of picks, ``>= 0``.

        Returns:
            `(n,)` long, the candidate indices picked by this call.
        """
        check_int(n, "n", 0)
        return torch.as_tensor([self.step() for _ in range(n)], dtype=torch.long,
                               device=self.candidates.device).reshape(-1)

    def finalize(self) -> UncertaintyExplorer:
        """Redraw the dictionary over *all* picks if the current one is older (Algorithm 1, line 16)."""
        if not self._picks:
            raise TorchBKBError("UncertaintyExplorer: expected at least one pick before finalize(), got none")
        if self._dict_at != len(self._picks):
            with torch.no_grad():
                self._refresh()
        return self

    # ------------------------------------------------------------------ results
    @property
    def inducing_points(self) -> torch.Tensor:
        """`(m, d)` the current inducing points."""
        return self.candidates[self.picks[self.dictionary]]

    def regressor(self, y: torch.Tensor) -> DTCPosterior:
        """The sparse regressor ``μ̄_n`` on the picks with rewards ``y`` and the current dictionary.

        Args:
            y: `(j,)` rewards of :attr:`picks`, in pick order (call :meth:`finalize` first to use the
                dictionary of all picks, as Theorem 4.1 does).

        Returns:
            A fitted :class:`~torchbkb.DTCPosterior` (``post(X)`` gives ``μ̄`` and ``σ̄²``).
        """
        if self._post is None:
            raise TorchBKBError("UncertaintyExplorer: expected at least one pick before regressor(), got none")
        X = self.candidates[self.picks]
        return DTCPosterior(self._post.embedding, noise=self.lam, chunk_size=self.chunk_size).fit(X, y)

    def lambda_max(self, **kwargs) -> float:
        """``λ_max`` of the current dictionary over the points it was drawn from (see
        :func:`~torchbkb.sampling.recursive_rls.nystrom_lambda_max`; keyword arguments are passed on)."""
        if self._post is None:
            raise TorchBKBError("UncertaintyExplorer: expected at least one pick before lambda_max(), got none")
        X = self.candidates[self.picks[: self._dict_at]]
        return nystrom_lambda_max(X, self.kernel, self.inducing_points, **kwargs)

    # ------------------------------------------------------------------ internals
    def _refresh(self) -> None:
        """Redraw the dictionary over the picks; kernel values NaN/inf among them or against the candidates raise a
        :class:`~torchbkb.errors.NumericsError` naming the candidates at fault (``arms``), before any change."""
        j = len(self._picks)
        X = self.candidates[self.picks]  # (j, d)
        indices, emb, post = sketched_fit(X, X.new_zeros(j), self.kernel, self.lam, names=self._picks,
                                          oversample=self.oversample, base_size=self.base_size,
                                          delta=self.rls_delta(j), generator=self.generator, chunk_size=self.chunk_size)
        Z = emb(self.candidates)  # (A, r)
        rls = post.score_embedded(Z, self.kdiag)[1]
        if not bool(torch.isfinite(rls).all()):
            raise nonfinite_rows_error((~torch.isfinite(Z).all(1) | ~torch.isfinite(rls)).nonzero().squeeze(1).tolist())
        self._Z, self._post, self._rls = Z, post, rls
        self.dictionary = indices
        self._dict_at = j
        self.refreshes += 1


class UncertaintyDesign(NamedTuple):
    """Result of :func:`uncertainty_design`.

    Attributes:
        indices: `(n,)` long, the design (candidate indices in pick order; repeats possible).
        y: `(n,)` the rewards observed at the design.
        regressor: the fitted sparse :class:`~torchbkb.DTCPosterior` (``μ̄_n``, ``σ̄_n``).
        inducing_indices: `(m,)` long, candidate indices of the final inducing points.
        lambda_max: ``λ_max`` of the final dictionary over the design (``nan`` if not computed).
    """

    indices: torch.Tensor
    y: torch.Tensor
    regressor: DTCPosterior
    inducing_indices: torch.Tensor
    lambda_max: float


def uncertainty_design(
    candidates: torch.Tensor,
    kernel: Callable,
    noise: float,
    num_points: int,
    objective: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor,
    *,
    oversample: float | str = DEFAULT_OVERSAMPLE,
    base_size: int | None = None,
    delta: float = 0.01,
    refresh: int = 1,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    compute_lambda_max: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
) -> UncertaintyDesign:
    """003 Sec. 4.1: choose ``n`` points by maximal sparse posterior variance, observe them, fit ``μ̄_n``.

    The inducing points at step ``j`` come from recursive RLS with ``δ_j = 3δ/(π² j²)`` (Theorem 4.1;
    only the ``"theory"`` constants use ``δ_j``); the regressor uses a dictionary redrawn over all ``n``
    points. For a continuous domain pass a fine grid as ``candidates`` (Theorem 4.2 / Sec. 4.3).

    Args:
        candidates: `(A, d)` finite domain (or a grid of a continuous one).
        kernel: a ``gpytorch.kernels.Kernel`` or callable ``(X1, X2) -> Tensor``.
        noise: ``τ² > 0``.
        num_points: ``n >= 1``.
        objective: a callable ``indices (n,) -> rewards (n,)`` (e.g. :class:`torchbkb.ArmObjective`), or an
            `(A,)` tensor of rewards per candidate.
        oversample, base_size, refresh, chunk_size: see :class:`UncertaintyExplorer`.
        delta: the ``δ`` of Theorem 4.1's recursive-RLS schedule.
        seed: seed of the recursive-RLS draws (ignored when ``generator`` is given).
        generator: a ``torch.Generator`` for the draws.
        compute_lambda_max: also compute ``λ_max`` of the final dictionary (Lanczos, ``O(n²)`` per step).

    Returns:
        An :class:`UncertaintyDesign`.

    Example:
        >>> import torch
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> cand = torch.rand(300, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> f = torch.cos(3 * cand[:, 0]) * cand[:, 1]
        >>> res = uncertainty_design(cand, GaussianKernel(0.3), 0.01, 25, f, seed=1, compute_lambda_max=True)
        >>> res.inducing_indices.numel() <= 25, res.lambda_max <= 0.01
        (True, True)
    """
    check_int(num_points, "num_points")
    check_matrix(candidates, "candidates", min_rows=1)
    objective = as_objective(objective, candidates.shape[0])  # the run loop's tensor-or-callable rule
    generator = check_generator(generator, seed)
    ex = UncertaintyExplorer(
        candidates,
        kernel,
        noise,
        oversample=oversample,
        base_size=base_size,
        rls_delta=theory_rls_delta(delta),
        refresh=refresh,
        generator=generator,
        chunk_size=chunk_size,
    )
    idx = ex.run(num_points)
    ex.finalize()
    y = torch.as_tensor(objective(idx)).reshape(-1).to(device=candidates.device, dtype=candidates.dtype)
    if y.shape != (num_points,):
        raise InputDataError(f"objective: expected {num_points} rewards, got shape {tuple(y.shape)}")
    post = ex.regressor(y)
    lam_max = ex.lambda_max() if compute_lambda_max else float("nan")
    return UncertaintyDesign(idx, y, post, idx[ex.dictionary], lam_max)


def linf_error(regressor: Callable, f: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor, X: torch.Tensor, *,
               chunk_size: int = DEFAULT_CHUNK) -> float:
    """``max_{x ∈ X} |f(x) - μ̄(x)|`` -- the L∞ error of Theorem 4.1 measured on the points ``X``.

    Args:
        regressor: a fitted posterior (``regressor.mean(X)`` or ``regressor(X)[0]`` is ``μ̄``).
        f: the true function, a callable `(n, d) -> (n,)`, or its `(n,)` values at ``X``.
        X: `(n, d)` evaluation points (e.g. a grid or the whole finite domain).
        chunk_size: points evaluated at once.

    Returns:
        The error as a Python float.

    Example:
        >>> import torch
        >>> from torchbkb import ExactPosterior
        >>> from torchbkb.gp.kernels import GaussianKernel
        >>> X = torch.linspace(0, 1, 5, dtype=torch.float64)[:, None]
        >>> post = ExactPosterior(GaussianKernel(0.3), noise=1e-6).fit(X, torch.zeros(5, dtype=torch.float64))
        >>> linf_error(post, torch.ones(5, dtype=torch.float64), X)
        1.0
    """
    check_matrix(X, "X", min_rows=1)
    n = X.shape[0]
    errs = []
    with torch.no_grad():
        for i in range(0, n, chunk_size):
            Xc = X[i : i + chunk_size]
            mu = regressor.mean(Xc) if hasattr(regressor, "mean") else regressor(Xc)[0]
            fc = f[i : i + chunk_size] if isinstance(f, torch.Tensor) else f(Xc)
            fc = torch.as_tensor(fc).reshape(-1)
            if fc.shape != mu.shape:
                raise InputDataError(f"f: expected values of shape {tuple(mu.shape)} at the points, got "
                                     f"{tuple(fc.shape)}")
            errs.append((fc.to(torch.float64) - mu.to(torch.float64)).abs().max())
    return float(torch.stack(errs).max())
