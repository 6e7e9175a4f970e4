"""One continuous BO iteration with BKBModel against BoTorch's own models, n = 250..5,000, d = 2 and 6.

An iteration is what a BoTorch loop does each step: build the model on ``n`` observations (fitting its
hyperparameters where the model has any to fit) and maximize ``LogExpectedImprovement`` with
``optimize_acqf`` (4 restarts, 256 raw samples, at most 50 L-BFGS iterations) over the unit cube.
Models, each in its BoTorch-documented form:

* ``BKBModel`` -- fixed Matérn-5/2 hyperparameters (``default_kernel``, ``DEFAULT_NOISE``), ``Standardize``,
  dictionary drawn with seed 0 (BKBModel with learned hyperparameters: ``botorch_scale.py``);
* ``SingleTaskGP fixed`` -- the same kernel and noise, no fitting (the exact model BKBModel approximates);
* ``SingleTaskGP fitted`` -- BoTorch defaults, ``fit_gpytorch_mll`` (skipped above ``--fit-max``: its fit
  costs minutes there);
* ``SingleTaskVariationalGP fitted`` -- BoTorch's scalable model, 128 inducing points, fitted by
  ``fit_gpytorch_mll`` on the variational ELBO (at most 100 L-BFGS iterations, or 200 Adam steps past
  1,024 points: BoTorch's default L-BFGS run takes about 100 s even at n = 250).

Reported per (d, n, model): min/median seconds over interleaved repeats, acquisition evaluations of the
iteration (optimizer trajectories differ between models, so the time per evaluation is reported too), the
dictionary size and mode of BKBModel, and with ``--memory`` the peak memory of one iteration in a fresh
interpreter (rise of the resident-set high-water mark). Ratios are against ``SingleTaskGP fixed`` in the
same run.

Usage::

    python -m benchmarks.botorch_iteration --threads 2            # n = 250..5,000, d = 2, 6 (about 20 min)
    python -m benchmarks.botorch_iteration --quick --threads 2    # n = 250, 500 (about a minute)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import reset_hwm, status_kb

SVGP_INDUCING = 128
MODELS = ("BKBModel", "SingleTaskGP fixed", "SingleTaskGP fitted", "SingleTaskVariationalGP fitted")
BASELINE = "SingleTaskGP fixed"


def objective(d: int):
    """Hartmann-6 (d = 6) or Branin (d = 2), negated, on the unit cube."""
    from botorch.test_functions import Branin, Hartmann

    f = Hartmann(6, negate=True) if d == 6 else Branin(negate=True)
    lb, ub = f.bounds[0].double(), f.bounds[1].double()
    return lambda X: f(lb + X * (ub - lb))


def data(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(1000 * d + n + seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = objective(d)(X).unsqueeze(-1)
    return X, Y + 0.01 * Y.std() * torch.randn(n, 1, generator=g, dtype=torch.float64)


def build(name: str, X, Y):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP, SingleTaskVariationalGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood, VariationalELBO

    from torchbkb.botorch import BKBModel, default_kernel
    from torchbkb.botorch.defaults import DEFAULT_NOISE

    d = X.shape[-1]
    if name == "BKBModel":  # the fixed hyperparameters of "SingleTaskGP fixed" (fitting: botorch_scale.py)
        return BKBModel(X, Y, kernel=default_kernel(d), noise=DEFAULT_NOISE, seed=0)
    if name == "SingleTaskGP fixed":
        gp = SingleTaskGP(X, Y, covar_module=default_kernel(d))
        gp.likelihood.noise = torch.tensor([DEFAULT_NOISE], dtype=X.dtype)
        return gp.eval()
    if name == "SingleTaskGP fitted":
        gp = SingleTaskGP(X, Y)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        return gp.eval()
    n = X.shape[0]
    svgp = SingleTaskVariationalGP(X, Y, inducing_points=min(SVGP_INDUCING, n), outcome_transform=Standardize(m=1))
    # BoTorch's fit: full-batch L-BFGS up to 1,024 points, minibatch Adam beyond; capped (the default
    # L-BFGS run takes ~100 s even at n = 250 with 256 inducing points)
    limit = {"options": {"maxiter": 100}} if n <= 1024 else {"step_limit": 200}
    fit_gpytorch_mll(VariationalELBO(svgp.likelihood, svgp.model, num_data=n), optimizer_kwargs=limit)
    return svgp.eval()


def iteration(name: str, X, Y) -> dict:
    """Build (and fit) the model, maximize LogEI; returns seconds, evaluations and the model."""
    from botorch.acquisition import LogExpectedImprovement
    from botorch.optim import optimize_acqf

    t0 = time.perf_counter()
    model = build(name, X, Y)
    acqf = LogExpectedImprovement(model, best_f=Y.max())
    calls = [0]
    forward = acqf.forward

    def counted(Xc):
        calls[0] += 1
        return forward(Xc)

    acqf.forward = counted
    torch.manual_seed(0)
    bounds = torch.stack([torch.zeros(X.shape[-1]), torch.ones(X.shape[-1])]).to(X)
    optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=256, options={"maxiter": 50})
    return {"seconds": time.perf_counter() - t0, "evaluations": calls[0], "model": model}


def _memory_child(name: str, n: int, d: int) -> None:
    X, Y = data(n, d)
    iteration(name, X[: max(2, n // 10)], Y[: max(2, n // 10)])  # warm code paths, small
    reset_hwm()
    base = status_kb("VmRSS")
    iteration(name, X, Y)
    print((status_kb("VmHWM") - base) / 1024)




def _memory(name: str, n: int, d: int, threads: int | None) -> float:
    cmd = [sys.executable, "-m", "benchmarks.botorch_iteration", "--_memory", name, str(n), str(d)]
    if threads:
        cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=None, help="training set sizes n")
    p.add_argument("--dims", type=int, nargs="*", default=[2, 6], choices=[2, 6])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fit-max", type=int, default=2000, help="largest n for the fitted SingleTaskGP")
    p.add_argument("--memory", action="store_true", help="peak memory of each iteration in a fresh interpreter")
    p.add_argument("--_memory", nargs=3, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    setup(args)
    if args._memory:
        return _memory_child(args._memory[0], int(args._memory[1]), int(args._memory[2]))
    size = size_of(args)
    sizes = args.sizes or ([250, 500] if size == "quick" else [250, 500, 1000, 2000, 5000])
    repeats = 1 if size == "quick" else args.repeats
    rows = []
    for d in args.dims:
        for n in sizes:
            X, Y = data(n, d)
            names = [m for m in MODELS if m != "SingleTaskGP fitted" or n <= args.fit_max]
            for name in names:  # warm-up (imports, first-call caches) outside the timing
                iteration(name, X[:50], Y[:50])
            runs = {name: [] for name in names}
            for r in range(repeats):  # interleaved: every model sees the same machine conditions
                for name in names:
                    if r > 0 and name.endswith("fitted") and n > 1000:
                        continue  # one timing of the slow fits at large n
                    runs[name].append(iteration(name, X, Y))
            base = statistics.median(x["seconds"] for x in runs[BASELINE])
            for name, res in runs.items():
                secs = [x["seconds"] for x in res]
                model = res[-1]["model"]
                row = {
                    "d": d, "n": n, "model": name,
                    "median_s": statistics.median(secs), "min_s": min(secs), "repeats": len(secs),
                    "evaluations": statistics.median(x["evaluations"] for x in res),
                    "ratio_to_fixed_gp": statistics.median(secs) / base,
                    "dictionary_size": getattr(model, "num_inducing", None),
                    "exact": getattr(model, "is_exact", None),
                    "peak_mb": _memory(name, n, d, args.threads) if args.memory else None,
                }
                row["ms_per_evaluation"] = 1e3 * row["median_s"] / max(row["evaluations"], 1)
                rows.append(row)
            print_table([r for r in rows if r["d"] == d and r["n"] == n],
                        ["d", "n", "model", "median_s", "evaluations", "ms_per_evaluation", "ratio_to_fixed_gp",
                         "dictionary_size", "exact", "peak_mb"])
    payload = {"size": size, "baseline": BASELINE,
               "settings": {"acquisition": "LogExpectedImprovement", "num_restarts": 4, "raw_samples": 256,
                            "maxiter": 50, "svgp_inducing": SVGP_INDUCING,
                            "svgp_fit": "L-BFGS maxiter 100 (n <= 1024), Adam step_limit 200", "fit_max": args.fit_max},
                            "rows": rows}
    path = write_json(args.out, "botorch_iteration", payload)
    _plot(rows, args.out, args.dims)
    print(f"wrote {path}")
    return payload


def _plot(rows, out, dims):
    fig, axes = new_figure(ncols=len(dims), width=5.0, height=3.8)
    for ax, d in zip(axes[0], dims):
        for name, marker in zip(MODELS, "so^v"):
            pts = [(r["n"], r["median_s"]) for r in rows if r["d"] == d and r["model"] == name]
            if pts:
                ax.loglog(*zip(*pts), marker + "-", label=name)
        ax.set_xlabel("training points n")
        ax.set_ylabel("seconds per BO iteration (median)")
        ax.set_title(f"d = {d}: build (+ fit) and LogEI + optimize_acqf")
        ax.legend(fontsize=7)
    return save_figure(fig, out, "botorch_iteration")


if __name__ == "__main__":
    main()
