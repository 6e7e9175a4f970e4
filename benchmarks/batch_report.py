"""The report of :mod:`benchmarks.batch`: its summary, table and figure, from the runs' result dictionaries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot", "regret_at", "summarize", "table", "time_at_T"]


def time_at_T(r: dict) -> tuple[float, str]:
    """A run's seconds at T: measured, extrapolated from its curve, or NaN."""
    if r["complete"]:
        return r["wall_s"], "measured"
    if "extrapolated" in r:
        return r["extrapolated"]["time_at_T_s"], "extrapolated"
    return float("nan"), "n/a"


def regret_at(r: dict, t: int) -> float:
    """A run's normalized regret at evaluation ``t`` (its curve's last point at or before ``t``)."""
    ts = r["curve"]["t"]
    j = int(np.searchsorted(ts, t, side="right")) - 1
    return r["curve"]["normalized_regret"][max(j, 0)]


def summarize(results: list[dict], T: int) -> dict:
    """The headline numbers: BBKB's median time and regret, against GP-UCB at T and BBKB scoring every arm."""
    by = {}
    for r in results:
        by.setdefault((r["method"], r["beta"]), []).append(r)
    bbkb = by[("BBKB", "constant")]
    bbkb_time = float(np.median([r["wall_s"] for r in bbkb]))
    bbkb_cpu = float(np.median([r["cpu_s"] for r in bbkb]))
    bbkb_regret = float(np.median([r["normalized_regret"] for r in bbkb]))
    s = {
        "bbkb_constant_median_wall_s": bbkb_time,
        "bbkb_constant_median_cpu_s": bbkb_cpu,
        "bbkb_constant_median_normalized_regret": bbkb_regret,
        "target_under_20s": bbkb_time < 20.0,
    }
    gps = by.get(("GP-UCB", "constant"), [])
    if gps:
        at_T = [time_at_T(g) for g in gps]
        t_gp = float(np.median([t for t, _ in at_T]))
        s["gpucb_constant_time_at_T_s"] = t_gp
        s["gpucb_constant_time_at_T_is"] = "extrapolated" if any(h == "extrapolated" for _, h in at_T) else "measured"
        s["speedup_vs_gpucb_at_T"] = t_gp / bbkb_time
        # regrets compared at the same t (the shortest GP-UCB run) over the same seeds
        t_cmp = min(g["t_reached"] for g in gps)
        seeds_gp = {g["seed"] for g in gps}
        gp_at = float(np.median([regret_at(g, t_cmp) for g in gps]))
        bb_at = float(np.median([regret_at(r, t_cmp) for r in bbkb if r["seed"] in seeds_gp]))
        s["regret_comparison"] = {
            "t": t_cmp,
            "seeds": sorted(seeds_gp),
            "gpucb_median_normalized_regret": gp_at,
            "bbkb_median_normalized_regret": bb_at,
            "per_seed": {g["seed"]: {"gpucb": regret_at(g, t_cmp), "bbkb": regret_at(r, t_cmp)} for g in gps
                         for r in bbkb if r["seed"] == g["seed"]},
            "ratio_bbkb_over_gpucb": bb_at / gp_at if gp_at > 0 else float("inf"),
        }
    full = {r["seed"]: r for r in by.get(("BBKB-all-arms", "constant"), [])}
    if full:  # the pruning against scoring every arm, same seeds, same run
        pairs = [(full[r["seed"]], r) for r in bbkb if r["seed"] in full]
        s["pruning"] = {
            "speedup_median": float(np.median([f["wall_s"] / r["wall_s"] for f, r in pairs])),
            "per_seed": {r["seed"]: {"all_arms_wall_s": f["wall_s"], "pruned_wall_s": r["wall_s"],
                                     "arms_scored_fraction": r.get("arms_scored_fraction")} for f, r in pairs},
            "same_regret_and_batches": all(f["normalized_regret"] == r["normalized_regret"]
                                           and f["batches"] == r["batches"] for f, r in pairs),
        }
    return s


