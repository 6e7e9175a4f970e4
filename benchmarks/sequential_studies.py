"""The regret studies on the anchor problem (:func:`torchbkb.datasets.anchor_problem`), beside
:mod:`benchmarks.sequential`'s timings: does BKB keep exact GP-UCB's regret, and at which q̄ and width?

Part 1 (:func:`regret_study`). On the anchor problem over 20 seeds (a seed fixes the first arm and the reward
noise), exact GP-UCB and BKB with the constant width β = 0.5 and q̄ ∈ {2, 4, 8, 16, 10⁶} (10⁶: every pulled arm
stays in the dictionary, where BKB is exact GP-UCB), and both with their theorems' widths; medians over seeds,
their ratio with a 90 % paired-bootstrap interval, on how many seeds BKB pulled exactly GP-UCB's arms, and how
often a run leaves the arm it exploits. ``--skip-regret-study`` skips it.

Part 2 (:func:`width_scan`). Exact GP-UCB and BKB with q̄ = 2 and 4 for each constant width in
:data:`WIDTH_SCAN` over 10 seeds: median regrets, their ratio with a 90 % paired-bootstrap interval, seeds on
which BKB is higher. ``--skip-width-scan`` skips it.

Sizes: ``--quick`` T = 60, 2 seeds; default T = 1,000, 20 seeds (width scan 10); ``--full`` 50 (20). BKB uses the
inclusion rule of :class:`torchbkb.BKB`'s default. Writes ``sequential_studies.json`` and
``sequential_regret.png``; run with ``python -m benchmarks.sequential_studies``.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.registry import BanditSettings, make_bandit
from benchmarks.report import bootstrap_ratio, new_figure, print_table, save_figure, strip_plot, write_json
from benchmarks.sequential import BETA
from torchbkb.datasets import anchor_problem

NAME = "sequential_studies"
SIZES = {
    "quick": {"anchor_T": 60, "study_seeds": 2, "width_seeds": 2},
    "default": {"anchor_T": 1000, "study_seeds": 20, "width_seeds": 10},
    "full": {"anchor_T": 1000, "study_seeds": 50, "width_seeds": 20},
}


STUDY_Q = (2.0, 4.0, 8.0, 16.0, 1e6)  # q̄ of the regret study's BKB runs; 1e6: every pulled arm stays
EXPLORE_AFTER = 50  # the study's exploration statistic counts the steps after this one


def off_mode_fraction(index: list[int], after: int = EXPLORE_AFTER) -> float:
    """Fraction of the steps ``t > after`` whose arm is not the most-pulled arm of the steps before it
    (the arm a run exploits; a tie keeps the arm that reached the count first)."""
    counts: dict[int, int] = {}
    mode, off = None, 0
    for t, a in enumerate(index):
        if t >= after and a != mode:
            off += 1
        counts[a] = counts.get(a, 0) + 1
        if mode is None or counts[a] > counts[mode]:
            mode = a
    return off / max(len(index) - after, 1)


def regret_study(cfg: dict, device, dtype, seed: int) -> dict:
    """"the same regret as the exact method" on the anchor problem, over ``cfg["study_seeds"]`` seeds.

    Constant width: exact GP-UCB, and BKB with q̄ ∈ :data:`STUDY_Q` (q̄ = 2 is the anchor's; q̄ = 10⁶ keeps
    every pulled arm in the dictionary, where BKB is exact GP-UCB); theory widths: GP-UCB and BKB (q̄ = 2).
    A seed fixes the first arm and the reward noise, so the runs of one seed differ only in the method.
    Per run: ``R_T/R_unif``, wall time, dictionary, whether it pulled exactly the reference's arms, and
    :func:`off_mode_fraction` (how often it leaves the arm it exploits).
    """
    from dataclasses import replace

    import torchbkb

    prob = anchor_problem(dtype=dtype, device=device)
    T, seeds = cfg["anchor_T"], list(range(seed, seed + cfg["study_seeds"]))
    base = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / T, beta=BETA)
    configs = [("GP-UCB", "GPUCB", base, "GP-UCB")]
    configs += [(f"BKB q̄={q:g}" if q < 1e4 else f"BKB q̄=1e{round(math.log10(q))}", "BKB", replace(base, q_bar=q),
                 "GP-UCB") for q in STUDY_Q]
    configs += [("GP-UCB theory", "GPUCB-theory", base, "GP-UCB theory"),
                ("BKB theory q̄=2", "BKB-theory", base, "GP-UCB theory")]
    runs: dict[str, list[dict]] = {label: [] for label, *_ in configs}
    arms_of: dict[tuple[str, int], list[int]] = {}
    for s in seeds:
        for label, alg, settings, ref in configs:
            bandit = make_bandit(alg, prob.arms, settings, s)
            t0 = time.perf_counter()
            hist = torchbkb.run(bandit, prob.objective(s), budget=T, progress=False, values=prob.values)
            wall = time.perf_counter() - t0
            arms_of[label, s] = hist.index
            runs[label].append({
                "seed": s, "normalized_regret": hist.normalized_regret[-1], "time": wall,
                "dictionary_size": hist.dictionary_size[-1], "distinct_arms": len(set(hist.index)),
                "off_mode_fraction": off_mode_fraction(hist.index),
                "same_arms_as_reference": hist.index == arms_of[ref, s],
            })
        print(f"  regret study seed {s}: "
              + ", ".join(f"{label} {runs[label][-1]['normalized_regret']:.4f}" for label, *_ in configs), flush=True)
    summary = {}
    for label, _, settings, ref in configs:
        x = np.array([r["normalized_regret"] for r in runs[label]])
        g = np.array([r["normalized_regret"] for r in runs[ref]])
        summary[label] = {
            "reference": ref, "q_bar": settings.q_bar if label.startswith("BKB") else None,
            "median": float(np.median(x)), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "ratio_of_medians": float(np.median(x) / np.median(g)),
            "ratio_of_medians_90ci": bootstrap_ratio(x, g, np.median),
            "ratio_of_means": float(x.mean() / g.mean()), "ratio_of_means_90ci": bootstrap_ratio(x, g, np.mean),
            "seeds_higher_than_reference": int((x > g).sum()), "seeds_lower_than_reference": int((x < g).sum()),
            "seeds_same_arms_as_reference": sum(r["same_arms_as_reference"] for r in runs[label]),
            "median_time": statistics.median(r["time"] for r in runs[label]),
            "median_dictionary_size": statistics.median(r["dictionary_size"] for r in runs[label]),
            "median_distinct_arms": statistics.median(r["distinct_arms"] for r in runs[label]),
            "median_off_mode_fraction": statistics.median(r["off_mode_fraction"] for r in runs[label]),
        }
    return {"T": T, "seeds": seeds, "beta": BETA, "explore_after": EXPLORE_AFTER, "summary": summary, "runs": runs}


WIDTH_SCAN = (0.1, 0.2, 0.3, 0.5, 1.0)  # constant widths (RLS scale) of the width scan; 0.5 is the anchor's


def width_scan(cfg: dict, device, dtype, seed: int) -> dict:
    """exact GP-UCB and BKB (q̄ = 2 and 4) for each width of :data:`WIDTH_SCAN` on ``cfg["width_seeds"]`` seeds
    of the anchor problem; per width the median ``R_T/R_unif`` and, for BKB, the ratio of medians to GP-UCB's
    with a 90 % paired-bootstrap interval and the seeds on which BKB's regret is higher."""
    from dataclasses import replace

    import torchbkb

    prob = anchor_problem(dtype=dtype, device=device)
    T, seeds = cfg["anchor_T"], list(range(seed, seed + cfg["width_seeds"]))
    rows, runs = [], {}
    for beta in WIDTH_SCAN:
        base = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / T, beta=beta)
        res = {}
        for label, alg, settings in (("GP-UCB", "GPUCB", base), ("BKB q̄=2", "BKB", base),
                                     ("BKB q̄=4", "BKB", replace(base, q_bar=4.0))):
            res[label] = [torchbkb.run(make_bandit(alg, prob.arms, settings, s), prob.objective(s), budget=T,
                                       progress=False, values=prob.values).normalized_regret[-1] for s in seeds]
        runs[str(beta)] = res
        g = np.array(res["GP-UCB"])
        row = {"beta": beta, "gpucb_median": float(np.median(g))}
        for label in ("BKB q̄=2", "BKB q̄=4"):
            x = np.array(res[label])
            row[label] = {"median": float(np.median(x)), "ratio_of_medians": float(np.median(x) / np.median(g)),
                          "ratio_of_medians_90ci": bootstrap_ratio(x, g, np.median), "seeds_higher": int((x > g).sum())}
        rows.append(row)
        print(f"  width β = {beta}: GP-UCB {row['gpucb_median']:.4f}, " + ", ".join(
            f"{k} {row[k]['median']:.4f} ({row[k]['ratio_of_medians']:.2f}x, higher on "
            f"{row[k]['seeds_higher']}/{len(seeds)})" for k in ("BKB q̄=2", "BKB q̄=4")), flush=True)
    return {"T": T, "seeds": seeds, "widths": list(WIDTH_SCAN), "rows": rows, "runs": runs}




