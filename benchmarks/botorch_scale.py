"""BKBModel with learned hyperparameters against BoTorch's fitted models: prediction quality, time and scale.

Every model is fitted the BoTorch way (``fit_gpytorch_mll``): ``SingleTaskGP`` on its exact marginal likelihood,
``BKBModel`` on :class:`~torchbkb.botorch.DTCMarginalLogLikelihood` (both with ``SingleTaskGP``'s default
modules), ``SingleTaskVariationalGP`` (``SVGP_INDUCING`` inducing points) on the variational ELBO with Adam on
minibatches, as GPyTorch's large-data examples train it (``SVGP_EPOCHS`` epochs of 1,024 points, at least
``SVGP_MIN_STEPS`` steps).

Studies (noisy test functions on the unit cube, Gaussian noise of ``noise × std(f)``):

* ``quality`` -- n = 600: test RMSE against the noiseless function on 2,000 held-out points, held-out NLL of
  noisy observations and the coverage of their 95% predictive intervals, per function and seed;
* ``speed`` -- n = 3,000-5,000 (``--speed-sizes``): fit + predict of BKBModel and SingleTaskGP alternated
  per seed, RMSE, ``m``, and the dictionary BKB draws at SingleTaskGP's fitted hyperparameters;
* ``size`` -- n = 10⁴-10⁵ (``--sizes``): BKBModel fitted from scratch, then one BO loop iteration (the fit
  from the previous iteration's hyperparameters and a BBKB batch of ``--q`` points from ``--candidates``
  random candidates), against SingleTaskVariationalGP; time, peak memory, RMSE on 10⁴ points, ``m``.

Usage::

    python -m benchmarks.botorch_scale --threads 2                 # about 40 min
    python -m benchmarks.botorch_scale --quick --threads 2         # a minute
"""

from __future__ import annotations

import math
import time

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import PeakMemory

SVGP_INDUCING = 256
SVGP_EPOCHS = 3
SVGP_MIN_STEPS = 500
FUNCTIONS = ("hartmann6", "ackley6", "michalewicz5", "styblinski10")


def function(name: str):
    """``(f, d)``: the BoTorch test function (minimization, negated to maximize) mapped to the unit cube."""
    from botorch.test_functions import Ackley, Hartmann, Michalewicz, StyblinskiTang

    f = {"hartmann6": lambda: Hartmann(6), "ackley6": lambda: Ackley(6), "michalewicz5": lambda: Michalewicz(5),
         "styblinski10": lambda: StyblinskiTang(10)}[name]()
    lb, ub = f.bounds[0].double(), f.bounds[1].double()
    return (lambda X: -f(lb + X * (ub - lb))), f.dim


def dataset(name: str, n: int, noise: float, seed: int, n_test: int = 2000):
    """Training ``(X, Y)`` with noise ``noise·std(f)``, test ``(Xt, ft, Yt)`` (noiseless and noisy), noise std."""
    f, d = function(name)
    g = torch.Generator().manual_seed(seed)
    Xt = torch.rand(n_test, d, generator=g, dtype=torch.float64)
    ft = f(Xt)
    sd = noise * float(ft.std())
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = (f(X) + sd * torch.randn(n, generator=g, dtype=torch.float64)).unsqueeze(-1)
    return X, Y, Xt, ft, ft + sd * torch.randn(n_test, generator=g, dtype=torch.float64), sd


def fit(name: str, X, Y, q_bar: float = 2.0):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood

    if name == "BKBModel":
        model = BKBModel(X, Y, q_bar=q_bar, seed=0)
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        return model
    if name == "SingleTaskGP":
        model = SingleTaskGP(X, Y)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        return model.eval()
    return fit_svgp(X, Y)


