"""How fast a BBKB run can be on the CPU: the loop's floor, the fewest operations of an update, the picks, the authors.

Issue 38 asks for 5× the authors' NumPy BBKB on the anchor (A = 1,000, T = 1,000, constant width 0.5, C̃ = 2, one
thread). A run is about 35 batches: each an update (resample, kernel rows, ``K_S``, refit, scores) and the in-batch
picks. This times, with one thread each and interleaved seed by seed (every method once, then again, ``--reps``
times), the milliseconds per run of:

* ``torchbkb`` -- :class:`~torchbkb.BBKB` through ``torchbkb.run``, with its own counters of the time spent in the
  picks (``time_in_batch``) and in the updates (``time_resparsify``);
* ``loop`` -- a bandit that asks for batches of the same sizes as ``torchbkb``'s run of that seed and learns
  nothing, through ``torchbkb.run``: what the ask/tell protocol and the loop cost before any algorithm;
* ``fewest update ops`` -- the fewest tensor operations of an update at the anchor's sizes
  (:func:`benchmarks.step_floor.fewest_ops_runner` without the UCB and its argmax: 30 operations, no checks), bare,
  times the run's number of batches; ``fewest update ops, NumPy`` the same in NumPy and SciPy's LAPACK wrappers;
* ``authors`` -- the authors' Batch_BKB through the peers harness (skipped when it cannot be imported), with NumPy's
  BLAS on one thread (``threadpoolctl``).

What the target needs: ``authors / (loop + picks + fewest update ops)``, with the picks as ``torchbkb`` makes them,
bounds the ratio a run whose updates are separate PyTorch operations reaches through this loop; with the NumPy
update, one whose updates are NumPy calls. Writes ``batch_floor.json`` and ``batch_floor.png``.

Usage::

    python -m benchmarks.batch_floor --threads 1
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.cli import base_parser, setup, with_one_blas_thread
from benchmarks.report import new_figure, print_table, save_figure, strip_plot, write_json
from benchmarks.step_floor import BETA, LAM, LENGTHSCALE, Q_BAR, T, fewest_numpy_ops_runner, fewest_ops_runner
from benchmarks.step_floor import authors_runner as authors_bkb_runner

BATCH_BOUND = 2.0


def torchbkb_runners():
    """``(bbkb, loop, sizes)``: runners ``(seed, T) -> dict`` of BBKB and of the loop at BBKB's batch sizes
    (``sizes``: seed -> the batch sizes of BBKB's last run of that seed)."""
    import torchbkb
    from torchbkb.bandits.base import KernelBandit
    from torchbkb.datasets import anchor_problem
    from torchbkb.gp.kernels import GaussianKernel
    from torchbkb.objectives import ArmObjective

    prob = anchor_problem(dtype=torch.float64)
    sizes: dict[int, list[int]] = {}

    class Replay(KernelBandit):
        """Batches of given sizes, always the first arms; learns nothing."""

        def _select(self):
            k = self.sizes[self.asked] if self.asked < len(self.sizes) else 1
            self.asked += 1
            return torch.arange(k)

        def _algorithm_state(self):
            return {}

        def _load_algorithm_state(self, state):
            pass

    def bbkb(seed: int, steps: int = T) -> dict:
        b = torchbkb.BBKB(prob.arms, GaussianKernel(LENGTHSCALE), noise=LAM, q_bar=Q_BAR, beta=BETA, seed=seed,
                          batch_bound=BATCH_BOUND)
        obj = ArmObjective(prob.values, noise_std=prob.noise_std, seed=seed)
        t0 = time.perf_counter()
        torchbkb.run(b, obj, budget=steps, progress=False, values=prob.values)
        wall = time.perf_counter() - t0
        sizes[seed] = list(b.batch_sizes)
        return {"s": wall, "picks_s": b.time_in_batch, "updates_s": b.time_resparsify, "batches": len(b.batch_sizes)}

    def loop(seed: int, steps: int = T) -> dict:
        b = Replay(prob.arms, GaussianKernel(LENGTHSCALE), noise=LAM, beta=BETA, seed=seed)
        b.sizes, b.asked = sizes[seed], 0
        obj = ArmObjective(prob.values, noise_std=prob.noise_std, seed=seed)
        t0 = time.perf_counter()
        torchbkb.run(b, obj, budget=steps, progress=False, values=prob.values)
        return {"s": time.perf_counter() - t0}

    return bbkb, loop, sizes


def bare_updates(step_runner):
    """``(seed, n) -> dict``: ``n`` bare updates of ``step_runner`` (a :mod:`benchmarks.step_floor` runner)."""

    def run(seed: int, n: int) -> dict:
        return {"s": step_runner(seed, n) * n}

    return run


def authors_runner(peers: str):
    """The authors' Batch_BKB (constant width 0.5) through the peers harness, or ``None``."""
    bkb = authors_bkb_runner(peers, "authors Batch_BKB (β=0.5)")
    if bkb is None:
        return None
    return lambda seed, steps=T: {"s": bkb(seed, steps) * steps}


def main(argv=None):
    return with_one_blas_thread(measure, argv)


def measure(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="interleaved rounds")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--peers", default="../shared/peers", help="the peers harness directory")
    args = p.parse_args(argv)
    setup(args, default_threads=1)
    steps = 200 if args.quick else T
    if args.quick:
        args.reps, args.seeds = 1, 1
    bbkb, loop, sizes = torchbkb_runners()
    update = bare_updates(fewest_ops_runner(ucb=False))
    try:
        update_np = bare_updates(fewest_numpy_ops_runner(ucb=False))
    except ImportError as err:  # scipy missing
        print(f"the NumPy update skipped: {err!r}")
        update_np = None
    authors = authors_runner(args.peers)
    for seed in range(args.seeds):  # warm-up, and each seed's batch sizes for the loop
        batches = bbkb(seed, steps)["batches"]
        loop(seed, steps)
        update(seed, batches)
        if update_np is not None:
            update_np(seed, batches)
        if authors is not None:
            authors(seed, steps)
    names = ["torchbkb", "loop", "fewest update ops"] + ["fewest update ops, NumPy"] * (update_np is not None)
    names += ["authors"] * (authors is not None)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(args.reps):
        for seed in range(args.seeds):
            out = bbkb(seed, steps)
            runs["torchbkb"].append(out)
            runs["loop"].append(loop(seed, steps))
            runs["fewest update ops"].append(update(seed, out["batches"]))
            if update_np is not None:
                runs["fewest update ops, NumPy"].append(update_np(seed, out["batches"]))
            if authors is not None:
                runs["authors"].append(authors(seed, steps))
        print(f"round {rep}: " + ", ".join(f"{k} {1e3 * v[-1]['s']:.1f} ms" for k, v in runs.items()), flush=True)
    med = {k: statistics.median(r["s"] for r in v) for k, v in runs.items()}
    for part in ("picks_s", "updates_s"):
        med[part] = statistics.median(r[part] for r in runs["torchbkb"])
    floor = med["loop"] + med["picks_s"] + med["fewest update ops"]
    np_floor = med["loop"] + med["picks_s"] + med["fewest update ops, NumPy"] if update_np is not None else None
    rows = [{"method": k, "ms_per_run": 1e3 * med[k], "authors_over_this": med["authors"] / med[k]
             if "authors" in med else None} for k in names]
    rows += [{"method": "torchbkb: its picks", "ms_per_run": 1e3 * med["picks_s"], "authors_over_this": None},
             {"method": "torchbkb: its updates", "ms_per_run": 1e3 * med["updates_s"], "authors_over_this": None},
             {"method": "loop + picks + fewest update ops", "ms_per_run": 1e3 * floor,
              "authors_over_this": med["authors"] / floor if "authors" in med else None}]
    if np_floor is not None:
        rows.append({"method": "loop + picks + fewest update ops, NumPy", "ms_per_run": 1e3 * np_floor,
                     "authors_over_this": med["authors"] / np_floor if "authors" in med else None})
    print_table(rows, ["method", "ms_per_run", "authors_over_this"], title="ms per BBKB run on the anchor, one thread")
    write_json(args.out, "batch_floor", {"T": steps, "reps": args.reps, "seeds": args.seeds, "rows": rows,
                                         "batch_sizes": {str(k): v for k, v in sizes.items()}})
    fig, axes = new_figure(width=7.0)
    ax = axes[0, 0]
    series = {k: [1e3 * r["s"] for r in runs[k]] for k in names}
    series["torchbkb: picks"] = [1e3 * r["picks_s"] for r in runs["torchbkb"]]
    series["loop + picks + fewest update ops"] = [  # run by run, the parts measured in the same round
        1e3 * (lp["s"] + tb["picks_s"] + up["s"])
        for lp, tb, up in zip(runs["loop"], runs["torchbkb"], runs["fewest update ops"])]
    strip_plot(ax, list(series), list(series.values()), rotation=25)
    ax.set_ylabel("ms per run of T = 1,000 (one thread)")
    ax.set_title("BBKB on the anchor: the run, its floor's parts, the authors'")
    print(save_figure(fig, args.out, "batch_floor"))


if __name__ == "__main__":
    main()
