"""Online kernel regression benchmark (paper 004, Sec. 4 and App. G) on data available offline.

Three experiments, every learner with the paper's settings (σ = 1, λ = 1; KORS μ = β = 1, ε = 1/2;
FOGD with 1000 random frequencies and η = 1/√n):

1. **adversarial** (App. G, Fig. 3): a greedy adversary picks ``(x_t, y_t) ∈ [-1, 1]^5 × {-1, +1}``
   maximizing each learner's regret against the best regularized kernel predictor in hindsight,
   ``R_t = Σ_{s<=t} (y_s - ŷ_s)² - min_f {Σ_{s<=t} (y_s - f(x_s))² + λ‖f‖²}`` (the minimum is
   ``λ Yᵀ(K + λI)⁻¹Y``). For a fixed ``x`` the regret is convex in ``y``, so ``y = ±1``; ``x`` is found by
   scoring random candidates and refining the best ones with L-BFGS-B (scipy).
2. **california**: online regression on the bundled California housing table (20,640 rows, d = 8),
   rows shuffled once (seed 0), features and target min-max scaled to [-1, 1].
3. **synthetic**: a 10⁶-round stream, ``x_t ~ U[-1, 1]^8``, ``y_t`` = a random smooth function
   (sum of 30 Gaussian bumps) plus noise N(0, 0.1²), clipped to [-1, 1].

Learners: PKAWV with Taylor features (M = 2, 3, 4), PKAWV with a KORS Nyström dictionary, exact
Kernel-AWV, Pros-N-KONS (004's competitor in Fig. 3: ``α = λ``, ``C = 1``, KORS as above) and FOGD.
Kernel-AWV (``O(t²)`` per round), PKAWV-KORS (``O(t·m)`` per dictionary addition) and Pros-N-KONS (one
Python-level round at a time) are capped by wall time; the JSON says where they stopped.

Usage (from the repository root)::

    python -m benchmarks.online            # ~10 minutes on 2 cores
    python -m benchmarks.online --quick    # smoke test, < 60 s

Writes ``results/online.json`` and ``results/online.png`` (``--out`` changes the folder).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from torchbkb.gp.kernels import GaussianKernel
from torchbkb.online import FOGD, PKAWV, KernelAWV, ProsNKONS, TaylorEmbedding

ROOT = Path(__file__).resolve().parents[1]
CALIFORNIA = ROOT / "torchbkb" / "datasets" / "data" / "california_housing.csv.gz"
SIGMA, LAM, MU, BETA, EPS, FOGD_FEATURES = 1.0, 1.0, 1.0, 1.0, 0.5, 1000


# ---------------------------------------------------------------------- learners
def make_learners(d: int, n: int, taylor_degrees=(2, 3, 4)) -> dict:
    """name -> factory of a fresh learner (paper settings)."""
    out = {}
    for M in taylor_degrees:
        out[f"PKAWV Taylor M={M}"] = lambda M=M: PKAWV(embedding=TaylorEmbedding(d, M, lengthscale=SIGMA), lam=LAM)
    out["PKAWV Nyström-KORS"] = lambda: PKAWV(
        kernel=GaussianKernel(SIGMA), lam=LAM, dictionary="kors", mu=MU, beta=BETA, epsilon=EPS, seed=0
    )
    out["Kernel-AWV"] = lambda: KernelAWV(GaussianKernel(SIGMA), lam=LAM)
    out["Pros-N-KONS"] = lambda: ProsNKONS(GaussianKernel(SIGMA), alpha=LAM, C=1.0, mu=MU, beta=BETA, epsilon=EPS,
                                           seed=0)
    out["FOGD"] = lambda: FOGD(d, lengthscale=SIGMA, num_features=FOGD_FEATURES, lr=1.0 / math.sqrt(n), seed=0)
    return out


def describe(f) -> dict:
    info = {}
    if isinstance(f, PKAWV):
        info["num_features"] = f.num_features
        if f.dictionary is not None:
            info["dictionary_size"] = len(f.dictionary)
            info["skipped_directions"] = f.num_skipped
            grid = log_grid(f.num_rounds, 60)
            idx = f.dictionary.indices.cpu().numpy()
            info["dictionary_growth"] = {"round": grid.tolist(), "size": np.searchsorted(np.sort(idx), grid).tolist()}
    if isinstance(f, ProsNKONS):
        info.update(num_features=f.num_features, dictionary_size=len(f.dictionary), restarts=f.num_restarts)
    if isinstance(f, KernelAWV):
        info["kernel_matrix_size"] = f.size
    return info


# ---------------------------------------------------------------------- curves
def log_grid(n: int, points: int = 160) -> np.ndarray:
    """Distinct 1-based round counts, log-spaced in [1, n]."""
    if n <= 0:
        return np.zeros(0, dtype=int)
    return np.unique(np.round(np.logspace(0, math.log10(n), points)).astype(int).clip(1, n))


def time_profile(tpr: np.ndarray) -> dict:
    """Mean seconds per round in log-spaced windows, and the late/early ratio (flat = t-independent)."""
    n = len(tpr)
    edges = np.unique(np.round(np.logspace(0, math.log10(max(n, 1)), 25)).astype(int).clip(0, n))
    edges = np.unique(np.concatenate([[0], edges, [n]]))
    centers, means = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            centers.append(int((lo + hi) // 2 + 1))
            means.append(float(tpr[lo:hi].mean()))
    early = tpr[n // 10 : max(2 * n // 10, n // 10 + 1)]
    late = tpr[9 * n // 10 :]
    ratio = float(late.mean() / early.mean()) if n >= 20 and early.mean() > 0 else float("nan")
    return {"round": centers, "seconds_per_round": means, "late_over_early": ratio}


def summarize(name: str, res, f, extra: dict | None = None) -> dict:
    n = res.n_rounds
    grid = log_grid(n)
    cum = res.cumulative_loss.numpy()
    tpr = res.time_per_round.numpy()
    out = {
        "name": name,
        **res.summary(),
        "mean_seconds_per_round": res.total_time / max(n, 1),
        **describe(f),
        "curve": {
            "round": grid.tolist(),
            "average_loss": (cum[grid - 1] / grid).tolist() if n else [],
            "cumulative_time_s": np.cumsum(tpr)[grid - 1].tolist() if n else [],
        },
        "time_profile": time_profile(tpr),
    }
    if extra:
        out.update(extra)
    return out


def run_stream(name: str, factory, X, y, cap: float | None, log) -> dict:
    f = factory()
    capped = name in ("Kernel-AWV", "PKAWV Nyström-KORS", "Pros-N-KONS")
    t0 = time.perf_counter()
    res = f.fit_stream(X, y, max_time=cap if capped else None, chunk_size=256)
    wall = time.perf_counter() - t0
    s = summarize(name, res, f, {"time_cap_s": cap if capped else None, "wall_s": wall})
    msg = "" if not res.stopped_early else f"  (stopped by the {cap:.0f} s cap)"
    log(
        f"  {name:22s} rounds {res.n_rounds:>8d}/{res.n_total}  avg loss {res.average_loss:.4f}  "
        f"{1e6 * s['mean_seconds_per_round']:8.1f} µs/round  late/early {s['time_profile']['late_over_early']:.2f}{msg}"
    )
    return s


# ---------------------------------------------------------------------- data
def california():
    with gzip.open(CALIFORNIA, "rt") as fh:
        rows = list(csv.reader(fh))
    header, data = rows[0], np.asarray(rows[1:], dtype=np.float64)
    rng = np.random.default_rng(0)
    data = data[rng.permutation(len(data))]
    lo, hi = data.min(0), data.max(0)
    data = 2.0 * (data - lo) / np.where(hi > lo, hi - lo, 1.0) - 1.0  # every column to [-1, 1]
    return torch.from_numpy(data[:, :-1].copy()), torch.from_numpy(data[:, -1].copy()), header


def synthetic(n: int, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.rand(30, d, generator=g, dtype=torch.float64) * 2 - 1
    weights = torch.randn(30, generator=g, dtype=torch.float64)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    f = torch.empty(n, dtype=torch.float64)
    for i in range(0, n, 65536):  # chunked: (65536, 30) kernel blocks
        f[i : i + 65536] = GaussianKernel(SIGMA)(X[i : i + 65536], centers) @ weights
    f = f / (2.0 * f[: min(n, 100000)].std())
    y = (f + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(-1.0, 1.0)
    return X, y


# ---------------------------------------------------------------------- adversary
def adversarial_run(factory, n: int, d: int, rng: np.random.Generator, candidates: int, restarts: int, maxiter: int):
    """Greedy adversary against one learner; returns the regret curve and the learner's time per round."""
    from scipy.optimize import minimize

    f = factory()
    X = np.zeros((0, d))
    Y = np.zeros(0)
    Minv = np.zeros((0, 0))  # (K_t + λI)⁻¹ of the rounds so far
    loss, regret, times = 0.0, [], []

    def best_y(Xc: np.ndarray):
        """Regret increment of each candidate row for its best y ∈ {-1, +1}: `(c,)` values and labels."""
        yhat = f.predict(torch.from_numpy(Xc)).numpy()
        k = np.exp(-0.5 * ((X[:, None, :] - Xc[None, :, :]) ** 2).sum(-1) / SIGMA**2)  # (t, c)
        u = Minv @ k  # (t, c)
        schur = 1.0 + LAM - (k * u).sum(0)  # k(x,x) + λ - kᵀ(K + λI)⁻¹k
        uy = u.T @ Y
        vals = np.stack([(yv - yhat) ** 2 - LAM * (yv - uy) ** 2 / schur for yv in (-1.0, 1.0)])  # (2, c)
        j = vals.argmax(0)
        return vals[j, np.arange(len(j))], np.where(j == 1, 1.0, -1.0)

    for _ in range(n):
        C = rng.uniform(-1, 1, size=(candidates, d))
        v, _ = best_y(C)
        best_x, best_v = C[int(v.argmax())], float(v.max())
        for x0 in C[np.argsort(-v)[:restarts]]:
            r = minimize(lambda x: -best_y(x[None])[0][0], x0, method="L-BFGS-B", bounds=[(-1, 1)] * d,
                         options={"maxiter": maxiter})
            if -r.fun > best_v:
                best_x, best_v = np.clip(r.x, -1, 1), float(-r.fun)
        _, yb = best_y(best_x[None])
        x_t, y_t = best_x, float(yb[0])
        t0 = time.perf_counter()
        yhat = float(f.step(torch.from_numpy(x_t[None].copy()), torch.tensor([y_t], dtype=torch.float64)))
        times.append(time.perf_counter() - t0)
        # comparator: λ Yᵀ (K + λI)⁻¹ Y with the block inverse of the grown matrix
        k = np.exp(-0.5 * ((X - x_t) ** 2).sum(-1) / SIGMA**2)
        u = Minv @ k
        s = 1.0 + LAM - k @ u
        t = len(Y)
        M = np.empty((t + 1, t + 1))
        M[:t, :t] = Minv + np.outer(u, u) / s
        M[:t, t] = M[t, :t] = -u / s
        M[t, t] = 1.0 / s
        Minv, X, Y = M, np.vstack([X, x_t]), np.append(Y, y_t)
        loss += (y_t - yhat) ** 2
        regret.append(loss - LAM * float(Y @ Minv @ Y))
    return regret, times, f


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (< 60 s)")
    ap.add_argument("--out", default=str(ROOT / "results"), help="output folder")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: per-round work is small, and intra-op threads only add "
                         "synchronization, badly so on a shared machine; 0 keeps torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    q = args.quick
    cfg = {
        "quick": q,
        "sigma": SIGMA,
        "lam": LAM,
        "kors": {"mu": MU, "beta": BETA, "epsilon": EPS},
        "fogd": {"num_features": FOGD_FEATURES, "lr": "1/sqrt(n)"},
        "adversarial": {"n": 12 if q else 80, "d": 5, "candidates": 256 if q else 1024, "restarts": 1 if q else 2,
                        "maxiter": 5 if q else 15},
        "california": {"n": 2000 if q else 20640, "cap_s": 3.0 if q else 45.0},
        "synthetic": {"n": 20000 if q else 1_000_000, "d": 8, "cap_s": 3.0 if q else 60.0},
        "chunk_size": 256,
    }
    lines = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    machine = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "device": "cpu",
        "load_average_at_start": os.getloadavg(),
    }
    log(f"machine: {machine['processor']}, {machine['cpu_count']} cores, torch {machine['torch']} "
        f"({machine['torch_threads']} threads), load average {machine['load_average_at_start']}")
    t_start = time.perf_counter()
    results = {"config": cfg, "machine": machine, "experiments": {}}

    # 1. adversarial
    a = cfg["adversarial"]
    log(f"[adversarial] greedy adversary, n = {a['n']}, d = {a['d']}")
    adv = []
    for name, factory in make_learners(a["d"], a["n"]).items():
        rng = np.random.default_rng(1)
        t0 = time.perf_counter()
        regret, times, f = adversarial_run(factory, a["n"], a["d"], rng, a["candidates"], a["restarts"], a["maxiter"])
        log(f"  {name:22s} regret after {a['n']} rounds {regret[-1]:8.3f}   ({time.perf_counter() - t0:.1f} s with the "
            f"adversary)")
        adv.append({"name": name, "regret": regret, "final_regret": regret[-1], "learner_time_s": float(sum(times)),
                    **describe(f)})
    results["experiments"]["adversarial"] = {"learners": adv}

    # 2. California housing
    c = cfg["california"]
    X, y, header = california()
    X, y = X[: c["n"]], y[: c["n"]]
    log(f"[california] n = {len(y)}, d = {X.shape[1]} ({', '.join(header[:-1])} -> {header[-1]}), all scaled to [-1, "
        f"1]")
    results["experiments"]["california"] = {
        "n": len(y),
        "baseline_average_loss_predict_mean": float(((y - y.mean()) ** 2).mean()),
        "learners": [run_stream(name, fac, X, y, c["cap_s"], log) for name,
                     fac in make_learners(X.shape[1], len(y)).items()],
    }

    # 3. synthetic 10⁶
    s = cfg["synthetic"]
    X, y = synthetic(s["n"], s["d"])
    log(f"[synthetic] n = {s['n']}, d = {s['d']}, x ~ U[-1, 1]^d, y = smooth f + N(0, 0.1²) clipped")
    results["experiments"]["synthetic"] = {
        "n": s["n"],
        "noise_floor_average_loss": 0.01,
        "learners": [run_stream(name, fac, X, y, s["cap_s"], log) for name,
                     fac in make_learners(s["d"], s["n"]).items()],
    }
    del X, y

    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["total_wall_s"] = time.perf_counter() - t_start
    results["log"] = lines
    (out / "online.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "online.png")
    print(f"wrote {out / 'online.json'} and {out / 'online.png'} in {results['total_wall_s']:.0f} s")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exps = results["experiments"]
    fig, ax = plt.subplots(2, 3, figsize=(16, 9))
    colors = {}
    for e in exps["adversarial"]["learners"]:
        (line,) = ax[0, 0].plot(np.arange(1, len(e["regret"]) + 1), e["regret"], label=e["name"])
        colors[e["name"]] = line.get_color()
    ax[0, 0].set(title="adversarial (d = 5): regret", xlabel="round t", ylabel="regret $R_t$")
    names = [e["name"] for e in exps["adversarial"]["learners"]]
    ax[1, 0].bar(range(len(names)),
                 [1e3 * e["learner_time_s"] / len(e["regret"]) for e in exps["adversarial"]["learners"]],
                 color=[colors[n] for n in names])
    ax[1, 0].set_xticks(range(len(names)), [n.replace("PKAWV ", "") for n in names], rotation=30, ha="right")
    ax[1, 0].set(title="adversarial: learner time per round", ylabel="ms / round")
    for col, key in ((1, "california"), (2, "synthetic")):
        for e in exps[key]["learners"]:
            cur = e["curve"]
            lab = e["name"] + (" (capped)" if e["stopped_early"] else "")
            ax[0, col].plot(cur["round"], cur["average_loss"], label=lab, color=colors.get(e["name"]))
            tp = e["time_profile"]
            ax[1, col].plot(tp["round"], np.asarray(tp["seconds_per_round"]) * 1e6, label=lab,
                            color=colors.get(e["name"]))
        ax[0, col].set(xscale="log", yscale="log", title=f"{key} (n = {exps[key]['n']:,}): average square loss",
                       xlabel="round t", ylabel="cumulative loss / t")
        ax[1, col].set(xscale="log", yscale="log", title=f"{key}: time per round", xlabel="round t",
                       ylabel="µs / round")
    ax[0, 0].legend(fontsize=8)
    ax[0, 2].legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(f"torchbkb.online — PKAWV vs Kernel-AWV vs FOGD ({m['processor']}, {m['cpu_count']} cores, "
                 f"torch {m['torch']}, {m['torch_threads']} threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
