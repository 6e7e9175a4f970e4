"""Tensor operations (kernel launches on a GPU) and host synchronizations per BKB step and per BBKB pick.

A step's arithmetic on the anchor is a few microseconds; what it costs beyond that is the number of tensor
operations it dispatches (each one a kernel launch on CUDA) and of the points where the host must wait for the
device (``.item()``, ``bool(tensor)``, ``nonzero``, boolean masks: data-dependent shapes). This counts both:

* **operations**: the ``aten::`` operators the PyTorch profiler records at the top level of the dispatcher
  (calls made by other operators are not counted again), per step;
* **kernels**: the operators that do work, counted at the dispatcher (:class:`KernelCount`: views, no-op casts and
  empty allocations left out, composite operators counted as their parts), per step -- a GPU's launches, roughly;
* **synchronizations**: on CUDA, the warnings of ``torch.cuda.set_sync_debug_mode("warn")``; on the CPU, where
  nothing waits, the operators that would synchronize a GPU (``aten::_local_scalar_dense``, ``aten::nonzero``,
  ``aten::masked_select``, ``aten::unique*``, ``aten::is_nonzero``) and the ``Tensor.tolist`` calls, as a forecast.

Cases (steps counted after a warm-up, the median per step over the measured window):

* ``bkb_anchor`` -- BKB on the anchor problem (A = 1,000, d = 2), constant width, one ``ask`` + ``tell`` per step;
* ``bbkb_anchor`` -- BBKB on the anchor (C̃ = 2): per evaluation of a whole run of 1,000 from a fresh bandit, as
  ``torchbkb.run`` and the peers' harness make it (the batch that crosses the budget told in part; about 34
  batches). Its batches grow with the pull counts (``σ̃² ≈ 1/n``): past t ≈ 500 one is 10⁴-10⁵ picks of one arm,
  so a count per pick after a warm-up would describe no run anyone makes;
* ``bkb_large`` -- BKB on ``--arms`` random arms in d = 8 (default 10⁵); ``bkb_large_all`` the same with every arm's
  variance scored at every step (``prune=False``: the step the floor below describes);
* ``bbkb_cadata`` -- BBKB on Cadata (A = 20,640, d = 8) at ``benchmarks.batch``'s settings (constant width,
  C̃ = 2): per pick, as ``bbkb_anchor``; its synchronizations per batch are ``syncs_per_pick × picks_per_step``;
* ``*_fixed`` / ``*_eager`` -- the same bandit as on a GPU (the fixed-capacity update, ``fixed_capacity = True``:
  one host read per update, every arm scored; BBKB's device loop, replayed picks and deferred update) or as on the
  CPU (the eager update with its data-dependent shapes and pruning; the lazy loop), whatever the device;
  ``--compiled`` runs the fixed-capacity update through ``torch.compile`` (``bandit.engine.compiled``) and BBKB's
  replayed picks too (``PickGraphs(compiled=True)``; ``--compiled-picks`` the picks alone); on CUDA the update
  replays from CUDA graphs (``bandit.engine.graphs``; ``--no-update-graphs`` launches it operation by operation).
  Past ``FIXED_ROWS_MAX`` padded row entries an update that prunes runs eagerly (BKB at 10⁶ arms);
  ``--fixed-rows-max`` moves that limit.
  A replayed update's kernels run inside its graph: the counts see its copies in and out, not them. On the CPU the
  BKB ``_fixed`` cases also forecast that count (``kernels_per_pick_update_replayed``: the graph's buffers run
  eagerly, the update's own kernels counted apart and replaced by one launch).

Beside the counts, each case times its steps without the profiler (the median over ``--timed-steps`` steps)
and, interleaved with them, its **arithmetic floor**: the ``(A × m)·(m × m)`` product that scores every arm at
the final dictionary size ``m`` (the least a step must compute), timed as a bare GEMM on the same device (the
fastest of the `(A, m)·(m, m)` and `(m, m)·(m, A)` layouts and of a 4,096-column slice scaled to A, which stays
in cache as the library's chunked scoring does). The
ratio step / floor says how much of a step is arithmetic; at A = 1,000 it is dispatch and bookkeeping.

Usage::

    python -m benchmarks.launches --threads 1
    python -m benchmarks.launches --device cuda
"""

