"""Closed-loop BO with a fitted BKBModel against the same loop with a fitted SingleTaskGP, at equal evaluations.

Each loop starts from ``--n-init`` random points and runs ``--iterations`` rounds: fit the model from scratch
with ``fit_gpytorch_mll`` (``DTCMarginalLogLikelihood`` / ``ExactMarginalLogLikelihood``), then pick ``--q``
points with ``qLogNoisyExpectedImprovement`` over ``--choices`` fresh random candidates
(``optimize_acqf_discrete``, the same for both models), then observe them with Gaussian noise of
``noise × std(f)``. BKBModel runs with ``exact_fraction=None``: its posterior is DTC on its dictionary at every
size, never the exact GP. The score of a loop is the best noiseless value among the points it evaluated
(functions negated: larger is better); the table gives, per function, the median over seeds of each model's
score and the median and spread of the per-seed difference, against the noise level.

Usage::

    python -m benchmarks.botorch_closed_loop --threads 2            # about 15 min
    python -m benchmarks.botorch_closed_loop --quick --threads 2    # seconds
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.botorch_scale import function
from benchmarks.cli import base_parser, setup
from benchmarks.report import new_figure, print_table, save_figure, write_json

FUNCTIONS = ("hartmann6", "michalewicz5", "styblinski10")


def fit(name: str, X, Y):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood

    if name == "BKBModel":
        model = BKBModel(X, Y, seed=0, exact_fraction=None)
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        return model
    model = SingleTaskGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return model


def loop(name: str, fname: str, seed: int, args) -> dict:
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.optim import optimize_acqf_discrete
    from botorch.sampling import SobolQMCNormalSampler

    f, d = function(fname)
    g = torch.Generator().manual_seed(seed)
    sd = args.noise * float(f(torch.rand(2000, d, generator=g, dtype=torch.float64)).std())
    X = torch.rand(args.n_init, d, generator=g, dtype=torch.float64)
    observe = lambda Z: (f(Z) + sd * torch.randn(Z.shape[0], generator=g, dtype=torch.float64)).unsqueeze(-1)
    Y = observe(X)
    t0 = time.perf_counter()
    sizes = []  # (n, m) at each fit: m = n means the DTC posterior is the exact GP's
    for it in range(args.iterations):
        model = fit(name, X, Y)
        sizes.append((X.shape[0], getattr(model, "dictionary_size", X.shape[0])))
        acq = qLogNoisyExpectedImprovement(model, X,
                                           sampler=SobolQMCNormalSampler(torch.Size([128]), seed=seed * 1000 + it))
        choices = torch.rand(args.choices, d, generator=g, dtype=torch.float64)
        new, _ = optimize_acqf_discrete(acq, q=args.q, choices=choices)
        X, Y = torch.cat([X, new]), torch.cat([Y, observe(new)])
    best = f(X).cummax(0).values
    return {"function": fname, "model": name, "seed": seed, "n": X.shape[0], "best": float(best[-1]),
            "best_curve": best.tolist(), "noise_sd": sd, "time_s": time.perf_counter() - t0,
            "n_and_dictionary_size": sizes}


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for fname in dict.fromkeys(r["function"] for r in rows):
        by = {(r["model"], r["seed"]): r for r in rows if r["function"] == fname}
        seeds = sorted({s for _, s in by})
        diffs = [by["BKBModel", s]["best"] - by["SingleTaskGP", s]["best"] for s in seeds if ("BKBModel", s) in by
                 and ("SingleTaskGP", s) in by]
        if not diffs:
            continue
        q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
        out.append({"function": fname, "seeds": len(diffs), "noise_sd": by["SingleTaskGP", seeds[0]]["noise_sd"],
                    "best_SingleTaskGP": statistics.median(by["SingleTaskGP", s]["best"] for s in seeds),
                    "best_BKBModel": statistics.median(by["BKBModel", s]["best"] for s in seeds),
                    "diff_median": statistics.median(diffs), "diff_q25": q[0], "diff_q75": q[2],
                    "bkb_better_or_equal": sum(x >= 0 for x in diffs),
                    "bkb_final_m_median": statistics.median(by["BKBModel", s]["n_and_dictionary_size"][-1][1]
                                                            for s in seeds if ("BKBModel", s) in by)})
    return out


def plot(rows: list[dict], out: str):
    fnames = list(dict.fromkeys(r["function"] for r in rows))
    fig, axes = new_figure(ncols=max(1, len(fnames)), width=4.2)
    for ax, fname in zip(axes[0], fnames):
        for name in ("SingleTaskGP", "BKBModel"):
            curves = torch.tensor([r["best_curve"] for r in rows if r["function"] == fname and r["model"] == name])
            if curves.numel():
                ax.plot(curves.median(0).values, label=f"{name} (median of {curves.shape[0]})")
        ax.set(title=fname, xlabel="evaluations", ylabel="best noiseless value")
        ax.legend(fontsize=7)
    return save_figure(fig, out, "botorch_closed_loop")


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--functions", nargs="*", default=list(FUNCTIONS))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--n-init", type=int, default=20)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--q", type=int, default=5)
    p.add_argument("--choices", type=int, default=1000)
    p.add_argument("--noise", type=float, default=0.1, help="noise std as a fraction of std(f)")
    args = p.parse_args(argv)
    setup(args)
    if args.quick:
        args.functions, args.seeds, args.iterations, args.choices = args.functions[:1], 2, 2, 200
    rows = []
    for fname in args.functions:
        for seed in range(args.seed, args.seed + args.seeds):
            for name in ("SingleTaskGP", "BKBModel"):
                rows.append(loop(name, fname, seed, args))
                print({k: v for k, v in rows[-1].items() if k != "best_curve"}, flush=True)
        write_json(args.out, "botorch_closed_loop", {"settings": vars(args), "rows": rows, "summary": summarize(rows)})
    summary = summarize(rows)
    print_table(summary, list(summary[0]), "botorch_closed_loop")
    print(write_json(args.out, "botorch_closed_loop", {"settings": vars(args), "rows": rows, "summary": summary}))
    plot(rows, args.out)


if __name__ == "__main__":
    main()
