"""torchbkb benchmarks: the papers' experiments, peers side by side, scaling and core throughput.

Run from the repository root::

    python -m benchmarks                       # the main job: the regret suite on Cadata (~10 min, 2 cores)
    python -m benchmarks --quick               # the same at smoke-test size (under a minute)
    python -m benchmarks --full                # the papers' sizes: Abalone and Cadata, T = 10⁴, 10 repetitions
    python -m benchmarks --all                 # every benchmark below at its default size (about an hour)
    python -m benchmarks --only scaling,batch --device cuda --out results/

Each benchmark writes ``<out>/<name>.json`` (config, machine, raw numbers) and PNG plots, and prints
a results table. They are also runnable one by one: ``python -m benchmarks.core_throughput --quick``.

Benchmarks (name -> module):

* ``regret`` -- **the main job**: BBKB paper Sec. 4 / Fig. 1 and its batch-size figure: BBKB, BKB, GP-UCB,
  GP-BUCB, ε-greedy and the BoTorch exact-GP peer on Cadata (and Abalone with ``--full``);
* ``variance_starvation`` -- BKB paper Fig. 1 (exact GP vs DTC/BKB vs SoR);
* ``scaling`` -- BKB per-step time vs A (10³..10⁶) and vs t (to 10⁴), log-log slopes;
* ``sequential`` -- BKB vs GPUCB per-step time vs t and A; the anchor problem with the authors' and BoTorch's times;
* ``core_throughput`` -- issue 2: embed/score A = 10⁵..10⁶ arms vs a bare GEMM, peak memory;
* ``batch`` -- issue 8: BBKB vs GP-BUCB/GP-UCB/BKB at T = 10⁴ on Cadata, extrapolated exact peers;
* ``botorch_peer`` -- issue 4: one BO iteration, BKBModel vs SingleTaskGP, n = 500..5,000;
* ``botorch_iteration`` -- a continuous BO iteration (LogEI + optimize_acqf): BKBModel vs SingleTaskGP (fixed,
  fitted) vs SingleTaskVariationalGP, n = 250..5,000, d = 2, 6, time and memory;
* ``botorch_candidates`` -- UCB, BBKB and Thompson selections over 10⁵-10⁷ candidates, time and peak memory;
* ``botorch_scale`` -- fitted BKBModel vs fitted SingleTaskGP / SingleTaskVariationalGP: quality at n = 600,
  fit + predict at n = 3,000-5,000, a BO loop iteration (fit + BBKB batch) at n = 10⁴-10⁵;
* ``botorch_closed_loop`` -- BO loops with the fitted BKBModel and the fitted SingleTaskGP, qLogNEI, equal
  evaluations, over seeds;
* ``inclusion`` -- the dictionary inclusion rule for repeated pulls: regret vs exact GP-UCB on the anchor, GP
  samples, Cadata and Abalone (docs/readings.md);
* ``launches`` -- tensor operations and host synchronizations per BKB step and per BBKB pick;
* ``sbpe`` -- issue 6: S-BPE vs exact BPE, interval coverage and time;
* ``online`` -- issue 7: PKAWV vs Kernel-AWV / online KRR / FOGD, regret and time per round.

Algorithms are looked up in :mod:`benchmarks.registry`. Studies that are run on demand, not by ``--all``, have their own
modules: ``sequential_studies``, ``batch_studies``, ``float32_check``, ``paper_readings`` (the readings of 001 Sec. 4
under which the paper's figures appear), ``high_throughput`` (trust-region BKB against TuRBO-1 on a SingleTaskGP,
global BKB loops and Sobol search in 20-60 dimensions; ``--study speed``: one proposal's time against ``n``; hours)
``tutorial_swap`` (BoTorch's and Ax's tutorial flows with SingleTaskGP swapped for BKBModel) and ``ab_commits`` (a git
revision and the working tree in one process, whole runs alternated) (``python -m benchmarks.<name>``).
"""

MAIN = "regret"  # what `python -m benchmarks` runs without --only/--all

BENCHMARKS = {
    "regret": "benchmarks.regret",
    "variance_starvation": "benchmarks.variance_starvation",
    "scaling": "benchmarks.scaling",
    "sequential": "benchmarks.sequential",
    "core_throughput": "benchmarks.core_throughput",
    "batch": "benchmarks.batch",
    "botorch_peer": "benchmarks.botorch_peer",
    "botorch_iteration": "benchmarks.botorch_iteration",
    "botorch_candidates": "benchmarks.botorch_candidates",
    "botorch_scale": "benchmarks.botorch_scale",
    "botorch_closed_loop": "benchmarks.botorch_closed_loop",
    "inclusion": "benchmarks.inclusion",
    "launches": "benchmarks.launches",
    "sbpe": "benchmarks.sbpe",
    "online": "benchmarks.online",
}

# The common options each benchmark understands (None: all of them); the runner drops the others, saying so.
OPTIONS = {
    "batch": {"--quick", "--device", "--dtype", "--threads", "--out"},
    "botorch_peer": {"--quick", "--device", "--threads", "--out"},
    "botorch_iteration": {"--quick", "--threads", "--out"},
    "botorch_candidates": {"--quick", "--threads", "--out"},
    "botorch_scale": {"--quick", "--full", "--threads", "--out"},
    "botorch_closed_loop": {"--quick", "--threads", "--out"},
    "inclusion": {"--quick", "--full", "--device", "--dtype", "--threads", "--out"},
    "launches": {"--quick", "--device", "--dtype", "--threads", "--out"},
    "sbpe": {"--quick", "--threads", "--out"},
    "online": {"--quick", "--threads", "--out"},
}