def fit_svgp(X, Y):
    from botorch.models import SingleTaskVariationalGP
    from gpytorch.mlls import VariationalELBO

    from botorch.models.transforms import Standardize

    g = torch.Generator().manual_seed(0)
    inducing = X[torch.randperm(X.shape[0], generator=g)[:SVGP_INDUCING]]
    model = SingleTaskVariationalGP(X, Y, inducing_points=inducing, outcome_transform=Standardize(m=1))
    mll = VariationalELBO(model.likelihood, model.model, num_data=X.shape[0])
    opt = torch.optim.Adam(mll.parameters(), lr=0.02)
    model.train()
    Xtr = model.transform_inputs(X)
    Ytr = model.outcome_transform(Y)[0].squeeze(-1)
    model.outcome_transform.eval()  # statistics of the whole data set, fixed during the minibatches
    steps = max(SVGP_MIN_STEPS, SVGP_EPOCHS * math.ceil(X.shape[0] / 1024))
    batches = []
    while len(batches) < steps:
        batches += list(torch.randperm(X.shape[0], generator=g).split(1024))
    for idx in batches[:steps]:
        opt.zero_grad()
        loss = -mll(model.model(Xtr[idx]), Ytr[idx])
        loss.backward()
        opt.step()
    return model.eval()


def predict(model, Xt, chunk: int = 2048):
    with torch.no_grad():
        parts = [model.posterior(Xt[i : i + chunk]) for i in range(0, Xt.shape[0], chunk)]
        return torch.cat([p.mean.reshape(-1) for p in parts]), torch.cat([p.variance.reshape(-1) for p in parts])


def scores(model, Xt, ft, Yt, sd: float) -> dict:
    mean, var = predict(model, Xt)
    pred_var = var + sd**2  # of a noisy observation
    nll = 0.5 * (torch.log(2 * math.pi * pred_var) + (Yt - mean) ** 2 / pred_var)
    inside = (Yt - mean).abs() <= 1.96 * pred_var.sqrt()
    return {"rmse": float(((mean - ft) ** 2).mean().sqrt()), "nll": float(nll.mean()),
            "coverage": float(inside.double().mean())}


def dictionary_size(model):
    return getattr(model, "dictionary_size", None)


def is_exact(model):
    return getattr(model, "is_exact", None)


def quality(args) -> list[dict]:
    rows = []
    for fname in args.functions:
        for seed in range(args.seeds):
            X, Y, Xt, ft, Yt, sd = dataset(fname, args.n_quality, args.noise, seed)
            for name in ("SingleTaskGP", "BKBModel"):  # alternate per seed: the VM's speed drifts
                t0 = time.perf_counter()
                model = fit(name, X, Y)
                row = {"study": "quality", "function": fname, "seed": seed, "model": name, "n": args.n_quality,
                       "fit_s": time.perf_counter() - t0, "m": dictionary_size(model), "exact": is_exact(model),
                       **scores(model, Xt, ft, Yt, sd)}
                rows.append(row)
                print(row, flush=True)
    return rows


