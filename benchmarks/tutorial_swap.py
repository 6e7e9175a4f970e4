"""The flows of BoTorch's and Ax's tutorials with ``SingleTaskGP`` swapped for ``BKBModel`` (and the exact MLL for
``DTCMarginalLogLikelihood``) and nothing else, at reduced sizes, against the same flow with ``SingleTaskGP``.

Each flow is written here from the tutorial's steps (its models, acquisition, optimizer and loop), not copied; a
flow returns one number, larger is better (best value found, hypervolume, or minus a prediction error). The table
gives, per flow, the median over seeds for each model and whether BKBModel's median lies within SingleTaskGP's
seed spread or above it. ``docs/botorch.md`` lists the result.

Usage::

    python -m benchmarks.tutorial_swap --threads 2 --seeds 3     # about half an hour
    python -m benchmarks.tutorial_swap --quick                    # one seed of the quick flows
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
import warnings

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.report import print_table, write_json
from benchmarks.tutorial_swap_ax import ax_analyses, ax_modular

F64 = torch.float64
MODELS = ("SingleTaskGP", "BKBModel")


def make(kind: str, X, Y, **kwargs):
    """``(model, mll)``: the one-class swap."""
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood

    if kind == "BKBModel":
        model = BKBModel(X, Y, **kwargs)
        return model, DTCMarginalLogLikelihood(model.likelihood, model)
    model = SingleTaskGP(X, Y, **kwargs)
    return model, ExactMarginalLogLikelihood(model.likelihood, model)


def fitted(kind, X, Y, **kwargs):
    from botorch.fit import fit_gpytorch_mll

    model, mll = make(kind, X, Y, **kwargs)
    fit_gpytorch_mll(mll)
    return model


def closed_loop(kind, seed, quick):
    """Noisy Hartmann-6 with an outcome constraint, a ModelListGP, qLogNEI, optimize_acqf (q = 3)."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.models import ModelListGP
    from botorch.optim import optimize_acqf
    from botorch.sampling import SobolQMCNormalSampler
    from botorch.test_functions import Hartmann

    torch.manual_seed(seed)
    f = Hartmann(dim=6, negate=True).to(F64)
    bounds = torch.tensor([[0.0] * 6, [1.0] * 6], dtype=F64)

    def observe(X):
        obj = f(X) + 0.5 * torch.randn(X.shape[0], dtype=F64) * 0.1
        con = X.sum(-1) - 3 + 0.5 * torch.randn(X.shape[0], dtype=F64) * 0.1
        return obj.unsqueeze(-1), con.unsqueeze(-1)

    X = torch.rand(10, 6, dtype=F64)
    Yo, Yc = observe(X)
    for _ in range(3 if quick else 10):
        model = ModelListGP(fitted(kind, X, Yo), fitted(kind, X, Yc))
        acq = qLogNoisyExpectedImprovement(model, X, sampler=SobolQMCNormalSampler(torch.Size([128])),
                                           objective=_first_output(), constraints=[lambda Z: Z[..., 1]])
        new, _ = optimize_acqf(acq, bounds=bounds, q=3, num_restarts=5, raw_samples=128)
        o, c = observe(new)
        X, Yo, Yc = torch.cat([X, new]), torch.cat([Yo, o]), torch.cat([Yc, c])
    feasible = X.sum(-1) <= 3
    return float(f(X)[feasible].max()) if bool(feasible.any()) else -math.inf


def _first_output():
    from botorch.acquisition.objective import GenericMCObjective

    return GenericMCObjective(lambda Z, X=None: Z[..., 0])


def batch_cv(kind, seed, quick):
    """Leave-one-out ``batch_cross_validation`` of 20 noisy points: minus the mean squared error."""
    from botorch.cross_validation import batch_cross_validation, gen_loo_cv_folds
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood
    from botorch.models import SingleTaskGP

    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(0, 1, 20, dtype=F64).unsqueeze(-1)
    Y = torch.sin(6 * X) + 0.2 * torch.randn(20, 1, dtype=F64, generator=g)
    cls, mll = (BKBModel, DTCMarginalLogLikelihood) if kind == "BKBModel" else (SingleTaskGP,
                                                                                ExactMarginalLogLikelihood)
    cv = batch_cross_validation(model_cls=cls, mll_cls=mll, cv_folds=gen_loo_cv_folds(train_X=X, train_Y=Y))
    return -float((cv.posterior.mean - cv.observed_Y).pow(2).mean())


