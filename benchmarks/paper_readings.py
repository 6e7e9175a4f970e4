"""Which reading of 001 Sec. 4 makes the paper's Fig. 1 and Fig. 2 appear (issue 24, item 4).

The paper runs BBKB on Abalone and Cadata with a Gaussian kernel of width ``σ² = 5``, ``F = 20``, ``δ = 1/T``,
``q̄ = 2``, ``λ = 0.2``, ``T = 10⁴``, and reports sublinear regret (Fig. 1) and batches that grow "up to 3700 and
3900" (Fig. 2). It does not state the reward units, the width it ran (the theorem's or its code's), ``C̃`` or how
an arm pulled ``n`` times enters the dictionary. This study runs BBKB (``C̃ = 2``, noise-free rewards, z-scored
features) over a grid of those readings:

* reward scale: ``z`` (the targets z-scored, torchbkb's default) or the raw targets times a factor. Cadata's
  bundled targets are in units of $100,000: ``×100`` is thousands of dollars, ``×100000`` LIBSVM's dollars;
  Abalone's are ring counts;
* width: ``theory`` (001 Theorem 2, ``α̃ = C̃β̃``), ``practical`` (the authors' code) or a constant (RLS scale);
* inclusion: ``count_scaled`` (the authors' rule, torchbkb's default) or ``per_pull``.

Per run: ``R_T/R_unif``, the growth ``R_T / R_{T/2}`` (2 for linear regret, 1 once regret stops growing), the
largest batch, the number of batches, the dictionary size, ``t`` reached within the wall-time cap and the
time. A reading *shows the paper's figures* when, in the median over seeds, regret is sublinear
(``R_T / R_{T/2} ≤ 1.5`` and ``R_T/R_unif ≤ 0.2``) and the largest batch has at least 2,000 picks.

Run: ``python -m benchmarks.paper_readings [--quick|--full] [--datasets ...] [--scales z,1,100]
[--widths theory,practical] [--rules count_scaled,per_pull]``; writes ``<out>/paper_readings.json`` and
``paper_readings.png``. Default size: T = 10⁴, 3 seeds, 30 s cap per run (about 25 minutes on 2 cores).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections import Counter

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import new_figure, print_table, save_figure, write_json

NAME = "paper_readings"
SIZES = {
    "quick": {"datasets": ["cadata"], "T": 300, "seeds": 1, "time_limit": 5.0, "scales": ["z", "100"],
              "widths": ["practical"], "rules": ["count_scaled"]},
    "default": {"datasets": ["abalone", "cadata"], "T": 10_000, "seeds": 3, "time_limit": 30.0,
                "scales": ["z", "1", "10", "100", "1000", "100000"], "widths": ["theory", "practical"],
                "rules": ["count_scaled", "per_pull"]},
    "full": {"datasets": ["abalone", "cadata"], "T": 10_000, "seeds": 10, "time_limit": 300.0,
             "scales": ["z", "1", "3", "10", "30", "100", "300", "1000", "100000"],
             "widths": ["theory", "practical", "1.0"], "rules": ["count_scaled", "per_pull"]},
}
#: What "the paper's figures" means in numbers (medians over seeds).
SUBLINEAR_GROWTH, SMALL_REGRET, LARGE_BATCH = 1.5, 0.2, 2000


def rewards_at(dataset: str, scale: str, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(arms, rewards)``: z-scored arms; rewards z-scored (``scale="z"``, arms' dtype) or float64 raw targets ×
    ``float(scale)``."""
    from torchbkb.datasets import load

    arms, z = load(dataset, dtype=dtype, device=device)
    if scale == "z":
        return arms, z
    _, raw = load(dataset, dtype=torch.float64, device=device, standardize_rewards=False)
    return arms, raw * float(scale)


def width_of(name: str):
    """``"theory"``/``"practical"`` as they are, anything else a constant RLS-scale width."""
    return name if name in ("theory", "practical") else float(name)


