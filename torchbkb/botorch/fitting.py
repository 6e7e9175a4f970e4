"""How ``fit_gpytorch_mll`` fits a :class:`~torchbkb.botorch.BKBModel`: the evidence bound maximized with the
dictionary fixed, then the dictionary re-drawn by BKB's variance sampling at the new hyperparameters, in rounds.

The bound depends on the dictionary, and the dictionary (drawn with probabilities ``q̄·σ̃²``) on the
hyperparameters, so neither can be fixed first. Past :data:`WARM_START` points the rounds start from the exact
GP fitted on :data:`WARM_START` random points. Past :data:`FIT_POINTS` points the rounds run on one uniform random
subset of that many training points (the subset-of-data estimate of the hyperparameters: a fit's cost no longer
grows with ``n``); the posterior always uses every point. Round ``r`` draws inducing points by BKB's variance sampling
at the current hyperparameters, thinned to at most :data:`FIT_INDUCING` (:func:`fit_inducing_points`: the bound
is valid on any inducing set, and its cost is ``O(n·FIT_INDUCING²)`` whatever ``m``), and runs L-BFGS-B
(BoTorch's ``fit_gpytorch_mll_scipy``) on the bound over them. It stops when a round moves no hyperparameter
by more than :data:`HYPER_TOL` (relative; the constant mean absolute below 1, in standardized units), or after
:data:`MAX_ROUNDS` rounds. Up to :data:`EXACT_FIT` points, and while the model computes the exact GP outright
(:func:`~torchbkb.botorch.defaults.exact_below`, a GPU's larger threshold), one round maximizes the exact evidence
instead. The model's own posterior then uses its whole dictionary, drawn at the fitted hyperparameters.

Example:
    >>> import torch
    >>> from botorch.fit import fit_gpytorch_mll
    >>> from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
    >>> X = torch.rand(80, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> model = BKBModel(X, torch.cos(5 * X[:, :1]), seed=0)
    >>> _ = fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
    >>> 1 <= model.fit_rounds <= MAX_ROUNDS
    True
"""

from __future__ import annotations

import math

import torch
from botorch.optim.fit import fit_gpytorch_mll_scipy
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.module import Module as GPyTorchModule

from torch import Tensor

from torchbkb.botorch.defaults import EXACT_FIT, exact_outright
from torchbkb.sampling.dictionary_replay import sample_dictionary
from torchbkb.botorch.fit_attempts import optimize_with_retries
from torchbkb.botorch.marginal_likelihood import DTCMarginalLogLikelihood, training_noise
from torchbkb.errors import InputDataError
from torchbkb.gp.evidence_bound import FIT_CHUNK

__all__ = ["fit_rounds", "fit_inducing_points", "hyperparameters", "hyperparameter_change", "MAX_ROUNDS", "HYPER_TOL",
           "WARM_START", "FIT_INDUCING",
           "EXACT_FIT", "FIT_POINTS", "ROUND_NATS", "DENSE_FIT"]

#: At most this many rounds of (draw the dictionary, fit).
MAX_ROUNDS = 3
#: Stop when a round changes every positive hyperparameter by less than this factor (``|Δ log θ|``) and the
#: constant mean by less than this, relative (absolute below 1: standardized outcomes).
HYPER_TOL = 0.05
#: Past this many training points the rounds start from a fit of the exact GP on this many of them, drawn at
#: random: at ``SingleTaskGP``'s prior modes (noise ≈ 0.007) the first dictionary would hold most of the data.
WARM_START = 500
#: The bound is maximized over at most this many inducing points (:func:`fit_inducing_points`).
FIT_INDUCING = 256

#: Past this many training points the rounds maximize the bound of a uniform random subset of this many of them
#: (drawn once per fit): one chunk of the bound's sums, so its backward pass recomputes nothing. The
#: hyperparameters' statistical error shrinks as ``1/√FIT_POINTS``; an evaluation over all ``n`` points costs
#: ``n / FIT_POINTS`` times more, plus the recomputed chunks. ``fit_gpytorch_mll(mll, fit_points=None)`` uses every
#: point.
FIT_POINTS = FIT_CHUNK
#: A bound round's L-BFGS-B (the default optimizer) stops once a step gains less than about this many nats of
#: the bound in all (``ftol = ROUND_NATS / points``: the loss is per point). One standard error of a
#: hyperparameter is worth about ½ nat, so smaller gains are changes the data cannot tell apart; scipy's
#: default ``ftol`` (2.2e-9) spends most of a round's evaluations on them. ``options={"ftol": ...}`` overrides it.
ROUND_NATS = 0.1
#: When a round's draw at the current hyperparameters holds at least this fraction of the points (and more than the
#: round's ``inducing_limit``), the bound over the thinned draw is loose for the kernel's effective dimension and
#: prefers a large noise and long lengthscales (an over-smoothed model); the fit then maximizes the exact evidence of
#: a uniform subset of ``EXACT_FIT`` points instead, in one round. ``model.fit_objective`` says which objective the
#: fit used: ``"exact"``, ``"bound"`` or ``"exact subset"``.
DENSE_FIT = 0.5