def bbkb_batch(model, d: int, q: int, candidates: int) -> float:
    from torchbkb.botorch import optimize_acqf_bbkb

    C = torch.rand(candidates, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t0 = time.perf_counter()
    # q picks: C̃ never stops the batch first
    picks, _ = optimize_acqf_bbkb(model, C, batch_bound=1e9, max_batch_size=q)
    assert picks.shape[0] == q
    return time.perf_counter() - t0


def speed(args) -> list[dict]:
    """Fit + predict of BKBModel and SingleTaskGP, alternated per seed, at n = 3,000-5,000; ``m_at_exact`` is the
    dictionary BKB draws at SingleTaskGP's fitted hyperparameters (how sparse the exact model's kernel is)."""
    from torchbkb.botorch import BKBModel

    rows = []
    for n in args.speed_sizes:
        for fname in args.speed_functions:
            for seed in range(args.speed_seeds if n <= 3000 else 1):
                X, Y, Xt, ft, Yt, sd = dataset(fname, n, args.noise, seed)
                for name in ("BKBModel", "SingleTaskGP"):
                    t0 = time.perf_counter()
                    model = fit(name, X, Y)
                    predict(model, Xt)
                    el = time.perf_counter() - t0
                    row = {"study": "speed", "function": fname, "seed": seed, "model": name, "n": n,
                           "fit_predict_s": el,
                           "m": dictionary_size(model), "exact": is_exact(model),
                           "fit_rounds": getattr(model, "fit_rounds", None),
                           **scores(model, Xt, ft, Yt, sd)}
                    if name == "SingleTaskGP":
                        row["m_at_exact"] = BKBModel.from_model(model, seed=0).dictionary_size
                    rows.append(row)
                    print(row, flush=True)
    return rows


def iteration(X, Y, previous, q: int, candidates: int) -> tuple:
    """One BO iteration of a loop at ``n`` observations: a new BKBModel on all of them starting from the
    previous iteration's fitted hyperparameters (its modules' ``state_dict``), fitted without the warm start,
    the posterior built (its dictionary drawn over all ``n`` points, then the DTC fit), and a BBKB batch of ``q`` points
    from ``candidates`` random candidates. Returns (model, fit s, posterior s, batch s)."""
    from botorch.fit import fit_gpytorch_mll

    from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood

    t0 = time.perf_counter()
    model = BKBModel(X, Y, seed=0)
    for part in ("covar_module", "likelihood", "mean_module"):
        getattr(model, part).load_state_dict(getattr(previous, part).state_dict())
    fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model), warm_start=False)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        model.posterior(X[:1])  # the posterior is built on first use: its dictionary drawn over all n points
    t_post = time.perf_counter() - t0
    return model, t_fit, t_post, bbkb_batch(model, X.shape[-1], q, candidates)


def size(args, on_row=None) -> list[dict]:
    """Per n: BKBModel fitted from scratch on the first n - q points, then one loop iteration on all n
    (:func:`iteration`), scored; SingleTaskVariationalGP fitted on all n; SingleTaskGP up to ``--exact-max``."""
    rows = []
    fname = args.size_function
    for n in args.sizes:
        X, Y, Xt, ft, Yt, sd = dataset(fname, n, args.noise, 0, n_test=10_000)
        names = ["BKBModel", "SingleTaskVariationalGP"] + (["SingleTaskGP"] if n <= args.exact_max else [])
        for name in names:
            extra = {}
            with PeakMemory(torch.device("cpu")) as mem:
                t0 = time.perf_counter()
                if name == "BKBModel":
                    first = fit(name, X[: n - args.q], Y[: n - args.q])
                    extra["fit_scratch_s"] = time.perf_counter() - t0
                    model, t_fit, t_post, t_batch = iteration(X, Y, first, args.q, args.candidates)
                    extra.update(iteration_fit_s=t_fit, posterior_s=t_post, bbkb_batch_s=t_batch,
                                 iteration_s=t_fit + t_post + t_batch, q=args.q)
                    t_fit += t_post  # a usable model: fitted and its posterior built
                else:
                    model = fit(name, X, Y)
                    t_fit = time.perf_counter() - t0
                t1 = time.perf_counter()
                sc = scores(model, Xt, ft, Yt, sd)
                t_pred = time.perf_counter() - t1
            row = {"study": "size", "function": fname, "model": name, "n": n, "fit_s": t_fit, "predict_s": t_pred,
                   "fit_predict_s": t_fit + t_pred, **extra,
                   "peak_mb": None if mem.extra is None else mem.extra / 2**20,
                   "m": dictionary_size(model), "exact": is_exact(model),
                   "fit_rounds": getattr(model, "fit_rounds", None), **sc}
            rows.append(row)
            print(row, flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--functions", nargs="*", default=list(FUNCTIONS), choices=FUNCTIONS)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--noise", type=float, default=0.2, help="noise std as a fraction of std(f)")
    p.add_argument("--n-quality", type=int, default=600)
    p.add_argument("--size-function", default="styblinski10", choices=FUNCTIONS)
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    p.add_argument("--exact-max", type=int, default=0, help="largest n of the size study for SingleTaskGP")
    p.add_argument("--q", type=int, default=100)
    p.add_argument("--candidates", type=int, default=100_000)
    p.add_argument("--speed-functions", nargs="*", default=["styblinski10", "hartmann6"], choices=FUNCTIONS)
    p.add_argument("--speed-sizes", type=int, nargs="*", default=[3000, 5000])
    p.add_argument("--speed-seeds", type=int, default=2, help="seeds at n <= 3,000 (one above)")
    p.add_argument("--studies", nargs="*", default=["quality", "speed", "size"], choices=["quality", "speed", "size"])
    args = p.parse_args(argv)
    setup(args)
    if args.quick:
        args.functions, args.seeds, args.n_quality = args.functions[:1], 1, min(args.n_quality, 150)
        args.sizes, args.candidates, args.q, args.exact_max = args.sizes or [300], min(args.candidates,
                                                                                       5000), min(args.q, 10), 300
        args.speed_functions, args.speed_sizes, args.speed_seeds = args.speed_functions[:1], [300], 1
    args.sizes = args.sizes or [10_000, 30_000, 100_000]
    rows: list[dict] = []
    if "quality" in args.studies:
        rows += quality(args)
    if "speed" in args.studies:
        rows += speed(args)
        report(args, rows, quiet=True)
    if "size" in args.studies:
        rows += size(args, lambda done: report(args, rows + done, quiet=True))  # a partial report after each row
    report(args, rows)


