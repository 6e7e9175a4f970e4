"""The main job: regret, time, batch and dictionary sizes on the BBKB paper's arm sets (001 Sec. 4, Fig. 1).

Algorithms (registry names): ``BBKB`` and ``BBKB-theory`` (001 Alg. 1), ``BKB`` and ``BKB-theory``
(000 Alg. 1), exact ``GPUCB`` (incremental) and ``GPBUCB`` (same batch rule as BBKB), ``BoTorch-UCB``
(SingleTaskGP + UpperConfidenceBound + optimize_acqf_discrete, the peer a BoTorch user has),
``EpsGreedy`` and ``Random``. The plot has the four panels of the paper's figures: regret, time, batch
size and dictionary size against t, mean ± std over repetitions.

Every row of the table is an arm, its (standardized) target the deterministic reward, regret is
measured against the best row. Settings of the paper: Gaussian kernel of width ``σ² = 5``
(lengthscale ``√5``), ``λ = 0.2``, ``q̄ = 2``, ``F = 20``, ``δ = 1/T``; the constant-β variants use
``β = 1`` (RLS scale; BoTorch gets ``β²/λ = 5``). Exact peers (GP-UCB, BoTorch) are capped by wall time
and the table says where they stopped.

Every run is capped by the same wall-time limit (it bites on the exact peers, and on BKB with the
theory β, whose confidence width ``β̃ ≈ 25`` makes it (and BBKB with ``α̃ = C̃β̃``) explore the 8-dimensional table
uniformly, so that every pulled arm keeps prior-level variance and enters the dictionary: ``m_t ≈ t``).

Sizes: ``--quick`` Cadata, T = 100, 1 repetition, cap 5 s (smoke test); default Cadata, T = 1,000,
2 repetitions, cap 60 s per run; ``--full`` Abalone and Cadata, T = 10⁴, 10 repetitions, cap 30 min
per run, and every method with each of its widths (:data:`FULL_ALGORITHMS`: constant, ``-theory``,
``-practical``, and GP-BUCB with Desautels et al.'s rule). Not yet run end to end; an estimate from the
default size: up to ~45 hours on 2 cores, dominated by the theory-width runs, which explore almost uniformly and
reach the 30-minute cap.

Run: ``python -m benchmarks [--quick|--full] [--device cuda]`` (this is the default benchmark).
"""

from __future__ import annotations

import time


from benchmarks.cli import base_parser, setup, size_of
from benchmarks.harness import run_bandit, summarize_runs
from benchmarks.paper_readings import rewards_at
from benchmarks.registry import ALGORITHMS, BanditSettings
from benchmarks.report import BANDIT_COLUMNS, bandit_table_rows, plot_bandit_runs, print_table, write_json

NAME = "regret"
DEFAULT_ALGORITHMS = ["BBKB", "BBKB-theory", "BKB", "BKB-theory", "GPUCB", "GPBUCB", "BoTorch-UCB", "EpsGreedy",
                      "Random"]
#: ``--full`` runs every width of every method (the constant, the theorems', the authors' code's)
FULL_ALGORITHMS = ([f"{m}{w}" for m in ("BBKB", "BKB", "GPUCB", "GPBUCB") for w in ("", "-theory", "-practical")]
                   + ["GPBUCB-desautels", "BoTorch-UCB", "EpsGreedy", "Random"])
SIZES = {
    "quick": {"datasets": ["cadata"], "T": 100, "repetitions": 1, "time_limit": 5.0},
    "default": {"datasets": ["cadata"], "T": 1000, "repetitions": 2, "time_limit": 60.0},
    "full": {"datasets": ["abalone", "cadata"], "T": 10_000, "repetitions": 10, "time_limit": 1800.0},
}


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--algorithms", default=None,
                   help="comma-separated registry names (default: every width with --full)")
    p.add_argument("--datasets", default=None, help="comma-separated: abalone, cadata")
    p.add_argument("--T", type=int, default=None, help="horizon (overrides the size)")
    p.add_argument("--repetitions", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None, help="wall-time cap of every run [s]")
    p.add_argument("--beta", type=float, default=1.0, help="constant β (RLS scale)")
    p.add_argument("--rewards", default="z", help="z (z-scored targets, the default) or a factor on the raw targets "
                   "(Cadata's are in $100,000: 100 = thousands of dollars; see benchmarks.paper_readings)")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    for key, val in (("T", args.T), ("repetitions", args.repetitions), ("time_limit", args.time_limit)):
        if val is not None:
            cfg[key] = val
    if args.datasets:
        cfg["datasets"] = args.datasets.split(",")
    chosen = args.algorithms or ",".join(FULL_ALGORITHMS if size_of(args) == "full" else DEFAULT_ALGORITHMS)
    algorithms = [a for a in chosen.split(",") if a]
    device, dtype = setup(args, default_threads=1)
    T = int(cfg["T"])
    settings = BanditSettings(lengthscale=5.0**0.5, lam=0.2, q_bar=2.0, F=20.0, delta=1.0 / T, beta=args.beta)
    payload = {"size": size_of(args), "rewards": args.rewards, "config": cfg, "settings": settings.to_dict(),
               "algorithms": algorithms, "datasets": {}}
    t_start = time.perf_counter()
    for ds in cfg["datasets"]:
        arms, rewards = rewards_at(ds, args.rewards, dtype, device)
        results: dict[str, list] = {}
        for alg in algorithms:
            if alg not in ALGORITHMS:
                raise SystemExit(f"--algorithms: expected names from {sorted(ALGORITHMS)}, got {alg!r}")
            limit = cfg["time_limit"]
            results[alg] = []
            for rep in range(int(cfg["repetitions"])):
                results[alg].append(
                    run_bandit(alg, arms, rewards, rewards, settings, T, seed=args.seed + rep, time_limit=limit,
                               progress=not args.no_progress)
                )
        summaries = [summarize_runs(r) for r in results.values()]
        units = "z-scored rewards" if args.rewards == "z" else f"rewards = raw × {args.rewards}"
        title = (f"{ds}: A={arms.shape[0]}, d={arms.shape[1]}, T={T}, σ²=5, λ=0.2, q̄=2, β={args.beta} / theory (F=20, "
                 f"δ=1/T), {units}; {device}, {args.dtype}")
        print_table(bandit_table_rows(summaries), BANDIT_COLUMNS, title)
        png = plot_bandit_runs(results, args.out, f"{NAME}_{ds}", title)
        payload["datasets"][ds] = {"A": arms.shape[0], "d": arms.shape[1], "summaries": summaries, "runs": results,
                                   "plot": str(png)}
    payload["total_time"] = time.perf_counter() - t_start
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
