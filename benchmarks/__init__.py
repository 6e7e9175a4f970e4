"""torchbkb benchmarks: the papers' experiments, peers side by side, scaling and core throughput.

Run from the repository root::

    python -m benchmarks                       # every benchmark at its default size
    python -m benchmarks --quick               # smoke-test sizes (about a minute in all)
    python -m benchmarks --full                # the papers' sizes (hours)
    python -m benchmarks --only regret,scaling --device cuda --out results/

Each benchmark writes ``<out>/<name>.json`` (config, machine, raw numbers) and PNG plots, and prints
a results table. They are also runnable one by one: ``python -m benchmarks.core_throughput --quick``.

Benchmarks (name -> module):

* ``variance_starvation`` -- BKB paper Fig. 1 (exact GP vs DTC/BKB vs SoR);
* ``core_throughput`` -- issue 2: embed/score A = 10⁵..10⁶ arms vs a bare GEMM, peak memory;
* ``scaling`` -- BKB per-step time vs A (10³..10⁶) and vs t (to 10⁴), log-log slopes;
* ``sequential`` -- issue 3: BKB vs GPUCB per-step time vs t and A; the DESIGN §6 anchor with BoTorch;
* ``regret`` -- the BBKB paper's Sec. 4 settings on Cadata (and Abalone with ``--full``), all algorithms.

Algorithms are looked up in a registry (:mod:`benchmarks.common`, entries in :mod:`benchmarks.algorithms`).
"""

BENCHMARKS = {
    "variance_starvation": "benchmarks.variance_starvation",
    "core_throughput": "benchmarks.core_throughput",
    "scaling": "benchmarks.scaling",
    "sequential": "benchmarks.sequential",
    "regret": "benchmarks.regret",
}
