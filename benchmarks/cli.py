"""Command-line options every benchmark shares: sizes, device, dtype, threads, output folder."""

from __future__ import annotations

import argparse

import torch

SIZES = ("quick", "default", "full")


def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark understands."""
    p = argparse.ArgumentParser(description=description)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smoke-test size (seconds)")
    size.add_argument("--full", action="store_true", help="the papers' sizes (hours)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"], help="arm/feature dtype")
    p.add_argument("--out", default="results", help="output directory for JSON and PNG")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    return p


def setup(args: argparse.Namespace, *, default_threads: int | None = None) -> tuple[torch.device, torch.dtype]:
    """Apply the common options (threads) and return ``(device, dtype)``.

    ``default_threads`` applies when ``--threads`` is not given: the bandit loops pass 1, since their
    per-step matrices are small and a second OpenMP thread only adds synchronization (on a shared 2-core
    VM it made them several times slower). The thread count is recorded in the JSON (:func:`machine_info`).
    """
    threads = args.threads if args.threads is not None else default_threads
    if threads is not None:
        torch.set_num_threads(int(threads))
    return resolve_device(args.device), resolve_dtype(args.dtype)


def size_of(args: argparse.Namespace) -> str:
    """``"quick"``, ``"default"`` or ``"full"``."""
    return "quick" if getattr(args, "quick", False) else "full" if getattr(args, "full", False) else "default"


def resolve_device(name: str) -> torch.device:
    """A ``torch.device``; ``cuda`` without a GPU is an error, not a silent fallback."""
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return dev


def resolve_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[name]


def with_one_blas_thread(measure, argv=None):
    """``measure(argv)`` with NumPy's BLAS on one thread (``threadpoolctl``; it is about 16× slower with two on these
    VMs), or as is without ``threadpoolctl``: the floor benchmarks time NumPy code beside torch's."""
    try:
        import threadpoolctl
    except ImportError:
        return measure(argv)
    with threadpoolctl.threadpool_limits(1):
        return measure(argv)