def torch_optimizer(kind, seed, quick):
    """The GPyTorch training loop (SGD, 150 epochs, the tutorial's noise constraint): minus the RMSE to sin(2πx)."""
    from gpytorch.constraints import GreaterThan

    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(0, 1, 15, dtype=F64).unsqueeze(1)
    Y = torch.sin(2 * math.pi * X) + 0.15 * torch.randn(15, 1, dtype=F64, generator=g)
    model, mll = make(kind, X, Y)
    model.likelihood.noise_covar.register_constraint("raw_noise", GreaterThan(1e-5))
    optimizer = torch.optim.SGD([{"params": model.parameters()}], lr=0.025)
    model.train()
    for _ in range(150):
        optimizer.zero_grad()
        loss = -mll(model(X), model.train_targets)
        loss.backward()
        optimizer.step()
    model.eval()
    grid = torch.linspace(0, 1, 101, dtype=F64)
    with torch.no_grad():
        mean = model.posterior(grid).mean.squeeze(-1)  # a (q,) query, as the tutorial's plot asks it
    return -float((mean - torch.sin(2 * math.pi * grid)).pow(2).mean().sqrt())


def turbo(kind, seed, quick):
    """TuRBO-1 on Ackley-10 in ``[-5, 10]``: the tutorial's kernel and likelihood keywords, MaxPosteriorSampling."""
    from botorch.generation import MaxPosteriorSampling
    from botorch.test_functions import Ackley
    from torch.quasirandom import SobolEngine

    from torchbkb.botorch import TrustRegion
    from torchbkb.botorch.trust_region_loop import turbo_modules

    d, q = 10, 4
    f = Ackley(dim=d, negate=True).to(F64)
    lo, hi = -5.0, 10.0
    U = SobolEngine(d, scramble=True, seed=seed).draw(2 * d).to(F64)
    Y = f(lo + (hi - lo) * U)
    region = TrustRegion(d, q)
    region.update(Y)
    while Y.numel() < (60 if quick else 200):
        model = fitted(kind, U, Y.unsqueeze(-1), **turbo_modules(d))
        ls = model.covar_module.base_kernel.lengthscale.detach().reshape(-1)
        cand = region.candidates(U[Y.argmax()], ls, 2000, seed=seed * 1000 + Y.numel())
        with torch.no_grad():
            new = MaxPosteriorSampling(model=model, replacement=False)(cand, num_samples=q)
        y = f(lo + (hi - lo) * new)
        region.update(y)
        U, Y = torch.cat([U, new]), torch.cat([Y, y])
        if region.restart_triggered:
            break
    return float(Y.max())


def scbo(kind, seed, quick):
    """Constrained TuRBO (SCBO) on Ackley-10: objective and two constraint models, ConstrainedMaxPosteriorSampling."""
    from botorch.generation.sampling import ConstrainedMaxPosteriorSampling
    from botorch.test_functions import Ackley
    from torch.quasirandom import SobolEngine

    from torchbkb.botorch import TrustRegion
    from torchbkb.botorch.trust_region_loop import turbo_modules

    d, q = 10, 4
    f = Ackley(dim=d, negate=True).to(F64)
    lo, hi = -5.0, 10.0
    cons = (lambda X: X.sum(-1), lambda X: X.norm(dim=-1) - 5.0)  # feasible when <= 0
    U = SobolEngine(d, scramble=True, seed=seed).draw(2 * d).to(F64)
    X = lo + (hi - lo) * U
    Y, C = f(X), torch.stack([c(X) for c in cons], -1)
    region = TrustRegion(d, q)
    while Y.numel() < (60 if quick else 160):
        feasible = (C <= 0).all(-1)
        score = torch.where(feasible, Y, -1e6 - C.clamp_min(0).sum(-1))
        model = fitted(kind, U, Y.unsqueeze(-1), **turbo_modules(d))
        cmodels = [fitted(kind, U, C[:, i : i + 1], **turbo_modules(d)) for i in range(2)]
        from botorch.models import ModelListGP

        ls = model.covar_module.base_kernel.lengthscale.detach().reshape(-1)
        cand = region.candidates(U[score.argmax()], ls, 2000, seed=seed * 1000 + Y.numel())
        with torch.no_grad():
            new = ConstrainedMaxPosteriorSampling(model=model, constraint_model=ModelListGP(*cmodels),
                                                  replacement=False)(cand, num_samples=q)
        Xn = lo + (hi - lo) * new
        yn, cn = f(Xn), torch.stack([c(Xn) for c in cons], -1)
        region.update(torch.where((cn <= 0).all(-1), yn, torch.full_like(yn, -1e6)))
        U, Y, C = torch.cat([U, new]), torch.cat([Y, yn]), torch.cat([C, cn])
        if region.restart_triggered:
            break
    feasible = (C <= 0).all(-1)
    return float(Y[feasible].max()) if bool(feasible.any()) else -math.inf


