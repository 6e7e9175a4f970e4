"""BBKB benchmark (paper 001, Sec. 4) on the California housing arm set, with GP-UCB, GP-BUCB and BKB.

Every row of the bundled California housing table is an arm (A = 20,640, d = 8, features standardized),
its reward is its target (MedHouseVal, noise-free), and regret is measured against the best row. The
paper's settings: Gaussian kernel of width σ² = 5 (``GaussianKernel.from_width(5.0)``), λ = 0.2,
q̄ = 2, F = 20, δ = 1/T, T = 10⁴; C̃ = 2 (the paper does not state its C̃).

Widths:

* constant β: "2σ on the GP scale", i.e. UCB = μ + 2·σ_GP. With σ_GP = √λ·σ̃ (DESIGN §3) this is the
  RLS-scale multiplier α̃ = 2·√λ ≈ 0.894, given as ``beta=0.894`` to every algorithm (for BBKB and
  GP-BUCB a float ``beta`` is the in-batch multiplier itself, not multiplied by C̃);
* theory β: BBKB α̃ = C̃·β̃ (001 Thm 2), GP-BUCB α = C̃·β (exact log-det), BKB β̃ of 000 Thm 2,
  GP-UCB the self-normalized β (``torchbkb.bandits.confidence``).

BBKB runs to T (three seeds for the constant β; exact GP-UCB with the constant β runs the same seeds, so that
regrets are compared at equal t over equal seeds). The exact methods (and BKB, and BBKB with the theory β)
are capped by wall time with ``run(..., time_limit=...)``; their time at T is **extrapolated** and
labelled so: two power laws are fitted on the second half of the run -- ``time(t) = a·t^p`` with a free
``p``, and a per-step cost ``c·t^g`` with ``g`` from the complexity (1 for the exact methods' ``O(A·p)``
steps, taking the distinct pulled arms ``p`` to grow like t as they do with the theory widths, 0 for BKB's
``O(A·m²)`` steps) integrated to T -- and the smaller one is reported (conservative for BBKB's speedups;
both are in the JSON). The cap is checked between batches, so a batch method can overrun it by one batch.
With the constant width the exact methods merge their repeated pulls into counts and reach T in 10-20 s,
uncapped. A free fit is fragile on a shared machine: one run measured p = 3.2 for GP-UCB, whose per-step
cost is at most linear in t. Times are wall-clock seconds of the whole ``torchbkb.run`` (selection, updates, evaluation
of the tensor objective); the process CPU time is recorded too, since this machine may be shared.

Runs with one torch thread by default (``--threads``): most operations are small, and on a shared VM an
OpenMP thread that gets descheduled stalls every parallel region.

The authors' code is not run here: it is compared in one process, interleaved, one thread each, by the harness
in ``../shared/peers/`` (docs/performance.md, "Against the authors' code").

Usage (from the repository root)::

    python -m benchmarks.batch             # ~10 minutes on 2 cores
    python -m benchmarks.batch --quick     # smoke test, < 60 s
    python -m benchmarks.batch --device cuda

Writes ``results/batch.json`` and ``results/batch.png`` (``--out`` changes the folder). The studies on the
same settings have their own modules: :mod:`benchmarks.batch_studies` (seed study, q̄ and C̃ scans) and
:mod:`benchmarks.float32_check` (BBKB on float32 arms against the float64 posterior).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

import torchbkb
import torchbkb.datasets
from torchbkb import BBKB, GPBUCB

from benchmarks.batch_report import plot, summarize, table, time_at_T
from benchmarks.registry import BanditSettings, make_bandit
from benchmarks.report import git_commit
from benchmarks.timing import sync

ROOT = Path(__file__).resolve().parents[1]
WIDTH, LAM, Q_BAR, F_NORM, C_TILDE, B_GP = 5.0, 0.2, 2.0, 20.0, 2.0, 2.0
ALPHA_CONST = B_GP * math.sqrt(LAM)  # μ + 2 σ_GP = μ + 2√λ σ̃
GROWTH = {  # exponent of the per-step cost in t (see run_one's extrapolation)
    "GP-UCB": {"constant": 1, "theory": 1},
    "GP-BUCB": {"constant": 1, "theory": 1},
    "BKB": {"constant": 0, "theory": 0},
    "BBKB": {"constant": 0, "theory": 0},
    "BBKB-all-arms": {"constant": 0, "theory": 0},
}


def load_cadata(dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Arms `(20640, 8)` (standardized features) and rewards `(20640,)` (raw MedHouseVal, float64)."""
    arms, _ = torchbkb.datasets.load("cadata", dtype=dtype, device=device)
    _, f = torchbkb.datasets.load("cadata", dtype=torch.float64, device=device, standardize_rewards=False)
    return arms, f


