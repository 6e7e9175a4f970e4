"""Running a registered bandit on an objective: the wall-time cap, regret curves, per-run summaries."""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from typing import Any

import torch

from benchmarks.registry import BanditSettings, make_bandit
from benchmarks.report import subsample_indices
from benchmarks.timing import sync

def run_bandit(
    name: str,
    arms: torch.Tensor,
    objective,
    values: torch.Tensor,
    settings: BanditSettings,
    T: int,
    seed: int,
    *,
    time_limit: float | None = None,
    progress: bool = True,
    curve_points: int = 400,
) -> dict[str, Any]:
    """Run one registered algorithm once; return its summary and subsampled curves.

    The returned curves are sampled at ``t = steps[i]`` (1-based): cumulative regret, normalized regret,
    wall time, algorithm time, batch size of the batch containing ``t``, dictionary size.
    """
    import torchbkb

    device = arms.device
    sync(device)
    t0 = time.perf_counter()
    bandit = make_bandit(name, arms, settings, seed)
    sync(device)
    setup = time.perf_counter() - t0
    hist = torchbkb.run(bandit, objective, budget=T, progress=progress, values=values, time_limit=time_limit)
    sync(device)
    n = len(hist)
    idx = subsample_indices(n, curve_points)
    per_batch = Counter(hist.batch)  # batch id -> evaluations in it
    cum, norm = hist.cumulative_regret, hist.normalized_regret
    s = hist.summary()
    capped_at = n if n < T else None
    return {
        "algorithm": name,
        "seed": seed,
        "T_requested": T,
        "T": n,
        "capped": capped_at is not None,
        "stopped": hist.meta.get("stopped"),
        "setup_time": setup,
        "time": s["time"] + setup,
        "algo_time": s["algo_time"],
        "regret": s["regret"],
        "normalized_regret": s["normalized_regret"],
        "batches": s["batches"],
        "dictionary_size": s["dictionary_size"],
        "curves": {
            "t": [i + 1 for i in idx],
            "cumulative_regret": [cum[i] for i in idx],
            "normalized_regret": [norm[i] for i in idx],
            "time": [hist.time[i] + setup for i in idx],
            "algo_time": [hist.algo_time[i] for i in idx],
            "batch_size": [per_batch[hist.batch[i]] for i in idx],
            "dictionary_size": [hist.dictionary_size[i] for i in idx],
        },
    }


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean/std/median over repetitions of one algorithm's runs."""

    def stats(key):
        vals = [r[key] for r in runs if r[key] is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
        if not vals:
            return float("nan"), float("nan")
        return statistics.fmean(vals), (statistics.pstdev(vals) if len(vals) > 1 else 0.0)

    out = {"algorithm": runs[0]["algorithm"], "repetitions": len(runs)}
    for key in ("time", "algo_time", "normalized_regret", "regret", "batches", "dictionary_size", "T"):
        out[key], out[key + "_std"] = stats(key)
    out["time_median"] = statistics.median(r["time"] for r in runs)
    out["time_min"] = min(r["time"] for r in runs)
    out["ms_per_step"] = 1e3 * out["time_median"] / max(statistics.median(r["T"] for r in runs), 1)
    out["capped"] = any(r["capped"] for r in runs)
    out["T_requested"] = runs[0]["T_requested"]
    return out
