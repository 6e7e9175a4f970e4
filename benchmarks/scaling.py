"""BKB scaling: time per step against the number of arms A (10³ to 10⁶) and against t (up to 10⁴).

Problem: arms uniform in ``[0, 1]²``, f a GP sample (RBF, lengthscale 0.2; random Fourier features
for A > 4,000), rewards ``f + N(0, 0.1²)``, BKB with ``λ = 0.01``, ``q̄ = 2``, constant ``β = 0.5``.

* vs A: a short run (T steps) per A; the per-step time is the median of the per-step algorithm times
  (``ask`` + ``tell``) over the second half of the run, where the dictionary has settled near the same
  size for every A. BKB's step costs ``O(A·m²)`` (re-embedding and rescoring all arms), so the fitted
  log-log slope against A should be close to 1.
* vs t: one long run at fixed A; per-step times binned over log-spaced windows of t. Once the
  dictionary size ``m_t`` saturates near ``d_eff``, the per-step time should stop growing (slope → 0);
  the only ``t``-dependent part is refitting ``V`` from the ``min(t, A)`` distinct pulled arms.

Sizes: ``--quick`` A ∈ {10³, 10⁴} (T = 20), t up to 300 at A = 2,000; default A ∈ {10³, 10⁴, 10⁵, 10⁶}
(T = 40), t up to 10⁴ at A = 10⁴ (capped at 180 s); ``--full`` the same with T = 100 and t up to 10⁴
uncapped (30 min).
"""

from __future__ import annotations

import statistics
import time

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.harness import run_bandit
from benchmarks.registry import BanditSettings
from benchmarks.report import fit_loglog_slope, new_figure, print_table, save_figure, write_json
from benchmarks.sequential import BETA, _objective, per_step_profile
from torchbkb.datasets import gp_sample, random_arms

NAME = "scaling"
SIZES = {
    "quick": {"A": [1000, 10_000], "T_A": 20, "t_A": 2000, "t_T": 300, "t_cap": 30.0},
    "default": {"A": [1000, 10_000, 100_000, 1_000_000], "T_A": 40, "t_A": 10_000, "t_T": 10_000, "t_cap": 180.0},
    "full": {"A": [1000, 10_000, 100_000, 1_000_000], "T_A": 100, "t_A": 10_000, "t_T": 10_000, "t_cap": 1800.0},
}


def _problem(A: int, device, dtype, seed: int):
    arms = random_arms(A, 2, seed=seed, dtype=dtype, device=device)
    f = gp_sample(arms, kernel="rbf", lengthscale=0.2, seed=seed)
    return arms, (f - f.mean()) / f.std()


def _per_step_second_half(run: dict) -> float:
    t, a = run["curves"]["t"], run["curves"]["algo_time"]
    half = [(a[i] - a[i - 1]) / (t[i] - t[i - 1]) for i in range(1, len(t)) if t[i] > run["T"] / 2 and t[i] > t[i - 1]]
    return statistics.median(half) if half else float("nan")


def main(argv: list[str] | None = None) -> dict:
    p = base_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    cfg = dict(SIZES[size_of(args)])
    device, dtype = setup(args, default_threads=1)
    progress = not args.no_progress
    t0 = time.perf_counter()

    vs_A = []
    for A in cfg["A"]:
        arms, f = _problem(A, device, dtype, args.seed)
        settings = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / cfg["T_A"], beta=BETA)
        run = run_bandit("BKB", arms, _objective(f, args.seed), f, settings, cfg["T_A"], args.seed, progress=progress)
        vs_A.append({"A": A, "T": run["T"], "per_step_s": _per_step_second_half(run), "time": run["time"],
                     "setup_time": run["setup_time"], "dictionary_size": run["dictionary_size"]})
        print(f"  A={A:>8}: per-step {1e3 * vs_A[-1]['per_step_s']:.2f} ms, m={run['dictionary_size']}", flush=True)
        del arms, f
    slope_A = fit_loglog_slope([r["A"] for r in vs_A], [r["per_step_s"] for r in vs_A])

    arms, f = _problem(cfg["t_A"], device, dtype, args.seed)
    settings = BanditSettings(lengthscale=0.2, lam=0.01, q_bar=2.0, F=1.0, delta=1.0 / cfg["t_T"], beta=BETA)
    run_t = run_bandit("BKB", arms, _objective(f, args.seed), f, settings, cfg["t_T"], args.seed,
                       time_limit=cfg["t_cap"], progress=progress)
    xs, ys = per_step_profile(run_t, bins=20)
    late = [(x, y) for x, y in zip(xs, ys) if x >= xs[-1] / 10]
    slope_t = fit_loglog_slope([x for x, _ in late], [y for _, y in late])

    rows = [{"A": f"{r['A']:.0e}", "T": r["T"], "per-step [ms]": 1e3 * r["per_step_s"],
             "per-step / A [ns]": 1e9 * r["per_step_s"] / r["A"], "m_T": r["dictionary_size"]} for r in vs_A]
    print_table(rows, list(rows[0]),
                f"BKB per-step time vs A (second half of T={cfg['T_A']} steps); log-log slope {slope_A:.2f}  "
                f"({device}, {args.dtype})")
    print(f"BKB per-step time vs t at A={cfg['t_A']}: T={run_t['T']}{' (capped by time)' if run_t['capped'] else ''}, "
          f"m_T={run_t['dictionary_size']}, "
          f"late slope {slope_t:.2f}, per-step {1e3 * ys[0]:.2f} ms at t≈{xs[0]:.0f} -> {1e3 * ys[-1]:.2f} ms at "
          f"t≈{xs[-1]:.0f}")

    fig, axes = new_figure(ncols=3, width=4.6)
    ax = axes[0][0]
    ax.loglog([r["A"] for r in vs_A], [1e3 * r["per_step_s"] for r in vs_A], "o-", label=f"BKB (slope {slope_A:.2f})")
    a0 = vs_A[0]
    ax.loglog([r["A"] for r in vs_A], [1e3 * a0["per_step_s"] * r["A"] / a0["A"] for r in vs_A], "k:", lw=0.8,
              label="∝ A")
    ax.set_xlabel("A (arms)")
    ax.set_ylabel("per-step time [ms]")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ax = axes[0][1]
    ax.loglog(xs, [1e3 * y for y in ys], "o-", label=f"BKB, A={cfg['t_A']:.0e} (late slope {slope_t:.2f})")
    ax.set_xlabel("t")
    ax.set_ylabel("per-step time [ms] (median in window)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ax = axes[0][2]
    ax.plot(run_t["curves"]["t"], run_t["curves"]["dictionary_size"])
    ax.set_xlabel("t")
    ax.set_ylabel("dictionary size $m_t$")
    ax.grid(alpha=0.3)
    png = save_figure(fig, args.out, NAME)

    payload = {
        "size": size_of(args),
        "config": cfg,
        "settings": settings.to_dict(),
        "vs_A": vs_A,
        "slope_vs_A": slope_A,
        "vs_t": {"A": cfg["t_A"], "T": run_t["T"], "capped": run_t["capped"], "t": xs, "per_step_s": ys,
                 "late_slope": slope_t, "curves": run_t["curves"], "dictionary_size": run_t["dictionary_size"]},
        "plot": str(png),
        "time": time.perf_counter() - t0,
    }
    path = write_json(args.out, NAME, payload, device)
    print(f"wrote {path} and {png}")
    return payload


if __name__ == "__main__":
    main()
