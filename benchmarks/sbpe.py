"""S-BPE benchmark (003 Sec. 5 and Sec. 4): regret of S-BPE vs BKB vs GP-UCB on GP-like samples with RBF and
Matérn-5/2 kernels, and the L∞ error of the uncertainty-reduction regression design vs ``n``.

Not a test. Standalone::

    python -m benchmarks.sbpe            # default, ≲ 10 min on 2 CPU cores
    python -m benchmarks.sbpe --quick    # < 60 s

Writes ``results/sbpe.json`` and ``results/sbpe.png``.

Objective functions ("GP samples with known RKHS norm"): a GP sample ``g ~ N(0, K_cc)`` at ``J`` random
centers, interpolated by ``f = k_c(·)ᵀ K_cc⁻¹ g`` (the GP posterior mean given the noise-free sample), then
rescaled to ``‖f‖_H = C`` exactly (``‖f‖²_H = gᵀ K_cc⁻¹ g``) -- so every algorithm's theory width gets the
true ``C``. The kernel used by the algorithms is the one the sample was drawn from.

Widths: ``theory`` -- each algorithm's own theorem with the true ``C`` and ``R`` (S-BPE: 003 Eq. 13
with measured λ_max; BKB: 000 Theorem 2; GP-UCB: the self-normalized bound of
:func:`torchbkb.bandits.confidence.gpucb_beta`); ``const`` -- one shared GP-scale multiplier ``μ ± 2σ`` for all
three (RLS scale ``2√λ`` for BKB/GP-UCB).
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

import torch

import torchbkb
from torchbkb import ArmObjective
from torchbkb.bandits.design import UncertaintyExplorer, linf_error
from torchbkb.gp.dtc_posterior import DTCPosterior
from torchbkb.gp.nystrom import NystromEmbedding
from torchbkb.sampling.recursive_rls import recursive_rls

from benchmarks.kernels import check_matern_against_gpytorch, make_kernel
from benchmarks.registry import BanditSettings, make_bandit

NAME = "sbpe"


def rkhs_sample(kernel, X: torch.Tensor, C: float, J: int, g: torch.Generator) -> torch.Tensor:
    """Values at ``X`` of ``f = k_c(·)ᵀ K_cc⁻¹ s`` with ``s ~ N(0, K_cc)``, rescaled to ``‖f‖_H = C``."""
    c = torch.rand(J, X.shape[1], dtype=X.dtype, generator=g)
    Kcc = kernel(c, c) + 1e-10 * torch.eye(J, dtype=X.dtype)
    L = torch.linalg.cholesky(Kcc)
    s = L @ torch.randn(J, dtype=X.dtype, generator=g)
    alpha = torch.cholesky_solve(s[:, None], L)[:, 0]  # K_cc⁻¹ s
    norm = math.sqrt(float(s @ alpha))  # ‖f‖_H
    return kernel(X, c) @ alpha * (C / norm)


def settings_for(algo: str, width: str, kname: str, lam: float, R: float, C: float, N: int, ls: float) -> tuple[str,
        BanditSettings]:
    """The registry name and settings of one run: the same interval ``μ ± 2σ_GP`` for the constant widths (GP scale for
    S-BPE, RLS scale ``2√λ`` for BKB and GP-UCB)."""
    name = {"S-BPE": "SBPE", "BKB": "BKB", "GP-UCB": "GPUCB"}.get(algo, algo) + ("-theory" if width == "theory" else "")
    beta = 2.0 if algo == "S-BPE" else 2.0 * math.sqrt(lam)
    return name, BanditSettings(lengthscale=ls, kernel_name=kname, lam=lam, q_bar=2.0, F=C, delta=0.05, beta=beta,
                                noise_std=R, budget=N)


def regret_suite(cfg: dict, log) -> dict:
    out = {}
    for kname in cfg["kernels"]:
        kernel = make_kernel(kname, cfg["lengthscale"])
        runs = []
        for rep in range(cfg["reps"]):
            g = torch.Generator().manual_seed(1000 + rep)
            arms = torch.rand(cfg["A"], 2, dtype=torch.float64, generator=g)
            f = rkhs_sample(kernel, arms, cfg["C"], cfg["J"], g)
            for width in cfg["widths"]:
                for algo in cfg["algorithms"]:
                    name, settings = settings_for(algo, width, kname, cfg["lam"], cfg["R"], cfg["C"], cfg["T"],
                                                  cfg["lengthscale"])
                    bandit = make_bandit(name, arms, settings, rep)
                    obj = ArmObjective(f, noise_std=cfg["R"], seed=rep)
                    t0 = time.perf_counter()
                    hist = torchbkb.run(bandit, obj, budget=cfg["T"], progress=False)
                    wall = time.perf_counter() - t0
                    cum = hist.cumulative_regret
                    row = {
                        "kernel": kname,
                        "rep": rep,
                        "width": width,
                        "algorithm": algo,
                        "regret": cum[-1],
                        "normalized_regret": hist.normalized_regret[-1],
                        "curve": cum[:: max(1, cfg["T"] // 200)] + [cum[-1]],
                        "time_s": wall,
                        "batches": len(hist.batch_sizes),
                        "final_dictionary": hist.dictionary_size[-1],
                    }
                    if algo == "S-BPE":
                        row.update(
                            batch_sizes=bandit.schedule,
                            active_sizes=bandit.active_sizes,
                            betas=bandit.betas,
                            lambda_max_over_tau2=[lm / cfg["lam"] for lm in bandit.lambda_maxes],
                            dictionary_sizes=bandit.dictionary_sizes,
                            maximizer_kept=bool(bandit.active[int(torch.argmax(f))]),
                        )
                    runs.append(row)
                    log(f"{kname:6s} rep {rep} {width:6s} {algo:6s} R_T={cum[-1]:9.2f}  {wall:6.1f}s"
                        + (f"  active {row['active_sizes']}" if algo == "S-BPE" else ""))
        out[kname] = runs
    return out


def design_suite(cfg: dict, log) -> dict:
    """One max-variance sequence per (kernel, rep); at each ``n`` in ``design_ns`` the dictionary is the
    recursive-RLS draw over the first ``n`` picks (refresh=1) and ``μ̄_n`` is fitted on their rewards --
    the same as ``uncertainty_design(n)``, without recomputing the shared prefix."""
    out = {}
    side = cfg["grid_side"]
    lin = torch.linspace(0, 1, side, dtype=torch.float64)
    grid = torch.cartesian_prod(lin, lin)  # (side², 2): the finite domain
    n_max = max(cfg["design_ns"])
    for kname in cfg["kernels"]:
        kernel = make_kernel(kname, cfg["lengthscale"])
        rows = []
        for rep in range(cfg["design_reps"]):
            g = torch.Generator().manual_seed(2000 + rep)
            f = rkhs_sample(kernel, grid, cfg["C"], cfg["J"], g)
            noise = torch.Generator().manual_seed(3000 + rep)
            ex = UncertaintyExplorer(grid, kernel, cfg["lam"], generator=torch.Generator().manual_seed(rep))
            rand_idx = torch.randint(0, grid.shape[0], (n_max,), generator=g)
            t0 = time.perf_counter()
            for n in cfg["design_ns"]:
                ex.run(n - ex.picks.numel())
                picks = ex.picks
                y = f[picks] + cfg["R"] * torch.randn(n, dtype=torch.float64, generator=noise)
                err = linf_error(ex.regressor(y), f, grid)
                lam_max = ex.lambda_max()
                # baseline: uniformly random design, the same sparse regressor construction (recursive RLS on it)
                Xr = grid[rand_idx[:n]]
                Zr = recursive_rls(Xr, kernel, cfg["lam"], seed=rep + 77).indices
                yr = f[rand_idx[:n]] + cfg["R"] * torch.randn(n, dtype=torch.float64, generator=noise)
                post = DTCPosterior(NystromEmbedding(kernel, Xr[Zr]), noise=cfg["lam"]).fit(Xr, yr)
                err_rand = linf_error(post, f, grid)
                rows.append(
                    {
                        "kernel": kname,
                        "rep": rep,
                        "n": n,
                        "linf": err,
                        "linf_random": err_rand,
                        "m": ex.dictionary_size,
                        "m_random": int(Zr.numel()),
                        "lambda_max_over_tau2": lam_max / cfg["lam"],
                        "elapsed_s": time.perf_counter() - t0,
                    }
                )
                log(f"design {kname:8s} rep {rep} n={n:4d} m={rows[-1]['m']:4d} λmax/τ²={lam_max / cfg['lam']:.2e} "
                    f"L∞={err:.4f} (random {err_rand:.4f})")
        out[kname] = rows
    return out


def summarize(regret: dict, design: dict) -> dict:
    summ = {"regret": {}, "design": {}}
    for kname, runs in regret.items():
        for r in runs:
            key = f"{kname}/{r['width']}/{r['algorithm']}"
            summ["regret"].setdefault(key, {"regret": [], "time_s": []})
            summ["regret"][key]["regret"].append(r["regret"])
            summ["regret"][key]["time_s"].append(r["time_s"])
    for v in summ["regret"].values():
        v["regret_mean"] = sum(v["regret"]) / len(v["regret"])
        v["time_median_s"] = sorted(v["time_s"])[len(v["time_s"]) // 2]
    for kname, rows in design.items():
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["n"] == n]
            summ["design"][f"{kname}/n={n}"] = {
                "linf_mean": sum(r["linf"] for r in sel) / len(sel),
                "linf_random_mean": sum(r["linf_random"] for r in sel) / len(sel),
                "m_mean": sum(r["m"] for r in sel) / len(sel),
            }
    return summ


def plot(regret: dict, design: dict, cfg: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = list(regret)
    fig, axes = plt.subplots(2, len(kernels), figsize=(6 * len(kernels), 9), squeeze=False)
    colors = {"S-BPE": "C0", "BKB": "C1", "GPUCB": "C2"}
    for col, kname in enumerate(kernels):
        ax = axes[0, col]
        for width, ls in (("theory", "-"), ("const", "--")):
            for algo in cfg["algorithms"]:
                curves = [torch.tensor(r["curve"]) for r in regret[kname]
                          if r["width"] == width and r["algorithm"] == algo]
                if not curves:
                    continue
                c = torch.stack(curves)
                t = torch.linspace(0, cfg["T"], c.shape[1])
                ax.plot(t, c.mean(0), ls, color=colors[algo], label=f"{algo} ({width} β)")
                if c.shape[0] > 1:
                    ax.fill_between(t, c.min(0).values, c.max(0).values, color=colors[algo], alpha=0.12)
        ax.set_title(f"{kname}: cumulative regret (A={cfg['A']}, ‖f‖={cfg['C']}, σ={cfg['R']}, {cfg['reps']} reps)")
        ax.set_xlabel("t")
        ax.set_ylabel("R_t")
        ax.legend(fontsize=8)
        ax = axes[1, col]
        rows = design[kname]
        ns = sorted({r["n"] for r in rows})
        mean = lambda key, n, rows=rows: sum(r[key] for r in rows if r["n"] == n) / sum(1 for r in rows if r["n"] == n)
        ax.loglog(ns, [mean("linf", n) for n in ns], "o-", label="max-variance design (Sec. 4.1)")
        ax.loglog(ns, [mean("linf_random", n) for n in ns], "s--", label="uniform random design")
        for n in ns:
            ax.annotate(f"m={mean('m', n):.0f}", (n, mean("linf", n)), fontsize=7, textcoords="offset points",
                        xytext=(3, 5))
        ax.set_title(f"{kname}: L∞ error of the sparse regressor on a {cfg['grid_side']}² grid")
        ax.set_xlabel("n")
        ax.set_ylabel("‖f - μ̄_n‖∞")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke-test size (< 60 s)")
    p.add_argument("--out", default="results", help="output directory")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        cfg = dict(A=200, T=200, reps=1, widths=["theory"], design_ns=[10, 40], design_reps=1, grid_side=15)
    else:
        cfg = dict(A=600, T=1500, reps=2, widths=["theory", "const"], design_ns=[10, 25, 50, 100, 200, 400],
                   design_reps=2, grid_side=30)
    cfg.update(kernels=["rbf", "matern52"], algorithms=["S-BPE", "BKB", "GPUCB"], lengthscale=0.2, lam=0.01, R=0.1,
               C=2.0, J=40)
    start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - start:7.1f}s] {msg}", flush=True)

    matern_err = check_matern_against_gpytorch()
    log(f"Matérn-5/2 vs gpytorch MaternKernel(nu=2.5): max abs diff {matern_err:.2e}")
    regret = regret_suite(cfg, log)
    design = design_suite(cfg, log)
    payload = {
        "name": NAME,
        "size": "quick" if args.quick else "default",
        "config": cfg,
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torchbkb": torchbkb.__version__,
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "device": "cpu",
        },
        "matern_vs_gpytorch_max_abs_diff": matern_err,
        "summary": summarize(regret, design),
        "regret_runs": regret,
        "design_runs": design,
        "total_time_s": time.perf_counter() - start,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{NAME}.json").write_text(json.dumps(payload, indent=1))
    plot(regret, design, cfg, out / f"{NAME}.png")
    log(f"wrote {out / (NAME + '.json')} and {out / (NAME + '.png')}")
    for key, v in payload["summary"]["regret"].items():
        print(f"  {key:28s} R_T mean {v['regret_mean']:9.2f}   median time {v['time_median_s']:6.1f}s")
    for key, v in payload["summary"]["design"].items():
        print(f"  {key:28s} L∞ {v['linf_mean']:.4f}  (random {v['linf_random_mean']:.4f})  m {v['m_mean']:.0f}")
    return payload


if __name__ == "__main__":
    main()