def thompson(kind, seed, quick, sampler="cholesky"):
    """Hartmann-6 Thompson sampling over Sobol candidates: the Cholesky, RFF or pathwise sampler."""
    from botorch.generation import MaxPosteriorSampling
    from botorch.models.transforms.outcome import Standardize
    from botorch.sampling.pathwise.posterior_samplers import get_matheron_path_model
    from botorch.test_functions import Hartmann
    from botorch.utils.sampling import draw_sobol_samples
    from gpytorch.kernels import RBFKernel, RFFKernel, ScaleKernel

    f = Hartmann(dim=6, negate=True).to(F64)
    X = draw_sobol_samples(bounds=f.bounds.to(F64), n=10, q=1, seed=seed).squeeze(-2)
    Y = f(X).unsqueeze(-1)
    while X.shape[0] < (25 if quick else 50):
        base = RFFKernel(ard_num_dims=6, num_samples=1024) if sampler == "rff" else RBFKernel(ard_num_dims=6)
        model = fitted(kind, X, Y, covar_module=ScaleKernel(base), outcome_transform=Standardize(m=1))
        cand = draw_sobol_samples(bounds=f.bounds.to(F64), n=2000 if quick else 5000, q=1,
                                  seed=seed + X.shape[0]).squeeze(-2)
        with torch.no_grad():
            if sampler == "pathwise":
                model = get_matheron_path_model(model=model)
            new = MaxPosteriorSampling(model=model, replacement=False)(cand, num_samples=5)
        X, Y = torch.cat([X, new]), torch.cat([Y, f(new).unsqueeze(-1)])
    return float(Y.max())


def one_shot_kg(kind, seed, quick):
    """qKnowledgeGradient (one-shot, 32 fantasies) on a noisy 2-d quadratic: the true value of the recommendation."""
    from botorch.acquisition import PosteriorMean, qKnowledgeGradient
    from botorch.optim import optimize_acqf

    torch.manual_seed(seed)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    truth = lambda X: 1 - (X - 0.5).norm(dim=-1)  # noqa: E731
    X = torch.rand(20, 2, dtype=F64)
    Y = (truth(X) + 0.1 * torch.randn(20, dtype=F64)).unsqueeze(-1)
    for _ in range(1 if quick else 3):
        model = fitted(kind, X, Y)
        new, _ = optimize_acqf(qKnowledgeGradient(model, num_fantasies=32), bounds=bounds, q=1, num_restarts=4,
                               raw_samples=64)
        X, Y = torch.cat([X, new]), torch.cat([Y, (truth(new) + 0.1 * torch.randn(1, dtype=F64)).unsqueeze(-1)])
    model = fitted(kind, X, Y)
    rec, _ = optimize_acqf(PosteriorMean(model), bounds=bounds, q=1, num_restarts=4, raw_samples=64)
    return float(truth(rec))


