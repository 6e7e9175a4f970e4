"""Trust-region BKB: TuRBO-1 and TuRBO-m (Eriksson et al., NeurIPS 2019) with a :class:`~torchbkb.botorch.BKBModel`
as each region's local model, for loops of thousands of evaluations in tens of dimensions.

Each region (:class:`~torchbkb.botorch.trust_region.TrustRegion`) owns the points it proposed since its last
restart, starting from a Sobol design of ``n_init`` points. A proposal fits the region's model on its points --
at most ``local_points`` of them, the nearest to the region's centre in the region's own metric, so that a fit
costs the same at 10³ and at 10⁵ evaluations and the hyperparameters come from the exact evidence
(:data:`~torchbkb.botorch.defaults.EXACT_FIT`) -- once, warm from the region's previous hyperparameters or, now
and then, from the kernel's defaults (:data:`FIT_FTOL`, :data:`COLD_EVERY`), draws TuRBO's candidates in the
region and picks ``q`` of them by Thompson sampling (:func:`~torchbkb.botorch.optimize_acqf_thompson`: distinct
exact joint draws over the candidates, as TuRBO draws them) or by a fixed-``q`` BBKB batch
(:func:`~torchbkb.botorch.optimize_acqf_bbkb`).
With several regions the ``q`` best picks across regions are taken (their values are in the objective's units).

Example:
    >>> import torch
    >>> from torchbkb.botorch import TrustRegionBKB
    >>> f = lambda X: -((X - 0.3) ** 2).sum(-1)                 # maximize on [0, 1]^3
    >>> loop = TrustRegionBKB(torch.tensor([[0.0] * 3, [1.0] * 3], dtype=torch.float64), batch_size=8, seed=0)
    >>> X, Y = loop.optimize(f, budget=40)
    >>> X.shape, bool(Y.max() > -0.05)
    (torch.Size([40, 3]), True)
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable

import torch
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from torch import Tensor
from torch.quasirandom import SobolEngine

from torchbkb.botorch.batch import optimize_acqf_bbkb
from torchbkb.botorch.defaults import EXACT_FIT
from torchbkb.botorch.marginal_likelihood import DTCMarginalLogLikelihood
from torchbkb.botorch.model import BKBModel
from torchbkb.botorch.thompson import optimize_acqf_thompson
from torchbkb.botorch.trust_region import (TrustRegion, accept_stalled_line_search, model_lengthscale, num_candidates,
                                           turbo_modules)
from torchbkb.botorch.trust_region_state import check_loop_state, loop_settings
from torchbkb.errors import CheckpointError, InputDataError, NumericsWarning, ObjectiveError, check_finite, check_int
from torchbkb.experiment.checkpoint import check_checkpoint_path, read_checkpoint, save_checkpoint

__all__ = ["TrustRegionBKB", "LOCAL_POINTS", "COLD_EVERY", "WARM_MAXITER", "FIT_FTOL", "turbo_modules"]

#: A region's model is fitted on at most this many of its points (the exact evidence's limit).
LOCAL_POINTS = EXACT_FIT
#: A region's model is fitted from the kernel's defaults at its first fit, when its points doubled since that fit,
#: and at every this-many-th fit; warm from its previous hyperparameters otherwise.
COLD_EVERY = 4
#: The most L-BFGS-B iterations of a warm fit (also at most the evaluations of the region's last fit from the
#: defaults: a warm start that needs more does not pay, and the region fits from the defaults until it restarts).
WARM_MAXITER = 200
#: A fit stops when an L-BFGS-B step changes the evidence by less than this fraction (scipy's ``ftol``; BoTorch's
#: default, 2.2e-9, spends most of a 60-d fit's evaluations below any change that matters; docs/high_throughput.md).
FIT_FTOL = 1e-6


class TrustRegionBKB:
    """TuRBO with BKBModel local models (module docstring); maximizes. Ask/tell, or :meth:`optimize` a function.

    Args:
        bounds: `(2, d)` lower and upper bounds of the search box.
        batch_size: ``q``, points per proposal.
        num_regions: ``m`` (TuRBO-1: 1).
        acquisition: ``"thompson"`` or ``"bbkb"`` (fixed-``q`` BBKB with ``beta``).
        beta: the width of ``"bbkb"``'s UCB ``μ + β·σ`` on the GP scale (``α̃ = β√λ`` on the RLS scale).
        n_init: a region's initial Sobol design (default ``2d``, as BoTorch's TuRBO tutorial).
        n_candidates: candidates per region and proposal (default TuRBO's ``min(5000, max(2000, 200d))``).
        local_points: the most points a region's model is fitted on (:data:`LOCAL_POINTS`).
        model_kwargs: ``BKBModel`` keyword arguments (default :func:`turbo_modules`); fit_kwargs: passed to
            ``fit_gpytorch_mll``.
        warm_start: one fit per proposal, warm from the region's previous hyperparameters except at the first fit,
            when the points doubled and every :data:`COLD_EVERY`-th fit, which start from the kernel's defaults;
            a region whose warm fit needs more evaluations than its last fit from the defaults fits from the
            defaults until it restarts (``False``: from the defaults at every fit, as TuRBO's reference code).
        sampler: the Thompson draws: ``"joint"`` (exact, over the candidates) or ``"pathwise"`` (random-feature
            prior: inside a small region its approximation error swamps the posterior variance).
        seed: seeds the designs, candidates, dictionaries and draws.

    Attributes:
        X, Y: `(n, d)` and `(n,)` every told point (original units) and value; regions: the
        :class:`~torchbkb.botorch.trust_region.TrustRegion` states; models: each region's last fitted model;
        X_failed: `(f, d)` the points :meth:`optimize` dropped for NaN/inf values (``on_failure="skip"``).
    """

    def __init__(self, bounds: Tensor, batch_size: int = 100, *, num_regions: int = 1, acquisition: str = "thompson",
                 beta: float = 1.0, n_init: int | None = None, n_candidates: int | None = None,
                 local_points: int = LOCAL_POINTS, model_kwargs: dict | None = None, fit_kwargs: dict | None = None,
                 warm_start: bool = True, sampler: str = "joint", seed: int = 0):
        shaped = isinstance(bounds, Tensor) and bounds.dim() == 2 and bounds.shape[0] == 2
        if not (shaped and bounds.is_floating_point()):
            got = getattr(bounds, "shape", bounds)
            raise InputDataError(f"bounds: expected a floating tensor of shape (2, d), got {got}")
        check_finite(bounds, "bounds")
        if not bool((bounds[1] > bounds[0]).all()):
            raise InputDataError("bounds: expected every upper bound above its lower bound")
        if acquisition not in ("thompson", "bbkb"):
            raise InputDataError(f"acquisition: expected 'thompson' or 'bbkb', got {acquisition!r}")
        if sampler not in ("joint", "pathwise"):
            raise InputDataError(f"sampler: expected 'joint' or 'pathwise', got {sampler!r}")
        d = bounds.shape[1]
        for name, v in (("batch_size", batch_size), ("num_regions", num_regions), ("local_points", local_points),
                        ("n_init", 2 * d if n_init is None else n_init), ("seed", seed + 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputDataError(f"{name}: expected an integer >= 1 (seed >= 0), got {v!r}")
        self.bounds, self.batch_size, self.acquisition, self.beta = bounds, batch_size, acquisition, float(beta)
        self.n_init = 2 * d if n_init is None else n_init
        self.n_candidates = num_candidates(d) if n_candidates is None else int(n_candidates)
        self.local_points, self.seed, self.warm_start, self.sampler = local_points, seed, bool(warm_start), sampler
        self.model_kwargs, self.fit_kwargs = model_kwargs, dict(fit_kwargs or {})
        self.regions = [TrustRegion(d, batch_size) for _ in range(num_regions)]
        self.models: list[BKBModel | None] = [None] * num_regions
        self._owned: list[list[int]] = [[] for _ in range(num_regions)]  # each region's points since its restart
        self._hyper: list[dict | None] = [None] * num_regions  # each region's last hyperparameters
        self._cold_at, self._fits = [0] * num_regions, [0] * num_regions  # points at its last fit from the defaults
        self._cold_cost = [0] * num_regions  # evaluations of its last fit from the defaults (0: warm starts off)
        self._fit_rows: list[list[int] | None] = [None] * num_regions  # the points of its last model
        self._pending: list[int] | None = None  # the region of each asked point
        self._asked: Tensor | None = None  # the asked batch, until told
        self._draws = 0
        self.X, self.Y, self.X_failed = bounds.new_zeros((0, d)), bounds.new_zeros((0,)), bounds.new_zeros((0, d))

    # ------------------------------------------------------------------ the loop
    def optimize(self, f: Callable[[Tensor], Tensor], budget: int, checkpoint: str | os.PathLike | None = None,
                 on_failure: str = "raise") -> tuple[Tensor, Tensor]:
        """Ask, evaluate ``f`` (`(k, d) -> (k,)` or `(k, 1)`, maximized) and tell until ``budget`` evaluations;
        returns every point and value, ``(X, Y)``. A batch asked and not yet told is evaluated first.

        With ``checkpoint=path`` the loop's :meth:`state_dict` is written there atomically after every batch told
        (:mod:`torchbkb.experiment.checkpoint`), and a loop started on an existing file resumes from it: the same
        batches as a run never stopped. The path is checked before the first evaluation.

        Values that are NaN/inf are the objective's failures, as in :func:`torchbkb.run`: ``on_failure="raise"``
        raises an :class:`~torchbkb.errors.ObjectiveError` naming the batch's rows, with the batch still pending
        (checkpointed: the next call evaluates it again); ``"skip"`` tells the batch's other points and keeps the
        failed ones in :attr:`X_failed`, where they count against ``budget``. An exception of ``f`` propagates.
        """
        if on_failure not in ("raise", "skip"):
            raise InputDataError(f"on_failure: expected 'raise' or 'skip', got {on_failure!r}")
        check_int(budget, "budget", 0)
        if not callable(f):
            raise InputDataError(f"f: expected a callable (k, d) -> (k,), got {type(f).__name__}")
        path = None if checkpoint is None else check_checkpoint_path(checkpoint)
        if path is not None and path.exists():
            self.load_state_dict(read_checkpoint(path, fields=("trust_region",))["trust_region"])
        while (left := budget - self.Y.numel() - self.X_failed.shape[0]) > 0:
            X = (self.ask() if self._pending is None else self._asked)[:left]  # the last batch cut to the budget
            Y = f(X)
            Y = Y.reshape(-1) if isinstance(Y, Tensor) and Y.dim() == 2 and Y.shape[-1] == 1 else Y
            ok = torch.isfinite(Y).to(X.device) if isinstance(Y, Tensor) and Y.shape == (X.shape[0],) else None
            if ok is None or bool(ok.all()):
                self.tell(X, Y)  # or its typed error for a wrong shape
            elif on_failure == "skip":
                self.tell(X[ok], Y[ok.to(Y.device)], rows=ok.nonzero().squeeze(-1).tolist())
                self.X_failed = torch.cat([self.X_failed, X[~ok]])
            else:
                if path is not None:
                    save_checkpoint(path, {"trust_region": self.state_dict()})
                bad = (~ok).nonzero().squeeze(-1).tolist()
                raise ObjectiveError(f"f: expected finite values, got NaN/inf at rows {bad} of the batch; the batch is "
                                     f"still pending and the next call evaluates it again (on_failure='skip' drops "
                                     f"such points)")
            if path is not None:
                save_checkpoint(path, {"trust_region": self.state_dict()})
        return self.X, self.Y

    def initialize(self, X: Tensor, Y: Tensor) -> None:
        """Start every region from points evaluated elsewhere (an initial design of your own, an earlier run):
        `(n, d)` ``X`` in the box and `(n,)` ``Y``; the regions then skip their Sobol designs."""
        if self._pending is not None or self.Y.numel():
            raise InputDataError("initialize: expected a loop that has neither asked nor been told anything")
        self._pending = [-1] * (X.shape[0] if isinstance(X, Tensor) and X.dim() == 2 else 0)
        try:
            self.tell(X, Y)
        finally:
            self._pending = None  # told, or refused with nothing changed

    def ask(self) -> Tensor:
        """The next batch `(k, d)` (original units): the initial design of every region that has no point, else
        ``q`` picks across regions."""
        if self._pending is not None:
            raise InputDataError("ask: expected the last batch told first, got a batch still pending")
        fresh = [r for r, owned in enumerate(self._owned) if not owned]
        if fresh:
            d = self.bounds.shape[1]
            designs = [SobolEngine(d, scramble=True, seed=self._seed()).draw(self.n_init) for _ in fresh]
            self._pending = [r for r in fresh for _ in range(self.n_init)]
            self._asked = self._from_unit(torch.cat(designs).to(self.bounds))
            return self._asked.clone()
        picks, values, owners = [], [], []
        for r in range(len(self.regions)):
            X_r, v_r = self._propose(r)
            picks.append(X_r)
            values.append(v_r)
            owners += [r] * X_r.shape[0]
        order = torch.cat(values).argsort(descending=True)[: self.batch_size]
        self._pending = [owners[i] for i in order.tolist()]  # one read, not one a point
        self._asked = self._from_unit(torch.cat(picks)[order])
        return self._asked.clone()

    def tell(self, X: Tensor, Y: Tensor, rows: list[int] | None = None) -> None:
        """The values `(k,)` (or `(k, 1)`) of asked points ``X`` `(k, d)`: the whole batch, its first ``k`` points,
        or with ``rows`` the batch's points at those ``k`` distinct positions (``k = 0`` too). The batch's other
        points are dropped; a region that collapsed restarts."""
        if self._pending is None:
            raise InputDataError("tell: expected a batch asked first, got none pending")
        Y = Y.reshape(-1) if isinstance(Y, Tensor) and Y.dim() == 2 and Y.shape[-1] == 1 else Y
        d, k = self.bounds.shape[1], len(self._pending)
        if not isinstance(X, Tensor) or X.dim() != 2 or X.shape[1] != d or not int(rows is None) <= X.shape[0] <= k:
            raise InputDataError(f"X: expected the asked batch (or its first rows) of shape ({k}, {d}), "
                                 f"got {getattr(X, 'shape', X)}")
        rows = list(range(X.shape[0])) if rows is None else rows.tolist() if isinstance(rows, Tensor) else rows
        if not (isinstance(rows, (list, tuple)) and len(rows) == X.shape[0] == len(set(rows)) and all(
                isinstance(j, int) and not isinstance(j, bool) and 0 <= j < k for j in rows)):
            raise InputDataError(f"rows: expected {X.shape[0]} distinct positions in the batch of {k}, got {rows!r}")
        if not isinstance(Y, Tensor) or Y.shape != (X.shape[0],):
            raise InputDataError(f"Y: expected shape ({X.shape[0]},), got {getattr(Y, 'shape', Y)}")
        check_finite(X, "X")
        check_finite(Y, "Y")
        tol = 1e-9 * (self.bounds[1] - self.bounds[0])
        if bool(((X < self.bounds[0] - tol) | (X > self.bounds[1] + tol)).any()):
            raise InputDataError("X: expected points inside the bounds")
        n, pending = self.Y.numel(), [self._pending[j] for j in rows]
        self.X, self.Y = torch.cat([self.X, X.to(self.X)]), torch.cat([self.Y, Y.to(self.Y)])
        for r, region in enumerate(self.regions):
            mine = [n + j for j, owner in enumerate(pending) if owner in (r, -1)]  # -1: every region's (initialize)
            if not mine:
                continue
            self._owned[r] += mine
            region.update(self.Y[mine])
            if region.restart_triggered:
                region.restart()
                self._owned[r], self._hyper[r], self.models[r] = [], None, None
                self._fit_rows[r] = None
                self._cold_at[r] = self._fits[r] = self._cold_cost[r] = 0
        self._pending = self._asked = None

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The loop's state in tensors, numbers and lists (``torch.load(weights_only=True)`` reads it back): the
        settings, the told and failed points, the pending batch and its regions, the draws so far, and per region
        its TuRBO state, points, fit counters and last hyperparameters. Its last model is kept as the rows and seed
        it was built with, and rebuilt by :meth:`load_state_dict`. The model and fit keywords are not in it: give
        the same."""
        regions = [{"trust_region": region.state_dict(), "owned": list(self._owned[r]),
                    "hyper": None if self._hyper[r] is None else {k: v.clone() for k, v in self._hyper[r].items()},
                    "cold_at": self._cold_at[r], "fits": self._fits[r], "cold_cost": self._cold_cost[r],
                    "fit_rows": None if self._fit_rows[r] is None else list(self._fit_rows[r]),
                    "fit_seed": None if self.models[r] is None else self.models[r].seed}
                   for r, region in enumerate(self.regions)]
        return {"settings": loop_settings(self), "X": self.X.clone(), "Y": self.Y.clone(), "draws": self._draws,
                "pending": None if self._pending is None else list(self._pending), "regions": regions,
                "asked": None if self._asked is None else self._asked.clone(), "X_failed": self.X_failed.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` (of a loop with the same settings): the next batches are those the saved
        loop would have asked. A state that does not fit raises :class:`~torchbkb.errors.CheckpointError` and
        changes nothing."""
        state = check_loop_state(state, loop_settings(self))
        X, Y, saved = state["X"].to(self.bounds), state["Y"].to(self.bounds), state["regions"]
        models = [self._rebuilt(X, Y, s, r) for r, s in enumerate(saved)]
        regions = [TrustRegion(self.bounds.shape[1], self.batch_size) for _ in saved]
        for region, s in zip(regions, saved):
            region.load_state_dict(dict(s["trust_region"]))
        self.X, self.Y, self.regions, self.models = X, Y, regions, models
        self._owned = [list(s["owned"]) for s in saved]
        self._hyper = [None if s["hyper"] is None else {k: v.to(self.bounds.device) for k, v in s["hyper"].items()}
                       for s in saved]
        self._cold_at, self._fits, self._cold_cost = ([s[k] for s in saved] for k in ("cold_at", "fits", "cold_cost"))
        self._fit_rows = [None if s["fit_rows"] is None else list(s["fit_rows"]) for s in saved]
        self._pending = None if state["pending"] is None else list(state["pending"])
        self._asked = None if state["asked"] is None else state["asked"].to(self.bounds)
        self.X_failed = state["X_failed"].to(self.bounds)
        self._draws = state["draws"]

    def _rebuilt(self, X: Tensor, Y: Tensor, saved: dict, r: int) -> BKBModel | None:
        """Region ``r``'s last model, built again on its rows with its seed and hyperparameters."""
        if saved["fit_rows"] is None:
            return None
        rows = torch.tensor(saved["fit_rows"], dtype=torch.long)
        kwargs = self._model_kwargs(X.shape[1])
        try:
            model = BKBModel(self._to_unit(X[rows]), Y[rows].unsqueeze(-1), seed=saved["fit_seed"], **kwargs)
            model.load_state_dict(saved["hyper"], strict=False, keep_transforms=False)
        except (InputDataError, RuntimeError, KeyError) as e:
            raise CheckpointError(f"regions[{r}]: expected hyperparameters this loop's model takes, got {e}") from e
        return model.eval()

    @property
    def best(self) -> tuple[Tensor, float]:
        """The best point found `(d,)` and its value."""
        i = int(self.Y.argmax())
        return self.X[i], float(self.Y[i])

    # ------------------------------------------------------------------ one region's proposal
    def _propose(self, r: int) -> tuple[Tensor, Tensor]:
        """`(k, d)` picks in the unit cube and `(k,)` their values (Thompson draws or UCBs, objective units)."""
        owned = torch.tensor(self._owned[r], dtype=torch.long)
        U, Y = self._to_unit(self.X[owned]), self.Y[owned]
        center = U[Y.argmax()]
        local = self._local(U, center, r)
        model = self._fit(U[local], Y[local], r)
        self._fit_rows[r] = [self._owned[r][i] for i in local.tolist()]
        ls = model_lengthscale(model, center)
        cand = self.regions[r].candidates(center, ls, self.n_candidates, seed=self._seed())
        q = min(self.batch_size, cand.shape[0])
        if self.acquisition == "thompson":
            devices = [cand.device.index or 0] if cand.is_cuda else []
            with torch.random.fork_rng(devices=devices):  # the draws follow the loop's seed; the caller's RNG is kept
                torch.manual_seed(self._seed())
                X, values = optimize_acqf_thompson(model, cand, q, sampler=self.sampler)
        else:
            X, values = optimize_acqf_bbkb(model, cand, q=q, beta=self.beta * math.sqrt(model.noise))
        return X, values

    def _local(self, U: Tensor, center: Tensor, r: int) -> Tensor:
        """Indices of the region's points its model is fitted on: all, or the ``local_points`` nearest to the
        centre in the metric of the region's last lengthscales."""
        if U.shape[0] <= self.local_points:
            return torch.arange(U.shape[0])
        model = self.models[r]
        scale = torch.ones(1, dtype=U.dtype) if model is None else model_lengthscale(model, U)
        dist = ((U - center) / scale).pow(2).sum(-1)
        return dist.topk(self.local_points, largest=False).indices.sort().values

    def _fit(self, U: Tensor, Y: Tensor, r: int) -> BKBModel:
        """The region's model, fitted once: warm from the region's previous hyperparameters, or from the kernel's
        defaults (as TuRBO fits) at its first fit, whenever its points doubled since that fit and at every
        :data:`COLD_EVERY`-th fit. A warm start alone stays where the first fits on a few points left it
        (docs/high_throughput.md). A warm fit may take at most the evaluations of the last fit from the defaults;
        one that needs them all (a warm start from hyperparameters stuck on their bounds) turns warm starts off for
        the region until it restarts."""
        prev, cost = self._hyper[r], self._cold_cost[r]
        cold = prev is None or not self.warm_start or cost == 0 or U.shape[0] >= 2 * self._cold_at[r]
        cold = cold or self._fits[r] % COLD_EVERY == 0
        if not cold:
            warm, evaluations = self._fit_from(U, Y, prev, min(WARM_MAXITER, cost))
            if warm is None or evaluations >= cost:
                self._cold_cost[r] = cost = 0  # warm starts do not pay in this region
            model = warm
        if cold or model is None:
            try:
                model, evaluations = self._fit_from(U, Y, None, None)
            except ModelFittingError:  # every attempt stopped by its line search: the fit kept where it stopped
                model, evaluations = self._fit_from(U, Y, None, None, handler=accept_stalled_line_search)
                warnings.warn(f"region {r}: its fit from the defaults ended in L-BFGS-B line searches that could not "
                              "improve (float32?); kept where they stopped", NumericsWarning, stacklevel=3)
            self._cold_at[r] = U.shape[0]
            if cost or prev is None:
                self._cold_cost[r] = max(evaluations, 1)
        self._fits[r] += 1
        self._hyper[r] = {k: v.detach().clone() for k, v in model.state_dict().items() if "transform" not in k}
        self.models[r] = model
        return model

    def _fit_from(self, U: Tensor, Y: Tensor, start: dict | None, maxfun: int | None,
                  handler: Callable | None = None) -> tuple[BKBModel | None, int]:
        """A model fitted from ``start`` (hyperparameters; ``None``: the kernel's defaults) with at most ``maxfun``
        evaluations (and ``fit_gpytorch_mll``'s ``warning_handler``, unless ``fit_kwargs`` has one), and the
        evaluations it took; ``(None, evaluations)`` when a warm fit fails."""
        kwargs = self._model_kwargs(U.shape[1])
        model = BKBModel(U, Y.unsqueeze(-1), seed=self._seed(), **kwargs)
        fit_kwargs = dict(self.fit_kwargs) if handler is None else {"warning_handler": handler, **self.fit_kwargs}
        options = {"ftol": FIT_FTOL} if maxfun is None else {"ftol": FIT_FTOL, "maxiter": maxfun, "maxfun": maxfun}
        fit_kwargs.setdefault("optimizer_kwargs", {"options": options})
        if start is not None:
            model.load_state_dict(start, strict=False, keep_transforms=False)
        mll = DTCMarginalLogLikelihood(model.likelihood, model)
        try:
            fit_gpytorch_mll(mll, **fit_kwargs)
        except ModelFittingError:
            if start is None:
                raise
            return None, mll.evaluations
        mll.eval()
        return model, mll.evaluations

    def _model_kwargs(self, d: int) -> dict:
        """A model's own modules: the user's ``model_kwargs`` copied (each region's models fit their own kernel, and
        a fit from the defaults starts from the user's values), or :func:`turbo_modules`."""
        return turbo_modules(d) if self.model_kwargs is None else copy.deepcopy(dict(self.model_kwargs))

    def _seed(self) -> int:
        self._draws += 1
        return self.seed * 1_000_003 + self._draws

    def _to_unit(self, X: Tensor) -> Tensor:
        return (X - self.bounds[0]) / (self.bounds[1] - self.bounds[0])

    def _from_unit(self, U: Tensor) -> Tensor:
        return self.bounds[0] + U * (self.bounds[1] - self.bounds[0])