def fit_rounds(model, mll, closure=None, optimizer=None, closure_kwargs=None, optimizer_kwargs=None,
               max_rounds: int = MAX_ROUNDS, warm_start: bool = True, inducing_limit: int = FIT_INDUCING,
               fit_points: int | None = FIT_POINTS, **kwargs):
    """Fit ``model``'s hyperparameters by maximizing ``mll`` (a :class:`~torchbkb.botorch.DTCMarginalLogLikelihood`
    of ``model``) in rounds; ``model.fit_rounds`` records how many ran.

    Args:
        model: the :class:`~torchbkb.botorch.BKBModel`.
        mll: ``DTCMarginalLogLikelihood(model.likelihood, model)``, or GPyTorch's ``ExactMarginalLogLikelihood`` of
            the same (the MLL of BoTorch's loops, the exact evidence the bound replaces: the bound is fitted, as in Ax).
        closure, closure_kwargs: as in ``fit_gpytorch_mll`` (default: the negated bound and its gradients; a
            closure of your own is evaluated as given, on the model's whole dictionary).
        optimizer: a BoTorch fit routine ``(mll, closure=..., closure_kwargs=..., **optimizer_kwargs)``; default
            ``fit_gpytorch_mll_scipy`` (L-BFGS-B).
        optimizer_kwargs: passed to ``optimizer``; the default optimizer's bound rounds get
            ``options={"ftol": ROUND_NATS / points}`` unless these options name an ``ftol``.
        max_rounds: the largest number of rounds.
        warm_start: start from the exact GP fitted on :data:`WARM_START` random points (past that many points);
            ``False`` starts from the model's current hyperparameters (e.g. the previous iteration's of a BO
            loop, loaded with ``load_state_dict``): ``fit_gpytorch_mll(mll, warm_start=False)``.
        inducing_limit: the most inducing points a round's bound uses (:data:`FIT_INDUCING`): more fit a
            kernel of large effective dimension better, at ``O(n·inducing_limit²)`` per evaluation.
        fit_points: past this many training points, the rounds run on a uniform random subset of this many
            (:data:`FIT_POINTS`); ``None``: every round on every point.
        kwargs: ``max_attempts``, ``warning_handler``, ``caught_exception_types`` of ``fit_gpytorch_mll``'s retry
            policy, which every optimizer run follows (:func:`~torchbkb.botorch.fit_attempts.optimize_with_retries`).

    Returns:
        ``mll`` in eval mode; the model's posterior is rebuilt at the fitted hyperparameters when next read.
    """
    if isinstance(mll, ExactMarginalLogLikelihood) and mll.model is model:  # BoTorch loops' MLL: the bound replaces it
        fit_rounds(model, DTCMarginalLogLikelihood(mll.likelihood, model), closure, optimizer, closure_kwargs,
                   optimizer_kwargs, max_rounds, warm_start, inducing_limit, fit_points, **kwargs)
        return mll.eval()
    if not isinstance(mll, DTCMarginalLogLikelihood) or mll.model is not model:
        raise InputDataError(
            f"mll: expected DTCMarginalLogLikelihood(model.likelihood, model) for this BKBModel, got "
            f"{type(mll).__name__}"
        )
    if isinstance(inducing_limit, bool) or not isinstance(inducing_limit, int) or inducing_limit < 1:
        raise InputDataError(f"inducing_limit: expected an integer >= 1, got {inducing_limit!r}")
    if fit_points is not None and (isinstance(fit_points, bool) or not isinstance(fit_points, int) or fit_points < 1):
        raise InputDataError(f"fit_points: expected None or an integer >= 1, got {fit_points!r}")
    if int(max_rounds) < 1:
        raise InputDataError(f"max_rounds: expected an integer >= 1, got {max_rounds!r}")
    policy = {k: kwargs[k] for k in ("max_attempts", "warning_handler", "caught_exception_types") if k in kwargs}
    optimizer = fit_gpytorch_mll_scipy if optimizer is None else optimizer
    rounds = 0
    if not any(p.requires_grad for p in mll.parameters()):
        model.fit_rounds = 0  # nothing to learn (fixed noise and a kernel without parameters)
        return mll.eval()
    X = model.train_inputs[0]
    device, n = X.device, X.shape[-2]
    # one round on the exact evidence (it does not depend on a dictionary): small n, one set per batch, or a model
    # whose posterior is the exact GP outright (on a GPU, up to its larger threshold)
    exact = n <= EXACT_FIT or X.dim() > 2 or exact_outright(X, model.exact_fraction)
    gen = torch.Generator().manual_seed(0 if model.seed is None else model.seed)
    if n > max(WARM_START, EXACT_FIT) and closure is None and warm_start and not exact:
        idx = torch.randperm(n, generator=gen)[:WARM_START].to(device)
        optimize_with_retries(mll, optimizer, closure_kwargs={**(closure_kwargs or {}), "indices": idx},
                              optimizer_kwargs=optimizer_kwargs, **policy)
    subset = None  # the rounds' training points: all of them, or one uniform subset past fit_points
    if not exact and closure is None and fit_points is not None and n > fit_points:
        subset = torch.randperm(n, generator=gen)[:fit_points].sort().values.to(device)
    round_opt = optimizer_kwargs or {}
    if not exact and optimizer is fit_gpytorch_mll_scipy:  # the bound's rounds stop at ROUND_NATS in all
        points = n if subset is None else int(subset.numel())
        round_opt = {**round_opt, "options": {"ftol": ROUND_NATS / points, **(round_opt.get("options") or {})}}
    model.fit_objective = "exact" if exact else "bound"
    for rounds in range(1, 2 if exact else int(max_rounds) + 1):  # noqa: B007 - read after the loop
        before = None if exact else hyperparameters(model)
        round_kwargs = closure_kwargs
        if closure is None:
            if exact:
                extra = {"indices": torch.arange(n, device=device)}
            else:
                drawn: list[int] = []
                extra = {"inducing_points": fit_inducing_points(model, gen, inducing_limit, subset, drawn)}
                if subset is not None:
                    extra["indices"] = subset
                points = n if subset is None else int(subset.numel())
                if drawn[0] > inducing_limit and drawn[0] >= DENSE_FIT * points:
                    # the dictionary would hold most points: a bound over `inducing_limit` of them is loose and
                    # prefers a large noise; the exact evidence of a uniform subset of EXACT_FIT points is not biased
                    pool = torch.arange(n, device=device) if subset is None else subset
                    pick = torch.randperm(pool.numel(), generator=gen)[:EXACT_FIT].sort().values.to(device)
                    exact_kwargs = {**(closure_kwargs or {}), "indices": pool[pick]}
                    optimize_with_retries(mll, optimizer, closure_kwargs=exact_kwargs,
                                          optimizer_kwargs=optimizer_kwargs,
                                          **policy)
                    model.fit_objective = "exact subset"
                    break
            round_kwargs = {**(closure_kwargs or {}), **extra}
        optimize_with_retries(mll, optimizer, closure=closure, closure_kwargs=round_kwargs, optimizer_kwargs=round_opt,
                              **policy)
        if not exact and hyperparameter_change(before, hyperparameters(model)) < HYPER_TOL:
            break
    model.fit_rounds = rounds
    return mll.eval()


