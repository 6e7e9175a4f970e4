"""Two versions of torchbkb in one process: whole runs alternated, for changes smaller than the VM's noise.

Runs of the same code in two processes on the 2-core VM differ by 0.7-1.5× from one minute to the next, so a
change worth 5-10 % cannot be seen by timing processes one after the other. This extracts the package at ``--base``
(``git archive``) as a second package, ``torchbkb_base`` (every ``torchbkb`` name in its sources renamed), imports
both into this process and runs each case with the two alternately, seed by seed, the order swapped every other
pair, timing CPU time (``time.process_time``: a stolen slice of the VM does not count). Every pair must make the same
picks unless ``--allow-different``. Cases (one thread):

* ``bkb_anchor`` and ``bbkb_anchor`` -- the anchor (A = 1,000, T = 1,000, constant width 0.5, C̃ = 2);
* ``bbkb_cadata`` -- BBKB on Cadata, T = 10⁴, β = 2√λ (the peers harness's P2 settings).

Reports, per case, the medians of the base and of the working tree (``old / new``: above 1, the working tree is
faster) and the median of the per-pair ratios. Writes ``ab_commits.json`` and ``ab_commits.png``.

Usage::

    python -m benchmarks.ab_commits --base HEAD~3 --cases bbkb_anchor bkb_anchor --rounds 10
"""

from __future__ import annotations

import importlib
import io
import math
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.report import new_figure, print_table, save_figure, strip_plot, write_json

REPO = Path(__file__).resolve().parents[1]
BASE_NAME = "torchbkb_base"


def base_package(rev: str, root: Path) -> str:
    """Extract ``torchbkb/`` at ``rev`` into ``root`` as the package :data:`BASE_NAME` and return its name."""
    out = subprocess.run(["git", "-C", str(REPO), "archive", rev, "torchbkb"], capture_output=True)
    if out.returncode:
        raise SystemExit(f"ab_commits: expected a git revision of {REPO}, got {rev!r} "
                         f"({out.stderr.decode(errors='replace').strip()})")
    tar_bytes = out.stdout
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(root, filter="data")
        else:  # Python without extraction filters: git's own archive of this repository
            tar.extractall(root)
    pkg = root / BASE_NAME
    (root / "torchbkb").rename(pkg)
    for path in pkg.rglob("*.py"):  # imports, lazy imports and module names in strings alike
        path.write_text(re.sub(r"\btorchbkb\b", BASE_NAME, path.read_text()))
    return BASE_NAME


def case_runner(case: str, name: str):
    """``seed -> (cpu seconds, picks)`` of ``case`` with the package ``name``."""
    pkg = importlib.import_module(name)
    datasets = importlib.import_module(f"{name}.datasets")
    kernels = importlib.import_module(f"{name}.gp.kernels")
    objectives = importlib.import_module(f"{name}.objectives")
    if case == "bbkb_cadata":
        arms, _ = datasets.load("cadata", dtype=torch.float64)
        _, f = datasets.load("cadata", dtype=torch.float64, standardize_rewards=False)
        kern = kernels.GaussianKernel.from_width(5.0)

        def run(seed: int, T: int):
            b = pkg.BBKB(arms, kern, noise=0.2, q_bar=2.0, beta=2 * math.sqrt(0.2), batch_bound=2.0, seed=seed,
                         F=20.0, delta=1e-4)
            t0 = time.process_time()
            hist = pkg.run(b, f, budget=T, progress=False, values=f)
            return time.process_time() - t0, list(hist.index)

        return run
    prob = datasets.anchor_problem(dtype=torch.float64)

    def run(seed: int, T: int):
        common = {"noise": 0.01, "q_bar": 2.0, "beta": 0.5, "seed": seed}
        if case == "bkb_anchor":
            b = pkg.BKB(prob.arms, kernels.GaussianKernel(0.2), **common)
        else:
            b = pkg.BBKB(prob.arms, kernels.GaussianKernel(0.2), batch_bound=2.0, F=1.0, delta=1e-3, **common)
        obj = objectives.ArmObjective(prob.values, noise_std=prob.noise_std, seed=seed)
        t0 = time.process_time()
        hist = pkg.run(b, obj, budget=T, progress=False, values=prob.values)
        return time.process_time() - t0, list(hist.index)

    return run


def alternate(old, new, seeds: int, rounds: int, T: int, same_picks: bool) -> tuple[list[float], list[float]]:
    """CPU seconds of ``old`` and ``new`` over ``rounds × seeds`` pairs, the order swapped every other pair."""
    old_s, new_s = [], []
    for r in range(rounds):
        for seed in range(seeds):
            first, second = (old, new) if (r + seed) % 2 == 0 else (new, old)
            a, b = first(seed, T), second(seed, T)
            (t_old, p_old), (t_new, p_new) = (a, b) if first is old else (b, a)
            if same_picks and p_old != p_new:
                raise AssertionError(f"seed {seed}: the two versions picked differently")
            old_s.append(t_old)
            new_s.append(t_new)
    return old_s, new_s


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="the git revision to compare the working tree with")
    p.add_argument("--cases", nargs="+", default=["bbkb_anchor", "bkb_anchor"],
                   choices=["bkb_anchor", "bbkb_anchor", "bbkb_cadata"])
    p.add_argument("--rounds", type=int, default=10, help="pairs per seed")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--allow-different", action="store_true", help="do not require the same picks")
    args = p.parse_args(argv)
    setup(args, default_threads=1)
    if args.quick:
        args.rounds, args.seeds = 1, 1
    rows, pairs = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        try:
            base = base_package(args.base, Path(tmp))
            for case in args.cases:
                T = (200 if case == "bbkb_cadata" else 100) if args.quick else (10_000 if case == "bbkb_cadata"
                                                                                  else 1000)
                old, new = case_runner(case, base), case_runner(case, "torchbkb")
                old(0, T), new(0, T)  # imports, caches
                old_s, new_s = alternate(old, new, args.seeds, args.rounds, T, not args.allow_different)
                ratios = [a / b for a, b in zip(old_s, new_s)]
                pairs[case] = ratios
                rows.append({"case": case, "T": T, "pairs": len(ratios), "old_s": statistics.median(old_s),
                             "new_s": statistics.median(new_s),
                             "old_over_new": statistics.median(old_s) / statistics.median(new_s),
                             "paired_median": statistics.median(ratios), "old_runs_s": old_s, "new_runs_s": new_s})
        finally:
            sys.path.remove(tmp)
            for name in [m for m in sys.modules if m == BASE_NAME or m.startswith(BASE_NAME + ".")]:
                del sys.modules[name]  # its files are deleted with the folder
    print_table(rows, ["case", "pairs", "old_s", "new_s", "old_over_new", "paired_median"],
                title=f"{args.base} (old) against the working tree (new), CPU seconds a run")
    write_json(args.out, "ab_commits", {"base": args.base, "rounds": args.rounds, "seeds": args.seeds, "rows": rows})
    fig, axes = new_figure(width=5.5)
    ax = axes[0, 0]
    strip_plot(ax, list(pairs), list(pairs.values()))
    ax.set_yscale("linear")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("old / new, CPU time of a pair")
    ax.set_title(f"{args.base} against the working tree")
    print(save_figure(fig, args.out, "ab_commits"))


if __name__ == "__main__":
    main()
