"""Seconds per BBKB in-batch pick on a device: the eager pick loop against the same picks compiled and replayed.

BBKB's device loop (:func:`torchbkb.bandits.device_batch.hallucinated_pick`) costs a few kernel launches per pick
with no host read; on a GPU each launch is microseconds of Python and driver time for microseconds of arithmetic. This
times ``--chunk`` picks at a time, at Cadata's size (``--arms`` × ``--rank`` features, no stop: ``C̃ = 1000``,
which a chunk neither reaches nor stalls at; an unbounded ``C̃`` would end every batch at its first pick):

* ``eager`` -- the picks as the library runs them without a graph (every pick hallucinated, the stop rule on the
  host);
* ``flagged`` -- the same picks with the stop rule on the device as a done flag
  (:func:`~torchbkb.bandits.device_batch.pick_step`, ``run_batch_on_device(..., rule_on_host=False)``);
* ``graph`` -- the same picks replayed from a CUDA graph (:class:`~torchbkb.bandits.pick_graph.PickGraph`, the
  library's: every pick hallucinated, the stop rule on the host; on the CPU the same chunk on its padded buffers,
  eagerly);
* ``graph_compiled`` -- the library's graph of compiled picks (``PickGraphs(compiled=True)``: one compiled call
  per pick, shapes dynamic, captured together; on the CPU compiled, not captured);
* ``compiled`` -- the chunk through ``torch.compile(fullgraph=True)``;
* ``compiled_graph`` -- the same with ``mode="reduce-overhead"`` (inductor's CUDA graphs; CUDA only).

Each variant's picks are compared with the eager ones (``same_picks``). Compile and capture times are reported
apart from the per-pick times (medians over ``--repeats`` chunks, after a warm-up).

Usage::

    python -m benchmarks.pick_loop --device cuda
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.cli import base_parser, setup
from benchmarks.report import print_table, write_json
from benchmarks.timing import sync


def problem(A: int, r: int, device, dtype):
    g = torch.Generator().manual_seed(0)
    Z = (torch.randn(A, r, generator=g, dtype=torch.float64) / r**0.5).to(device=device, dtype=dtype)
    mean = (0.1 * torch.randn(A, generator=g, dtype=torch.float64)).to(device=device, dtype=dtype)
    V_inv = torch.eye(r, dtype=torch.float64, device=device) * 0.5
    rls = (Z.double() @ V_inv * Z.double()).sum(-1).to(dtype)
    return Z, mean, rls, V_inv


def start_state(Z, mean, rls, V_inv, alpha):
    from torchbkb.bandits.device_batch import PickState

    dev = Z.device
    return PickState(cur=rls.clone(), ucb=mean + alpha * rls.clamp_min(0.0).sqrt(), V_inv=V_inv.clone(),
                     level=torch.ones((), dtype=V_inv.dtype, device=dev),
                     done=torch.zeros((), dtype=torch.bool, device=dev),
                     count=torch.zeros((), dtype=torch.long, device=dev))


def time_variant(name, run, state0, repeats, device):
    """``run(state) -> (ids, state)``; returns (seconds per chunk, first chunk's ids on the host)."""
    ids, state = run(state0)
    first = ids.tolist()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        ids, state = run(state)
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def replayed(Z, mean, rls0, V_inv, alpha, C, picks, compiled=False):
    """The library's :class:`~torchbkb.bandits.pick_graph.PickGraph`: ``picks`` picks on static, padded buffers,
    captured in a CUDA graph at the first replay; ``run`` loads the state and replays once."""
    from torchbkb.bandits.pick_graph import PickGraphs

    graphs = PickGraphs(devices=("cpu", "cuda"), compiled=compiled)
    graph = graphs.get(Z.shape[0], Z.shape[1], Z.dtype, V_inv.dtype, Z.device, picks)
    graph.load(Z, mean, rls0, V_inv, alpha, C)
    graph.replay()  # the capture

    def run(state):
        for dst, src in zip(graph.state, state):
            (dst[: src.shape[0], : src.shape[1]] if dst.dim() == 2 else dst).copy_(src)
        return graph.replay().ids, graph.state

    return run


def gpu_kernels(run, state0, device, picks: int) -> float | None:
    """The device's kernels per pick of one ``run``, as the profiler sees them (CUDA only: ``None`` elsewhere, or
    where the profiler cannot see them)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(state0)
            sync(device)
        n = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - a profiler without CUPTI: no count
        return None
    return n / picks


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--arms", type=int, default=20_640)
    p.add_argument("--rank", type=int, default=40)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--variants", nargs="*", default=["eager", "flagged", "graph", "graph_compiled", "compiled",
                                                          "compiled_graph"])
    args = p.parse_args(argv)
    device, dtype = setup(args, default_threads=1)
    if args.quick:
        args.arms, args.repeats = 2000, 3
    Z, mean, rls, V_inv = problem(args.arms, args.rank, device, dtype)
    alpha, C = 0.894, 1e3
    from torchbkb.bandits.device_batch import hallucinated_picks
    from torchbkb.bandits.pick_graph import pick_steps

    def chunk(Z, mean, rls0, state, alpha, C):  # the library's k picks, without their variances
        ids, _, _, _, state = hallucinated_picks(Z, mean, state, alpha, args.chunk)
        return ids, state

    def flagged(Z, mean, rls0, state, alpha, C):  # the same picks with the stop rule as a done flag
        ids, _, state = pick_steps(Z, mean, rls0, state, alpha, C, args.chunk)
        return ids, state

    state0 = start_state(Z, mean, rls, V_inv, alpha)
    rows, ref = [], None
    for name in args.variants:
        if name == "compiled_graph" and device.type != "cuda":
            continue
        t0 = time.perf_counter()
        try:
            if name in ("eager", "flagged"):
                fn = chunk if name == "eager" else flagged
                run = lambda st, fn=fn: fn(Z, mean, rls, st, alpha, C)  # noqa: E731
            elif name in ("graph", "graph_compiled"):
                run = replayed(Z, mean, rls, V_inv, alpha, C, args.chunk, compiled=name == "graph_compiled")
            else:
                mode = "reduce-overhead" if name == "compiled_graph" else None
                fn = torch.compile(chunk, fullgraph=True, mode=mode)
                run = lambda st, fn=fn: fn(Z, mean, rls, st, alpha, C)  # noqa: E731
                run(state0)  # the compilation (and capture)
            sync(device)
            setup_s = time.perf_counter() - t0
            per_chunk, first = time_variant(name, run, state0, args.repeats, device)
        except Exception as err:  # noqa: BLE001 - a variant that fails is reported, the others still run
            rows.append({"variant": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
            print(rows[-1], flush=True)
            continue
        ref = first if ref is None else ref
        rows.append({"variant": name, "setup_s": setup_s, "pick_us": 1e6 * per_chunk / args.chunk,
                     "same_picks": first == ref, "gpu_kernels_per_pick": gpu_kernels(run, state0, device, args.chunk)})
        print(rows[-1], flush=True)
    print_table([r for r in rows if "pick_us" in r], ["variant", "setup_s", "pick_us", "same_picks"],
                f"BBKB picks, A = {args.arms}, r = {args.rank}, {args.chunk} per chunk, {device}")
    print(write_json(args.out, "pick_loop", {"settings": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
