"""Issue 3: sequential BKB against exact GP-UCB -- per-step time against t and A, and the DESIGN §6 anchor.

Part 1 (scan). Arms uniform in ``[0, 1]²``, f a GP sample (RBF, lengthscale 0.2, standardized; exact
for A <= 4,000, random Fourier features beyond), rewards ``f + N(0, 0.1²)``, ``λ = 0.01``, ``q̄ = 2``,
constant ``β``. For each A, BKB and GPUCB run T steps (capped by wall time); the per-step algorithm
time (``ask`` + ``tell``) is binned over log-spaced windows of t (median per window).

Part 2 (anchor). :func:`torchbkb.datasets.anchor_problem` (A = 1,000 arms, T = 1,000, λ = 0.01, q̄ = 2)
with BKB (theory β: F = 1, δ = 1/T; constant β), GPUCB (same two widths) and the BoTorch peer
(SingleTaskGP + UpperConfidenceBound(beta = β²/λ) + optimize_acqf_discrete, fixed hyperparameters),
Targets: BKB < 1 s in both settings, GPUCB < 5 s, regret as the exact method's. The authors' NumPy code
is compared by the harness in ``../shared/peers/`` (one thread each, interleaved; docs/performance.md).

Threads: torch's default (both cores here) unless ``--threads`` is given: BKB's theory-β run is bound by the
``(A × m)·(m × m)`` scoring product at ``m ≈ 90``, which the second core speeds up.

The constant width is ``β = 0.5`` on the RLS scale (``μ + 0.5 σ̃ = μ + 5 σ_GP`` at λ = 0.01; BoTorch's
``beta = 25``), the anchor's width since an early stop (chosen then on a single seed; the width scan of
:mod:`benchmarks.sequential_studies` shows that over 10 seeds ``β = 0.2`` gives both methods a lower regret,
and the same ratio between them).

The regret studies on the same problem (q̄, widths, over seeds) are :mod:`benchmarks.sequential_studies`.

The anchor also times an idealized BKB theory-β loop (:func:`idealized_bkb_loop`: kernel rows
precomputed, no validation or bookkeeping) right after each BKB theory-β repetition, as a floor in the
same phase of the machine: this VM's speed changes by a third from one minute to the next, and the ratio
to the floor says how much of a time is the implementation.

Each anchor algorithm first runs once untimed (a warm-up: the first run in a process pays first-touch
page faults as its buffers grow; its time is in the JSON as ``cold_time``), then the timed repetitions;
the table reports their median (the JSON also the minimum).

Sizes: ``--quick`` scan A ∈ {500, 2,000}, T = 60; anchor T = 60, 1 repetition. Default:
scan A ∈ {10³, 10⁴, 10⁵}, T = 1,000, cap 60 s per run; anchor T = 1,000, 5 repetitions (BoTorch 1);
``--full``: scan A up to 10⁵ with T = 3,000 and a 10 min cap, anchor 10 repetitions.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.harness import run_bandit, summarize_runs
from benchmarks.registry import BanditSettings
from benchmarks.report import (
    BANDIT_COLUMNS, bandit_table_rows, fit_loglog_slope, new_figure, plot_bandit_runs, print_table, save_figure,
    write_json
)
from torchbkb.datasets import anchor_problem, gp_sample, random_arms

NAME = "sequential"
BETA = 0.5
SIZES = {
    "quick": {"scan_A": [500, 2000], "scan_T": 60, "scan_cap": 20.0, "anchor_T": 60, "anchor_reps": 1, "peer_reps": 1,
              "anchor_cap": 30.0},
    "default": {"scan_A": [1000, 10_000, 100_000], "scan_T": 1000, "scan_cap": 60.0, "anchor_T": 1000, "anchor_reps": 5,
                "peer_reps": 1, "anchor_cap": 120.0},
    "full": {"scan_A": [1000, 10_000, 100_000], "scan_T": 3000, "scan_cap": 600.0, "anchor_T": 1000, "anchor_reps": 10,
             "peer_reps": 3, "anchor_cap": 600.0},
}
TARGETS = {"BKB-theory": 1.0, "BKB": 1.0, "GPUCB": 5.0, "GPUCB-theory": 5.0}
ANCHOR_ALGORITHMS = ["BKB-theory", "BKB", "GPUCB-theory", "GPUCB", "BoTorch-UCB"]


def per_step_profile(run: dict, bins: int = 16) -> tuple[list[float], list[float]]:
    """Median per-step algorithm time in log-spaced windows of t, from a run's algo-time curve.

    The curve is subsampled, so increments are averaged over the gaps between samples first.
    """
    t, a = run["curves"]["t"], run["curves"]["algo_time"]
    steps = [(t[i], (a[i] - a[i - 1]) / (t[i] - t[i - 1])) for i in range(1, len(t)) if t[i] > t[i - 1]]
    if not steps:
        return [], []
    edges = [math.exp(x) for x in _linspace(math.log(max(steps[0][0], 1)), math.log(steps[-1][0] + 1), bins + 1)]
    xs, ys = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        vals = [v for s, v in steps if lo <= s < hi]
        if vals:
            xs.append(math.sqrt(lo * hi))
            ys.append(statistics.median(vals))
    return xs, ys


def _linspace(a: float, b: float, n: int) -> list[float]:
    return [a + (b - a) * i / (n - 1) for i in range(n)] if n > 1 else [a]


def scan(cfg: dict, device, dtype, seed: int, progress: bool) -> dict:
    """Part 1: per-step time against t for each A, BKB and GPUCB (constant β)."""
    settings = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / cfg["scan_T"], beta=BETA)
    out = {}
    for A in cfg["scan_A"]:
        arms = random_arms(A, 2, seed=seed, dtype=dtype, device=device)
        f = gp_sample(arms, kernel="rbf", lengthscale=0.2, seed=seed)
        f = (f - f.mean()) / f.std()
        obj = _objective(f, seed)
        for alg in ("BKB", "GPUCB"):
            run = run_bandit(alg, arms, obj, f, settings, cfg["scan_T"], seed, time_limit=cfg["scan_cap"],
                             progress=progress)
            xs, ys = per_step_profile(run)
            late = [y for x, y in zip(xs, ys) if x >= xs[-1] / 4] if xs else []
            out[f"{alg}@{A}"] = {
                "algorithm": alg,
                "A": A,
                "T": run["T"],
                "capped": run["capped"],
                "time": run["time"],
                "algo_time": run["algo_time"],
                "normalized_regret": run["normalized_regret"],
                "dictionary_size": run["dictionary_size"],
                "per_step_t": xs,
                "per_step_s": ys,
                "late_per_step_s": statistics.median(late) if late else float("nan"),
                "slope_vs_t": fit_loglog_slope([x for x in xs if x >= xs[-1] / 8],
                                               [y for x, y in zip(xs, ys) if x >= xs[-1] / 8]) if xs else float("nan"),
            }
            r = out[f"{alg}@{A}"]
            print(f"  scan {alg:>5} A={A:>7}: T={r['T']} time {r['time']:.2f}s, late per-step "
                  f"{1e3 * r['late_per_step_s']:.2f} ms, slope vs t {r['slope_vs_t']:.2f}, m={r['dictionary_size']}",
                  flush=True)
    return out


def _objective(f: torch.Tensor, seed: int):
    from torchbkb import ArmObjective

    return ArmObjective(f, noise_std=0.1, seed=seed)


def idealized_bkb_loop(prob, T: int, seed: int) -> dict:
    """A floor for BKB's theory-β step on this machine, measured in the same run: Algorithm 1 of 000 with
    every kernel row precomputed (``K(arms, arms)``, outside the timing), no validation, no history, no
    row cache -- only the per-step linear algebra BKB cannot avoid (Bernoulli resampling over the pulled
    arms with their counts, ``L⁻¹`` of ``K_S``, ``V`` from the pulled arms, ``[M; aᵀ]``, one scoring
    GEMM, β̃ of Theorem 2, argmax). Its random stream differs from :class:`~torchbkb.BKB`'s, so its
    choices do too; only its time is reported."""
    from torchbkb.bandits.confidence import bkb_beta
    from torchbkb.gp.kernels import GaussianKernel

    X, f = prob.arms, prob.values.to(torch.float64)
    A, lam, dt = X.shape[0], 0.01, torch.float64
    K = GaussianKernel(0.2)(X, X).to(dt)  # (A, A), not timed
    kd = torch.ones(A, dtype=dt, device=X.device)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(T, generator=g, dtype=dt).to(X.device) * prob.noise_std
    t0 = time.perf_counter()
    counts, sums = torch.zeros(A, dtype=dt, device=X.device), torch.zeros(A, dtype=dt, device=X.device)
    rls, i, D = kd / lam, int(torch.randint(A, (1,), generator=g)), None
    for t in range(1, T + 1):
        counts[i] += 1
        sums[i] += float(f[i] + noise[t - 1])
        pulled = counts.nonzero().squeeze(1)
        if D is None:
            D = torch.tensor([i], device=X.device)
        else:
            p = 1 - (1 - (2.0 * rls[pulled]).clamp(0, 1)) ** counts[pulled]
            D = pulled[torch.rand(len(pulled), generator=g, dtype=dt).to(X.device) < p]
        K_SA = K[D]  # (m, A)
        L = torch.linalg.cholesky_ex(K_SA.T[D])[0]  # K_S (symmetric): a row gather of the transposed view
        W = torch.linalg.solve_triangular(L, torch.eye(len(D), dtype=dt, device=X.device), upper=False)
        Zt = W @ K_SA.T[pulled].T
        V = (Zt * counts[pulled]) @ Zt.T
        V.diagonal().add_(lam)
        Vi = torch.cholesky_inverse(torch.linalg.cholesky_ex(V)[0])
        w = Vi @ (Zt @ sums[pulled])
        Vi.neg_().diagonal().add_(1 / lam)
        P = torch.cat([W.T @ (Vi @ W), (w @ W)[None]]) @ K_SA
        mean, rls = P[-1], (kd / lam - P[:-1].mul_(K_SA).sum(0)).clamp_min_(0)
        beta = bkb_beta(float((counts[pulled] * rls[pulled]).sum()), t, noise_std=lam**0.5, lam=lam, F=1.0,
                        delta=1.0 / T)
        i = int(torch.argmax(mean + beta * rls.sqrt()))
    return {"time": time.perf_counter() - t0, "dictionary_size": int(D.numel())}


def anchor(cfg: dict, device, dtype, seed: int, progress: bool) -> dict:
    """Part 2: the anchor problem, all algorithms, repetitions over seeds (first arm and noise)."""
    prob = anchor_problem(dtype=dtype, device=device)
    T = cfg["anchor_T"]
    settings = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / T, beta=BETA)
    results, cold, floor = {}, {}, []
    idealized_bkb_loop(prob, T, seed)  # warm-up
    for alg in ANCHOR_ALGORITHMS:
        peer = alg.startswith("BoTorch")
        reps = cfg["peer_reps"] if peer else cfg["anchor_reps"]
        # one untimed warm-up run first (the BoTorch loop: 20 steps): a process's first run of each
        # algorithm pays one-time costs -- on this VM 0.1-0.35 s of first-touch page faults as its buffers
        # grow -- that the repetitions then do not; its time is kept in the JSON as "cold_time"
        warm = run_bandit(alg, prob.arms, prob.objective(seed), prob.values, settings, 20 if peer else T, seed,
                          time_limit=cfg["anchor_cap"], progress=False)
        cold[alg] = warm["time"]
        results[alg] = []
        for r in range(reps):
            results[alg].append(run_bandit(alg, prob.arms, prob.objective(seed + r), prob.values, settings, T, seed + r,
                                           time_limit=cfg["anchor_cap"], progress=progress))
            if alg == "BKB-theory":  # the floor right after each repetition: the same phase of the VM
                floor.append(idealized_bkb_loop(prob, T, seed + r))
    return {"settings": settings.to_dict(), "runs": results, "cold_time": cold, "idealized_bkb_theory": floor,
            "summaries": [summarize_runs(r) for r in results.values()]}


def plot_scan(res: dict, out_dir) -> str:
    fig, axes = new_figure(ncols=2, width=5.2)
    ax = axes[0][0]
    for r in res.values():
        if r["per_step_t"]:
            ax.loglog(r["per_step_t"], [1e3 * y for y in r["per_step_s"]], marker=".",
                      ls="-" if r["algorithm"] == "BKB" else "--",
                      label=f"{r['algorithm']} A={r['A']:.0e} (slope {r['slope_vs_t']:.2f})")
    ax.set_xlabel("t")
    ax.set_ylabel("per-step time [ms] (median in window)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")
    ax = axes[0][1]
    for alg in ("BKB", "GPUCB"):
        pts = sorted((r["A"], r["late_per_step_s"]) for r in res.values() if r["algorithm"] == alg)
        As, ys = [p[0] for p in pts], [1e3 * p[1] for p in pts]
        ax.loglog(As, ys, marker="o", label=f"{alg} (slope {fit_loglog_slope(As, ys):.2f})")
    ax.set_xlabel("A (arms)")
    ax.set_ylabel("per-step time at late t [ms]")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return str(save_figure(fig, out_dir, f"{NAME}_scan"))


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--skip-scan", action="store_true")
    p.add_argument("--skip-anchor", action="store_true")
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    device, dtype = setup(args)  # all cores by default: the anchor's NumPy timings used both
    progress = not args.no_progress
    t0 = time.perf_counter()
    payload = {"size": size_of(args), "config": cfg, "beta": BETA}
    if not args.skip_scan:
        res = scan(cfg, device, dtype, args.seed, progress)
        rows = [
            {
                "algorithm": r["algorithm"],
                "A": r["A"],
                "T": r["T"],
                "time [s]": r["time"],
                "late ms/step": 1e3 * r["late_per_step_s"],
                "slope vs t": r["slope_vs_t"],
                "R_T/R_unif": r["normalized_regret"],
                "dict. size": r["dictionary_size"] if r["dictionary_size"] >= 0 else None,
                "note": "capped by time" if r["capped"] else "",
            }
            for r in res.values()
        ]
        print_table(rows, list(rows[0]),
                    f"per-step time vs t and A (d=2, ℓ=0.2, λ=0.01, q̄=2, β={BETA}; {device}, {args.dtype})")
        payload["scan"] = res
        payload["scan_plot"] = plot_scan(res, args.out)
    if not args.skip_anchor:
        anc = anchor(cfg, device, dtype, args.seed, progress)
        rows = bandit_table_rows(anc["summaries"])
        comparable = cfg["anchor_T"] == 1000  # the targets are for T = 1,000
        for row, s in zip(rows, anc["summaries"]):
            row["min [s]"] = s["time_min"]
            row["cold run [s]"] = anc["cold_time"][s["algorithm"]]
            target = TARGETS.get(s["algorithm"]) if comparable else None
            row["target [s]"] = target
            row["time / target"] = s["time_median"] / target if target else None
        cols = (BANDIT_COLUMNS[:3] + ["min [s]", "cold run [s]"] + BANDIT_COLUMNS[3:-1]
                + ["target [s]", "time / target", "note"])
        title = (f"anchor: A=1,000 in [0,1]², GP ℓ=0.2, noise 0.1, T={cfg['anchor_T']}, λ=0.01, q̄=2, β={BETA} | "
                 f"theory (F=1, δ=1/T); {device}, {args.dtype}")
        print_table(rows, cols, title)
        floor = statistics.median(r["time"] for r in anc["idealized_bkb_theory"])
        bkb_theory = next((x["time_median"] for x in anc["summaries"] if x["algorithm"] == "BKB-theory"), float("nan"))
        anc["idealized_bkb_theory_median"] = floor
        anc["bkb_theory_over_idealized"] = bkb_theory / floor
        print(f"idealized BKB theory-β loop (kernel precomputed, no bookkeeping; this run's floor): median {floor:.3f} "
              f"s "
              "(" + ", ".join(f"{r['time']:.3f}" for r in anc["idealized_bkb_theory"])
              + f"); BKB-theory / floor = {bkb_theory / floor:.2f}")
        payload["anchor"] = anc
        payload["anchor_table"] = rows
        payload["anchor_plot"] = str(plot_bandit_runs(anc["runs"], args.out, f"{NAME}_anchor", title))
    payload["targets"] = TARGETS
    payload["total_time"] = time.perf_counter() - t0
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
