"""Which dictionary inclusion rule: ``inclusion="per_pull"`` (000 Algorithm 1 read literally) or ``"count_scaled"``
(the authors' code) -- regret against exact GP-UCB, dictionary size and time, over seeds (issue 24, item 1).

Problems (``q̄ = 2`` throughout, constant widths on the RLS scale, one seed = first arm and reward noise):

* ``anchor`` -- :func:`torchbkb.datasets.anchor_problem` (A = 1,000, λ = 0.01, ℓ = 0.2, β = 0.5), BKB, T = 1,000;
* ``gp`` -- held-out GP samples: 800 uniform arms in [0, 1]², f ~ GP(0, k_ℓ=0.2) (sample seeds 1000 + s, never
  used elsewhere), noise 0.1, λ = 0.01, β = 0.5, BKB, T = 1,000;
* ``cadata`` / ``abalone`` -- the 001 arm sets (standardized features, raw targets, noise-free), Gaussian
  kernel of width σ² = 5, λ = 0.2, C̃ = 2, the "2σ" width α̃ = 2√λ, BBKB, T = 2,000 (``--T``).

Per run: ``R_T`` over exact GP-UCB's ``R_T`` on the same seed (GP-UCB with the same width), the final
dictionary size, the mean batch size (BBKB) and the wall time. The summary gives medians over seeds and the
ratio of medians with a bootstrap 90 % interval.

Run: ``python -m benchmarks.inclusion [--quick] [--seeds N] [--problems anchor,gp,cadata,abalone]``; writes
``<out>/inclusion.json`` and ``inclusion.png``.
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import numpy as np
import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import bootstrap_ratio, new_figure, print_table, save_figure, strip_plot, write_json

NAME = "inclusion"
RULES = ("per_pull", "count_scaled")
SIZES = {
    "quick": {"seeds": 2, "T": 150, "table_T": 150, "problems": ["anchor", "gp", "cadata"]},
    "default": {"seeds": 10, "T": 1000, "table_T": 2000, "problems": ["anchor", "gp", "cadata", "abalone"]},
    "full": {"seeds": 20, "T": 1000, "table_T": 10_000, "problems": ["anchor", "gp", "cadata", "abalone"]},
}


def _problem(name: str, seed: int, dtype, device):
    """``(arms, values, noise_std, kernel, lam, width, batched)`` of one problem instance."""
    from torchbkb.datasets import anchor_problem, gp_sample
    from torchbkb.gp.kernels import GaussianKernel

    if name == "anchor":
        p = anchor_problem(dtype=dtype, device=device)
        return p.arms, p.values, p.noise_std, GaussianKernel(0.2), 0.01, 0.5, False
    if name == "gp":
        g = torch.Generator().manual_seed(1000 + seed)
        arms = torch.rand(800, 2, generator=g, dtype=torch.float64).to(device, dtype)
        f = gp_sample(arms, "rbf", lengthscale=0.2, seed=1000 + seed)
        return arms, f, 0.1, GaussianKernel(0.2), 0.01, 0.5, False
    arms, f = _table(name, dtype, device)
    lam = 0.2
    return arms, f, 0.0, GaussianKernel.from_width(5.0), lam, 2.0 * math.sqrt(lam), True


@functools.cache
def _table(name: str, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardized arms and raw rewards of a bundled table, read once per run of the study."""
    from benchmarks.paper_readings import rewards_at

    return rewards_at(name, "1", dtype, device)


def _run(method: str, prob, T: int, seed: int) -> dict:
    import torchbkb

    arms, values, noise_std, kernel, lam, width, batched = prob
    common = dict(noise=lam, beta=width, seed=seed)
    if method == "GP-UCB":
        bandit = torchbkb.GPUCB(arms, kernel, **common)
    elif batched:
        bandit = torchbkb.BBKB(arms, kernel, q_bar=2.0, batch_bound=2.0, inclusion=method, **common)
    else:
        bandit = torchbkb.BKB(arms, kernel, q_bar=2.0, inclusion=method, **common)
    objective = torchbkb.ArmObjective(values, noise_std=noise_std, seed=seed)
    t0 = time.perf_counter()
    hist = torchbkb.run(bandit, objective, budget=T, progress=False, values=values)
    wall = time.perf_counter() - t0
    return {
        "seed": seed, "regret": hist.cumulative_regret[-1], "time": wall,
        "dictionary_size": hist.dictionary_size[-1] if method != "GP-UCB" else None,
        "mean_batch": T / max(len(set(hist.batch)), 1),
    }