def fit_inducing_points(model, generator: torch.Generator | None = None, limit: int = FIT_INDUCING,
                        indices: Tensor | None = None, drawn: list | None = None) -> Tensor:
    """`(k, d)` the inducing points a fitting round maximizes the bound over, ``k <= limit``: BKB's variance
    sampling of the model's training points (those at ``indices`` `(s,)` if given) at its current
    hyperparameters (``q̄`` and per-point noise as the model's own draw), thinned to a uniform subset of
    ``limit`` points whenever it grows past them (:func:`~torchbkb.sampling.dictionary_replay.sample_dictionary`
    with ``max_size``); the draw's size before thinning is appended to ``drawn`` if given."""
    X = model.train_inputs[0].detach()
    with torch.no_grad():  # a transient draw: the live kernel is read, never changed
        noise = training_noise(model).detach().to(X)
        if indices is not None:
            X, noise = X[indices], noise[indices]
        lam = float(noise.mean())
        return sample_dictionary(model.covar_module, X, lam, q_bar=model.q_bar, generator=generator, counts=lam / noise,
                                 max_size=int(limit), inclusion=model.inclusion, drawn=drawn)


def hyperparameters(model) -> dict[str, tuple[bool, Tensor]]:
    """The model's hyperparameter values (constrained), by name, with whether each is positive."""
    out = {}
    for prefix in ("covar_module", "likelihood", "mean_module"):
        module = getattr(model, prefix, None)
        if not isinstance(module, GPyTorchModule):
            continue
        for name, raw, constraint in module.named_parameters_and_constraints():
            value = raw.detach() if constraint is None else constraint.transform(raw.detach())
            lower = getattr(constraint, "lower_bound", torch.tensor(-1.0))
            positive = constraint is not None and float(lower.min()) >= 0
            out[f"{prefix}.{name}"] = (positive, value.clone())
    return out


def hyperparameter_change(a: dict, b: dict) -> float:
    """The largest change between two :func:`hyperparameters` snapshots: ``|Δ log θ|`` for positive values,
    ``|Δ θ| / max(1, |θ|)`` for the others (``inf`` if they do not hold the same parameters)."""
    if a.keys() != b.keys():
        return math.inf
    worst = 0.0
    for key, (positive, va) in a.items():
        vb = b[key][1]
        if va.shape != vb.shape:
            return math.inf
        if positive:
            diff = va.clamp_min(1e-12).log() - vb.clamp_min(1e-12).log()
        else:
            diff = (va - vb) / torch.maximum(va.abs(), vb.abs()).clamp_min(1.0)
        worst = max(worst, float(diff.abs().max())) if diff.numel() else worst
    return worst
