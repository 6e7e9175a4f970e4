"""One BO iteration with BoTorch's SingleTaskGP vs torchbkb's BKBModel, in one process.

The iteration is what a BoTorch loop does each step on a discrete domain: build the model on ``n``
observations (fixed hyperparameters, no fitting) and pick the UCB maximizer over all 20,640 rows of
California housing with ``optimize_acqf_discrete(UpperConfidenceBound(model, beta=4), q=1, choices)``.
The only difference between the two runs is the model class (BKBModel additionally samples its
dictionary, which is included in its time).

Setting (001 Sec. 4): features standardized, Gaussian kernel of width σ² = 5 (``RBFKernel``, lengthscale
√5, outputscale 1), noise λ = 0.2 on standardized rewards (``Standardize``), q̄ = 2; training points are
``n`` random rows with their house value.

Reported per ``n``: min/median wall time over repeats (after a warm-up call), peak memory of one iteration
measured in a fresh interpreter (CPU: rise of the resident-set high-water mark over the state just before
the iteration, reset through ``/proc/self/clear_refs``; CUDA: ``torch.cuda.max_memory_allocated``), the dictionary size,
whether both picked the same row, the speed ratio of the medians, and the operators called from Python (a GPU's
kernel launches) and host synchronizations of one iteration (measured on CUDA, forecast from the data-dependent
operators elsewhere). Writes ``results/botorch_peer.json`` and
``results/botorch_peer.png``.

Usage::

    python -m benchmarks.botorch_peer --threads 1          # n = 500, 1000, 2000, 5000 (about 5-8 min)
    python -m benchmarks.botorch_peer --quick --threads 1  # n = 200, 500, fewer repeats (< 60 s)

On a machine shared with other jobs use ``--threads 1``: oversubscribed OpenMP threads slow the many
small BKB operations far more than the big GPyTorch ones, which says nothing about either method.
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import botorch
import gpytorch
from botorch.acquisition import UpperConfidenceBound
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf_discrete
from gpytorch.kernels import RBFKernel, ScaleKernel

import torchbkb
from benchmarks.timing import status_kb
from torchbkb.botorch import BKBModel

ROOT = Path(__file__).resolve().parents[1]

WIDTH, NOISE, Q_BAR, UCB_BETA = 5.0, 0.2, 2.0, 4.0


def load_california(device, dtype):
    path = ROOT / "torchbkb" / "datasets" / "data" / "california_housing.csv.gz"
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",", skiprows=1)
    X = torch.tensor(data[:, :8], dtype=dtype, device=device)
    y = torch.tensor(data[:, 8], dtype=dtype, device=device)
    return (X - X.mean(0)) / X.std(0), y


def kernel(device, dtype):
    k = ScaleKernel(RBFKernel()).to(device=device, dtype=dtype)
    k.base_kernel.lengthscale = torch.tensor(math.sqrt(WIDTH), dtype=dtype, device=device)
    k.outputscale = torch.tensor(1.0, dtype=dtype, device=device)
    return k


def make_gp(X, Y):
    gp = SingleTaskGP(X, Y, covar_module=kernel(X.device, X.dtype), outcome_transform=Standardize(m=1))
    gp.likelihood.noise = torch.tensor([NOISE], dtype=X.dtype, device=X.device)
    return gp


def make_bkb(X, Y, seed=0):
    return BKBModel(X, Y, kernel=kernel(X.device, X.dtype), noise=NOISE, q_bar=Q_BAR, seed=seed)


def one_iteration(make, X, Y, choices):
    model = make(X, Y)
    cand, val = optimize_acqf_discrete(UpperConfidenceBound(model, beta=UCB_BETA), q=1, choices=choices)
    return model, cand


class PeakMemory:
    """Peak memory of a block: CUDA allocator peak, or the rise of the process RSS high-water mark."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.reset_ok = _reset_hwm()
            self.base = status_kb("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        else:
            hwm = status_kb("VmHWM")
            self.peak_mb = (hwm - self.base) / 1024 if self.reset_ok else float("nan")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False




def timed(fn, device, repeats):
    times = []
    out = None
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times, out


def _memory_in_fresh_process(which: str, n: int, args) -> float:
    """Peak memory (MB) of one iteration, measured in a new interpreter so that no freed-but-resident
    memory of earlier runs can hide the allocation."""
    cmd = [sys.executable, "-m", "benchmarks.botorch_peer", "--_memory", which, str(n), "--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return float(res.stdout.strip().splitlines()[-1])


def _memory_child(which: str, n: int, device) -> None:
    choices, rewards = load_california(device, torch.float64)
    idx = torch.randperm(choices.shape[0], generator=torch.Generator().manual_seed(n))[:n].to(device)
    X, Y = choices[idx], rewards[idx].unsqueeze(-1)
    make = make_gp if which == "gp" else make_bkb
    with PeakMemory(device) as mem:
        one_iteration(make, X, Y, choices)
    print(mem.peak_mb)


def make_bkb_as_on_an_accelerator(X, Y, seed=0):
    """``make_bkb`` with the rule of a GPU whose float64 runs at full rate (``defaults.exact_below``): the exact GP
    outright up to ``EXACT_BELOW_ACCELERATOR`` points, whatever the device -- a GPU's path counted on the CPU."""
    from unittest import mock

    from torchbkb.botorch.defaults import EXACT_BELOW_ACCELERATOR

    with mock.patch("torchbkb.botorch.defaults.exact_below", lambda device: EXACT_BELOW_ACCELERATOR):
        model = make_bkb(X, Y, seed)
        _ = model.engine  # built now, under the rule
    return model


def launches(make, X, Y, choices, device) -> dict:
    """Operators called from Python, the operators that do work counted at the dispatcher (a GPU's kernel
    launches, :class:`benchmarks.op_counts.KernelCount`) and host synchronizations of one iteration: measured with
    ``set_sync_debug_mode`` on CUDA, forecast from the data-dependent operators elsewhere."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.op_counts import SYNC_OPS, KernelCount, counted_tolist, top_level_ops

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        with profile(activities=[ProfilerActivity.CPU]) as prof, counted_tolist() as lists:
            one_iteration(make, X, Y, choices)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    names = top_level_ops(prof)
    syncs = (sum(1 for w in caught if "synchroniz" in str(w.message).lower()) if device.type == "cuda"
             else sum(1 for n in names if n in SYNC_OPS) + lists[0])
    with KernelCount() as kernels:
        one_iteration(make, X, Y, choices)
    return {"ops": len(names), "kernels": kernels.work, "syncs": syncs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="n = 200, 500 and fewer repeats (< 60 s)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    p.add_argument("--out", default=str(ROOT / "results"))
    p.add_argument("--_memory", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), torch.float64
    if args._memory:
        return _memory_child(args._memory[0], int(args._memory[1]), device)
    sizes = args.sizes or ([200, 500] if args.quick else [500, 1000, 2000, 5000])
    choices, rewards = load_california(device, dtype)
    A = choices.shape[0]

    # warm-up both code paths (imports, allocator, GPyTorch caches of the first call)
    idx0 = torch.randperm(A, generator=torch.Generator().manual_seed(123))[:100].to(device)
    for make in (make_gp, make_bkb):
        one_iteration(make, choices[idx0], rewards[idx0].unsqueeze(-1), choices)

    rows = []
    for n in sizes:
        idx = torch.randperm(A, generator=torch.Generator().manual_seed(n))[:n].to(device)
        X, Y = choices[idx], rewards[idx].unsqueeze(-1)
        gp_rep = 1 if (args.quick or n >= 5000) else 2
        bkb_rep = 3 if args.quick else 5
        _, cand_gp = one_iteration(make_gp, X, Y, choices)
        model, cand_bkb = one_iteration(make_bkb, X, Y, choices)
        mem_gp = _memory_in_fresh_process("gp", n, args)
        mem_bkb = _memory_in_fresh_process("bkb", n, args)
        t_gp, _ = timed(lambda X=X, Y=Y: one_iteration(make_gp, X, Y, choices), device, gp_rep)
        t_bkb, _ = timed(lambda X=X, Y=Y: one_iteration(make_bkb, X, Y, choices), device, bkb_rep)
        counts = {"singletaskgp": launches(make_gp, X, Y, choices, device),
                  "bkbmodel": launches(make_bkb, X, Y, choices, device)}
        if device.type == "cpu":  # the path a GPU takes, counted here
            counts["bkbmodel_as_on_an_accelerator"] = launches(make_bkb_as_on_an_accelerator, X, Y, choices, device)
        row = {
            "n": n,
            "singletaskgp_s": {"min": min(t_gp), "median": statistics.median(t_gp), "repeats": len(t_gp)},
            "bkbmodel_s": {"min": min(t_bkb), "median": statistics.median(t_bkb), "repeats": len(t_bkb)},
            "ratio_median": statistics.median(t_gp) / statistics.median(t_bkb),
            "peak_mem_mb": {"singletaskgp": mem_gp, "bkbmodel": mem_bkb},
            "dictionary_size": model.num_inducing,
            "bkbmodel_exact": model.is_exact,
            "same_pick": bool(torch.equal(cand_gp, cand_bkb)),
            "launches": counts,
            "sync_kind": "measured (set_sync_debug_mode)" if device.type == "cuda" else "forecast (data-dependent ops)",
        }
        rows.append(row)
        print(
            f"n={n:5d}  SingleTaskGP {row['singletaskgp_s']['median']:8.3f}s  BKBModel "
            f"{row['bkbmodel_s']['median']:7.3f}s "
            f"(m={row['dictionary_size']})  ratio {row['ratio_median']:6.1f}x  peak MB {mem_gp:8.1f} vs {mem_bkb:7.1f} "
            f" same pick: {row['same_pick']}  ops {counts['singletaskgp']['ops']} vs {counts['bkbmodel']['ops']}, "
            f"kernels {counts['singletaskgp']['kernels']} vs {counts['bkbmodel']['kernels']}, "
            f"syncs {counts['singletaskgp']['syncs']} vs {counts['bkbmodel']['syncs']}"
            + ("" if device.type != "cpu" else " (as on an accelerator: kernels "
               f"{counts['bkbmodel_as_on_an_accelerator']['kernels']}, syncs "
               f"{counts['bkbmodel_as_on_an_accelerator']['syncs']})"),
            flush=True,
        )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "benchmark": "botorch_peer",
        "command": "python -m benchmarks.botorch_peer" + (" --quick" if args.quick else "")
        + (f" --threads {args.threads}" if args.threads else ""),
        "task": "build model (fixed hyperparameters) + optimize_acqf_discrete(UpperConfidenceBound(beta=4), q=1) over "
        "20,640 California housing rows",
        "setting": {"kernel": "ScaleKernel(RBFKernel), lengthscale sqrt(5), outputscale 1", "noise": NOISE,
                    "q_bar": Q_BAR,
                    "outcome_transform": "Standardize(m=1)", "features": "standardized", "dtype": str(dtype),
                    "candidates": A},
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "device": str(device),
                    "cuda": torch.cuda.get_device_name(0) if device.type == "cuda" else None},
        "versions": {"torch": torch.__version__, "gpytorch": gpytorch.__version__, "botorch": botorch.__version__,
                     "torchbkb": torchbkb.__version__},
        "notes": "SingleTaskGP runs with BoTorch's default posterior settings (fast_pred_var/LOVE). Times are per "
        "iteration; "
                 "peak memory is the rise over the process baseline during one iteration, in a fresh interpreter.",
        "results": rows,
    }
    name = "botorch_peer_quick" if args.quick else "botorch_peer"
    (out / f"{name}.json").write_text(json.dumps(meta, indent=2))
    plot(rows, out / f"{name}.png", meta)
    print(f"wrote {out / (name + '.json')} and {out / (name + '.png')}")
    return meta


def plot(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["n"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.loglog(n, [r["singletaskgp_s"]["median"] for r in rows], "o-", label="BoTorch SingleTaskGP")
    a.loglog(n, [r["bkbmodel_s"]["median"] for r in rows], "s-", label="torchbkb BKBModel")
    for r in rows:
        a.annotate(f"{r['ratio_median']:.0f}×", (r["n"], r["bkbmodel_s"]["median"]), textcoords="offset points",
                   xytext=(0, 8), ha="center", fontsize=8)
    a.set_xlabel("training points n")
    a.set_ylabel("seconds per BO iteration (median)")
    a.set_title("model + UCB over 20,640 candidates")
    a.legend()
    b.loglog(n, [max(r["peak_mem_mb"]["singletaskgp"], 1e-1) for r in rows], "o-", label="SingleTaskGP")
    b.loglog(n, [max(r["peak_mem_mb"]["bkbmodel"], 1e-1) for r in rows], "s-", label="BKBModel")
    for ax in (a, b):
        ax.set_xticks(n, [str(v) for v in n])
        ax.minorticks_off()
    b.set_xlabel("training points n")
    b.set_ylabel("peak memory of the iteration (MB)")
    b.legend()
    m = meta["machine"]
    fig.suptitle(f"{m['device']} · {m['cpu_count']} CPUs · {m['torch_threads']} torch threads · torch "
                 f"{meta['versions']['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
