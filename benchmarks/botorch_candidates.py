"""BoTorch selections over 10⁵-10⁷ discrete candidates: time and peak memory of each, in a fresh interpreter.

Setting: d = 6, n = 300 training points of Hartmann-6, ``BKBModel`` with its defaults (seed 0) and
``SingleTaskGP`` with the same fixed hyperparameters; ``A`` uniform candidates in the unit cube (float64,
``A·48`` bytes). Selections:

* ``UCB SingleTaskGP`` / ``UCB BKBModel`` -- ``optimize_acqf_discrete(UpperConfidenceBound(beta=4), q=1)``
  (BoTorch evaluates the candidates in chunks of 2,048);
* ``BBKB batch`` -- :func:`torchbkb.botorch.optimize_acqf_bbkb` (``C̃ = 2``, width 2, at most 100 picks);
* ``Thompson q=10`` -- :func:`torchbkb.botorch.optimize_acqf_thompson` (10 pathwise draws, 1,024 features).

Each (selection, A) runs once in a new interpreter that builds the data, warms the code path on 10⁴
candidates, then reports the seconds and the rise of the resident-set high-water mark during the call
("extra" memory; ``× cand`` is that over the candidates' own bytes).

Usage::

    python -m benchmarks.botorch_candidates --threads 2          # A = 10⁵, 10⁶, 10⁷ (about 15 min)
    python -m benchmarks.botorch_candidates --quick --threads 2  # A = 10⁴, 10⁵
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from benchmarks.cli import base_parser, setup, size_of
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import reset_hwm, status_kb

SELECTIONS = ("UCB SingleTaskGP", "UCB BKBModel", "BBKB batch", "Thompson q=10")
D, N = 6, 300


def _models():
    from botorch.models import SingleTaskGP
    from botorch.test_functions import Hartmann

    from torchbkb.botorch import BKBModel, default_kernel
    from torchbkb.botorch.defaults import DEFAULT_NOISE

    g = torch.Generator().manual_seed(0)
    X = torch.rand(N, D, generator=g, dtype=torch.float64)
    Y = Hartmann(D, negate=True)(X).unsqueeze(-1)
    gp = SingleTaskGP(X, Y, covar_module=default_kernel(D))
    gp.likelihood.noise = torch.tensor([DEFAULT_NOISE], dtype=torch.float64)
    return gp.eval(), BKBModel(X, Y, kernel=default_kernel(D), noise=DEFAULT_NOISE, seed=0)  # gp's hyperparameters


def select(name: str, gp, bkb, choices):
    from botorch.acquisition import UpperConfidenceBound
    from botorch.optim import optimize_acqf_discrete

    from torchbkb.botorch import optimize_acqf_bbkb, optimize_acqf_thompson

    with torch.no_grad():
        if name == "UCB SingleTaskGP":
            return optimize_acqf_discrete(UpperConfidenceBound(gp, beta=4.0), q=1, choices=choices)[0]
        if name == "UCB BKBModel":
            return optimize_acqf_discrete(UpperConfidenceBound(bkb, beta=4.0), q=1, choices=choices)[0]
        if name == "BBKB batch":
            return optimize_acqf_bbkb(bkb, choices, batch_bound=2.0, beta=2.0, max_batch_size=100)[0]
    return optimize_acqf_thompson(bkb, choices, q=10)[0]


def _child(name: str, A: int) -> None:
    gp, bkb = _models()
    g = torch.Generator().manual_seed(A)
    select(name, gp, bkb, torch.rand(10_000, D, generator=g, dtype=torch.float64))  # warm-up
    choices = torch.rand(A, D, generator=g, dtype=torch.float64)
    reset_hwm()
    base = status_kb("VmRSS")
    t0 = time.perf_counter()
    picks = select(name, gp, bkb, choices)
    seconds = time.perf_counter() - t0
    extra_mb = (status_kb("VmHWM") - base) / 1024
    print(json.dumps({"seconds": seconds, "extra_mb": extra_mb, "picks": int(picks.shape[0]),
                      "dictionary_size": bkb.num_inducing, "exact": bkb.is_exact}))




def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--candidates", type=int, nargs="*", default=None)
    p.add_argument("--_child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    setup(args)
    if args._child:
        return _child(args._child[0], int(args._child[1]))
    size = size_of(args)
    sizes = args.candidates or ([10_000, 100_000] if size == "quick" else [100_000, 1_000_000, 10_000_000])
    rows = []
    for A in sizes:
        for name in SELECTIONS:
            cmd = [sys.executable, "-m", "benchmarks.botorch_candidates", "--_child", name, str(A)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                rows.append({"A": A, "selection": name, "error": res.stderr.strip().splitlines()[-1][:200]})
                continue
            out = json.loads(res.stdout.strip().splitlines()[-1])
            cand_mb = A * D * 8 / 2**20
            rows.append({"A": A, "selection": name, **out, "candidates_mb": cand_mb,
                         "extra_over_candidates": out["extra_mb"] / cand_mb})
        base = next((r["seconds"] for r in rows if r["A"] == A and r["selection"] == "UCB SingleTaskGP"
                     and "seconds" in r), None)
        for r in rows:
            if r["A"] == A and "seconds" in r and base:
                r["time_ratio_to_gp_ucb"] = r["seconds"] / base
        print_table([r for r in rows if r["A"] == A],
                    ["A", "selection", "seconds", "extra_mb", "extra_over_candidates", "picks", "time_ratio_to_gp_ucb"])
    payload = {"size": size,
               "settings": {"d": D, "n": N, "dtype": "float64", "ucb_beta": 4.0,
                            "bbkb": {"batch_bound": 2.0, "beta": 2.0, "max_batch_size": 100},
                            "thompson": {"q": 10, "num_features": 1024}}, "rows": rows}
    path = write_json(args.out, "botorch_candidates", payload)
    _plot(rows, args.out)
    print(f"wrote {path}")
    return payload


def _plot(rows, out):
    fig, axes = new_figure(ncols=2, width=5.0, height=3.8)
    for name, marker in zip(SELECTIONS, "so^v"):
        pts = [(r["A"], r["seconds"], r["extra_over_candidates"]) for r in rows if r["selection"] == name
               and "seconds" in r]
        if pts:
            A, secs, mem = zip(*pts)
            axes[0][0].loglog(A, secs, marker + "-", label=name)
            axes[0][1].semilogx(A, mem, marker + "-", label=name)
    axes[0][0].set_xlabel("candidates A")
    axes[0][0].set_ylabel("seconds per selection")
    axes[0][1].set_xlabel("candidates A")
    axes[0][1].set_ylabel("extra peak memory / candidates' bytes")
    axes[0][1].axhline(10, color="k", lw=0.8, ls="--")
    for ax in axes[0]:
        ax.legend(fontsize=7)
    return save_figure(fig, out, "botorch_candidates")


if __name__ == "__main__":
    main()