def table(results: list[dict], T: int) -> str:
    """One Markdown row per run."""
    rows = [f"| method | β | T reached | time at T = {T:,} (s) | CPU (s) | R_t/R_unif | batches (mean / max size) | "
            f"dictionary | split |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        t, how = time_at_T(r)
        t_txt = f"{t:,.1f}" + (" (extrapolated)" if how == "extrapolated" else "")
        split = ""
        if "time_resparsify_s" in r:
            split = (f"resparsify {r['time_resparsify_s']:.2f} s, in-batch {r['time_in_batch_s']:.2f} s, arms scored "
                     f"{100 * r.get('arms_scored_fraction', 1.0):.0f} %")
        elif "time_update_s" in r:
            split = f"in-batch {r['time_in_batch_s']:.1f} s, updates {r['time_update_s']:.1f} s"
        dsz = r["dictionary_size"] if r["dictionary_size"] is not None else "—"
        rows.append(
            f"| {r['method']} (seed {r['seed']}) | {r['beta']} (α = {r['alpha']:.3g}) | {r['t_reached']:,} | {t_txt} | "
            f"{r['cpu_s']:.1f} | "
            f"{r['normalized_regret']:.4f} | {r['batches']:,} ({r['mean_batch']:.1f} / {r['max_batch']:,}) | {dsz} | "
            f"{split} |"
        )
    return "\n".join(rows)


def plot(results: list[dict], path: Path, T: int, title: str) -> None:
    """The four panels (regret, time, batch sizes, dictionary size) over t, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(13, 9))
    colors = {"BBKB": "C0", "GP-BUCB": "C1", "BKB": "C2", "GP-UCB": "C3"}
    for r in results:
        if r["method"] == "BBKB-all-arms":  # the same choices as BBKB: only its time is of interest
            ax[0, 1].plot(r["curve"]["t"], r["curve"]["time_s"], ":", color="0.4",
                          label=f"BBKB, every arm scored (seed {r['seed']})")
            continue
        c = colors[r["method"]]
        ls = "-" if r["beta"] == "constant" else "--"
        lab = f"{r['method']} ({r['beta']} β)" + ("" if r["complete"] else f", capped at t={r['t_reached']:,}")
        if r["method"] == "BBKB" and r["beta"] == "constant":
            lab = f"BBKB (constant β, seed {r['seed']})"
            c = ["C0", "C4", "C9", "C6", "C8"][r["seed"] % 5]
        cu = r["curve"]
        ax[0, 0].plot(cu["t"], cu["normalized_regret"], ls, color=c, label=lab)
        ax[0, 1].plot(cu["t"], cu["time_s"], ls, color=c, label=lab)
        if "extrapolated" in r:
            ax[0, 1].plot([r["t_reached"], T], [cu["time_s"][-1], r["extrapolated"]["time_at_T_s"]], ":", color=c,
                          alpha=0.7)
            ax[0, 1].plot([T], [r["extrapolated"]["time_at_T_s"]], "x", color=c)
        if r["method"] in ("BBKB", "GP-BUCB"):
            ax[1, 0].plot(r["batch_curve"]["t_end"], r["batch_curve"]["size"], ls, color=c, label=lab, marker=".", ms=3)
        if r["method"] in ("BBKB", "BKB"):
            ax[1, 1].plot(cu["t"], cu["dictionary_size"], ls, color=c, label=lab)
    ax[0, 0].set(xscale="log", yscale="log", xlabel="t", ylabel="R_t / R_unif(t)", title="normalized cumulative regret")
    ax[0, 1].set(xscale="log", yscale="log", xlabel="t", ylabel="wall time (s)", title="time (x: extrapolated to T)")
    ax[1, 0].set(yscale="log", xlabel="t (end of batch)", ylabel="batch size", title="batch size over t")
    ax[1, 1].set(xlabel="t", ylabel="|S_t|", title="dictionary size")
    for a in ax.flat:
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