from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.cli import base_parser, setup
from benchmarks.op_counts import SYNC_OPS, KernelCount, counted_tolist, sync_sites, top_level_ops
from benchmarks.report import new_figure, print_table, save_figure, write_json
from benchmarks.timing import sync

CHUNK = 4096  # columns of a cache-resident slice of the floor product, timed and scaled to A
BASE_CASES = ("bkb_anchor", "bbkb_anchor", "bkb_large", "bkb_large_all", "bbkb_cadata")
CASES = BASE_CASES + tuple(c + s for s in ("_fixed", "_eager") for c in BASE_CASES)
RUN_BUDGET = {"bbkb_anchor": 1000}  # cases counted over a whole run of this many evaluations


def bandit(case: str, device, dtype, arms_large: int, chunk_size: int | None = None, compiled: bool = False,
           update_graphs: bool = True, compiled_picks: bool = False, kernel_cache_bytes: int | None = None):
    """The case's bandit; a ``_fixed`` case runs as on a GPU (the fixed-capacity update, BBKB's device loop), an
    ``_eager`` one as on the CPU (the eager update, the lazy loop), whatever the device; ``compiled`` compiles the
    fixed-capacity update and BBKB's replayed picks, ``compiled_picks`` the picks alone; without ``update_graphs``
    the update is never replayed from a CUDA graph; ``kernel_cache_bytes``: the ``bkb_large`` bandit's (its
    dictionary's rows streamed past it)."""
    base = case.removesuffix("_fixed").removesuffix("_eager")
    b, values, noise_std = plain_bandit(base, device, dtype, arms_large, chunk_size, kernel_cache_bytes)
    if base != case:
        b.fixed_capacity = case.endswith("_fixed")
        if hasattr(b, "device_loop"):
            b.device_loop = b.fixed_capacity
    b.engine.compiled = compiled
    if not update_graphs:
        b.engine.graphs = None
    if base != case and getattr(b, "pick_graphs", None) is not None:
        from torchbkb.bandits.pick_graph import PickGraphs

        # as on a GPU: replayed picks (eagerly off CUDA, on the same buffers), the batch end's update deferred
        picks = PickGraphs(devices=("cpu", "cuda"), compiled=compiled or compiled_picks)
        b.pick_graphs = picks if b.fixed_capacity else None
    return b, values, noise_std


