"""High-throughput BO: trust-region BKB against TuRBO-1 with SingleTaskGP, global BKB loops and Sobol search.

Problems (maximizing the negated function on its box): Ackley-20 on ``[-32.768, 32.768]^20``, Levy-20 on
``[-10, 10]^20``, Styblinski-Tang-50 on ``[-5, 5]^50`` and Rosenbrock-60 on ``[-5, 10]^60``; ``q = 100`` per batch.

Methods:

* ``turbo1`` -- TuRBO-1 written from the paper as the baseline: the same :class:`~torchbkb.botorch.TrustRegion`
  state and candidates, a ``SingleTaskGP`` (TuRBO's Matérn-5/2 kernel and noise constraint) fitted with
  ``fit_gpytorch_mll`` on every point since the region's last restart, ``q`` distinct Thompson picks by BoTorch's
  ``MaxPosteriorSampling(replacement=False)`` (joint samples over the candidates), both under
  ``max_cholesky_size(inf)`` (Cholesky, not Lanczos), as BoTorch's tutorial does;
* ``trbkb_thompson``, ``trbkb_bbkb`` -- :class:`~torchbkb.botorch.TrustRegionBKB` with Thompson or fixed-``q``
  BBKB proposals (``β = 2`` on the GP scale);
* ``bkb_thompson``, ``bkb_bbkb`` -- a global BKBModel (BoTorch's default modules) fitted on every point, Thompson
  or fixed-``q`` BBKB over 10⁴ uniform candidates;
* ``sobol`` -- Sobol points.

The loop study records every method's best value against evaluations and wall time (``--problems``, ``--seeds``,
``--budget``). The speed study (``--study speed``) times one proposal (fit + a batch of ``q``) at ``n`` points of a
previous run's kind (uniform points of the region of side 0.8 around the optimum of Ackley), TuRBO-1 and
trust-region BKB interleaved, for ``--sizes``; TuRBO-1 is skipped where its ``n × n`` kernel matrix would not fit in
``--max-gib`` of memory. The fixed-q study (``--study fixed_q``) times a batch of ``--fixed-q`` picks from
``--candidates`` uniform candidates and its extra peak memory, beside 001's adaptive batch (both in
:mod:`benchmarks.proposal_speed`).

Usage::

    python -m benchmarks.high_throughput --threads 2 --seeds 3                      # the loops, hours
    python -m benchmarks.high_throughput --threads 2 --study speed --sizes 1000,5000,10000
    python -m benchmarks.high_throughput --threads 2 --study fixed_q --dims 20      # q = 1,000 from 10^6
    python -m benchmarks.high_throughput --quick                                    # seconds
    python -m benchmarks.high_throughput --merge run_a run_b --out merged           # seeds run apart, one report
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.proposal_speed import fixed_q, plot_speed, speed
from benchmarks.report import new_figure, print_table, save_figure, write_json

PROBLEMS = {  # name: (BoTorch class, d, lower, upper)
    "ackley20": ("Ackley", 20, -32.768, 32.768),
    "levy20": ("Levy", 20, -10.0, 10.0),
    "styblinski50": ("StyblinskiTang", 50, -5.0, 5.0),
    "rosenbrock60": ("Rosenbrock", 60, -5.0, 10.0),
}
METHODS = ("turbo1", "trbkb_thompson", "trbkb_bbkb", "bkb_thompson", "bkb_bbkb", "sobol")
GLOBAL_CANDIDATES = 10_000
BETA = 2.0  # GP-scale width of the BBKB proposals
PROPOSAL_COLUMNS = ["problem", "method", "from_n", "to_n", "median_s", "proposals", "turbo1_ratio"]


def problem(name: str):
    """``(f, bounds)``: the negated BoTorch test function (maximized) and its `(2, d)` box."""
    import botorch.test_functions as tf

    cls, d, lo, hi = PROBLEMS[name]
    fn = getattr(tf, cls)(dim=d, negate=True).to(torch.float64)
    bounds = torch.tensor([[lo] * d, [hi] * d], dtype=torch.float64)
    return (lambda X: fn(X)), bounds


class Turbo1:
    """TuRBO-1 with a SingleTaskGP on every point since the last restart (the baseline; ask/tell, maximizes)."""

    def __init__(self, bounds, q: int, seed: int):
        from torchbkb.botorch import TrustRegion
        from torchbkb.botorch.trust_region import num_candidates

        self.bounds, self.q, self.seed, self.draws = bounds, q, seed, 0
        d = bounds.shape[1]
        self.region, self.n_cand, self.n_init = TrustRegion(d, q), num_candidates(d), 2 * d
        self.X, self.Y, self.owned = bounds.new_zeros((0, d)), bounds.new_zeros(0), []

    def ask(self):
        from botorch.fit import fit_gpytorch_mll
        from botorch.generation import MaxPosteriorSampling
        from botorch.models import SingleTaskGP
        from gpytorch.mlls import ExactMarginalLogLikelihood
        from gpytorch.settings import max_cholesky_size
        from torch.quasirandom import SobolEngine

        from torchbkb.botorch.trust_region_loop import turbo_modules

        lo, hi = self.bounds
        self.draws += 1
        if not self.owned:
            U = SobolEngine(lo.numel(), scramble=True, seed=self.seed * 1000 + self.draws).draw(self.n_init).double()
            return lo + U * (hi - lo)
        idx = torch.tensor(self.owned)
        U, Y = (self.X[idx] - lo) / (hi - lo), self.Y[idx]
        with max_cholesky_size(float("inf")):  # the tutorial's setting: Cholesky, never Lanczos
            model = SingleTaskGP(U, Y.unsqueeze(-1), **turbo_modules(U.shape[1]))
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
            forward, calls = mll.forward, []
            mll.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)  # counts the fit's evaluations
            fit_gpytorch_mll(mll)
            self.fit_evaluations = len(calls)
            ls = model.covar_module.base_kernel.lengthscale.detach().reshape(-1)
            cand = self.region.candidates(U[Y.argmax()], ls, self.n_cand, seed=self.seed * 1000 + self.draws)
            with torch.no_grad():
                new = MaxPosteriorSampling(model=model, replacement=False)(cand, num_samples=self.q)
        return lo + new * (hi - lo)

    def tell(self, X, Y):
        n = self.Y.numel()
        self.X, self.Y = torch.cat([self.X, X]), torch.cat([self.Y, Y])
        self.owned += list(range(n, n + Y.numel()))
        self.region.update(Y)
        if self.region.restart_triggered:
            self.region.restart()
            self.owned = []


class GlobalBKB:
    """A global BKBModel (BoTorch's default modules) on every point; Thompson or fixed-q BBKB over uniform
    candidates (ask/tell, maximizes)."""

    def __init__(self, bounds, q: int, seed: int, acquisition: str):
        self.bounds, self.q, self.seed, self.acquisition, self.draws = bounds, q, seed, acquisition, 0
        self.X, self.Y = bounds.new_zeros((0, bounds.shape[1])), bounds.new_zeros(0)

    def ask(self):
        from botorch.fit import fit_gpytorch_mll
        from torch.quasirandom import SobolEngine

        from torchbkb.botorch import BKBModel, DTCMarginalLogLikelihood, optimize_acqf_bbkb, optimize_acqf_thompson

        lo, hi = self.bounds
        d = lo.numel()
        self.draws += 1
        if self.Y.numel() == 0:
            return lo + SobolEngine(d, scramble=True, seed=self.seed * 1000).draw(2 * d).double() * (hi - lo)
        U = (self.X - lo) / (hi - lo)
        model = BKBModel(U, self.Y.unsqueeze(-1), seed=self.seed)
        fit_gpytorch_mll(DTCMarginalLogLikelihood(model.likelihood, model))
        g = torch.Generator().manual_seed(self.seed * 1000 + self.draws)
        cand = torch.rand(GLOBAL_CANDIDATES, d, generator=g, dtype=torch.float64)
        if self.acquisition == "thompson":
            new, _ = optimize_acqf_thompson(model, cand, self.q)
        else:
            new, _ = optimize_acqf_bbkb(model, cand, q=self.q, beta=BETA * math.sqrt(model.noise))
        return lo + new * (hi - lo)

    def tell(self, X, Y):
        self.X, self.Y = torch.cat([self.X, X]), torch.cat([self.Y, Y])


class SobolSearch:
    def __init__(self, bounds, q: int, seed: int):
        from torch.quasirandom import SobolEngine

        self.bounds, self.q, self.engine = bounds, q, SobolEngine(bounds.shape[1], scramble=True, seed=seed)

    def ask(self):
        lo, hi = self.bounds
        return lo + self.engine.draw(self.q).double() * (hi - lo)

    def tell(self, X, Y):
        pass


def optimizer(method: str, bounds, q: int, seed: int):
    from torchbkb.botorch import TrustRegionBKB

    if method == "turbo1":
        return Turbo1(bounds, q, seed)
    if method.startswith("trbkb_"):
        return TrustRegionBKB(bounds, batch_size=q, acquisition=method.split("_")[1], beta=BETA, seed=seed)
    if method.startswith("bkb_"):
        return GlobalBKB(bounds, q, seed, method.split("_")[1])
    return SobolSearch(bounds, q, seed)


def run_loop(method: str, name: str, seed: int, budget: int, q: int) -> dict:
    """One loop to ``budget`` evaluations: the best value after each batch, the wall time and each proposal's time."""
    f, bounds = problem(name)
    opt = optimizer(method, bounds, q, seed)
    evals, best, wall, proposals = [], [], [], []
    start, n, top = time.perf_counter(), 0, -math.inf
    while n < budget:
        t0 = time.perf_counter()
        X = opt.ask()[: budget - n]
        proposals.append((n, time.perf_counter() - t0))
        Y = f(X)
        opt.tell(X, Y)
        n += X.shape[0]
        top = max(top, float(Y.max()))
        evals.append(n), best.append(top), wall.append(time.perf_counter() - start)
    return {"method": method, "problem": name, "seed": seed, "evaluations": evals, "best": best, "wall_s": wall,
            "proposal_s": proposals}


def loops(args) -> list[dict]:
    rows = []
    for name in args.problems:
        for seed in range(args.seed, args.seed + args.seeds):
            for method in args.methods:  # interleaved: every method of a seed before the next seed
                t0 = time.perf_counter()
                row = run_loop(method, name, seed, args.budget, args.q)
                rows.append(row)
                print(f"{name} seed {seed} {method:15s} best {row['best'][-1]:9.3f}  {time.perf_counter() - t0:7.1f} s",
                      flush=True)
    return rows


def summarize(rows: list[dict], budget: int) -> list[dict]:
    """Per problem and method: the median, min and max over seeds of the best value at ``budget`` evaluations."""
    out = []
    for name in dict.fromkeys(r["problem"] for r in rows):
        for method in dict.fromkeys(r["method"] for r in rows):
            finals = [r["best"][-1] for r in rows if r["problem"] == name and r["method"] == method]
            walls = [r["wall_s"][-1] for r in rows if r["problem"] == name and r["method"] == method]
            if finals:
                out.append({"problem": name, "method": method, "median": statistics.median(finals), "min": min(finals),
                            "max": max(finals), "wall_s": statistics.median(walls), "seeds": len(finals)})
    return out


def proposal_table(rows: list[dict], width: int = 500) -> list[dict]:
    """Per problem, method and bin of ``width`` evaluations: the median seconds of the loops' proposals made in
    that bin (initial designs excluded), over every seed, and TuRBO-1's median over the method's."""
    out = []
    for name in dict.fromkeys(r["problem"] for r in rows):
        medians = {}
        for method in dict.fromkeys(r["method"] for r in rows):
            if method == "sobol":
                continue
            times: dict[int, list[float]] = {}
            for r in rows:
                if r["problem"] == name and r["method"] == method:
                    for n, sec in r["proposal_s"][1:]:
                        times.setdefault(n // width * width, []).append(sec)
            for lo, secs in sorted(times.items()):
                medians[method, lo] = statistics.median(secs)
                out.append({"problem": name, "method": method, "from_n": lo, "to_n": lo + width,
                            "median_s": medians[method, lo], "proposals": len(secs)})
        for row in out:
            if row["problem"] == name and ("turbo1", row["from_n"]) in medians:
                row["turbo1_ratio"] = medians["turbo1", row["from_n"]] / row["median_s"]
    return out


def plot(rows: list[dict], out: str) -> None:
    names = list(dict.fromkeys(r["problem"] for r in rows))
    fig, axes = new_figure(ncols=len(names), nrows=2, width=4.2, height=3.5)
    for j, name in enumerate(names):
        top, bottom = axes[0][j], axes[1][j]
        for method in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows if r["problem"] == name and r["method"] == method]
            for k, r in enumerate(mine):
                label = method if k == 0 else None
                top.plot(r["evaluations"], r["best"], color=f"C{METHODS.index(method)}", alpha=0.7, label=label)
                bottom.plot(r["wall_s"], r["best"], color=f"C{METHODS.index(method)}", alpha=0.7)
        top.set(title=name, xlabel="evaluations", ylabel="best value")
        bottom.set(xlabel="wall time (s)", ylabel="best value", xscale="log")
        top.legend(fontsize=7)
    save_figure(fig, out, "high_throughput")


def merge(folders: list[str], out: str) -> dict:
    """One loop report from the ``high_throughput.json`` of several runs (seeds or problems run in parallel
    processes); every run must have the same budget and ``q``."""
    docs = [json.loads((Path(f) / "high_throughput.json").read_text()) for f in folders]
    kinds = sorted({(d["budget"], d["q"], d["size"]) for d in docs})
    if len(kinds) != 1:
        raise SystemExit(f"--merge: expected runs of one (budget, q, size), got {kinds}")
    rows = [r for d in docs for r in d["rows"]]
    budget, q, size = kinds[0]
    payload = loop_report(rows, budget, q, size, out)
    payload["merged_from"] = [{"folder": f, "command": d["command"], "created": d["created"]}
                              for f, d in zip(folders, docs)]
    write_json(out, "high_throughput", payload)
    return payload


def loop_report(rows: list[dict], budget: int, q: int, size: str, out: str) -> dict:
    """The loop study's tables (printed), figure (written to ``out``) and JSON payload from its rows."""
    table = summarize(rows, budget)
    columns = ["problem", "method", "median", "min", "max", "wall_s", "seeds"]
    print_table(table, columns, f"best value at {budget} evaluations")
    times = proposal_table(rows)
    print_table(times, PROPOSAL_COLUMNS, "seconds per proposal in the loops, by evaluations so far")
    plot(rows, out)
    return {"study": "loops", "size": size, "budget": budget, "q": q, "summary": table, "proposal_times": times,
            "rows": rows}


def main(argv=None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--study", choices=["loops", "speed", "fixed_q"], default="loops")
    p.add_argument("--problems", default=",".join(PROBLEMS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--budget", type=int, default=2000)
    p.add_argument("--q", type=int, default=100)
    p.add_argument("--sizes", default=None, help="speed study: n values (default 1000,2000,5000,10000,50000)")
    p.add_argument("--dims", default="20,60")
    p.add_argument("--max-gib", type=float, default=12.0, help="skip TuRBO-1 where its n x n matrices exceed this")
    p.add_argument("--measure-max", type=int, default=5000, help="estimate TuRBO-1 from its parts past this n")
    p.add_argument("--candidates", default="1000000", help="fixed_q study: candidate set sizes")
    p.add_argument("--fixed-q", type=int, default=1000, help="fixed_q study: the batch size")
    p.add_argument("--fit-n", type=int, default=1000, help="fixed_q study: the model's training points")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="combine the loop rows of earlier runs' --out folders")
    args = p.parse_args(argv)
    setup(args)
    if args.merge:
        return merge(args.merge, args.out)
    args.problems, args.methods = args.problems.split(","), args.methods.split(",")
    sizes = args.sizes or ("200" if args.quick else "1000,2000,5000,10000,50000")
    args.sizes, args.dims = [int(s) for s in sizes.split(",")], [int(s) for s in args.dims.split(",")]
    args.candidates = [int(s) for s in args.candidates.split(",")]
    if args.quick:
        args.problems, args.seeds, args.budget, args.q = args.problems[:1], 1, 140, 50
        args.dims = [20]
        args.candidates, args.fixed_q, args.fit_n = [20_000], 100, 200
    size = "quick" if args.quick else "default"
    if args.study == "speed":
        rows = speed(args)
        payload = {"study": "speed", "size": size, "q": args.q, "rows": rows}
        print_table(rows, ["method", "d", "n", "seconds", "note"], "one proposal (fit + q picks), seconds")
        plot_speed(rows, args.out)
    elif args.study == "fixed_q":
        rows = fixed_q(args)
        payload = {"study": "fixed_q", "size": size, "rows": rows}
        columns = ["d", "A", "q", "seconds", "picks", "distinct", "stop_reason", "extra_peak_mb"]
        print_table(rows, columns + ["extra_over_candidates"], "a BBKB batch from A candidates")
    else:
        payload = loop_report(loops(args), args.budget, args.q, size, args.out)
    write_json(args.out, "high_throughput" if args.study == "loops" else f"high_throughput_{args.study}", payload)
    return payload


if __name__ == "__main__":
    main()