def mes_gibbon(kind, seed, quick, gibbon=False):
    """Branin with qMaxValueEntropy (q = 1) or GIBBON's batch (qLowerBoundMaxValueEntropy, q = 3, sequential)."""
    from botorch.acquisition.max_value_entropy_search import qLowerBoundMaxValueEntropy, qMaxValueEntropy
    from botorch.optim import optimize_acqf
    from botorch.test_functions import Branin

    torch.manual_seed(seed)
    f = Branin(negate=True).to(F64)
    lb, ub = f.bounds.to(F64)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    U = torch.rand(10, 2, dtype=F64)
    Y = f(lb + U * (ub - lb)).unsqueeze(-1)
    for _ in range(3 if quick else 8):
        model = fitted(kind, U, Y)
        candidates = torch.rand(1000, 2, dtype=F64)
        if gibbon:
            acq = qLowerBoundMaxValueEntropy(model, candidate_set=candidates)
            new, _ = optimize_acqf(acq, bounds=bounds, q=3, num_restarts=4, raw_samples=128, sequential=True)
        else:
            acq = qMaxValueEntropy(model, candidate_set=candidates)
            new, _ = optimize_acqf(acq, bounds=bounds, q=1, num_restarts=4, raw_samples=128)
        U, Y = torch.cat([U, new]), torch.cat([Y, f(lb + new * (ub - lb)).unsqueeze(-1)])
    return float(Y.max())


def jes(kind, seed, quick):
    """Information-theoretic acquisition: qJointEntropySearch with get_optimal_samples on Branin."""
    from botorch.acquisition.joint_entropy_search import qJointEntropySearch
    from botorch.acquisition.utils import get_optimal_samples
    from botorch.optim import optimize_acqf
    from botorch.test_functions import Branin

    torch.manual_seed(seed)
    f = Branin(negate=True).to(F64)
    lb, ub = f.bounds.to(F64)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    U = torch.rand(10, 2, dtype=F64)
    Y = f(lb + U * (ub - lb)).unsqueeze(-1)
    for _ in range(3 if quick else 8):
        model = fitted(kind, U, Y)
        opt_x, opt_y = get_optimal_samples(model, bounds=bounds, num_optima=8)
        acq = qJointEntropySearch(model, optimal_inputs=opt_x, optimal_outputs=opt_y, estimation_type="LB")
        new, _ = optimize_acqf(acq, bounds=bounds, q=1, num_restarts=4, raw_samples=128)
        U, Y = torch.cat([U, new]), torch.cat([Y, f(lb + new * (ub - lb)).unsqueeze(-1)])
    return float(Y.max())


def mobo(kind, seed, quick, acquisition="qLogNEHVI"):
    """BraninCurrin with a ModelListGP: qLogNEHVI, qLogEHVI or qLogNParEGO (q = 2); the hypervolume reached."""
    from botorch.acquisition.multi_objective.logei import (
        qLogExpectedHypervolumeImprovement, qLogNoisyExpectedHypervolumeImprovement
    )
    from botorch.acquisition.multi_objective.parego import qLogNParEGO
    from botorch.models import ModelListGP
    from botorch.optim import optimize_acqf
    from botorch.test_functions.multi_objective import BraninCurrin
    from botorch.utils.multi_objective.box_decompositions import FastNondominatedPartitioning
    from botorch.utils.multi_objective.hypervolume import Hypervolume
    from botorch.utils.multi_objective.pareto import is_non_dominated

    torch.manual_seed(seed)
    f = BraninCurrin(negate=True).to(F64)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    X = torch.rand(6, 2, dtype=F64)
    Y = f(X)
    for _ in range(3 if quick else 8):
        model = ModelListGP(*(fitted(kind, X, Y[:, i : i + 1]) for i in range(2)))
        if acquisition == "qLogNEHVI":
            acq = qLogNoisyExpectedHypervolumeImprovement(model, ref_point=f.ref_point, X_baseline=X,
                                                          prune_baseline=True)
        elif acquisition == "qLogEHVI":
            part = FastNondominatedPartitioning(ref_point=f.ref_point, Y=Y)
            acq = qLogExpectedHypervolumeImprovement(model, ref_point=f.ref_point, partitioning=part)
        else:
            acq = qLogNParEGO(model, X_baseline=X)
        new, _ = optimize_acqf(acq, bounds=bounds, q=2, num_restarts=4, raw_samples=128,
                               sequential=acquisition == "qLogNParEGO")
        X, Y = torch.cat([X, new]), torch.cat([Y, f(new)])
    front = Y[is_non_dominated(Y)]
    return float(Hypervolume(ref_point=f.ref_point).compute(front))