def report(args, rows: list[dict], quiet: bool = False):
    summary = summarize(rows)
    if not quiet:
        print_table(summary,
                    ["study", "function", "model", "n", "rmse", "nll", "coverage", "fit_predict_s", "iteration_s", "m",
                     "m_at_exact"], "botorch_scale")
    path = write_json(args.out, "botorch_scale",
                      {"settings": {k: v for k, v in vars(args).items()}, "rows": rows, "summary": summary})
    plot(rows, args.out)
    if not quiet:
        print(path)


def summarize(rows: list[dict]) -> list[dict]:
    """Medians per (study, function, model, n)."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["study"], r["function"], r["model"], r["n"]), []).append(r)
    out = []
    for (study, fname, model, n), rs in groups.items():
        med = lambda k, rs=rs: statistics.median(r[k] for r in rs) if all(r.get(k) is not None for r in rs) else None
        out.append({"study": study, "function": fname, "model": model, "n": n, "rmse": med("rmse"), "nll": med("nll"),
                    "coverage": med("coverage"),
                    "fit_predict_s": med("fit_s") if study == "quality" else med("fit_predict_s"), "m": med("m"),
                    "iteration_s": med("iteration_s"), "m_at_exact": med("m_at_exact")})
    return out


def plot(rows: list[dict], out: str):
    fig, axes = new_figure(ncols=3, width=4.2)
    axes = axes[0]
    size_rows = [r for r in rows if r["study"] == "size"]
    for model in sorted({r["model"] for r in size_rows}):
        rs = sorted((r for r in size_rows if r["model"] == model), key=lambda r: r["n"])
        ns = [r["n"] for r in rs]
        axes[0].loglog(ns, [r["fit_predict_s"] for r in rs], "o-", label=model)
        axes[1].semilogx(ns, [r["rmse"] for r in rs], "o-", label=model)
        if model == "BKBModel":
            axes[2].loglog(ns, [r["m"] for r in rs], "o-", label="dictionary size m")
            axes[2].loglog(ns, ns, ":", color="gray", label="m = n")
    axes[0].set(xlabel="n", ylabel="fit + predict 10⁴ points (s)")
    axes[1].set(xlabel="n", ylabel="test RMSE")
    axes[2].set(xlabel="n", ylabel="m")
    for ax in axes:
        ax.legend(fontsize=7)
    return save_figure(fig, out, "botorch_scale")


if __name__ == "__main__":
    main()