def plain_bandit(case: str, device, dtype, arms_large: int, chunk_size: int | None = None,
                 kernel_cache_bytes: int | None = None):
    from torchbkb import BBKB, BKB
    from torchbkb.datasets import ANCHOR_SETTINGS, anchor_problem
    from torchbkb.gp.kernels import GaussianKernel

    if case == "bbkb_cadata":
        from benchmarks.batch import build, load_cadata

        arms, values = load_cadata(dtype, device)
        b = build("BBKB", "constant", arms, 10_000, seed=0)
        return b, values, 0.0  # benchmarks.batch tells the noise-free values
    if case.startswith("bkb_large"):
        g = torch.Generator().manual_seed(0)
        arms = torch.rand(arms_large, 8, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
        values = torch.sin(6 * arms).sum(-1)
        return BKB(arms, GaussianKernel(0.5), noise=0.01, beta=0.5, seed=0, prune=case == "bkb_large",
                   chunk_size=chunk_size, kernel_cache_bytes=kernel_cache_bytes), values, 0.1
    arms, values, noise_std, _ = anchor_problem(dtype=dtype, device=device)
    kernel = GaussianKernel(ANCHOR_SETTINGS["lengthscale"])
    if case == "bkb_anchor":
        bkb = BKB(arms, kernel, noise=ANCHOR_SETTINGS["noise"], beta=0.5, seed=0, chunk_size=chunk_size)
        return bkb, values, noise_std
    return BBKB(arms, kernel, noise=ANCHOR_SETTINGS["noise"], beta=0.5, batch_bound=2.0, seed=0,
                chunk_size=chunk_size), values, noise_std


def stepper(case: str, args, device, dtype, budget: int | None = None):
    """A fresh bandit of the case and its ``step()`` (one ``ask`` and ``tell``, returning the picks told): with a
    ``budget``, the picks past that many evaluations are not told, as ``torchbkb.run`` does."""
    b, values, noise_std = bandit(case, device, dtype, args.arms, args.chunk_size, args.compiled,
                                  not args.no_update_graphs, args.compiled_picks,
                                  getattr(args, "kernel_cache_bytes", None))
    g = torch.Generator(device=values.device).manual_seed(1)
    on_host = values.detach().cpu() if args.host_rewards else None  # a black box on the host: no device read
    g_host = torch.Generator().manual_seed(1)
    told = [0]

    def step() -> int:
        idx = b.ask()
        if budget is not None and told[0] + idx.shape[0] > budget:
            idx = idx[: budget - told[0]]
        if on_host is None:
            y = values[idx] + noise_std * torch.randn(idx.shape, generator=g, dtype=values.dtype, device=values.device)
        else:
            ids = torch.tensor(b.pending_ids[: idx.shape[0]])
            y = on_host[ids] + noise_std * torch.randn(ids.shape, generator=g_host, dtype=on_host.dtype)
        b.tell(idx, y)
        told[0] += int(idx.shape[0])
        return int(idx.shape[0])

    return b, step, told


def profiled_step(step, device, sites: Counter) -> tuple[int, list[str], int]:
    """Run ``step()`` under the profiler: the picks it told, its top-level operators and its synchronizations
    (measured on CUDA, forecast elsewhere)."""
    with warnings.catch_warnings(record=True) as caught, sync_sites(sites):
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        with profile(activities=[ProfilerActivity.CPU]) as prof, counted_tolist() as lists:
            k = step()
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    names = top_level_ops(prof)
    forecast = sum(1 for n in names if n in SYNC_OPS) + lists[0]
    cuda_syncs = sum(1 for w in caught if "synchroniz" in str(w.message).lower()) + sites.pop("_n", 0)
    return k, names, cuda_syncs if device.type == "cuda" else forecast


def row(case: str, b, device, step_s: float, floor_s: float, ops: float, kernels: float, syncs: float,
        picks: float, sites: Counter, last: Counter, replayed: float | None = None, host_rewards: bool = False,
        whole_run: int | None = None) -> dict:
    """One case's results (counts per pick, or per evaluation of a ``whole_run``)."""
    return {"step_s": step_s, "floor_s": floor_s, "step_over_floor": step_s / floor_s, "num_arms": b.num_arms,
            "case": case, "device": str(device), "compiled": b.engine.compiled, "host_rewards": host_rewards,
            "compiled_picks": bool(getattr(getattr(b, "pick_graphs", None), "compiled", False)),
            "whole_run": whole_run, "ops_per_pick": ops, "kernels_per_pick": kernels,
            "kernels_per_pick_update_replayed": replayed, "syncs_per_pick": syncs,
            "sync_kind": "measured (set_sync_debug_mode)" if device.type == "cuda" else "forecast (data-dependent ops)",
            "picks_per_step": picks, "sync_sites": dict(sites.most_common(20)), "dictionary_size": b.dictionary_size,
            "streams_kernel_rows": b.streams_kernel_rows,
            "update_graphs_built": None if b.engine.graphs is None else b.engine.graphs.built,
            "top_ops_last_step": dict(last.most_common(12))}


def count(case: str, args, device, dtype) -> dict:
    budget = RUN_BUDGET.get(case.removesuffix("_fixed").removesuffix("_eager"))
    if budget is not None:
        return count_run(case, args, device, dtype, budget)
    b, step, _ = stepper(case, args, device, dtype)
    for _ in range(args.warmup):
        step()
    sync(device)
    ops, syncs, picks, sites = [], [], [], Counter()
    for _ in range(args.steps):
        k, names, n_sync = profiled_step(step, device, sites)
        picks.append(k)
        ops.append(len(names) / k)
        syncs.append(n_sync / k)
        last = Counter(names)
    kernels = []
    for _ in range(args.steps):
        with KernelCount() as kc:
            k = step()
        kernels.append(kc.work / k)
    replayed = None
    if device.type == "cpu" and case.startswith("bkb_") and b.fixed_capacity and not b.engine.compiled:
        replayed = replayed_kernels(b, step, args.steps)
    step_s, floor_s = time_steps(b, step, device, dtype, args.timed_steps)
    return row(case, b, device, step_s, floor_s, statistics.median(ops), statistics.median(kernels),
               statistics.median(syncs), statistics.median(picks), sites, last, replayed, args.host_rewards)


def count_run(case: str, args, device, dtype, budget: int) -> dict:
    """A case counted over whole runs of ``budget`` evaluations, each from a fresh bandit: operations and
    synchronizations (one run), kernels (another) and seconds (the median of ``--timed-steps`` runs, the floor GEMM
    at the final dictionary size timed after each) per evaluation; ``picks_per_step`` is the mean batch."""
    b, step, told = stepper(case, args, device, dtype, budget)
    ops = n_sync = batches = 0
    sites = Counter()
    while told[0] < budget:
        _, names, n = profiled_step(step, device, sites)
        ops, n_sync, batches, last = ops + len(names), n_sync + n, batches + 1, Counter(names)
    b2, step2, told2 = stepper(case, args, device, dtype, budget)
    with KernelCount() as kc:
        while told2[0] < budget:
            step2()
    runs, floors = [], []
    for _ in range(max(args.timed_steps // 5, 1)):
        b3, step3, told3 = stepper(case, args, device, dtype, budget)
        sync(device)
        t0 = time.perf_counter()
        while told3[0] < budget:
            step3()
        sync(device)
        runs.append((time.perf_counter() - t0) / budget)
        floors.append(floor_time(b3.num_arms, b3.dictionary_size, device, dtype))
    floor_operands.cache_clear()
    return row(case, b, device, statistics.median(runs), statistics.median(floors), ops / budget, kc.work / budget,
               n_sync / budget, budget / batches, sites, last, host_rewards=args.host_rewards, whole_run=budget)


def replayed_kernels(b, step, n: int) -> float:
    """A forecast on the CPU: the kernels per pick a GPU launches with the fixed-capacity update replayed from a CUDA
    graph -- the step's, with the graph's buffers run eagerly (copies in and out included), less the update's own,
    plus one launch per update (the median over ``n`` steps)."""
    from torchbkb.bandits import fixed_capacity
    from torchbkb.bandits.update_graph import UpdateGraphs

    original, graphs, inner, per = fixed_capacity.fixed_update, b.engine.graphs, [], []

    def counted(*a, **kw):
        with KernelCount() as kc:
            out = original(*a, **kw)
        inner.append(kc.work)
        return out

    fixed_capacity.fixed_update, b.engine.graphs = counted, UpdateGraphs(devices=("cpu",))
    try:
        for _ in range(n):
            inner.clear()
            with KernelCount() as kc:
                k = step()
            per.append((kc.work - sum(inner) + len(inner)) / k)
    finally:
        fixed_capacity.fixed_update, b.engine.graphs = original, graphs
    return statistics.median(per)


def time_steps(b, step, device, dtype, n: int) -> tuple[float, float]:
    """Median seconds per pick over ``n`` steps, and of the floor GEMM at the current ``m`` (:func:`floor_time`),
    timed alternately (step, floor, step, ...) so that both see the same phase of the machine."""
    steps, floors = [], []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        k = step()
        sync(device)
        steps.append((time.perf_counter() - t0) / k)
        floors.append(floor_time(b.num_arms, b.dictionary_size, device, dtype))
    floor_operands.cache_clear()
    return statistics.median(steps), statistics.median(floors)


def floor_time(A: int, m: int, device, dtype) -> float:
    """Seconds of the ``(A × m)·(m × m)`` product that scores every arm at dictionary size ``m``: the fastest of the
    `(A, m)·(m, m)` and `(m, m)·(m, A)` layouts and of a 4,096-column slice scaled to ``A``."""
    K, Kt, M = floor_operands(A, max(m, 1), device, dtype)
    sync(device)
    t1 = time.perf_counter()
    K @ M
    sync(device)
    t2 = time.perf_counter()
    M @ Kt
    sync(device)
    t3 = time.perf_counter()
    M @ Kt[:, :CHUNK]
    sync(device)
    t4 = time.perf_counter()
    return min(t2 - t1, t3 - t2, (t4 - t3) * A / min(A, CHUNK))


@functools.lru_cache(maxsize=1)  # made once for the steps of a case (cleared after it: they can take gigabytes)
def floor_operands(A: int, m: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(K (A, m), Kᵀ (m, A) contiguous, M (m, m))``, random: the product in either layout."""
    K = torch.randn(A, m, device=device, dtype=dtype)
    return K, K.T.contiguous(), torch.randn(m, m, device=device, dtype=dtype)


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="*", choices=CASES, default=list(CASES))
    p.add_argument("--arms", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--steps", type=int, default=20, help="profiled steps")
    p.add_argument("--timed-steps", type=int, default=50,
                   help="steps timed without the profiler, beside the floor GEMM")
    p.add_argument("--compiled", action="store_true",
                   help="compile the fixed-capacity update (torch.compile, fullgraph; a failure falls back, recorded)")
    p.add_argument("--compiled-picks", action="store_true",
                   help="compile BBKB's replayed picks alone (PickGraphs(compiled=True); a failure falls back)")
    p.add_argument("--no-update-graphs", action="store_true",
                   help="never replay the fixed-capacity update from a CUDA graph (bandit.engine.graphs = None)")
    p.add_argument("--fixed-rows-max", type=float, default=None,
                   help="the padded row entries (m_cap × A) up to which the fixed-capacity update runs (default: the "
                        "library's FIXED_ROWS_MAX; past it the eager update runs)")
    p.add_argument("--host-rewards", action="store_true",
                   help="rewards computed on the host from the arms ask hands over (bandit.pending_ids), as a black "
                        "box's: the device is read only by the bandit (default: on the device, read by tell)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="arms scored at once (default: the library's, sized for the device)")
    p.add_argument("--kernel-cache-bytes", type=int, default=None,
                   help="the bkb_large bandit's kernel_cache_bytes: past it its dictionary's rows are streamed "
                        "(0: always; default: the library's)")
    args = p.parse_args(argv)
    device, dtype = setup(args, default_threads=1)
    if args.fixed_rows_max is not None:
        from torchbkb.bandits import capacity

        capacity.FIXED_ROWS_MAX = int(args.fixed_rows_max)
    if args.quick:
        args.arms, args.warmup, args.steps, args.timed_steps = 5000, 20, 3, 5
    rows = [count(case, args, device, dtype) for case in args.cases]
    for r in rows:
        print(r, flush=True)
    for r in rows:
        r["step_ms"], r["floor_ms"] = 1e3 * r["step_s"], 1e3 * r["floor_s"]
    print_table(rows,
                ["case", "device", "num_arms", "whole_run", "ops_per_pick", "kernels_per_pick",
                 "kernels_per_pick_update_replayed", "syncs_per_pick", "sync_kind",
                 "picks_per_step", "dictionary_size", "streams_kernel_rows", "update_graphs_built", "step_ms",
                 "floor_ms", "step_over_floor"],
                f"launches ({torch.get_num_threads()} threads)")
    print(write_json(args.out, "launches", {"settings": vars(args), "rows": rows}))
    fig, axes = new_figure(ncols=2, width=4.2)
    names = [r["case"] for r in rows]
    axes[0][0].bar(names, [r["ops_per_pick"] for r in rows])
    axes[0][0].set(ylabel="tensor operations per pick")
    axes[0][1].bar(names, [r["syncs_per_pick"] for r in rows])
    axes[0][1].set(ylabel="host synchronizations per pick")
    save_figure(fig, args.out, "launches")


if __name__ == "__main__":
    main()