def plot_regret_study(study: dict, out_dir) -> str:
    fig, axes = new_figure(ncols=2, width=5.6)
    ax = axes[0][0]
    labels = list(study["summary"])
    strip_plot(ax, labels, [[r["normalized_regret"] for r in study["runs"][label]] for label in labels], rotation=35,
               fontsize=7)
    ax.set_ylabel("R_T / R_unif (one point per seed; bar: median)")
    ax = axes[0][1]
    bkb = [(v["q_bar"], v) for k, v in study["summary"].items() if k.startswith("BKB q")]
    qs = [q for q, _ in bkb]
    mid = [v["ratio_of_medians"] for _, v in bkb]
    err = [[m - v["ratio_of_medians_90ci"][0] for m, (_, v) in zip(mid, bkb)],
           [v["ratio_of_medians_90ci"][1] - m for m, (_, v) in zip(mid, bkb)]]
    ax.errorbar(qs, mid, yerr=err, marker="o", capsize=3, label="BKB / GP-UCB, median R_T (90 % bootstrap)")
    ax.plot(qs,
            [v["median_off_mode_fraction"] / max(study["summary"]["GP-UCB"]["median_off_mode_fraction"], 1e-12) for _,
             v in bkb], marker="s", ls="--",
            label=f"BKB / GP-UCB, steps off the most-pulled arm (t > {study['explore_after']})")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("q̄ (constant width)")
    ax.set_ylabel("ratio to exact GP-UCB")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"anchor problem, T = {study['T']:,}, {len(study['seeds'])} seeds", fontsize=9)
    return str(save_figure(fig, out_dir, "sequential_regret"))



