"""Timing and memory: CUDA-synchronized repeats (min and median), interleaved comparisons, peak memory."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

def sync(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work (a no-op on CPU)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Seconds over repeats: ``min`` (the least disturbed), ``median`` (typical), all values."""

    min: float
    median: float
    values: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def time_call(fn: Callable[[], Any], *, device=None, repeats: int = 3, warmup: int = 1) -> Timing:
    """Time ``fn()`` with CUDA synchronization before and after each call.

    Args:
        fn: the callable (its return value is dropped after synchronization).
        device: device to synchronize.
        repeats: timed calls.
        warmup: untimed calls first (allocator, kernels, caches).

    Returns:
        :class:`Timing`.
    """
    for _ in range(warmup):
        fn()
        sync(device)
    values = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        values.append(time.perf_counter() - t0)
    return Timing(min(values), statistics.median(values), values)


def time_interleaved(fns: dict[str, Callable[[], Any]], *, device=None, repeats: int = 3, warmup: int = 1) -> dict[str,
        Timing]:
    """Time several callables round-robin (a, b, c, a, b, c, ...), synchronizing CUDA around each.

    On a shared or throttling machine, interleaving exposes every candidate to the same conditions, so
    ratios between them (e.g. an operation against its GEMM baseline) stay meaningful.

    Returns:
        ``{name: Timing}``.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            sync(device)
    values: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            values[name].append(time.perf_counter() - t0)
    return {k: Timing(min(v), statistics.median(v), v) for k, v in values.items()}


def status_kb(key: str) -> float:
    """A field of ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``, ...); NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def reset_hwm() -> bool:
    """Reset the process's resident-set high-water mark (``VmHWM``) to its current RSS; whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return not math.isnan(status_kb("VmHWM"))
    except OSError:
        return False


class PeakMemory:
    """Extra peak memory [bytes] of a block beyond what was resident when it started.

    CUDA: ``max_memory_allocated`` after a reset. CPU (Linux): ``VmHWM`` after :func:`reset_hwm`, minus ``VmRSS``
    at the start. ``None`` when unavailable.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.extra: int | None = None

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.ok = reset_hwm()
            self.base = int(status_kb("VmRSS")) * 1024 if self.ok else 0
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            sync(self.device)
            self.extra = torch.cuda.max_memory_allocated(self.device) - self.base
        elif self.ok:
            self.extra = int(status_kb("VmHWM")) * 1024 - self.base
        return False