def study(problem: str, T: int, seeds: list[int], dtype, device) -> dict:
    runs: dict[str, list[dict]] = {m: [] for m in ("GP-UCB", *RULES)}
    for s in seeds:
        prob = _problem(problem, s, dtype, device)
        for method in ("GP-UCB", *RULES):  # interleaved seed by seed
            runs[method].append(_run(method, prob, T, s))
        print(f"  {problem} seed {s}: " + ", ".join(f"{m} R={runs[m][-1]['regret']:.4g}" for m in runs), flush=True)
    ref = np.array([r["regret"] for r in runs["GP-UCB"]])
    summary = {}
    for rule in RULES:
        x = np.array([r["regret"] for r in runs[rule]])
        summary[rule] = {
            "median_regret_ratio": float(np.median(x / ref)),
            "ratio_of_medians": float(np.median(x) / np.median(ref)),
            "ratio_of_medians_90ci": bootstrap_ratio(x, ref, np.median),
            "median_dictionary_size": statistics.median(r["dictionary_size"] for r in runs[rule]),
            "median_mean_batch": statistics.median(r["mean_batch"] for r in runs[rule]),
            "median_time": statistics.median(r["time"] for r in runs[rule]),
            "median_time_ratio_to_gpucb": statistics.median(a["time"] / b["time"] for a,
                                                            b in zip(runs[rule], runs["GP-UCB"])),
        }
    return {"T": T, "seeds": seeds, "summary": summary, "runs": runs}


def plot(results: dict, out_dir):
    """One panel per problem: R_T / R_T(GP-UCB) of each rule over seeds."""
    fig, axes = new_figure(ncols=len(results), width=3.2)
    axes = axes[0]
    for ax, (name, res) in zip(axes, results.items()):
        ref = [r["regret"] for r in res["runs"]["GP-UCB"]]
        strip_plot(ax, list(RULES), [[r["regret"] / g for r, g in zip(res["runs"][rule], ref)] for rule in RULES])
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_title(f"{name} (T = {res['T']})")
    axes[0].set_ylabel("R_T / R_T(exact GP-UCB)")
    return save_figure(fig, out_dir, NAME)


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--T", type=int, default=None, help="horizon of the table problems (Cadata, Abalone)")
    p.add_argument("--problems", default=None, help="comma-separated: anchor, gp, cadata, abalone")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    if args.seeds is not None:
        cfg["seeds"] = args.seeds
    if args.T is not None:
        cfg["table_T"] = args.T
    if args.problems:
        cfg["problems"] = args.problems.split(",")
    device, dtype = setup(args, default_threads=1)
    seeds = list(range(cfg["seeds"]))
    results = {}
    for name in cfg["problems"]:
        T = cfg["table_T"] if name in ("cadata", "abalone") else cfg["T"]
        results[name] = study(name, T, seeds, dtype, device)
    rows = []
    for name, res in results.items():
        for rule, s in res["summary"].items():
            lo, hi = s["ratio_of_medians_90ci"]
            rows.append({
                "problem": name, "T": res["T"], "rule": rule, "R/R_GP-UCB (median)": s["median_regret_ratio"],
                "ratio of medians [90% CI]": f"{s['ratio_of_medians']:.2f} [{lo:.2f}, {hi:.2f}]",
                "dict. size": s["median_dictionary_size"], "mean batch": s["median_mean_batch"],
                "time / GP-UCB": s["median_time_ratio_to_gpucb"],
            })
    print_table(rows, list(rows[0]), title="inclusion rule: regret vs exact GP-UCB (medians over seeds)")
    plot(results, args.out)
    write_json(args.out, NAME, {"config": cfg, "results": results, "table": rows}, device=device)
    return results


if __name__ == "__main__":
    main()