def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--skip-regret-study", action="store_true")
    p.add_argument("--skip-width-scan", action="store_true")
    p.add_argument("--study-seeds", type=int, default=None,
                   help="seeds of the regret study (default: 2 quick, 20, 50 full)")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    if args.study_seeds is not None:
        cfg["study_seeds"] = args.study_seeds
    device, dtype = setup(args)
    t0 = time.perf_counter()
    payload = {"size": size_of(args), "config": cfg, "beta": BETA}
    if not args.skip_regret_study:
        study = regret_study(cfg, device, dtype, args.seed)
        rows = [
            {
                "method": label,
                "vs": v["reference"],
                "median R_T/R_unif": v["median"],
                "mean": v["mean"],
                "ratio of medians": v["ratio_of_medians"],
                "90% CI": "{:.2f}-{:.2f}".format(*v["ratio_of_medians_90ci"]),
                "ratio of means": v["ratio_of_means"],
                "seeds higher/lower": f"{v['seeds_higher_than_reference']}/{v['seeds_lower_than_reference']}",
                "same arms": f"{v['seeds_same_arms_as_reference']}/{len(study['seeds'])}",
                "off most-pulled": v["median_off_mode_fraction"],
                "distinct arms": v["median_distinct_arms"],
                "dict. size": v["median_dictionary_size"] if label.startswith("BKB") else None,
                "time [s]": v["median_time"],
            }
            for label, v in study["summary"].items()
        ]
        print_table(rows, list(rows[0]),
                    f"regret study: anchor problem, T={study['T']}, {len(study['seeds'])} seeds (medians over seeds; "
                    f"{device}, {args.dtype})")
        payload["regret_study"] = study
        payload["regret_study_table"] = rows
        payload["regret_study_plot"] = plot_regret_study(study, args.out)
    if not args.skip_width_scan:
        ws = width_scan(cfg, device, dtype, args.seed)
        rows = [
            {"β (RLS)": r["beta"], "GP-UCB median": r["gpucb_median"]}
            | {f"{k} median": r[k]["median"] for k in ("BKB q̄=2", "BKB q̄=4")}
            | {f"{k} / GP-UCB": "{:.2f} "
                                "({:.2f}-{:.2f})".format(r[k]["ratio_of_medians"], *r[k]["ratio_of_medians_90ci"])
                                for k in ("BKB q̄=2", "BKB q̄=4")}
            | {f"{k} higher": f"{r[k]['seeds_higher']}/{len(ws['seeds'])}" for k in ("BKB q̄=2", "BKB q̄=4")}
            for r in ws["rows"]
        ]
        print_table(rows, list(rows[0]),
                    f"width scan: anchor problem, T={ws['T']}, {len(ws['seeds'])} seeds (medians over seeds)")
        payload["width_scan"] = ws
        payload["width_scan_table"] = rows
    payload["total_time"] = time.perf_counter() - t0
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