FLOWS = {
    "closed_loop": closed_loop,
    "batch_cross_validation": batch_cv,
    "fit_with_torch_optimizer": torch_optimizer,
    "turbo_1": turbo,
    "scbo": scbo,
    "thompson_cholesky": lambda k, s, q: thompson(k, s, q, "cholesky"),
    "thompson_rff": lambda k, s, q: thompson(k, s, q, "rff"),
    "thompson_pathwise": lambda k, s, q: thompson(k, s, q, "pathwise"),
    "one_shot_kg": one_shot_kg,
    "max_value_entropy": lambda k, s, q: mes_gibbon(k, s, q, gibbon=False),
    "gibbon": lambda k, s, q: mes_gibbon(k, s, q, gibbon=True),
    "information_theoretic_jes": jes,
    "multi_objective_qlognehvi": lambda k, s, q: mobo(k, s, q, "qLogNEHVI"),
    "multi_objective_qlogehvi": lambda k, s, q: mobo(k, s, q, "qLogEHVI"),
    "multi_objective_qlognparego": lambda k, s, q: mobo(k, s, q, "qLogNParEGO"),
    "ax_modular_botorch": ax_modular,
    "ax_multi_objective": lambda k, s, q: ax_modular(k, s, q, objectives=2),
    "ax_sensitivity_analysis": ax_analyses,
}


def main(argv=None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--flows", default=",".join(FLOWS))
    args = p.parse_args(argv)
    setup(args)
    flows = args.flows.split(",")
    seeds = 1 if args.quick else args.seeds
    if args.quick:
        flows = [f for f in flows if f in ("batch_cross_validation", "fit_with_torch_optimizer")]
    rows = []
    for name in flows:
        for seed in range(args.seed, args.seed + seeds):
            for kind in MODELS:
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        value, error = FLOWS[name](kind, seed, args.quick), None
                    except Exception as err:  # noqa: BLE001 - a flow that breaks is the result
                        value, error = None, f"{type(err).__name__}: {err}"[:300]
                        traceback.print_exc()
                rows.append({"flow": name, "model": kind, "seed": seed, "value": value, "error": error,
                             "seconds": time.perf_counter() - t0})
                print(f"{name:30s} {kind:12s} seed {seed}: {value} {error or ''} ({rows[-1]['seconds']:.1f} s)",
                      flush=True)
    table = []
    for name in flows:
        by = {k: [r for r in rows if r["flow"] == name and r["model"] == k] for k in MODELS}
        ok = {k: [r["value"] for r in v if r["error"] is None] for k, v in by.items()}
        errors = sum(r["error"] is not None for r in by["BKBModel"])
        ref, bkb = ok["SingleTaskGP"], ok["BKBModel"]
        within = bool(ref and bkb) and statistics.median(bkb) >= min(ref) - 1e-3 * abs(min(ref))  # ties to rounding
        table.append({"flow": name, "SingleTaskGP": statistics.median(ref) if ref else None,
                      "BKBModel": statistics.median(bkb) if bkb else None,
                      "stgp_spread": [min(ref), max(ref)] if ref else None,
                      "bkb_errors": errors, "within_or_above": within,
                      "seconds_stgp": statistics.median(r["seconds"] for r in by["SingleTaskGP"]),
                      "seconds_bkb": statistics.median(r["seconds"] for r in by["BKBModel"])})
    print_table(table,
                ["flow", "SingleTaskGP", "BKBModel", "stgp_spread", "bkb_errors", "within_or_above", "seconds_stgp",
                 "seconds_bkb"],
                "the tutorials with the one-class swap (median over seeds; larger is better)")
    payload = {"size": "quick" if args.quick else "default", "seeds": seeds, "table": table, "rows": rows}
    write_json(args.out, "tutorial_swap", payload)
    return payload


if __name__ == "__main__":
    main()