def run_one(arms, rewards, width: str, rule: str, T: int, seed: int, time_limit: float) -> dict:
    """One BBKB run at the paper's settings under one reading."""
    import torchbkb

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchbkb.TheoryWarning)  # q̄ = 2 is below the theorem's: the point of the study
        bandit = torchbkb.BBKB(arms, torchbkb.GaussianKernel.from_width(5.0), noise=0.2, q_bar=2.0,
                               beta=width_of(width),
                               F=20.0, delta=1.0 / T, batch_bound=2.0, inclusion=rule, seed=seed)
    t0 = time.perf_counter()
    hist = torchbkb.run(bandit, rewards, budget=T, progress=False, time_limit=time_limit)
    wall = time.perf_counter() - t0
    n = len(hist)
    cum = hist.cumulative_regret
    sizes = Counter(hist.batch)
    return {
        "seed": seed, "t": n, "capped": n < T, "time": wall,
        "normalized_regret": hist.summary()["normalized_regret"],
        "growth": cum[-1] / cum[n // 2 - 1] if n >= 2 and cum[n // 2 - 1] > 0 else float("nan"),
        "largest_batch": max(sizes.values()), "batches": len(sizes), "dictionary_size": hist.dictionary_size[-1],
        "regret_curve": [cum[i - 1] for i in (n // 4, n // 2, 3 * n // 4, n) if i >= 1],
    }


def summarize(runs: list[dict]) -> dict:
    """Medians over seeds, and whether the reading shows the paper's figures."""
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("normalized_regret", "growth", "largest_batch", "batches", "dictionary_size", "t", "time")}
    med["capped_runs"] = sum(r["capped"] for r in runs)
    med["sublinear"] = (med["growth"] <= SUBLINEAR_GROWTH and med["normalized_regret"] <= SMALL_REGRET
                        and not med["capped_runs"])
    med["large_batches"] = med["largest_batch"] >= LARGE_BATCH
    med["shows_paper_figures"] = med["sublinear"] and med["large_batches"]
    return med


def study(cfg: dict, dtype, device) -> dict:
    results: dict[str, list[dict]] = {}
    for ds in cfg["datasets"]:
        for scale in cfg["scales"]:
            arms, rewards = rewards_at(ds, scale, dtype, device)
            for width in cfg["widths"]:
                for rule in cfg["rules"]:
                    runs = [run_one(arms, rewards, width, rule, cfg["T"], s, cfg["time_limit"])
                            for s in range(cfg["seeds"])]
                    s = summarize(runs)
                    results.setdefault(ds,
                            []).append({"scale": scale, "width": width, "rule": rule, "summary": s, "runs": runs})
                    print(f"  {ds} scale={scale} width={width} rule={rule}: R/R_unif {s['normalized_regret']:.4f}, "
                          f"growth {s['growth']:.2f}, "
                          f"largest batch {s['largest_batch']}, t {s['t']}, {s['time']:.1f} s", flush=True)
    return results


def plot(results: dict, cfg: dict, out_dir):
    """Per data set: median R_T/R_unif and median largest batch against the reward scale, a line per (width, rule)."""
    fig, axes = new_figure(ncols=len(results), nrows=2, width=4.2, height=3.0)
    scales = cfg["scales"]
    for col, (ds, rows) in enumerate(results.items()):
        for width in cfg["widths"]:
            for rule in cfg["rules"]:
                sel = {r["scale"]: r["summary"] for r in rows if r["width"] == width and r["rule"] == rule}
                x = list(range(len(scales)))
                style = "-" if rule == "count_scaled" else "--"
                axes[0][col].plot(x, [sel[s]["normalized_regret"] for s in scales], style, marker="o",
                                  label=f"{width}, {rule}")
                axes[1][col].plot(x, [sel[s]["largest_batch"] for s in scales], style, marker="o")
        for ax in axes[:, col]:
            ax.set_xticks(range(len(scales)), [f"×{s}" if s != "z" else "z" for s in scales], fontsize=7)
        axes[0][col].set_title(f"{ds}, BBKB, T = {cfg['T']} (medians of {cfg['seeds']})")
        axes[1][col].axhline(LARGE_BATCH, color="gray", lw=0.8, ls=":")
        axes[1][col].set_yscale("log")
        axes[1][col].set_xlabel("rewards: z-scored or raw × factor")
    axes[0][0].set_ylabel("R_T / R_unif")
    axes[1][0].set_ylabel("largest batch")
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, out_dir, NAME)


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", default=None, help="comma-separated: abalone, cadata")
    p.add_argument("--scales", default=None, help="comma-separated reward scales: z or a factor on the raw targets")
    p.add_argument("--widths", default=None, help="comma-separated: theory, practical, or constants")
    p.add_argument("--rules", default=None, help="comma-separated inclusion rules: count_scaled, per_pull")
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--T", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None, help="wall-time cap of every run [s]")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    for key in ("datasets", "scales", "widths", "rules"):
        if getattr(args, key):
            cfg[key] = getattr(args, key).split(",")
    for key, val in (("seeds", args.seeds), ("T", args.T), ("time_limit", args.time_limit)):
        if val is not None:
            cfg[key] = val
    device, dtype = setup(args, default_threads=1)
    t0 = time.perf_counter()
    results = study(cfg, dtype, device)
    rows = [{"data": ds, "rewards": r["scale"], "width": r["width"], "rule": r["rule"],
             "R_T/R_unif": r["summary"]["normalized_regret"], "R_T/R_T/2": r["summary"]["growth"],
             "largest batch": r["summary"]["largest_batch"], "batches": r["summary"]["batches"],
             "m": r["summary"]["dictionary_size"],
             "t": r["summary"]["t"], "time [s]": r["summary"]["time"],
             "paper's figures": "yes" if r["summary"]["shows_paper_figures"] else ""}
            for ds, res in results.items() for r in res]
    print_table(rows, list(rows[0]),
            title=f"001 Sec. 4 readings: BBKB, σ²=5, λ=0.2, q̄=2, F=20, δ=1/T, C̃=2 (medians of {cfg['seeds']} seeds)")
    png = plot(results, cfg, args.out)
    path = write_json(args.out, NAME,
                      {"size": size_of(args), "config": cfg, "results": results, "table": rows, "plot": str(png),
                                       "total_time": time.perf_counter() - t0}, device=device)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