def build(method: str, beta: str, arms: torch.Tensor, T: int, seed: int, batch_bound: float = C_TILDE,
          q_bar: float = Q_BAR):
    """``method`` (BBKB, BBKB-all-arms: every arm scored, GP-BUCB, BKB, GP-UCB) from the registry at this study's
    settings, with the constant width ``ALPHA_CONST`` or ``beta="theory"``; GP-BUCB always stops at ``C̃``."""
    name = {"GP-BUCB": "GPBUCB", "GP-UCB": "GPUCB"}.get(method, method) + ("-theory" if beta == "theory" else "")
    bound = C_TILDE if method == "GP-BUCB" else batch_bound
    settings = BanditSettings(width=WIDTH, lam=LAM, q_bar=q_bar, F=F_NORM, delta=1.0 / T, beta=ALPHA_CONST,
                              batch_bound=bound)
    return make_bandit(name, arms, settings, seed)


def _curve_points(n: int, k: int = 250) -> list[int]:
    """~k indices in [0, n), log-spaced at the start and linear after (for compact curves)."""
    if n == 0:
        return []
    pts = set(np.unique(np.geomspace(1, n, k // 2).astype(int) - 1).tolist())
    pts |= set(np.linspace(0, n - 1, k // 2).astype(int).tolist())
    return sorted(pts)


def power_law(ts: list[float], times: list[float]) -> tuple[float, float] | None:
    """Least-squares ``log time = log a + p log t`` on the second half of the run."""
    pairs = [(t, s) for t, s in zip(ts, times) if s > 0 and t >= ts[-1] / 2]
    if len(pairs) < 5:
        return None
    lt, ls = np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs])
    p, loga = np.polyfit(lt, ls, 1)
    return float(math.exp(loga)), float(p)


def run_one(method: str, beta: str, arms, f, T: int, cap: float | None, seed: int, device: str,
            batch_bound: float = C_TILDE, q_bar: float = Q_BAR, compiled_picks: bool = False) -> dict:
    bandit = build(method, beta, arms, T, seed, batch_bound, q_bar)
    if compiled_picks and getattr(bandit, "pick_graphs", None) is not None:  # compiled once per process (warm-up)
        from torchbkb.bandits.pick_graph import PickGraphs

        bandit.pick_graphs = PickGraphs(compiled=True)
    sync(device)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    hist = torchbkb.run(bandit, f, T, progress=False, time_limit=cap)
    sync(device)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = len(hist)
    norm = hist.normalized_regret
    idx = _curve_points(n)
    batch_ends = np.cumsum(hist.batch_sizes).tolist()
    out = {
        "method": method,
        "beta": beta,
        "seed": seed,
        "alpha": float(bandit.beta),
        "T_target": T,
        "t_reached": n,
        "complete": n >= T,
        "time_limit_s": cap,
        "wall_s": wall,
        "cpu_s": cpu,
        "algo_s": hist.algo_time[-1] if n else 0.0,
        "normalized_regret": norm[-1] if n else float("nan"),
        "batches": len(hist.batch_sizes),
        "mean_batch": float(np.mean(hist.batch_sizes)) if n else 0.0,
        "max_batch": int(max(hist.batch_sizes)) if n else 0,
        "dictionary_size": bandit.dictionary_size,
        "curve": {
            "t": [i + 1 for i in idx],
            "normalized_regret": [norm[i] for i in idx],
            "time_s": [hist.time[i] for i in idx],
            "dictionary_size": [hist.dictionary_size[i] for i in idx],
        },
        "batch_curve": {"t_end": batch_ends, "size": list(hist.batch_sizes)},
    }
    if isinstance(bandit, BBKB):
        out.update(
            time_in_batch_s=bandit.time_in_batch,
            time_resparsify_s=bandit.time_resparsify,
            num_resparsifications=bandit.num_resparsifications,
            embeddings_computed=bandit.embeddings_computed,
            ucb_evaluations=bandit.ucb_evaluations,
            ucb_evaluations_per_pick=bandit.ucb_evaluations / max(sum(bandit.batch_sizes), 1),
            arms_scored_fraction=bandit.arms_scored_total / max(bandit.num_resparsifications * bandit.num_arms, 1),
        )
    if isinstance(bandit, GPBUCB):
        out.update(time_in_batch_s=bandit.time_in_batch, time_update_s=bandit.time_update)
    if not out["complete"] and n >= 10:
        ext = {}
        fit = power_law([float(i + 1) for i in range(n)], hist.time)
        if fit is not None:
            a, p = fit
            ext["free_power_law"] = {"time_at_T_s": a * T**p, "a": a, "power": p,
                                     "fit": "time(t) = a t^p, least squares in log-log on the second half of the run"}
        g = GROWTH[method][beta]
        half = n // 2
        delta = hist.time[-1] - hist.time[half - 1]
        c = delta * (g + 1) / (n ** (g + 1) - half ** (g + 1))  # per-step cost c t^g fitted on the second half
        ext["known_exponent"] = {
            "time_at_T_s": hist.time[-1] + c * (T ** (g + 1) - n ** (g + 1)) / (g + 1),
            "per_step_exponent": g,
            "fit": "per-step cost c t^g with g from the complexity (1 for the exact methods' O(A t) steps, 0 for "
            "BKB/BBKB's "
            "O(A m^2) steps at the final m), c fitted on the second half of the run, integrated from t to T",
        }
        best = min(v["time_at_T_s"] for v in ext.values())  # the smaller one: conservative for BBKB's speedups
        out["extrapolated"] = {"time_at_T_s": best, **ext}
    return out


def prepare(argv: list[str] | None = None) -> dict:
    """Parse the options (the studies' too), load Cadata, describe the machine: what a run and a study start from."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test (< 60 s): T = 2,000, short caps, one seed")
    ap.add_argument("--T", type=int, default=None, help="horizon (default 10,000; 2,000 with --quick)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"],
                    help="dtype of the arms (the m×m factorizations are float64 anyway; float32 kernel rows lose the "
                    "small "
                         "variances to rounding once K_S is ill-conditioned: python -m benchmarks.float32_check)")
    ap.add_argument("--seeds", type=int, default=None, help="BBKB (constant β) seeds (default 3; 1 with --quick)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: most operations are small, and on a shared 2-core VM a "
                    "second "
                         "OpenMP thread that gets descheduled makes every parallel region wait -- measured 8x slower)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated METHOD:BETA subset, e.g. BBKB:constant,GP-UCB:constant")
    ap.add_argument("--no-caps", action="store_true",
                    help="run every method to T (on a GPU the exact GP-UCB gets there)")
    ap.add_argument("--c-scan", default=None,
                    help="only run BBKB (constant β) for these comma-separated C̃ over the seeds, next to exact GP-UCB "
                    "at T "
                         "from results/cuda/batch.json if present; writes batch_c_scan.json")
    ap.add_argument("--q-scan", default=None,
                    help="only run BBKB (constant β, C̃ = 2) for these comma-separated q̄ over the seeds, next to "
                    "exact GP-UCB "
                         "as for --c-scan; writes batch_q_scan.json")
    ap.add_argument("--run-gpucb", action="store_true",
                    help="with --c-scan/--q-scan: run exact GP-UCB to T (uncapped; ~10 s per seed on this CPU since "
                    "repeated pulls "
                         "are merged into counts) for every seed without a reference in OUT/batch_gpucb_reference.json "
                         "and keep it "
                         "there (results/cuda is not used then)")
    ap.add_argument("--seed-study", type=int, default=None, metavar="N",
                    help="only run GP-UCB, BBKB, BKB and GP-BUCB (constant width) to T on seeds 0..N-1 and compare "
                    "their "
                         "regret as the paper does (mean and std over repetitions) and by the median; writes "
                         "batch_seeds.json/.png")
    ap.add_argument("--compiled-picks", action="store_true",
                    help="BBKB's replayed picks compiled (PickGraphs(compiled=True); a GPU's; compiled in the warm-up)")
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    T = args.T or (2000 if args.quick else 10_000)
    seeds = args.seeds or (1 if args.quick else 3)
    caps = (  # (method, β, wall-time cap in s; None = run to T)
        [("BBKB", "constant", None), ("BBKB-all-arms", "constant", None), ("BBKB", "theory", 8), ("BKB", "constant", 6),
         ("GP-UCB", "constant", 6),
         ("GP-BUCB", "constant", 6), ("BKB", "theory", 4), ("GP-UCB", "theory", 4), ("GP-BUCB", "theory", 4)]
        if args.quick
        else [("BBKB", "constant", None), ("BBKB-all-arms", "constant", None), ("BBKB", "theory", 100),
              ("BKB", "constant", 60), ("GP-UCB", "constant", 60),
              ("GP-BUCB", "constant", 60), ("BKB", "theory", 40), ("GP-UCB", "theory", 40), ("GP-BUCB", "theory", 40)]
    )
    if args.methods:
        want = {tuple(m.split(":")) for m in args.methods.split(",") if m}
        unknown = want - {(m, b) for m, b, _ in caps}
        if unknown:
            ap.error(f"--methods: expected METHOD:BETA from {[f'{m}:{b}' for m, b, _ in caps]}, got {sorted(unknown)}")
        caps = [c for c in caps if (c[0], c[1]) in want]
    if args.no_caps:
        caps = [(m, b, None) for m, b, _ in caps]
    dtype = getattr(torch, args.dtype)
    arms, f = load_cadata(dtype, args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": args.device,
        "dtype": args.dtype,
        "load_average_at_start": os.getloadavg(),
        "git_commit": git_commit(),
    }
    print(f"California housing: A = {arms.shape[0]}, d = {arms.shape[1]}, T = {T}, {args.dtype} on {args.device}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}", flush=True)
    start = time.perf_counter()
    return dict(args=args, arms=arms, f=f, T=T, seeds=seeds, caps=caps, machine=machine, out=out, start=start,
                dtype=dtype)


def main(argv: list[str] | None = None) -> None:
    ctx = prepare(argv)
    args, arms, f, T, seeds, caps, machine, out, start, dtype = (ctx[k]
            for k in ("args", "arms", "f", "T", "seeds", "caps", "machine", "out", "start", "dtype"))
    if args.seed_study or args.c_scan or args.q_scan:
        raise SystemExit("--seed-study, --c-scan, --q-scan: expected `python -m benchmarks.batch_studies` (the "
                         "studies' own module), got benchmarks.batch")
    results = []
    # warm-up, untimed: a process's first run pays one-time costs
    run_one("BBKB", "constant", arms, f, min(T, 500), None, 0, args.device, compiled_picks=args.compiled_picks)
    for method, beta, cap in caps:
        for seed in range(seeds
                          if (method, beta) in (("BBKB", "constant"), ("BBKB-all-arms", "constant"),
                                                ("GP-UCB", "constant")) else 1):
            r = run_one(method, beta, arms, f, T, cap, seed, args.device, compiled_picks=args.compiled_picks)
            results.append(r)
            t, how = time_at_T(r)
            print(f"  {method:8s} {beta:8s} seed {seed}: t = {r['t_reached']:6d}  wall {r['wall_s']:7.1f} s  cpu "
                  f"{r['cpu_s']:7.1f} s  "
                  f"time@T {t:9.1f} s ({how})  R/Runif {r['normalized_regret']:.4f}  batches {r['batches']}  m "
                  f"{r['dictionary_size']}", flush=True)
    machine["load_average_at_end"] = os.getloadavg()
    summary = summarize(results, T)
    payload = {
        "benchmark": "BBKB on California housing (001 Sec. 4)",
        "settings": {
            "A": int(arms.shape[0]),
            "d": int(arms.shape[1]),
            "T": T,
            "kernel": f"GaussianKernel.from_width({WIDTH}): exp(-|x - x'|^2 / (2 * {WIDTH}))",
            "features": "standardized (mean 0, std 1 per column)",
            "reward": "MedHouseVal of the arm (noise-free); regret against the best row",
            "lambda": LAM,
            "q_bar": Q_BAR,
            "F": F_NORM,
            "delta": f"1/T = {1.0 / T}",
            "C_tilde": C_TILDE,
            "constant_beta": {
                "gp_scale_multiplier": B_GP,
                "rls_scale_alpha": ALPHA_CONST,
                "conversion": "UCB = mu + b_GP * sigma_GP and sigma_GP = sqrt(lambda) * sigma_tilde (RLS scale), so "
                "alpha = b_GP * sqrt(lambda)",
            },
            "theory_beta": "BBKB: alpha = C * beta_tilde (001 Thm 2); GP-BUCB: alpha = C * gpucb_beta; BKB: 000 Thm 2; "
            "GP-UCB: gpucb_beta",
            "time": "wall seconds of torchbkb.run (selection + updates + tensor objective); capped runs are "
            "extrapolated to T with a power law",
        },
        "machine": machine,
        "summary": summary,
        "results": results,
        "total_benchmark_s": time.perf_counter() - start,
    }
    with open(out / "batch.json", "w") as fh:
        json.dump(payload, fh, indent=1, default=float)
    plot(results, out / "batch.png", T, f"California housing (A = 20,640, d = 8), σ² = {WIDTH}, λ = {LAM}, "
         f"q̄ = {Q_BAR}, F = {F_NORM}, C̃ = {C_TILDE}, δ = 1/T")
    print(table(results, T))
    print(json.dumps(summary, indent=1, default=float))
    print(f"wrote {out / 'batch.json'} and {out / 'batch.png'} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
