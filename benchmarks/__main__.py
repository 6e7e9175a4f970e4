"""``python -m benchmarks``: run the benchmark suite (see :mod:`benchmarks`)."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

import torch

from benchmarks import BENCHMARKS, MAIN, OPTIONS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="torchbkb benchmark suite")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smoke-test sizes")
    size.add_argument("--full", action="store_true", help="the papers' sizes (hours)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, choices=["float32", "float64"],
                   help="default float64 (core_throughput: both)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--only", default=None,
                       help=f"comma-separated subset of {', '.join(BENCHMARKS)} (default: {MAIN})")
    which.add_argument("--all", action="store_true", help="run every benchmark")
    p.add_argument("--out", default="results")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = p.parse_args(argv)
    if args.list:
        for name, mod in BENCHMARKS.items():
            doc = (importlib.import_module(mod).__doc__ or "").strip().splitlines()[0]
            print(f"{name:22s} {doc}")
        return 0
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    else:
        names = list(BENCHMARKS) if args.all else [MAIN]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"--only: expected names from {list(BENCHMARKS)}, got {unknown}")
    common = [("--device", args.device), ("--out", args.out), ("--seed", str(args.seed))]
    common += [("--quick", None)] if args.quick else [("--full", None)] if args.full else []
    common += [("--dtype", args.dtype)] if args.dtype else []
    common += [("--threads", str(args.threads))] if args.threads else []
    common += [("--no-progress", None)] if args.no_progress else []
    explicit = {a.split("=")[0] for a in argv if a.startswith("--")}
    times = {}
    threads0 = torch.get_num_threads()
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        # each benchmark sets its own thread count (the bandit loops default to 1): do not let one run's
        # setting leak into the next one's default
        torch.set_num_threads(threads0)
        supported = OPTIONS.get(name)
        passed, dropped = [], []
        for flag, value in common:
            if supported is None or flag in supported:
                passed += [flag] if value is None else [flag, value]
            elif flag in explicit:
                dropped.append(flag)
        if dropped:
            print(f"({name} does not take {', '.join(dropped)}; running without)", flush=True)
        t0 = time.perf_counter()
        importlib.import_module(BENCHMARKS[name]).main(passed)
        times[name] = time.perf_counter() - t0
    print("\n" + "  ".join(f"{n}: {t:.0f}s" for n, t in times.items()) + f"  (total {sum(times.values()):.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
